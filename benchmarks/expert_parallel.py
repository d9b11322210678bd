"""Expert parallelism chosen with the rest: a Qwen3-30B-A3B-shaped model on 64 H100s, and how far
a DeepSeek-V3-shaped 671B gets on 2,048.

**Qwen3-30B-A3B** (Hugging Face ``Qwen3MoeForCausalLM`` as given, meta tensors: 48 layers, hidden
2048, 32 query / 4 K/V heads of 128, 128 routed experts of width 768, top-8, vocab 151,936),
bf16 parameters with an fp32 master copy and fp32 AdamW state (``mixed_precision``), 2
sequences of 4096 tokens per GPU (global batch 128 x 4096), profile ``h100-sxm-80gb``, memory
limit 80 GiB. Two plans priced by the same cost model on the same trace:

* **torchtitan's documented layout** for this model: ``torchtitan/models/qwen3/train_configs/
  qwen3_30b_a3b.toml`` (pytorch/torchtitan, commit 24f66ec): ``data_parallel_shard_degree = -1``
  (FSDP over every rank), ``expert_parallel_degree = 2``, ``expert_tensor_parallel_degree = 1``,
  ``tensor_parallel_degree = 1``, full activation checkpointing, ``local_batch_size = 2``,
  ``seq_len = 4096``. Here: mesh ``32 x 2`` (``fsdp``, ``ep``), every parameter split over both
  dims (the ``fsdp`` baseline's pins: the dense ones FSDP over 64, the experts' E over ep and
  their FSDP over the other 32, as torchtitan's ``efsdp``), every experts node forced to its
  expert-parallel strategy on ``ep`` with the tokens split on both dims, ``recompute="full"``.
* **autoshard's choice**: the solve (placements, EP degree and mesh dim, recomputation
  ``auto``) on each candidate mesh of :data:`MESHES` (inner dims inside a node of 8), the
  fastest kept. Not the whole mesh search (16 layouts would not fit the 5-minute budget a
  timed command has on this machine).

**DeepSeek-V3** (671B, 61 layers, 256 routed experts top-8, 1 shared; DeepSeek trained it on
2,048 H800s as pipeline 16 x expert 64 with ZeRO-1 data parallelism): ``--deepseek`` builds the
model on meta and reports how far the plan gets (the trace of a 61-layer model stamped from three
blocks, the experts' share of the parameters, whether a plan without pipeline stages can fit);
``deepseek-pp`` plans the whole 61 layers on 2,048 GPUs as DeepSeek laid them out (pipeline 16
x data 2 x expert 64, :data:`DEEPSEEK_PP`): the stages' placements solved on a ``2 x 64``
sub-mesh, then the cuts, microbatches and schedule searched by the pipeline search.

One plan per run (each stays within the 5 minutes a timed command may take on the shared
2-core machine); each run merges its row into ``benchmarks/results/expert_parallel.json`` and
rewrites ``benchmarks/results/expert_parallel.md`` from every row. Not a test. The step times are
the cost model's estimates, whatever the machine's load; the wall times beside them are only
a guide (the runs shared the 2 cores with other work and were not serialized).

    python -m benchmarks.expert_parallel titan              # torchtitan's layout, 48 layers
    python -m benchmarks.expert_parallel 8x8                # autoshard's plan on 8 x 8
    python -m benchmarks.expert_parallel 8x8 --layers 4 --no-write
    python -m benchmarks.expert_parallel deepseek
    python -m benchmarks.expert_parallel deepseek-pp --microbatches 32   # 61 layers, pp 16 x dp 2 x ep 64
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/expert_parallel.py`: re-executed as the module

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

QWEN3_30B_A3B = {"vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48,
                 "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
                 "num_experts_per_tok": 8, "moe_intermediate_size": 768, "decoder_sparse_step": 1,
                 "norm_topk_prob": True, "max_position_embeddings": 4096, "tie_word_embeddings": False}
"""Qwen/Qwen3-30B-A3B's config.json (the fields the model's shapes read)."""
DEEPSEEK_V3 = {"vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 61,
               "num_attention_heads": 128, "num_key_value_heads": 128, "n_routed_experts": 256,
               "n_shared_experts": 1, "num_experts_per_tok": 8, "moe_intermediate_size": 2048, "n_group": 8,
               "topk_group": 4, "first_k_dense_replace": 3, "q_lora_rank": 1536, "kv_lora_rank": 512,
               "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "max_position_embeddings": 4096,
               "tie_word_embeddings": False}
"""deepseek-ai/DeepSeek-V3's config.json (the fields the model's shapes read)."""
TOKENS_PER_GPU = 2 * 4096
DEVICES = 64
TITAN = ((32, 2), ("fsdp", "ep"), 1)
"""torchtitan's layout: FSDP over all, EP 2 (mesh, dim names, the ep dim)."""
MESHES = (((8, 8), ("dp", "ep")), ((16, 4), ("dp", "ep")), ((32, 2), ("fsdp", "ep")))
PROFILE = "h100-sxm-80gb"
LIMIT = 80 * 2**30
RESULTS = Path(__file__).parent / "results" / "expert_parallel.md"


