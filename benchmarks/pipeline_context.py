"""The long-context stage of ``benchmarks.pipeline_runs``: a pipeline stage on a ``dp x cp x tp``
sub-mesh, priced with Llama 3's context parallelism (issue 56).

``pipeline_blocks.price_blocks`` prices a ``dp x tp`` stage with a baseline's pins; a ``cp`` stage
needs more than those pins say: the ``fsdp+tp`` parameter pins (FSDP over ``dp`` and ``cp``), the
inputs pinned ``S(0)S(1)R`` (batch on ``dp``, each sequence on ``cp``, as
``autoshard.search.mesh_stages.context_pins`` pins a cp layout), every attention node forced to
a balanced CP exchange on ``cp`` (:func:`balanced_context_only`: the solver's choice of the
all-gather one, ``context_gather_balanced``, or the whole-K/V one, ``context_whole_kv_balanced``,
whose K/V gather and dK/dV reduce-scatter are the graph's, placeable before the example's GQA
expansion, issue 56), and the 3-D graph restricted around two 2-D seeds
(:func:`context_restriction`). The exchange is priced as autoshard runs it
(``autoshard.rules.context_parallel``), the query rows moved to their head-and-tail chunks and
back on every call; :func:`context_what_ifs` prices Meta's variant beside it (the GQA heads
gathered, the sequence reordered once) and the other parts of the gap one at a time.
Each matmul reads its weight's ``tp`` shard as pinned (:func:`tensor_parallel_restriction`, Megatron's
split as the stage runtime runs it). Known mis-pricing (issue 56): the view rules give no placement
taking a matmul's ``[B S, d]`` rows, split over ``dp`` then ``cp``, to ``[B, S]`` with the batch on
``dp`` and the sequence on ``cp``, so the solve re-lays them with all-to-alls on ``cp x tp`` (about
65 ms a 405B block exposed; none at ``dp`` 1). :func:`stage_breakdown` lists where a block's time goes.
Partial: benchmark code, not the search's; the general piece (``price_blocks`` with pins and a
restriction for an extra sub-mesh dim) is not in ``autoshard.search`` yet.

>>> # pricing, attention = price_context_blocks(factory, (8, 16, 8), micro_batch=8, recompute="full",
>>> #                                           profile="h100-sxm-80gb", time_limit=60)
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/pipeline_context.py`: re-executed as the module

import math
import re
import time
from dataclasses import replace
from typing import Any

CONTEXT_NAMES = ("dp", "cp", "tp")
SEQUENCE_INPUTS = ("tokens", "labels")
"""The inputs shaped ``[batch, seq]``: pinned ``S(0)S(1)R`` on a ``dp x cp x tp`` stage (batch on dp,
each sequence on cp), as ``autoshard.search.mesh_stages.context_pins`` pins a cp layout."""


def fsdp_tp_param_pins(graph: Any) -> dict[str, str]:
    """The ``fsdp+tp`` baseline's parameter pins on ``graph``'s mesh (``autoshard.search.baselines``):
    TP on ``tp``, FSDP over every other mesh dim (``dp`` and ``cp``, as torchtitan shards over
    ``dp_shard x cp``). Its input pins are left out: a microbatch of one sequence per dp rank does
    not split over ``dp x cp``, and a cp stage pins its inputs along the sequence instead."""
    from types import SimpleNamespace

    from autoshard.search.baselines import baseline_pins

    return baseline_pins(SimpleNamespace(mesh=graph.mesh, params=graph.params, nodes=graph.nodes, inputs={}),
                         "fsdp+tp")


BALANCED_KINDS = ("context_gather_balanced", "context_whole_kv_balanced")
"""The CP exchanges with Llama 3's head-and-tail chunks (``autoshard.rules.context_parallel``)."""


