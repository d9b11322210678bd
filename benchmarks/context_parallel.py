"""Context parallelism chosen with the rest: LLaMA-3 8B, 4 sequences of 131,072 tokens on 64 H100s,
and torchtitan's published CP runs priced with their layouts pinned.

**The 8B target** (issue 56): ``examples.models.llama3.llama3_8b`` on meta in bf16 (32 layers,
dim 4096, 32 query / 8 K/V heads, the K/V heads expanded before attention as the example does),
global batch 4 x 131,072 tokens, parameters bf16 with an fp32 master copy and fp32 AdamW state
(``mixed_precision``), profile ``h100-sxm-80gb``, memory limit 80 GiB, ``recompute="auto"``;
traced once for CUDA kernels (32 layers stamped from 3) and solved on each mesh of
:data:`MESHES` (inner dims inside a node of 8). The solver chooses per attention node whether
to split it along the sequence (``context_gather`` / ``context_gather_balanced`` on one mesh
dim, K/V gathered inside the exchange, or ``context_whole_kv`` / ``context_whole_kv_balanced``,
K/V gathered and dK/dV reduce-scattered by the graph where the solver puts them, before the GQA
expansion where the graph lets it; ``autoshard.rules.context_parallel``) with every other
placement. MFU counts the model FLOPs as the issue does: ``6 N`` per token (``N`` every
parameter) plus causal attention's ``6 x layers x dim x seq`` per token, over 989 TFLOP/s per
H100 (the datasheet's dense bf16).

**torchtitan's Table 2** (pytorch/torchtitan, its December 2024 H100 benchmark page; LLaMA-3.1 8B on 8
H100s of 96 GB at 500 W, local batch 1, full activation checkpointing, compile + Float8): FSDP
``f`` x CP ``c`` at sequence ``32768 c``, as :data:`TITAN_ROWS` lists. Priced here with the
layout pinned: mesh ``f x c`` (``fsdp``, ``cp``), every parameter sharded on its first dim over all
8 ranks (as torchtitan shards over ``dp_shard x cp``), the batch on ``fsdp`` and each sequence on
``cp`` (the inputs pinned), every attention
node forced to the balanced CP exchange on ``cp`` (torchtitan's load balancer), ``recompute=
"full"``; profile ``h100-sxm-96gb-500w`` in bf16 (Float8 is not priced: its linear layers run
faster there than here), and autoshard's own plan for the same 8 GPUs and batch beside it. The
pinned layout is priced twice: with autoshard's balanced all-gather exchange as its runtime runs
it, and with that exchange priced as torch's own context parallelism ran it for torchtitan
(``costmodel.context_parallel_torch``: torch ``1963fc8``'s ring loop, one SDPA call per step,
fp32 merges and dK/dV passes, K/V by ``--rotate``, torchtitan's default ``all_gather``; no row
moves, the inputs being reordered once).

**dK/dV rounding of the whole-K/V kinds** (``--rounding``): a CPU simulation of what the
``context_whole_kv`` kinds do to bf16 dK/dV, with the runtime's own part loop
(``autoshard.runtime.context_attention._kernel_backward`` over ``CPConfig.parts``, the CPU flash
kernel): each of ``cp`` ranks accumulates its share in fp32 and hands it over in bf16, and the
plan's reduce-scatter adds the shares hop by hop in bf16 (a ring: ``2 cp - 1`` roundings),
against the gather kinds' one rounding of the fp32 sum; errors against a float64 reference on
the same bf16 inputs (:func:`rounding_errors`).

Writes ``benchmarks/results/context_parallel.md``. Not a test.

    python -m benchmarks.context_parallel                  # the 8B target on every mesh of MESHES
    python -m benchmarks.context_parallel --meshes 8x8 --layers 4
    python -m benchmarks.context_parallel --titan 2        # torchtitan's Table 2 row 2 (none given: all)
    python -m benchmarks.context_parallel --titan 3 --rotate all_to_all   # torch's CP with the all-to-all rotater
    python -m benchmarks.context_parallel --rounding       # bf16 dK/dV of the whole-K/V kinds, cp 2-16 (~1 min)
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/context_parallel.py`: re-executed as the module

import argparse
import dataclasses
import datetime
import json
import os
import time
from pathlib import Path
from typing import Any

PROFILE = "h100-sxm-80gb"
LIMIT = 80 * 2**30
PEAK_BF16 = 989e12
"""H100 SXM dense bf16 FLOP/s (datasheet), the MFU denominator."""
BATCH, SEQ = 4, 131072
SEQUENCE_PINS = {"tokens": "S(0)S(1)", "labels": "S(0)S(1)"}
"""The batch on ``dp``, each sequence split on ``cp``: the inputs of a ``+pins`` case pinned (the only
hint; placements, CP and recomputation are the solver's)."""
MESHES = (((8, 8), ("dp", "cp"), None), ((4, 2, 8), ("dp", "cp", "tp"), None), ((4, 16), ("dp", "cp"), None),
          ((4, 16), ("dp", "cp"), SEQUENCE_PINS),
          ((4, 2, 8), ("dp", "cp", "tp"), {"tokens": "S(0)S(1)R", "labels": "S(0)S(1)R"}),
          ((8, 8), ("dp", "cp"), {"tokens": "S(1)S(1)", "labels": "S(1)S(1)"}))
TITAN_PROFILE = "h100-sxm-96gb-500w"
TITAN_ROWS = ((8, 1, 32768, 3890.0), (4, 2, 65536, 2540.0), (2, 4, 131072, 1071.0), (1, 8, 262144, 548.0))
"""torchtitan's Table 2: (FSDP degree, CP degree, sequence, published tokens/s/GPU); local batch 1."""
RESULTS = Path(__file__).parent / "results" / "context_parallel.md"
DATA = RESULTS.with_suffix(".json")
"""The rows behind the page: each run updates the cases it ran."""


def model_flops(model: Any, layers: int, dim: int, seq: int, tokens: int) -> float:
    """The issue's count: ``6 N + 6 layers dim seq`` per token (causal attention), times tokens.

    >>> model_flops(type("M", (), {"parameters": lambda self: []})(), 1, 2, 3, 10)
    360.0
    """
    params = sum(p.numel() for p in model.parameters())
    return float(tokens) * (6.0 * params + 6.0 * layers * dim * seq)


def _llama(layers: int, batch: int, seq: int) -> tuple[Any, Any]:
    from examples.models import llama3

    return llama3.llama3_8b(device="meta", dtype="bfloat16", batch_size=batch, seq_len=seq, max_seq_len=seq,
                            n_layers=layers)


def _context(plan: Any) -> list[str]:
    """``kind@mesh_dim(ranks)`` of the plan's context-parallel nodes."""
    fp = plan.fingerprint
    found = sorted({n.exchange for n in plan.nodes if n.exchange is not None and n.exchange[0].startswith("context")})
    return [f"{kind}@{dim}({fp.mesh_shape[dim]})" for kind, dim in found]


def _row(plan: Any, flops: float, gpus: int) -> dict:
    e = plan.estimate
    return {"step_s": round(e.step_s, 3), "mfu": round(flops / (e.step_s * gpus * PEAK_BF16), 4),
            "compute_s": round(e.compute_s, 3), "exposed_comm_s": round(e.exposed_comm_s, 3),
            "recompute_s": round(e.recompute_s, 3), "peak_gib": round(e.peak_memory_bytes / 2**30, 2),
            "fits": e.fits, "cp": _context(plan), "status": plan.solver.status}


def target(layers: int, meshes: Any, time_limit: float) -> dict:
    """The 8B target on each mesh (module docstring)."""
    from autoshard.search.solve import prepare, solve_prepared
    from autoshard.trace import trace_joint

    start = time.perf_counter()
    model, inputs = _llama(layers, BATCH, SEQ)
    traced = trace_joint(model, inputs, target_device="cuda", stamp=True)
    out: dict = {"layers": layers, "trace_s": round(time.perf_counter() - start, 1), "rows": []}
    flops = model_flops(model, layers, model.layers[0].attention.wq.weight.shape[1], SEQ, BATCH * SEQ)
    for mesh, names, pins in meshes:
        start = time.perf_counter()
        cpu = time.process_time()
        try:
            prep = prepare(None, None, mesh, names, traced=traced, profile=PROFILE, mixed_precision=True,
                           recompute="auto")
            plan = solve_prepared(prep, recompute="auto", memory_limit=LIMIT, time_limit=time_limit, pins=pins)
            row = _row(plan, flops, 64)
        except ValueError as exc:  # a mesh that fits nothing: its one line, the others still priced
            row = {"error": str(exc).splitlines()[0][:200]}
        out["rows"].append({"mesh": "x".join(map(str, mesh)), "dims": ",".join(names), "pins": _pins_text(pins),
                            **row, "wall_s": round(time.perf_counter() - start, 1),
                            "cpu_s": round(time.process_time() - cpu, 1)})
    return out


def _pins_text(pins: dict | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in (pins or {}).items()) or "none"


def only_context_parallel_on(dim: int):
    """A graph restriction: every attention node runs the balanced CP exchange on mesh dim ``dim``."""
    from autoshard.rules.context_parallel import GATHER_BALANCED

    def keep(node: Any, strategies: Any) -> Any:
        if "scaled_dot_product" not in str(node.target):
            return strategies
        kept = tuple(s for s in strategies if s.exchange == (GATHER_BALANCED, dim))
        return kept or strategies
    return keep


def titan_row(fsdp: int, cp: int, seq: int, published: float, time_limit: float, layers: int = 32,
              rotate: str = "all_gather") -> dict:
    """One Table 2 row: the pinned layout (priced as autoshard runs it and as torch ran it) and
    autoshard's own plan (module docstring)."""
    from costmodel.mesh import MeshSpec
    from hw_profiles import load

    from autoshard.graph.builder import build_graph
    from autoshard.rules.context_parallel import priced_as_torch
    from autoshard.search.solve import prepare, solve_prepared
    from autoshard.trace import trace_joint

    start = time.perf_counter()
    model, inputs = _llama(layers, fsdp, seq)
    traced = trace_joint(model, inputs, target_device="cuda", stamp=True)
    if cp > 1 and fsdp > 1:
        mesh, names, batch = (fsdp, cp), ("fsdp", "cp"), "S(0)S(1)"
    else:
        mesh, names, batch = (fsdp * cp,), ("cp" if cp > 1 else "fsdp",), "S(1)" if cp > 1 else "S(0)"
    flops = model_flops(model, layers, 4096, seq, fsdp * seq)
    row: dict = {"fsdp": fsdp, "cp": cp, "seq": seq, "published": published, "layers": layers}
    prep = prepare(None, None, mesh, names, traced=traced, profile=TITAN_PROFILE, mixed_precision=True,
                   recompute="full")
    graph = torch_graph = prep.graph
    if cp > 1:
        def build() -> Any:
            return build_graph(traced, MeshSpec(mesh, names), load(TITAN_PROFILE), optimizer=prep.graph.optimizer,
                               recompute=True, restrict=only_context_parallel_on(len(mesh) - 1))
        graph = build()
        with priced_as_torch(rotate):
            torch_graph = build()
    # FSDP over every rank (torchtitan shards over dp_shard x cp), the batch on fsdp, each sequence on cp
    pins = {name: "S(0)" * len(mesh) for name, i in graph.params.items()
            if graph.nodes[i].outputs[0].shape[0] % (fsdp * cp) == 0}
    pins.update(tokens=batch, labels=batch)
    row["rotate"] = rotate
    for key, pinned_graph in (("pinned", graph), ("pinned_torch", torch_graph))[:2 if cp > 1 else 1]:  # CP 1: no CP
        try:
            pinned = solve_prepared(dataclasses.replace(prep, graph=pinned_graph), pins=pins, recompute="full",
                                    memory_limit=1e30, time_limit=time_limit)
            row[key] = {**_row(pinned, flops, 8), "tps_gpu": round(fsdp * seq / pinned.estimate.step_s / 8, 1)}
        except ValueError as exc:
            row[key] = {"error": str(exc).splitlines()[0][:200]}
    own = prepare(None, None, mesh, names, traced=traced, profile=TITAN_PROFILE, mixed_precision=True,
                  recompute="auto")
    try:
        plan = solve_prepared(own, recompute="auto", time_limit=time_limit)
        row["own"] = {**_row(plan, flops, 8), "tps_gpu": round(fsdp * seq / plan.estimate.step_s / 8, 1)}
    except ValueError as exc:
        row["own"] = {"error": str(exc).splitlines()[0][:200]}
    row["wall_s"] = round(time.perf_counter() - start, 1)
    return row


ROUNDING_CPS = (1, 2, 4, 8, 16)
ROUNDING_SHAPE = (1, 4, 2048, 64)
"""``[batch, heads, seq, head_dim]`` of the rounding simulation: 64 rows a chunk at cp 16, balanced."""


def whole_kv_shares(dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, cp: int, *,
                    load_balanced: bool = True) -> list[list[Any]]:
    """Each rank's fp32 ``[dK, dV]`` share of a whole-K/V kind's backward on ``cp`` ranks, as
    ``context_attention._whole_backward`` accumulates it before handing it over in the inputs'
    dtype (the CPU kernel; every tensor whole, each rank's rows taken here)."""
    import torch

    from costmodel.context_parallel import ChunkLayout

    from autoshard.runtime.context_attention import KERNELS, CPConfig, _kernel_backward, _WholeBlocks, sequence_shard

    layout, shares = ChunkLayout(cp, load_balanced), []
    for rank in range(cp):
        config = CPConfig("", rank, layout, True, None, None, "cpu", False, q.shape[2], whole_kv=True)
        blocks = _WholeBlocks((k, v), config)
        mine = [sequence_shard(t, cp, rank, dim=2, load_balanced=load_balanced) for t in (dout, q, out, lse)]
        dq = torch.zeros(mine[1].shape, dtype=torch.float32)
        acc = [torch.zeros(k.shape, dtype=torch.float32) for _ in range(2)]
        for part in config.parts():
            grads = _kernel_backward(KERNELS["cpu"], part, *mine, blocks, dq)
            keys = (part.key_chunks[0] * blocks.c, len(part.key_chunks) * blocks.c)
            for whole, grad in zip(acc, grads):
                whole.narrow(2, *keys).add_(grad)
        shares.append(acc)
    return shares


def rounding_errors(cp: int, shape: tuple[int, int, int, int] = ROUNDING_SHAPE, *, dtype: Any = None,
                    load_balanced: bool = True, seed: int = 0) -> dict[str, dict[str, float]]:
    """Causal attention's dK and dV (module docstring, dK/dV rounding) on ``cp`` ranks of the
    whole-K/V kinds: ``{"dk": {...}, "dv": {...}}`` with the relative RMS (``rms_*``) and the
    largest error over the largest magnitude (``max_*``), for ``once`` (the fp32 shares summed,
    one rounding: the gather kinds) and ``hops`` (each share rounded, then summed a hop at a time
    in ``dtype``: the whole-K/V kinds with the plan's reduce-scatter), against float64."""
    import torch

    from autoshard.runtime.context_attention import _math_backward, _math_forward

    dtype = dtype or torch.bfloat16
    gen = torch.Generator().manual_seed(seed)
    q, k, v, dout = (torch.randn(*shape, generator=gen).to(dtype) for _ in range(4))
    wide = [t.double() for t in (q, k, v, dout)]
    out64, lse64 = _math_forward(*wide[:3], True, None, None)
    _, *refs = _math_backward(wide[3], *wide[:3], out64, lse64, True, None, None)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, 0.0, True)
    shares = whole_kv_shares(dout, q, k, v, out, lse, cp, load_balanced=load_balanced)
    result = {}
    for name, i, ref in (("dk", 0, refs[0]), ("dv", 1, refs[1])):
        once = sum(share[i] for share in shares).to(dtype)
        hops = shares[0][i].to(dtype)
        for share in shares[1:]:  # a ring reduce-scatter: each hop's partial sum lands in dtype
            hops = (hops.float() + share[i].to(dtype).float()).to(dtype)
        row = {}
        for key, got in (("once", once), ("hops", hops)):
            diff = got.double() - ref
            row[f"rms_{key}"] = float(diff.norm() / ref.norm())
            row[f"max_{key}"] = float(diff.abs().max() / ref.abs().max())
        result[name] = row
    return result