def _hf_causal_lm(config_name: str, model_name: str, fields: dict, batch: int, seq: int) -> tuple[Any, dict]:
    """A ``transformers`` causal LM from ``fields`` on meta in bf16, with its ``input_ids`` and
    ``labels`` (``examples.models.hf`` takes only a config's dataclass fields; ``head_dim`` is not one)."""
    import transformers

    from examples.models.factory import BuildOptions, build_example, random_tokens

    config = getattr(transformers, config_name)(**fields, use_cache=False, attn_implementation="sdpa")
    options = BuildOptions(batch_size=batch, seq_len=seq, device="meta", dtype="bfloat16")
    return build_example(options, lambda: getattr(transformers, model_name)(config), lambda gen: {
        "input_ids": random_tokens((batch, seq), config.vocab_size, gen),
        "labels": random_tokens((batch, seq), config.vocab_size, gen)})


def qwen3_30b_a3b(layers: int = 48) -> tuple[Any, dict]:
    """The model on meta with its batch for :data:`DEVICES` GPUs (module docstring)."""
    return _hf_causal_lm("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {**QWEN3_30B_A3B, "num_hidden_layers": layers},
                         DEVICES * TOKENS_PER_GPU // 4096, 4096)


def only_expert_parallel_on(dim: int):
    """A graph restriction: every experts node runs expert-parallel on mesh dim ``dim`` with its
    tokens split on every mesh dim (how torchtitan runs EP beside FSDP)."""
    def keep(node: Any, strategies: Any) -> Any:
        if not str(node.target).startswith("autoshard.experts"):
            return strategies
        first = 1 if "backward" in str(node.target) else 0
        kept = [s for s in strategies if s.exchange == ("expert_dispatch", dim)
                and all(str(p).startswith("S(0)") for p in s.input_placements[first])
                and all(str(p) in ("R", "S(0)") for p in s.input_placements[first + 3])]
        return kept or strategies
    return keep


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _estimate(plan: Any) -> dict:
    e = plan.estimate
    ep = sorted({(n.exchange[1], plan.fingerprint.mesh_shape[n.exchange[1]]) for n in plan.nodes if n.exchange})
    return {"step_s": round(e.step_s, 4), "compute_s": round(e.compute_s, 4), "comm_s": round(e.comm_s, 4),
            "exposed_comm_s": round(e.exposed_comm_s, 4), "recompute_s": round(e.recompute_s, 4),
            "peak_gib": round(e.peak_memory_bytes / 2**30, 2), "fits": e.fits, "recomputed": len(plan.recompute),
            "ep": [{"mesh_dim": d, "ranks": r} for d, r in ep], "status": plan.solver.status}


def titan_layout(traced: Any, time_limit: float) -> dict:
    """torchtitan's documented EP layout priced by autoshard's cost model (module docstring): the
    ``fsdp`` baseline (its pins and data-parallel op mask) with every experts node's mask narrowed
    to its expert-parallel strategies on the ep dim."""
    import numpy as np

    from autoshard.search import pinned_problem
    from autoshard.search.solve import prepare, solve_prepared

    mesh, names, ep_dim = TITAN
    start = time.perf_counter()
    prep = prepare(None, None, mesh, names, traced=traced, profile=PROFILE, mixed_precision=True, recompute="full",
                   search="full")
    _say(f"titan: prepared {time.perf_counter() - start:.0f} s")
    keep = only_expert_parallel_on(ep_dim)
    baseline_allowed = pinned_problem.baseline_allowed

    def with_expert_parallel(graph: Any, name: str) -> dict:
        allowed = dict(baseline_allowed(graph, name))
        for i, node in enumerate(graph.nodes):
            if node.kind == "op" and node.target.startswith("autoshard.experts"):
                kept = set(keep(node, node.strategies))
                allowed[i] = np.array([s in kept for s in node.strategies], dtype=bool)
        return allowed

    # the baseline's problem is built by pinned_problem with its op mask; one graph serves both
    # (a restricted second build of 48 layers takes minutes on this machine)
    pinned_problem.baseline_allowed = with_expert_parallel
    try:
        plan = solve_prepared(prep, baseline="fsdp", recompute="full", memory_limit=LIMIT, time_limit=time_limit)
    finally:
        pinned_problem.baseline_allowed = baseline_allowed
    row = _estimate(plan)
    if row["ep"] != [{"mesh_dim": ep_dim, "ranks": mesh[ep_dim]}]:
        raise RuntimeError(f"torchtitan's layout: the plan's experts run {row['ep']}, not EP {mesh[ep_dim]}")
    return {"mesh": "x".join(map(str, mesh)), **row, "wall_s": round(time.perf_counter() - start, 1)}


def chosen(traced: Any, meshes: Any, time_limit: float) -> list[dict]:
    """autoshard's plan on each candidate mesh (``recompute="auto"``, placements and EP free)."""
    from autoshard.search.solve import prepare, solve_prepared

    rows = []
    for mesh, names in meshes:
        start = time.perf_counter()
        prep = prepare(None, None, mesh, names, traced=traced, profile=PROFILE, mixed_precision=True,
                       recompute="auto", search="full")
        _say(f"{mesh}: prepared {time.perf_counter() - start:.0f} s")
        try:
            plan = solve_prepared(prep, recompute="auto", memory_limit=LIMIT, time_limit=time_limit)
            row = _estimate(plan)
        except ValueError as exc:  # a mesh that fits nothing: its one line, the others still priced
            row = {"error": str(exc).splitlines()[0][:200]}
        rows.append({"mesh": "x".join(map(str, mesh)), **row, "wall_s": round(time.perf_counter() - start, 1)})
    return rows


def deepseek_v3_report(layers: int, solve_mesh: tuple[int, int] | None, time_limit: float) -> dict:
    """How far the 671B gets: parameters, the experts' share, the trace, what its optimizer state
    is per GPU sharded over 2,048, and (``solve_mesh``) autoshard's plan of a shortened stack on
    that mesh (module docstring)."""
    from autoshard.search.solve import prepare, solve_prepared
    from autoshard.trace import trace_joint

    start = time.perf_counter()
    model, inputs = _hf_causal_lm("DeepseekV3Config", "DeepseekV3ForCausalLM",
                                  {**DEEPSEEK_V3, "num_hidden_layers": layers}, 2048, 4096)
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".mlp.experts." in n)
    row: dict = {"layers": layers, "params_b": round(total / 1e9, 1), "expert_params_b": round(experts / 1e9, 1),
                 "build_s": round(time.perf_counter() - start, 1)}
    # bf16 weights + fp32 master + fp32 AdamW state: 16 bytes a parameter, all of it sharded over 2,048
    row["state_gib_per_gpu_all_sharded"] = round(16 * total / 2048 / 2**30, 2)
    start = time.perf_counter()
    traced = trace_joint(model, inputs, target_device="cuda", stamp=True)
    row["trace_s"] = round(time.perf_counter() - start, 1)
    row["experts_nodes"] = sum(1 for n in traced.nodes.values() if "autoshard.experts" in str(n.op))
    _say(f"deepseek: traced {layers} layers in {row['trace_s']} s")
    if solve_mesh is not None:
        start = time.perf_counter()
        prep = prepare(None, None, solve_mesh, ("dp", "ep"), traced=traced, profile=PROFILE, mixed_precision=True,
                       recompute="auto", search="full")
        _say(f"deepseek: prepared {time.perf_counter() - start:.0f} s")
        try:
            plan = solve_prepared(prep, recompute="auto", memory_limit=LIMIT, time_limit=time_limit)
            row["plan"] = {"mesh": "x".join(map(str, solve_mesh)), **_estimate(plan)}
        except ValueError as exc:  # no plan on that mesh: its one line is the result
            row["plan"] = {"mesh": "x".join(map(str, solve_mesh)), "error": str(exc).splitlines()[0][:200]}
        row["plan"]["wall_s"] = round(time.perf_counter() - start, 1)
    return row


