r"""A solved plan's step priced as another engine runs it: float8 linears, async TP.

The plan's own estimate prices the step as autoshard's runtime runs it: bf16 matmuls,
each TP collective on the communication stream, waited at its reader
(``costmodel.overlap``). torchtitan's large runs use two engine features that change
both (:class:`~autoshard.plan.options.EngineOptions`):

* ``float8_linears``: every ``aten.mm`` of a repeated block (the linear layers'
  forward, input-gradient and weight-gradient matmuls; the output layer is outside
  the blocks and stays bf16, as torchtitan filters it) is priced by
  ``costmodel.float8.float8_matmul`` at the op's local shape under its chosen
  strategy, casts included; with ``float8_all_gather`` every all-gather of such a
  weight (gather buckets and single gathers) carries one byte an element
  (``costmodel.float8.float8_gather_bytes``, re-priced by
  ``costmodel.collectives.collective_time_s``).
* ``async_tp``: each scheduled transfer that is one all-gather on the ``tp`` mesh dim
  read as the first operand of a block ``mm``, or one reduce-scatter on ``tp`` of a
  block ``mm``'s output, becomes a collective matmul with that ``mm``
  (``costmodel.async_tp.fuse``; its chunk a GEMM of ``1 / tp`` the FLOPs, priced on its
  own). An all-reduce is not fused (torch's async TP does not).

**Step** (:func:`reprice`). ``S_0`` and ``S_1``: the plan's schedule simulated
(``autoshard.program.schedule.schedule_transfers``, ``costmodel.overlap.simulate``) with
the graph's op times, without and with the options. The recomputation
(``estimate.recompute_s``, outside the simulated ops) is scaled by the ratio of the
forward's block matmul time with and without float8. Then

    step' = estimate.step_s + (S_1 - S_0) + recompute_s (ratio - 1)

so a plan repriced with no option keeps its own estimate exactly. The placements are
the bf16 solve's: the options change the price of a plan, not its choice (a solve that
chose placements under them would price its strategy graph with them).

A plan repriced so (:func:`repriced_plan`) records the options in ``plan.options["engine"]``,
and autoshard's runtime refuses it (``autoshard.plan.options.refuse_engine_options``): the
options are priced only.

>>> # step = reprice(prep.graph, plan, EngineOptions(float8_linears=True, async_tp=True))
>>> # step.step_s, step.float8_matmuls, step.fused_collectives
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from autoshard.plan.options import EngineOptions
from autoshard.program.schedule import VIEW_OPS, schedule_transfers
from costmodel.async_tp import CollectiveMatmul, fuse
from costmodel.collectives import collective_time_s
from costmodel.compute import op_time_s
from costmodel.float8 import cast_operands, float8_gather_bytes, float8_matmul
from costmodel.overlap import Transfer, simulate
from costmodel.shard_shapes import max_local_shape

__all__ = ["EngineStep", "reprice", "repriced_plan", "BLOCK_MATMULS", "chosen_strategies", "param_of", "edge_links",
           "grad_of", "simulate_moves"]

BLOCK_MATMULS = ("aten.mm.default",)
"""The ops priced as a linear layer's matmuls (a LLaMA block's linears have no bias: ``mm``)."""


@dataclass(frozen=True, slots=True)
class EngineStep:
    """One plan's step under :class:`EngineOptions` (module docstring)."""

    step_s: float
    op_compute_s: tuple[float, ...]
    """Each op's time under the options, async TP's fused collectives included."""
    recompute_s: float
    float8_matmuls: int
    """Block ``mm`` ops priced in float8."""
    fused_collectives: int
    """TP transfers fused with their matmul."""
    simulated_before_s: float
    """``S_0``: the schedule simulated as the plan prices it."""


@dataclass(frozen=True, slots=True)
class _Matmul:
    position: int
    m: int
    n: int
    k: int
    weights: tuple[bool, bool]
    """Whether operand A / B is a parameter (through views)."""