def balanced_context_only(mesh_dim: int):
    """A ``build_graph`` restriction: every attention node runs a balanced CP exchange (Llama 3's
    head-and-tail chunks: :data:`BALANCED_KINDS`, K/V gathered inside the exchange or by the graph)
    on ``mesh_dim``; a node without one is an error, not a silent fallback (the row would then
    price no CP)."""

    def keep(node: Any, strategies: Any) -> Any:
        if "scaled_dot_product" not in str(node.target):
            return strategies
        kept = tuple(s for s in strategies if s.exchange in {(kind, mesh_dim) for kind in BALANCED_KINDS})
        if not kept:
            raise ValueError(f"{node.name}: no balanced context-parallel strategy on mesh dim {mesh_dim}")
        return kept
    return keep


def _build(traced: Any, mesh: Any, profile: Any, restrict: Any = None) -> Any:
    """The strategy graph as ``prepare`` builds a pinned stage's (AdamW, bf16 with fp32 master and
    state, FSDP2's block-wise gathers with fp32 reductions, recomputation states)."""
    from autoshard.graph.builder import build_graph
    from autoshard.graph.memory import OptimizerMemory, optimizer_implementation

    optimizer = OptimizerMemory("adamw", True, optimizer_implementation("auto", profile))
    return build_graph(traced, mesh, profile, optimizer=optimizer, ties=True, restrict=restrict, recompute=True,
                       gather="fsdp2", reduce_dtype="float32")


def _seed(graph: Any, pins: dict, policy: str, time_limit: float, free: bool = False) -> list[int]:
    """The chosen strategy per node of ``graph`` under ``pins`` and the ``fsdp+tp`` data-parallel op
    layout (``free``: any op layout), the tp-split weights read as pinned on ``tp`` either way."""
    from solver import solve as solve_problem

    from autoshard.graph.problem import to_problem
    from autoshard.search.baselines import baseline_allowed, tensor_parallel_reads
    from autoshard.search.pins import resolve_pins

    # Megatron's column / row split as the runtime runs it: each matmul reads its weight's tp shard where
    # it lies (without it the solve gathers the weights over tp and runs the matmuls sequence-split)
    allowed = {i: m for i, m in tensor_parallel_reads(graph, pins).items() if m.any()} if free \
        else baseline_allowed(graph, "fsdp+tp", pins)
    found = solve_problem(to_problem(graph, pins=resolve_pins(graph, pins), recompute=policy, allowed=allowed),
                          time_limit=time_limit)
    if not found.choice:
        raise ValueError(f"cp stage seed on {graph.mesh.shape}: no solution ({found.status})")
    return list(found.choice)