def rounding_table(cps: tuple[int, ...] = ROUNDING_CPS) -> list[dict]:
    """:func:`rounding_errors` in bf16 for each of ``cps``, and in fp32 at the largest."""
    import torch

    rows = [{"cp": cp, "dtype": "bf16", **rounding_errors(cp)} for cp in cps]
    return rows + [{"cp": cps[-1], "dtype": "fp32", **rounding_errors(cps[-1], dtype=torch.float32)}]


def _rounding_lines(rows: list[dict]) -> list[str]:
    shape = "x".join(map(str, ROUNDING_SHAPE))
    lines = ["## dK/dV rounding of the whole-K/V kinds (CPU simulation)", "",
             f"Causal attention {shape} (batch x heads x seq x head_dim), balanced layout, random normal inputs "
             "rounded to the dtype; error against float64 on the same inputs: relative RMS, and largest error over "
             "the largest magnitude. *One rounding*: the fp32 shares summed, then rounded (the gather kinds); "
             "*2 cp - 1 roundings*: each share handed over in the dtype and summed a hop at a time in it (the "
             "whole-K/V kinds' reduce-scatter). cp 1 is the kernel alone.", "",
             "| cp | dtype | dK RMS: one / 2cp-1 | dK max: one / 2cp-1 | dV RMS: one / 2cp-1 | dV max: one / 2cp-1 |",
             "|---:|---|---|---|---|---|"]

    def pct(row: dict, kind: str) -> str:
        return f"{100 * row[kind + '_once']:.3g} / {100 * row[kind + '_hops']:.3g} %"

    for r in rows:
        lines.append(f"| {r['cp']} | {r['dtype']} | {pct(r['dk'], 'rms')} | {pct(r['dk'], 'max')} "
                     f"| {pct(r['dv'], 'rms')} | {pct(r['dv'], 'max')} |")
    return lines + [""]