def chosen_strategies(graph: Any, plan: Any) -> list[tuple[Any, int]]:
    """(graph node, chosen strategy index) of every plan op node, in plan order."""
    from autoshard.assembly.assemble import placement_text

    out = []
    for node in plan.nodes:
        g = graph.nodes[graph.index[node.name]]
        k = next((k for k, s in enumerate(g.strategies)
                  if tuple(placement_text(p) for p in s.output_placements) == node.out
                  and tuple(placement_text(p) for p in s.input_placements) == node.inputs), None)
        if k is None:
            raise ValueError(f"plan node {node.name}: placements {node.out} <- {node.inputs} are no strategy "
                             "of the graph")
        out.append((g, k))
    return out


def param_of(graph: Any, index: int, reads: dict[int, list[Any]]) -> str | None:
    """The parameter FQN node ``index`` is (or views), else None."""
    for _ in range(8):  # a weight reaches its mm through a transpose and at most a few views
        node = graph.nodes[index]
        if node.kind == "param":
            return node.name.split(":", 1)[1]
        if node.kind != "op" or node.target not in VIEW_OPS or len(reads.get(index, ())) != 1:
            return None
        index = reads[index][0].src
    return None


def edge_links(graph: Any) -> tuple[dict[int, list[Any]], dict[int, list[Any]]]:
    """Edges by reader and by producer."""
    reads: dict[int, list[Any]] = {}
    feeds: dict[int, list[Any]] = {}
    for e in graph.edges:
        reads.setdefault(e.dst, []).append(e)
        feeds.setdefault(e.src, []).append(e)
    return reads, feeds


def grad_of(graph: Any, index: int, feeds: dict[int, list[Any]]) -> str | None:
    """The parameter whose gradient node ``index``'s output becomes (through views), else None."""
    frontier = [index]
    for _ in range(4):  # a weight gradient leaves its mm through a transpose and a view or two
        nxt = []
        for i in frontier:
            for e in feeds.get(i, ()):
                node = graph.nodes[e.dst]
                if node.kind == "grad":
                    return node.name.split(":", 1)[1]
                if node.kind == "op" and node.target in VIEW_OPS:
                    nxt.append(e.dst)
        frontier = nxt
    return None


def _block_matmuls(graph: Any, chosen: Sequence[tuple[Any, int]]) -> tuple[list[_Matmul], set[str], dict[str, str]]:
    """The block linears' matmuls with their local shapes (forward: a block's ``mm``; input
    gradient: an ``mm`` reading a block weight; weight gradient: an ``mm`` whose output becomes
    a block weight's gradient), the block weights, and view op -> weight FQN."""
    reads, feeds = edge_links(graph)
    mesh = graph.mesh.shape
    found = []
    for position, (node, k) in enumerate(chosen):
        if node.kind != "op" or node.target not in BLOCK_MATMULS:
            continue
        i = graph.index[node.name]
        by_input = {e.dst_input: e for e in reads.get(i, ())}
        if 0 in by_input and 1 in by_input:
            names = tuple(param_of(graph, by_input[j].src, reads) for j in (0, 1))
            found.append((position, node, k, by_input, names, grad_of(graph, i, feeds)))
    weights = {n for _, node, _, _, names, _ in found if node.region >= 0 for n in names if n is not None}
    out, views = [], {}
    for position, node, k, by_input, names, grad in found:
        if not (node.region >= 0 or any(n in weights for n in names) or grad in weights):
            continue  # the output layer (and any linear outside the blocks) stays bf16
        s = node.strategies[k]
        a = max_local_shape(by_input[0].tensor.shape, s.input_placements[0], mesh)
        b = max_local_shape(by_input[1].tensor.shape, s.input_placements[1], mesh)
        for j, name in enumerate(names):
            src = graph.nodes[by_input[j].src]
            if name is not None and src.kind == "op":
                views[src.name] = name
        out.append(_Matmul(position, a[0], b[1], a[1], (names[0] is not None, names[1] is not None)))
    return out, weights, views