def context_restriction(traced: Any, mesh: Any, profile: Any, policy: str, time_limit: float,
                        seed_traced: Any = None) -> Any:
    """The ``dp x cp x tp`` stage's search space (``autoshard.graph.restrict``, seeded search, with
    seeds of our choosing): per op, any single-dim choice the two 2-D solves below made on either
    of their dims, or replicate, on each of the three mesh dims; attention forced to the balanced
    CP exchange on ``cp`` (:func:`balanced_context_only`). Seeds: ``cp x tp`` with the sequence
    pinned on ``cp`` and CP attention there (the sequence splits, the CP exchange, TP's splits),
    solved twice: with the ``fsdp+tp`` data-parallel op layout, and free (the whole-K/V exchange
    needs its K/V chain replicated and its dK/dV chain partial on ``cp``, which the data-parallel
    layout refuses); and ``dp x tp`` with the ``fsdp+tp`` baseline (the batch splits). A 3-D mesh is too big to
    enumerate (``autoshard.graph.restrict``), and the default seed, a free solve of a merged
    2-D mesh, keeps no CP exchange on the cp dim to pin. ``seed_traced``: the model at one dp rank's
    batch, for the ``cp x tp`` seeds (``traced`` when None): on the 3-D mesh the cp dim meets the
    shapes dp leaves, and a reshape's choice there depends on them (the flattened rows of one
    sequence split on cp are ``S(0) -> S(1)`` of ``[b, s]``; of ``dp`` sequences, a strided split),
    so a seed at the whole batch would allow only the choices the 3-D plan cannot use."""
    from costmodel.mesh import MeshSpec

    from autoshard.graph.restrict import SeededRestriction, dim_choice
    from autoshard.search.baselines import baseline_pins

    dp, cp, tp = mesh.shape
    on_cp = _build(traced if seed_traced is None else seed_traced, MeshSpec((cp, tp), ("cp", "tp")), profile,
                   balanced_context_only(0))
    seq_pins = {**fsdp_tp_param_pins(on_cp), **{name: "S(1)R" for name in SEQUENCE_INPUTS}}
    on_dp = _build(traced, MeshSpec((dp, tp), ("dp", "tp")), profile)
    allowed: dict[str, set] = {}
    # a restricted node's signature carries its kept list's digest; the fine build asks by the plain one.
    # Nodes are matched by name: the cp x tp seeds may have traced one dp rank's batch, whose signatures
    # differ from the whole batch's; the whole batch's (``on_dp``, the fine build's shapes) keys both.
    plain = lambda node: re.sub(r"\|kept:[0-9a-f]+", "", node.signature)  # noqa: E731
    signature_of: dict[str, str] = {node.name: plain(node) for node in on_dp.nodes if node.kind == "op"}
    for graph, choice in ((on_cp, _seed(on_cp, seq_pins, policy, time_limit)),
                          (on_cp, _seed(on_cp, seq_pins, policy, time_limit, free=True)),
                          (on_dp, _seed(on_dp, baseline_pins(on_dp, "fsdp+tp"), policy, time_limit))):
        for node, k in zip(graph.nodes, choice):
            if node.kind != "op":
                continue
            key = signature_of.setdefault(node.name, plain(node))
            for d in range(2):
                c = dim_choice(node.strategies[k], d)
                if any(key_ not in (None, "R") for key_ in c):
                    allowed.setdefault(key, set()).add(c)
    seeded = SeededRestriction({k: frozenset(v) for k, v in allowed.items()}, signature_of)
    only_cp = balanced_context_only(CONTEXT_NAMES.index("cp"))
    return lambda node, strategies: only_cp(node, seeded(node, strategies))


def _strategy_key(s: Any) -> tuple:
    return repr(s.input_placements), repr(s.output_placements), s.exchange


def tensor_parallel_restriction(graph: Any, pins: dict, inner: Any) -> Any:
    """A ``build_graph`` restriction: ``inner``, then every op that reads a weight pinned split on
    ``tp`` (through views) keeps the strategies that read it as pinned there
    (``autoshard.search.baselines.tensor_parallel_reads`` on ``graph``, built with ``inner``), as
    the ``fsdp+tp`` baseline restricts a ``dp x tp`` stage and the stage runtime runs Megatron's
    split; a node that would keep none keeps what ``inner`` leaves (issue 56: without it the cp
    stage's matmuls read their weights gathered over ``tp``, 6.4 GB a block held and re-gathered in
    the recomputation)."""
    from autoshard.search.baselines import tensor_parallel_reads

    keep = {graph.nodes[i].name: {_strategy_key(s) for s, ok in zip(graph.nodes[i].strategies, mask) if ok}
            for i, mask in tensor_parallel_reads(graph, pins).items() if mask.any() and not mask.all()}

    def restrict(node: Any, strategies: Any) -> Any:
        strategies = inner(node, strategies)
        wanted = keep.get(node.name)
        if wanted is None:
            return strategies
        return tuple(s for s in strategies if _strategy_key(s) in wanted) or strategies
    return restrict