DEEPSEEK_PP = {"pp": 16, "stage_mesh": (2, 64), "stage_dims": ("dp", "ep"), "batch": 4096, "seq": 4096}
"""DeepSeek-V3's layout on 2,048 GPUs (pipeline 16 x expert 64, ZeRO-1 data parallelism over the
other 2): each stage's 128 GPUs a ``dp 2 x ep 64`` sub-mesh. The global batch, 4,096 sequences of
4,096 (16.8M tokens), is Llama 3's batch size; DeepSeek ramped to 15,360 sequences."""


def _deepseek_blocks(n_layers: int, batch_size: int, **_: Any) -> tuple[Any, dict]:
    """``n_layers`` MoE layers of DeepSeek-V3 (``first_k_dense_replace = 0``): the pipeline prices
    every one of the 61 blocks as an MoE block, an upper bound for the 3 dense ones (their
    feed-forward has 0.4B parameters against an MoE layer's 11.3B)."""
    fields = {**DEEPSEEK_V3, "num_hidden_layers": n_layers, "first_k_dense_replace": 0}
    return _hf_causal_lm("DeepseekV3Config", "DeepseekV3ForCausalLM", fields, batch_size, DEEPSEEK_PP["seq"])


def deepseek_v3_pipeline(time_limit: float, recompute: str, microbatches: tuple[int, ...] | None) -> dict:
    """The 671B on 2,048 GPUs with pipeline stages (:data:`DEEPSEEK_PP`): each stage's placements
    (expert parallelism, its degree and dim, data parallelism of the rest) solved on the stage
    sub-mesh from two depths of MoE blocks (2 and 3: under full recomputation a model of one block
    recomputes nothing, so depth 1 is not a marginal block;
    ``autoshard.search.pipeline_blocks.price_blocks``), then
    the stage cuts, microbatch count and schedule searched (``autoshard.search.pipeline``) under
    the profile's usable memory a GPU."""
    from hw_profiles import load

    from autoshard.search.pipeline import PipelineLayout, model_flops_per_token, search_pipeline
    from autoshard.search.pipeline_blocks import price_blocks

    cfg = DEEPSEEK_PP
    model, _ = _deepseek_blocks(1, 1)
    per_layer = sum(p.numel() for n, p in model.named_parameters() if ".layers." in n)
    experts = sum(p.numel() for n, p in model.named_parameters() if ".mlp.experts." in n)
    layers = DEEPSEEK_V3["num_hidden_layers"]
    active = layers * (per_layer - experts * (1 - DEEPSEEK_V3["num_experts_per_tok"] / DEEPSEEK_V3["n_routed_experts"]))
    flops = model_flops_per_token(int(active), layers, DEEPSEEK_V3["hidden_size"], cfg["seq"])
    pricings: dict[int, Any] = {}

    def price_at(micro_batch: int) -> Any:
        if micro_batch not in pricings:
            started = time.perf_counter()
            pricings[micro_batch] = price_blocks(
                _deepseek_blocks, {}, cfg["stage_mesh"], cfg["stage_dims"], micro_batch=micro_batch, depths=(2, 3),
                recompute=recompute, profile=PROFILE, time_limit=time_limit,
                prepare_options={"mixed_precision": True})
            b = pricings[micro_batch].block
            _say(f"deepseek-pp: blocks priced at {micro_batch} sequences in {time.perf_counter() - started:.0f} s: "
                 f"a block {b.forward_s:.3f} + {b.backward_s:.3f} s, state {b.state_bytes / 2**30:.2f} GiB, "
                 f"activations {b.activation_bytes / 2**30:.2f} GiB a microbatch, transient "
                 f"{pricings[micro_batch].transient_bytes / 2**30:.2f} GiB")
        return pricings[micro_batch]

    layout = PipelineLayout(cfg["pp"], cfg["stage_mesh"][0] * cfg["stage_mesh"][1], 1)
    profile = load(PROFILE)
    usable = profile.device.usable_memory_bytes  # an 80 GB H100 less the allocator's headroom, the solve's default
    plan = search_pipeline(price_at, n_blocks=layers, batch=cfg["batch"], seq_len=cfg["seq"],
                           dim=DEEPSEEK_V3["hidden_size"], layout=layout, profile=profile, flops_per_token=flops,
                           microbatches=microbatches, memory_limit_bytes=usable, itemsize=2)
    block = next(iter(pricings.values())).block
    return {"mesh": f"{cfg['pp']}x{cfg['stage_mesh'][0]}x{cfg['stage_mesh'][1]} (pp,dp,ep)",
            "schedule": plan.schedule, "n_microbatches": plan.n_microbatches,
            "stages_per_rank": plan.stages_per_rank, "cuts": list(plan.cuts), "step_s": round(plan.step_s, 3),
            "bubble": round(plan.bubble_fraction, 3), "lower_bound_s": round(plan.lower_bound_s, 3),
            "peak_gib_per_stage_rank": [round(b / 2**30, 2) for b in plan.rank_memory_bytes],
            "memory_limit_gib": round(usable / 2**30, 2), "fits": max(plan.rank_memory_bytes) <= usable, "tokens_per_gpu_s": round(plan.tokens_per_gpu_s, 1),
            "tflops_per_gpu": round(plan.tflops_per_gpu, 1), "recompute": recompute,
            "block_forward_backward_s": [round(block.forward_s, 4), round(block.backward_s, 4)],
            "block_state_gib": round(block.state_bytes / 2**30, 2),
            "block_activation_gib": round(block.activation_bytes / 2**30, 3),
            "stage_exchanges": sorted({x for p in pricings.values() for f in p.figures for x in f.exchanges}),
            "search_s": round(plan.search_s, 1)}