def _float8_times(graph: Any, plan: Any, compute: list[float], matmuls: Sequence[_Matmul],
                  engine: EngineOptions) -> dict[int, float]:
    """Position -> float8 time of each block matmul (the casts its operands pay included)."""
    dp = [d for d, name in enumerate(plan.fingerprint.dim_names) if name != "tp"]
    shards = math.prod(graph.mesh.shape[d] for d in dp)
    out = {}
    for mm in matmuls:
        cast_a, cast_b = cast_operands(*mm.weights, float8_all_gather=engine.float8_all_gather)
        # a weight gathered in float8 was cast on its shard, once per gather: priced at the matmul reading it
        b_numel = mm.k * mm.n / shards if mm.weights[1] and not cast_b else None
        price = float8_matmul(mm.m, mm.n, mm.k, graph.profile, cast_a=cast_a, cast_b=cast_b or b_numel is not None,
                              b_cast_numel=b_numel)
        out[mm.position] = price.total_s
    return out


def _gather_weight(producer: str, weights: set[str], views: dict[str, str]) -> bool:
    name = producer.split(":", 1)[1] if producer.startswith("param:") else views.get(producer)
    return name in weights


def _fp8_gathers(graph: Any, plan: Any, transfers: list[Transfer], weights: set[str],
                 views: dict[str, str]) -> list[Transfer]:
    """``transfers`` with every weight all-gather carrying float8 (module docstring)."""
    by_edge = {(r.tensor, r.to, r.input_index): r for r in plan.redistributions}
    mesh, profile = graph.mesh, graph.profile
    out = []
    for item, t in zip(plan.schedule.items, transfers):
        if item.gather is not None:
            bucket = plan.gather_buckets[item.gather]
            parts = [by_edge[m] for m in bucket.members if m in by_edge]
            fp8 = sum(s.bytes for r in parts if _gather_weight(r.tensor, weights, views)
                      for s in r.steps if s.collective == "all_gather")
            if fp8 > 0:
                itemsize = _itemsize(bucket.dtype)
                new_bytes = bucket.bytes - fp8 + float8_gather_bytes(fp8, itemsize)
                delta = (collective_time_s("all_gather", new_bytes, bucket.mesh_dims, mesh, profile)
                         - collective_time_s("all_gather", bucket.bytes, bucket.mesh_dims, mesh, profile))
                t = Transfer(t.issue, t.wait, (max(0.0, t.durations_s[0] + delta),))
        elif item.edge is not None and _gather_weight(item.edge[0], weights, views):
            steps = [s for s in by_edge[item.edge].steps if s.collective in _COLLECTIVES]
            durations = tuple(
                d if s.collective != "all_gather" else max(0.0, d - collective_time_s(
                    "all_gather", s.bytes, s.mesh_dims, mesh, profile) + collective_time_s(
                    "all_gather", float8_gather_bytes(s.bytes, 2), s.mesh_dims, mesh, profile))
                for s, d in zip(steps, t.durations_s))
            t = Transfer(t.issue, t.wait, durations)
        out.append(t)
    return out


_COLLECTIVES = ("all_gather", "all_reduce", "reduce_scatter", "all_to_all", "permute")


def _itemsize(dtype: str) -> int:
    from costmodel.buckets.grouping import dtype_itemsize

    return dtype_itemsize(dtype) if dtype else 2