def _titan_cell(p: dict, published: float) -> str:
    """``tok/s/GPU (error %)`` of a pinned price, its error line, or a dash where not run."""
    if "tps_gpu" not in p:
        return p.get("error", "-")
    return f"{p['tps_gpu']} ({100 * (p['tps_gpu'] - published) / published:+.1f} %)"


def _now() -> str:
    return f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M}"


def write(result: dict | None, titan: list[dict] | None, rounding: list[dict] | None = None) -> str:
    """The results page (markdown)."""
    lines = ["# Context parallelism: LLaMA-3 8B at 131,072 tokens on 64 H100s", "",
             f"Written by `python -m benchmarks.context_parallel` on {_now()} UTC, load {os.getloadavg()[0]:.1f} "
             f"on {os.cpu_count()} cores; the module docstring says what is priced and how.", ""]
    if result:
        lines += [f"Layers {result['layers']}, batch {BATCH} x {SEQ}; trace {result['trace_s']} s (the last run's; "
                  "each row ran as its own command under the benchmark lock).", "",
                  "| mesh | dims | pins | step s | MFU | compute / exposed comm / recompute s | peak GiB | fits | CP "
                  "| solver | prepare + solve wall s (CPU s), trace apart |", "|---|---|---|---:|---:|---|---:|---|---|---|---:|"]
        for r in result["rows"]:
            if "error" in r:
                lines.append(f"| {r['mesh']} | {r['dims']} | {r['pins']} | {r['error']} | | | | | | | {r['wall_s']} |")
                continue
            lines.append(f"| {r['mesh']} | {r['dims']} | {r['pins']} | {r['step_s']} | {100 * r['mfu']:.1f} % | {r['compute_s']} / "
                         f"{r['exposed_comm_s']} / {r['recompute_s']} | {r['peak_gib']} | {r['fits']} "
                         f"| {', '.join(r['cp']) or 'none'} | {r['status']} | {r['wall_s']} ({r['cpu_s']}) |")
        lines.append("")
    if titan:
        lines += ["## torchtitan Table 2 (8 H100 96 GB 500 W), layouts pinned", "",
                  "Pinned tok/s/GPU (error against the published), the layout's CP attention priced as autoshard's "
                  "balanced all-gather exchange runs it, and as torch's `context_parallel` ran it for torchtitan "
                  "(K/V rotater in brackets).", "",
                  "| FSDP x CP | seq | published tok/s/GPU | pinned, autoshard's exchange | pinned, torch's CP "
                  "| autoshard's plan tok/s/GPU | CP chosen |", "|---|---:|---:|---|---|---:|---|"]
        for r in titan:
            o = r["own"]
            cells = [_titan_cell(r.get(key, {}), r["published"]) for key in ("pinned", "pinned_torch")]
            if "pinned_torch" in r and r["cp"] > 1:
                cells[1] += f" [{r.get('rotate', 'all_gather')}]"
            own = o.get("error") or o["tps_gpu"]
            lines.append(f"| {r['fsdp']} x {r['cp']} | {r['seq']} | {r['published']} | {cells[0]} | {cells[1]} "
                         f"| {own} | {', '.join(o.get('cp', [])) or 'none'} |")
        lines.append("")
    if rounding:
        lines += _rounding_lines(rounding)
    return "\n".join(lines)