def context_stage(factory: Any, mesh_shape: tuple[int, int, int], *, depth: int, micro_batch: int, recompute: str,
                  profile: str, time_limit: float) -> tuple[Any, Any]:
    """``(prepared, plan)``: one stage of ``depth`` blocks on the ``dp x cp x tp`` sub-mesh, solved with
    the ``fsdp+tp`` parameter pins and the inputs pinned ``S(0)S(1)R`` (batch on dp, sequence on cp;
    ``RS(1)R`` for ``dp`` 1)."""
    from costmodel.mesh import MeshSpec
    from hw_profiles import load as load_profile

    from autoshard.plan.fingerprint import make_fingerprint
    from autoshard.search.prepared import Prepared
    from autoshard.search.solve import solve_prepared
    from autoshard.trace import trace_joint

    prof = load_profile(profile)
    mesh = MeshSpec(tuple(mesh_shape), CONTEXT_NAMES)
    model, inputs = factory(n_layers=depth, batch_size=micro_batch)
    t0 = time.perf_counter()
    traced = trace_joint(model, inputs, target_device=prof.device_type, stamp=True)
    t1 = time.perf_counter()
    dp = mesh_shape[0]
    seed_traced = None
    if dp > 1 and micro_batch % dp == 0:  # the cp x tp seeds at one dp rank's batch (context_restriction)
        seed_model, seed_inputs = factory(n_layers=depth, batch_size=micro_batch // dp)
        seed_traced = trace_joint(seed_model, seed_inputs, target_device=prof.device_type, stamp=True)
    restrict = context_restriction(traced, mesh, prof, recompute, time_limit, seed_traced)
    seeded = _build(traced, mesh, prof, restrict)
    batch = "S(0)" if mesh_shape[0] > 1 else "R"
    pins = {**fsdp_tp_param_pins(seeded), **{name: batch + "S(1)R" for name in SEQUENCE_INPUTS}}
    graph = _build(traced, mesh, prof, tensor_parallel_restriction(seeded, pins, restrict))
    prep = Prepared(traced=traced, graph=graph, fingerprint=make_fingerprint(traced, mesh.shape, mesh.dim_names, prof),
                    timings={"trace_s": round(t1 - t0, 4), "build_s": round(time.perf_counter() - t1, 4)},
                    options={"optimizer": "adamw", "mixed_precision": True, "allow_uneven": False,
                             "search": "seeded", "bucket_bytes": 0, "recompute_states": True, "gather": "fsdp2",
                             "reduce_dtype": "float32"})
    plan = solve_prepared(prep, pins=pins, recompute=recompute, memory_limit=math.inf, time_limit=time_limit)
    return prep, plan


def price_context_blocks(factory: Any, mesh_shape: tuple[int, int, int], *, micro_batch: int, recompute: str,
                         profile: str, time_limit: float) -> tuple[Any, dict]:
    """``(BlockPricing, attention)`` of a ``dp x cp x tp`` stage (:func:`context_stage` at depths 2
    and 4; what ``pipeline_blocks.price_blocks`` does on a ``dp x tp`` stage, whose pins it cannot
    express: the ``fsdp+tp`` baseline's input pins need the batch to split over ``dp x cp``);
    ``attention``: one block's attention nodes as the deeper plan prices them, forward and backward
    seconds (the exchange's row moves inside, and its gathers for ``context_gather_balanced``; the
    whole-K/V kind's gather and reduce-scatter are the graph's, in the block's time, not here)."""
    from autoshard.assembly.engine_pricing import chosen_strategies
    from autoshard.search.pipeline_blocks import plan_figures, pricing_from_figures

    started, figures, plan, prep, depths = time.perf_counter(), [], None, None, (2, 4)
    for depth in depths:
        prep, plan = context_stage(factory, mesh_shape, depth=depth, micro_batch=micro_batch, recompute=recompute,
                                   profile=profile, time_limit=time_limit)
        figures.append(plan_figures(prep, plan, depth))
        if not any(e in (f"{kind}@1" for kind in BALANCED_KINDS) for e in figures[-1].exchanges):
            raise ValueError(f"cp stage at depth {depth}: no balanced CP attention on cp ({figures[-1].exchanges})")
    pricing = pricing_from_figures(micro_batch, figures[0], figures[1], time.perf_counter() - started,
                                   checkpointed=recompute in ("full", "selective", "selective_all_mm"),
                                   sequence_split=recompute == "none")
    attention = {"forward_s": 0.0, "backward_s": 0.0, "exchanges": figures[-1].exchanges}
    for node, k in chosen_strategies(prep.graph, plan):
        if "scaled_dot_product" in node.name:
            attention["backward_s" if "backward" in node.name else "forward_s"] += float(node.compute_s[k]) / depths[-1]
    return replace(pricing, params=tuple(sorted(plan.params.items()))), attention


def context_attention_costs(run: Any, micro_batch: int) -> dict[str, Any]:
    """One layer's CP attention of ``run`` on one CP group, priced by ``costmodel.context_parallel``
    as the exchange prices it (balanced, all-gather, K/V gathered again in the backward): with the
    K/V heads the traced attention reads (expanded to the query heads: the gather autoshard prices)
    and with the model's 8 GQA heads (the gather Meta ran, section 3.3.2); row moves not included."""
    from costmodel.context_parallel import AttentionShape, price_context_attention
    from costmodel.mesh import MeshSpec
    from hw_profiles import load as load_profile

    pp, dp, tp = run.layout
    mesh, prof = MeshSpec((dp, run.cp, tp), CONTEXT_NAMES), load_profile(run.profile)
    heads, kv_heads = 128 // tp, max(1, 8 // tp)  # the 405B's 128 query / 8 K/V heads over tp
    return {name: price_context_attention(AttentionShape(micro_batch // dp, heads, kv, run.seq, 128), mesh=mesh,
                                          cp_mesh_dim=1, profile=prof, keep_gathered=False)
            for name, kv in (("expanded", heads), ("gqa", kv_heads))}


WHAT_IFS = (("meta_cp", 2, False), ("v4", 4, False), ("noac", 2, True), ("meta_cp+v4", 4, False),
            ("meta_cp+v4+noac", 4, True), ("meta_cp+v4+noac+bwd_eff", 4, True))
"""The cp row's what-ifs: (name, stages a rank, recomputation dropped); ``meta_cp`` in a name: the
attention priced as Meta ran it, ``bwd_eff``: its backward kernels at the forward's FLOP rate
(:func:`context_what_ifs`)."""


def context_what_ifs(run: Any, pricing: Any, attention: dict, pinned: dict) -> dict[str, Any]:
    """Where a cp row's step goes, and what-ifs that change one thing at a time (the issue 56
    section), memory not checked. ``meta_cp``: each block's attention as Meta ran it
    (:func:`context_attention_costs`' GQA gather, no row moves: the sequence reordered once), the
    forward less ``d_f = a_f - g_f`` and the backward less ``d_b = a_b - g_b`` (``a`` as the plan
    prices the attention nodes, ``g`` the GQA price) and, under full AC, less ``d_f`` again (the
    recomputed forward); ``noac``: the backward less the block's recomputation ``R`` (what it
    would run without activation checkpointing, as the 8K rows ran; ``R`` holds the recomputed
    attention at the plan's price, so ``meta_cp+noac`` drops ``d_f`` from it only once); ``v4``:
    4 stages a rank (the paper does not publish its interleaving); ``bwd_eff``: the GQA attention's
    backward kernels at the forward kernels' FLOP rate, less ``max(0, g_bc - 2.5 g_fc)`` (``g_fc``,
    ``g_bc`` the kernels alone; the profile's backward efficiency is a quick 3-point calibration held
    constant above 2e10 FLOPs, at 18 % of peak against the forward's 31 %)."""
    from costmodel.stage_cuts import BlockCost

    from autoshard.search.pipeline import search_pipeline

    costs = context_attention_costs(run, pricing.micro_batch)
    gqa = costs["gqa"]
    d_f = max(0.0, attention["forward_s"] - gqa.forward_s)
    d_b = max(0.0, attention["backward_s"] - gqa.backward_s)
    blk, redo = pricing.block, pricing.block_recompute_s
    out: dict[str, Any] = {"attention": attention, "costs": costs, "d_f": d_f, "d_b": d_b, "block": blk,
                           "block_exposed_s": pricing.block_exposed_s, "block_recompute_s": redo, "what_if": {}}
    for name, v, noac in WHAT_IFS:
        meta = "meta_cp" in name
        f = blk.forward_s - (d_f if meta else 0.0)
        b = blk.backward_s - (redo if noac else 0.0) - (d_b if meta else 0.0)
        b -= d_f if meta and not noac and run.recompute == "full" else 0.0
        b -= max(0.0, gqa.backward_compute_s - 2.5 * gqa.forward_compute_s) if "bwd_eff" in name else 0.0
        block = replace(pricing, block=BlockCost(f, max(0.0, b), blk.state_bytes, blk.activation_bytes),
                        block_recompute_s=0.0 if noac else redo)
        what = {**pinned, "stages_per_rank": (v,), "memory_limit_bytes": math.inf,
                "recompute": "none" if noac else pinned["recompute"]}
        out["what_if"][name] = search_pipeline(lambda mb, block=block: block, **what)
    return out


def backward_rate_what_if(run: Any, pinned: dict, price: Any, full: Any, selective: Any, all_mm: Any = None) -> Any:
    """The pinned row searched again (memory checked, ``v`` and each block's recomputation chosen as
    the row chooses them) with every pricing's block backward less ``max(0, g_bc - 2.5 g_fc)``: the
    GQA attention's backward kernels at the forward kernels' FLOP rate (``bwd_eff`` of
    :func:`context_what_ifs`; a recomputed forward is unchanged, so the same cut applies to kept,
    selective and checkpointed blocks). ``price`` / ``full`` / ``selective``: the row's
    ``price(micro_batch)`` per policy, ``all_mm`` the policy saving every matmul (``full``,
    ``selective`` and ``all_mm`` may be None)."""
    from costmodel.stage_cuts import BlockCost

    from autoshard.search.pipeline import search_pipeline

    def faster(price_at: Any) -> Any:
        if price_at is None:
            return None

        def at(micro_batch: int) -> Any:
            pricing = price_at(micro_batch)
            gqa = context_attention_costs(run, micro_batch)["gqa"]
            cut = max(0.0, gqa.backward_compute_s - 2.5 * gqa.forward_compute_s)
            blk = pricing.block
            return replace(pricing, block=BlockCost(blk.forward_s, max(0.0, blk.backward_s - cut), blk.state_bytes,
                                                    blk.activation_bytes))
        return at
    return search_pipeline(faster(price), **{**pinned, "price_full": faster(full),
                                             "price_selective": faster(selective), "price_all_mm": faster(all_mm)})


def _op_kind(target: str) -> str:
    """``attention``, ``matmul`` or ``other``: the breakdown's compute kinds."""
    if "scaled_dot_product" in target:
        return "attention"
    return "matmul" if any(name in target for name in ("mm", "linear", "matmul")) else "other"


def stage_breakdown(prep: Any, plan: Any) -> dict[str, dict]:
    """Where one solved cp stage plan's step goes (the issue 56 breakdown): ``compute`` seconds by
    (kind, ``forward`` / ``backward`` / ``recomputed``; a recomputed op's forward counted again, as
    ``estimate.recompute_s`` holds it); ``comm``: each redistribution step's seconds by (class,
    collective, mesh dims), the class ``weight`` / ``grad`` / ``activation``
    (``autoshard.assembly.param_comm``), FSDP2's gather buckets and the gradient buckets apart;
    ``exposed``: per class of scheduled transfer, the simulated step with it less the step without
    it (``S(T) - S(T \\ class)``, the schedule's own overlap); ``totals``: the estimate's step,
    compute and recomputation (its redistributions included)."""
    from collections import Counter

    from autoshard.assembly.engine_pricing import chosen_strategies, simulate_moves
    from autoshard.assembly.param_comm import _classify
    from autoshard.program.schedule import schedule_transfers
    from autoshard.search.pipeline_blocks import _forward_end

    graph, dims = prep.graph, prep.graph.mesh.dim_names
    chosen = chosen_strategies(graph, plan)
    times = [float(node.compute_s[k]) for node, k in chosen]
    end, redone = _forward_end(graph, plan), set(getattr(plan, "recompute", ()))
    compute: Counter = Counter()
    for i, ((node, _), t) in enumerate(zip(chosen, times)):
        kind = _op_kind(str(node.target))
        compute[kind, "forward" if i <= end else "backward"] += t
        if node.name in redone:
            compute[kind, "recomputed"] += t
    weights, grads, _ = _classify(graph, plan)
    by_edge, comm, cls = {}, Counter(), {}
    for r in plan.redistributions:
        edge = (r.tensor, r.to, r.input_index)
        by_edge[edge] = r
        cls[edge] = "weight" if edge in weights else "grad" if edge in grads else "activation"
        for st in r.steps:
            comm[cls[edge], st.collective, "+".join(dims[d] for d in st.mesh_dims)] += float(st.cost_s)
    comm["weight", "fsdp2 gather buckets", "data"] = sum(float(b.cost_s) for b in plan.gather_buckets)
    comm["grad", "gradient buckets", "data"] = sum(float(b.cost_s) for b in plan.buckets)

    def of_item(item: Any) -> str:
        if item.edge is None:
            return "weight gather bucket" if item.gather is not None else "gradient bucket"
        r = by_edge[tuple(item.key[1:])]
        return f"{cls[tuple(item.key[1:])]} on {'+'.join(sorted({dims[d] for s in r.steps for d in s.mesh_dims}))}"

    tail = max(0.0, plan.estimate.compute_s - sum(times))

    def step(keep: Any) -> float:
        items = tuple(i for i in plan.schedule.items if keep(i))
        moves, local = schedule_transfers(replace(plan.schedule, items=items), plan.redistributions, plan.buckets,
                                          plan.gather_buckets)
        return simulate_moves(graph.profile, times, moves, local, tail)

    every = step(lambda i: True)
    exposed = {c: every - step(lambda i, c=c: of_item(i) != c) for c in {of_item(i) for i in plan.schedule.items}}
    totals = {"step": plan.estimate.step_s, "compute": sum(times), "recompute": plan.estimate.recompute_s,
              "simulated": every, "bare": step(lambda i: False), "peak_bytes": plan.estimate.peak_memory_bytes}
    return {"compute": dict(compute), "comm": dict(comm), "exposed": exposed, "totals": totals}


def block_breakdown(factory: Any, mesh_shape: tuple[int, int, int], *, micro_batch: int, recompute: str,
                    profile: str, time_limit: float) -> dict[str, dict]:
    """:func:`stage_breakdown` per block: the difference of the stage solved at depths 2 and 4,
    halved (``pipeline_blocks``' Per block; the blocks are tied, so alike)."""
    out = []
    for depth in (2, 4):
        prep, plan = context_stage(factory, mesh_shape, depth=depth, micro_batch=micro_batch, recompute=recompute,
                                   profile=profile, time_limit=time_limit)
        out.append(stage_breakdown(prep, plan))
    lo, hi = out
    return {part: {k: (hi[part].get(k, 0.0) - lo[part].get(k, 0.0)) / 2 for k in {*lo[part], *hi[part]}}
            for part in lo}


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.pipeline_context [--recompute full|none]``: the per-block breakdown of the
    ``meta-405b-128k`` stage (``benchmarks.pipeline_runs``), milliseconds and GB."""
    import argparse

    from benchmarks.pipeline_runs import RUNS, _factory

    parser = argparse.ArgumentParser(description="per-block breakdown of the Llama 3 long-context stage (issue 56)")
    parser.add_argument("--recompute", choices=("full", "none"), default="full")
    parser.add_argument("--time-limit", type=float, default=30.0)
    args = parser.parse_args(argv)
    run = next(r for r in RUNS if r.key == "meta-405b-128k")
    pp, dp, tp = run.layout
    per_block = block_breakdown(_factory(run.titan_loss, run.seq), (dp, run.cp, tp),
                                micro_batch=run.batch // run.n_microbatches, recompute=args.recompute,
                                profile=run.profile, time_limit=args.time_limit)
    for part, figures in per_block.items():
        for key, value in sorted(figures.items(), key=lambda kv: str(kv[0])):
            shown = f"{value / 1e9:.3f} GB" if str(key).endswith("bytes") else f"{1e3 * value:.2f} ms"
            print(f"{part}\t{' / '.join(key) if isinstance(key, tuple) else key}\t{shown}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