def _fed_matmul(graph: Any, reader: str, index: int, mm_at: dict[str, _Matmul],
                feeds: dict[int, list[Any]]) -> _Matmul | None:
    """The block matmul that reads the gathered tensor as its first operand: the reader itself,
    or the first one past at most :data:`CHAIN` elementwise or view ops (an all-gather the plan
    places before the norm fuses as torchtitan places it, after: the same bytes)."""
    if reader in mm_at:
        return mm_at[reader] if index == 0 else None
    frontier, best = [graph.index[reader]], None
    for _ in range(CHAIN):
        nxt = []
        for i in frontier:
            for e in feeds.get(i, ()):
                name = graph.nodes[e.dst].name
                if name in mm_at:
                    if e.dst_input == 0 and (best is None or mm_at[name].position < best.position):
                        best = mm_at[name]
                elif graph.nodes[e.dst].kind == "op":
                    nxt.append(e.dst)
        if best is not None:
            return best
        frontier = nxt
    return None


CHAIN = 3
"""Ops an all-gather may sit before the matmul it fuses with (:func:`_fed_matmul`)."""


def _made_by_matmul(graph: Any, producer: str, mm_at: dict[str, _Matmul],
                    reads: dict[int, list[Any]]) -> _Matmul | None:
    """The block matmul whose output (through views) a reduce-scatter splits, else None."""
    index = graph.index[producer]
    for _ in range(CHAIN):
        node = graph.nodes[index]
        if node.name in mm_at:
            return mm_at[node.name]
        if node.kind != "op" or node.target not in VIEW_OPS or len(reads.get(index, ())) != 1:
            return None
        index = reads[index][0].src
    return None


def _fusions(graph: Any, plan: Any, transfers: Sequence[Transfer], matmuls: Sequence[_Matmul],
             compute: Sequence[float]) -> list[CollectiveMatmul]:
    """The TP transfers async TP fuses with a block matmul (module docstring)."""
    names = plan.fingerprint.dim_names
    if "tp" not in names:
        return []
    tp_dim = names.index("tp")
    tp = graph.mesh.shape[tp_dim]
    reads, feeds = edge_links(graph)
    by_edge = {(r.tensor, r.to, r.input_index): r for r in plan.redistributions}
    mm_at = {plan.nodes[mm.position].name: mm for mm in matmuls}
    out: list[CollectiveMatmul] = []
    fused_at: set[int] = set()
    for k, (item, t) in enumerate(zip(plan.schedule.items, transfers)):
        if item.edge is None or len(t.durations_s) != 1:
            continue
        steps = [s for s in by_edge[item.edge].steps if s.collective in _COLLECTIVES]
        if len(steps) != 1 or steps[0].mesh_dims != (tp_dim,):
            continue
        kind = steps[0].collective
        producer, reader, index = item.edge
        if kind == "all_gather":
            mm = _fed_matmul(graph, reader, index, mm_at, feeds)
        elif kind == "reduce_scatter":
            mm = _made_by_matmul(graph, producer, mm_at, reads)
        else:
            continue
        if mm is None or mm.position in fused_at:  # one collective per matmul: a second stays on its stream
            continue
        fused_at.add(mm.position)
        # a chunk multiplies 1/tp of the rows by the whole B: a smaller GEMM, at its own efficiency (scaled
        # as the op's own time is to bf16's: float8 or not), never faster per FLOP than the whole one
        chunk = op_time_s("matmul", flops=2.0 * mm.m * mm.n * mm.k / tp,
                          bytes_accessed=2.0 * ((mm.m * mm.k + mm.m * mm.n) / tp + mm.k * mm.n),
                          dtype="bf16", profile=graph.profile) * compute[mm.position] / max(
            _bf16_s(graph, mm), 1e-30)
        out.append(CollectiveMatmul(k, mm.position, kind, tp, max(chunk, compute[mm.position] / tp)))
    return out


def _bf16_s(graph: Any, mm: _Matmul) -> float:
    return op_time_s("matmul", flops=2.0 * mm.m * mm.n * mm.k,
                     bytes_accessed=2.0 * (mm.m * mm.k + mm.k * mm.n + mm.m * mm.n), dtype="bf16",
                     profile=graph.profile)