def _case(case: tuple) -> str:
    """``8x8``, or ``4x16+pins`` for a case with pinned inputs."""
    return "x".join(map(str, case[0])) + ("+pins" if case[2] else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--meshes", default=None, help="comma-separated cases (8x8,4x2x8,4x16,4x16+pins); "
                        "default: every case of MESHES")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--titan", type=int, nargs="*", default=None,
                        help="torchtitan's Table 2 rows (indices into TITAN_ROWS; none given: all) instead of the 8B target")
    parser.add_argument("--rotate", choices=("all_gather", "all_to_all"), default="all_gather",
                        help="torch's K/V rotater for the Table 2 rows priced as torch ran them (torchtitan's default: "
                        "all_gather)")
    parser.add_argument("--rounding", action="store_true",
                        help="simulate the whole-K/V kinds' bf16 dK/dV rounding at cp 1-16 (CPU) instead")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    meshes = MESHES
    if args.meshes:
        wanted = args.meshes.split(",")
        known = {_case(case) for case in MESHES}
        unknown = [m for m in wanted if m not in known]
        if unknown:
            parser.error(f"--meshes: {', '.join(unknown)} not among {', '.join(sorted(known))}")
        meshes = tuple(case for case in MESHES if _case(case) in wanted)
    saved = json.loads(DATA.read_text()) if DATA.exists() and not args.no_write else {}
    result, titan, rounding = saved.get("target"), saved.get("titan"), saved.get("rounding")
    if args.rounding:
        rounding = rounding_table()
    elif args.titan is not None:
        picked = [TITAN_ROWS[k] for k in (args.titan or range(len(TITAN_ROWS))) if 0 <= k < len(TITAN_ROWS)]
        fresh = [titan_row(*row, time_limit=args.time_limit, layers=args.layers, rotate=args.rotate)
                 for row in picked]
        done = {(r["fsdp"], r["cp"]) for r in fresh}
        titan = sorted([r for r in titan or [] if (r["fsdp"], r["cp"]) not in done] + fresh, key=lambda r: r["seq"])
    else:  # each case replaces its own row: the cases run one command each (5 minutes a timed command)
        fresh = target(args.layers, meshes, args.time_limit)
        keys = {(r["mesh"], r["pins"]) for r in fresh["rows"]}
        kept = [r for r in (result or {}).get("rows", []) if (r["mesh"], r["pins"]) not in keys
                and (result or {}).get("layers") == fresh["layers"]]
        result = {**fresh, "rows": kept + fresh["rows"]}
    text = write(result, titan, rounding)
    print(text)
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        DATA.write_text(json.dumps({"target": result, "titan": titan, "rounding": rounding}, indent=1) + "\n")
        RESULTS.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