def write(rows: dict) -> str:
    """The results page (markdown) from every row measured so far."""
    lines = ["# Expert parallelism: Qwen3-30B-A3B on 64 H100s, DeepSeek-V3 on 2,048", "",
             "Written by `python -m benchmarks.expert_parallel` (one plan per run, rows merged from "
             "`expert_parallel.json`); the module docstring says what is priced and how.", ""]
    qwen = {k: v for k, v in rows.items() if k.startswith("qwen3:")}
    if qwen:
        lines += ["| plan | mesh | layers | step s | compute / exposed comm / recompute s | peak GiB | fits "
                  "| EP (mesh dim: ranks) | trace + solve wall s (not a timing) | when, load |", "|---" * 10 + "|"]
        for key, row in sorted(qwen.items()):
            label = "torchtitan (FSDP 64, EP 2, full AC)" if key.endswith(":titan") else "autoshard"
            when = f"{row['when']}, {row['load']}"
            if "error" in row:
                lines.append(f"| {label} | {row['mesh']} | {row['layers']} | {row['error']} | | | | | {row['wall_s']} "
                             f"| {when} |")
                continue
            ep = ", ".join(f"{e['mesh_dim']}: {e['ranks']}" for e in row["ep"]) or "none"
            lines.append(f"| {label} | {row['mesh']} | {row['layers']} | {row['step_s']} | {row['compute_s']} / "
                         f"{row['exposed_comm_s']} / {row['recompute_s']} | {row['peak_gib']} | {row['fits']} | {ep} "
                         f"| {row['wall_s']} | {when} |")
        lines.append("")
        for layers in sorted({row["layers"] for row in qwen.values()}):
            titan = qwen.get(f"qwen3:{layers}:titan")
            ours = [r for k, r in qwen.items() if r["layers"] == layers and not k.endswith(":titan")
                    and "step_s" in r and r["fits"]]
            if titan and ours:
                best = min(ours, key=lambda r: r["step_s"])
                lines.append(f"{layers} layers: autoshard's fastest plan ({best['mesh']}) / torchtitan's layout: "
                             f"{best['step_s'] / titan['step_s']:.2f} of its step time.")
        lines.append("")
    deepseek = {k: v for k, v in rows.items() if k.startswith("deepseek:")}
    if deepseek:
        lines += ["## DeepSeek-V3-shaped 671B", "", "```json", json.dumps(deepseek, indent=1, sort_keys=True), "```",
                  ""]
    return "\n".join(lines)