def reprice(graph: Any, plan: Any, engine: EngineOptions) -> EngineStep:
    """The step of ``plan`` (solved on ``graph``, ``prep.graph``) under ``engine`` (module docstring).

    >>> # reprice(prep.graph, plan, EngineOptions()).step_s == plan.estimate.step_s
    """
    if plan.schedule is None:
        raise ValueError("plan: has no schedule (a plan file older than the schedule): cannot reprice its step")
    chosen = chosen_strategies(graph, plan)
    compute = [float(node.compute_s[k]) for node, k in chosen]
    transfers, local = schedule_transfers(plan.schedule, plan.redistributions, plan.buckets, plan.gather_buckets)
    tail = max(0.0, plan.estimate.compute_s - sum(compute))

    def run(ops: Sequence[float], moves: Sequence[Transfer]) -> float:
        return simulate_moves(graph.profile, ops, moves, local, tail)

    before = run(compute, transfers)
    matmuls, weights, views = _block_matmuls(graph, chosen)
    new, ratio = list(compute), 1.0
    if engine.float8_linears:
        fp8 = _float8_times(graph, plan, compute, matmuls, engine)
        end = _forward_end(graph, chosen)
        old_fwd = sum(compute[p] for p in fp8 if p <= end)
        new_fwd = sum(fp8[p] for p in fp8 if p <= end)
        for p, seconds in fp8.items():
            new[p] = seconds
        ratio = new_fwd / old_fwd if old_fwd > 0 else 1.0
        if engine.float8_all_gather:
            transfers = _fp8_gathers(graph, plan, transfers, weights, views)
    fusions = _fusions(graph, plan, transfers, matmuls, new) if engine.async_tp else []
    ops, moves = fuse(new, transfers, fusions)
    after = run(ops, moves)
    recompute = plan.estimate.recompute_s * ratio
    step = plan.estimate.step_s + (after - before) + (recompute - plan.estimate.recompute_s)
    return EngineStep(step, tuple(ops), recompute, len(matmuls) if engine.float8_linears else 0, len(fusions),
                      before)


def simulate_moves(profile: Any, ops: Sequence[float], moves: Sequence[Transfer],
                   local: Sequence[tuple[int, float]], tail_s: float) -> float:
    """The simulated step (``costmodel.overlap.simulate``) of op times ``ops`` with the transfers
    ``moves`` and the local steps ``local`` (``(position, seconds)`` on the compute stream, from
    ``autoshard.program.schedule.schedule_transfers``) under ``profile``'s contention and skew.

    >>> # simulate_moves(graph.profile, [1.0, 2.0], [], [(1, 0.5)], 0.0)   # 3.5
    """
    ops, extra = list(ops), 0.0
    for p, seconds in local:
        if p < len(ops):
            ops[p] += seconds
        else:
            extra += seconds
    return simulate(ops, moves, tail_s=tail_s + extra, contention=profile.contention, skew_s=profile.skew_s).step_s


def _forward_end(graph: Any, chosen: Sequence[tuple[Any, int]]) -> int:
    """Position of the op the loss reads: the forward's last (the recomputation repeats the forward)."""
    loss = next(i for i, n in enumerate(graph.nodes) if n.kind == "loss")
    sources = {graph.nodes[e.src].name for e in graph.edges if e.dst == loss}
    return max(p for p, (n, _) in enumerate(chosen) if n.name in sources)


def repriced_plan(graph: Any, plan: Any, engine: EngineOptions) -> Any:
    """``plan`` with its estimate's step (and recomputation) under ``engine`` and the options
    recorded in ``plan.options["engine"]`` (a prediction for that engine; the runtime refuses it).

    >>> # repriced_plan(prep.graph, plan, EngineOptions(async_tp=True)).options["engine"]["async_tp"]
    """
    from dataclasses import replace

    step = reprice(graph, plan, engine)
    estimate = replace(plan.estimate, step_s=step.step_s, recompute_s=step.recompute_s)
    return replace(plan, estimate=estimate, options={**plan.options, "engine": engine.to_dict()})