def _load_rows() -> dict:
    path = RESULTS.with_suffix(".json")
    return json.loads(path.read_text()) if path.exists() else {}


def main(argv: list[str] | None = None) -> None:
    """Command line (module docstring)."""
    from autoshard.trace import trace_joint

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    choices = ["titan", *("x".join(map(str, m)) for m, _ in MESHES), "deepseek", "deepseek-pp"]
    ap.add_argument("plan", choices=choices, help="torchtitan's layout, autoshard's plan on one mesh, or the "
                    "DeepSeek-V3 report")
    ap.add_argument("--layers", type=int, default=None, help="default: the model's own (48; DeepSeek-V3 61)")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--solve-mesh", default=None, help="deepseek: also solve on this 2-D mesh (dp x ep), e.g. 32x64")
    ap.add_argument("--recompute", default="auto", help="deepseek-pp: the stage solves' recomputation policy")
    ap.add_argument("--microbatches", default=None, help="deepseek-pp: microbatch counts tried, e.g. 16,32")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    if args.plan == "deepseek-pp":
        counts = tuple(int(x) for x in args.microbatches.split(",")) if args.microbatches else None
        key = f"deepseek:61:pp16x2x64:{args.recompute}"
        row = deepseek_v3_pipeline(args.time_limit, args.recompute, counts)
    elif args.plan == "deepseek":
        mesh = tuple(int(x) for x in args.solve_mesh.split("x")) if args.solve_mesh else None
        layers = args.layers or DEEPSEEK_V3["num_hidden_layers"]
        key, row = f"deepseek:{layers}:{args.solve_mesh or 'trace'}", deepseek_v3_report(layers, mesh, args.time_limit)
    else:
        layers = args.layers or QWEN3_30B_A3B["num_hidden_layers"]
        model, inputs = qwen3_30b_a3b(layers)
        traced = trace_joint(model, inputs, target_device="cuda", stamp=True)
        trace_s = round(time.perf_counter() - start, 1)
        _say(f"traced {layers} layers: {trace_s} s")
        if args.plan == "titan":
            row = titan_layout(traced, args.time_limit)
        else:
            row = chosen(traced, [m for m in MESHES if "x".join(map(str, m[0])) == args.plan], args.time_limit)[0]
        key, row = f"qwen3:{layers}:{args.plan}", {**row, "layers": layers, "trace_s": trace_s}
    now = datetime.datetime.now(datetime.UTC)
    row.update(wall_s=round(time.perf_counter() - start, 1), when=f"{now:%Y-%m-%d %H:%M}",
               load=f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(json.dumps({key: row}, indent=1))
    if not args.no_write:
        rows = {**_load_rows(), key: row}
        RESULTS.with_suffix(".json").write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
        RESULTS.write_text(write(rows))


if __name__ == "__main__":
    main()
