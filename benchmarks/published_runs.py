"""Published GPU training runs, predicted: autoshard's cost model against what was measured.

Each run is configured as published (model, global batch, sequence, mesh,
layout, activation checkpointing, bf16 with an fp32 master copy and fp32
AdamW state) and priced twice on the published hardware's profile:

- the **baseline**: the published layout (``fsdp`` or ``fsdp+tp``, pinned by
  ``autoshard.search.baselines``) with the published recomputation policy, no
  memory limit (so its peak is the prediction, not a constraint);
- the **solved plan**: what autoshard chooses on the same mesh (placements and
  recomputation, ``recompute="auto"``) within the device's memory.

The model is ``examples.models.llama3`` with torchtitan's loss (logits cast
to fp32 before the cross entropy, :func:`_titan_forward`) and, for the runs
of torchtitan's 2024-12 eager benchmarks, torchtitan's own RMSNorm of then
(:class:`TitanRMSNorm`, ``PublishedRun.titan_norm``).

Predicted tokens/s/GPU = global batch x sequence / (step_s x GPUs), the way
torchtitan logs ``tps`` (tokens of the local batch / (time x non-data-parallel
degree)). Published step times are derived the same way where only tokens/s
are published. The error is (predicted - published) / published.

The published memory is torchtitan's ``max_reserved`` (the caching allocator's
reservation, which includes fragmentation); the plan's peak is of live tensors
(what ``max_allocated`` measures). Against a reserved figure the prediction is
the plan's ``estimate.reserved_bytes``: its tensors replayed through the
caching allocator with expandable segments, as torchtitan's launcher runs
(``autoshard.program.reservation``); beside it the peak plus the profile's flat
allocator headroom (``DeviceSpec.allocator_headroom``: ``h100-sxm-96gb-500w``
cites reserved / allocated of torchtitan's LLaMA-3 8B, +9.4 %). Where a source
gives both figures, both are shown.

Each run is solved in its own process (peak RSS its own). Not a test.

    python -m benchmarks.published_runs                      # every run, table on stdout
    python -m benchmarks.published_runs --only tt-8b-fsdp8
    python -m benchmarks.published_runs -o benchmarks/results/published_runs.md
    python -m benchmarks.published_runs --one-gpu             # the one-H100 steps (ONE_GPU), ~1 minute

**One H100** (:data:`ONE_GPU`): the steps measured on one H100 80GB HBM3 on
2026-11-27 (``benchmarks/results/h100-2026-11-27/README.md``), each priced on
mesh ``(1,)`` with the shipped ``h100-sxm-80gb``, the measured optimizer and its
implementation, no memory limit: the estimate's ``step_s`` beside the measured
step (median, eager torch, ``torch.cuda.synchronize`` around it) and its
``peak_memory_bytes`` beside ``max_memory_allocated``.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/published_runs.py`: re-executed as the module

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from types import MethodType

from torch import nn

from benchmarks.common.models import load

TT_2412 = ("https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3_h100_202412_torchtitan.md"
           " (torchtitan 9dec370, torch 1963fc8, 2024-12)")
TT_ASYNC = ("https://github.com/pytorch/torchtitan/blob/main/benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md"
            " (torchtitan 820504e, torch 38410cf9, 2025-06)")
AP_481 = ("https://github.com/meta-pytorch/autoparallel/pull/481 (commit 7ad1142, 'Real benchmark results',"
          " TorchTitan reference row)")


@dataclass(frozen=True, slots=True)
class PublishedRun:
    """One published measurement and the configuration it ran."""

    key: str
    title: str
    config: str
    """A ``benchmarks.solve_time.CONFIGS`` key (model shape and sequence length)."""
    seq_len: int
    global_batch: int
    mesh: tuple[int, ...]
    dim_names: tuple[str, ...]
    baseline: str
    recompute: str
    profile: str
    tokens_per_gpu_s: float
    step_s: float
    memory_gib: float | None
    memory_note: str
    source: str
    not_modeled: str
    """What the run did that the prediction does not price (it explains part of the error)."""
    expandable_segments: bool = True
    """The run's caching allocator had expandable segments (torchtitan's ``run_llama_train.sh`` and
    ``run_train.sh`` set ``PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True"``; at 9dec370 too)."""
    titan_norm: bool = False
    """The run used torchtitan's own RMSNorm (``norm_type = "rmsnorm"``, eager: an fp32 composite of
    separate kernels, :class:`TitanRMSNorm`), not ``nn.RMSNorm`` (one fused kernel on CUDA)."""

    @property
    def gpus(self) -> int:
        return math.prod(self.mesh)


def _tt_step(tps: float, global_batch: int, seq: int, gpus: int) -> float:
    """Step time from torchtitan's tokens/s/GPU."""
    return global_batch * seq / (tps * gpus)


RUNS = (
    PublishedRun(
        "tt-8b-fsdp8", "Llama 3.1 8B, FSDP 8 (1 host)", "8b-8192", 8192, 16, (8,), ("dp",), "fsdp", "selective",
        "h100-sxm-96gb-500w", 5762.0, _tt_step(5762.0, 16, 8192, 8), 82.4, "max reserved",
        TT_2412 + " Table 1 row FSDP; local batch 2, seq 8192 and per-op selective AC from train_configs/llama3_8b.toml",
        "eager (no torch.compile); kernel workspaces and temporaries inside one op (the allocator replay's time"
        " step is one op)", titan_norm=True),
    PublishedRun(
        "tt-8b-fsdp128", "Llama 3.1 8B, FSDP 128 (16 hosts)", "8b-8192", 8192, 256, (128,), ("dp",), "fsdp",
        "selective", "h100-sxm-96gb-500w", 5605.0, _tt_step(5605.0, 256, 8192, 128), 67.0, "max reserved",
        TT_2412 + " Table 3 row FSDP; local batch 2, seq 8192, per-op selective AC",
        "eager; the 128-rank collectives cross 16 hosts on 400 Gb/s RoCE", titan_norm=True),
    PublishedRun(
        "tt-8b-fsdp8-tp8", "Llama 3 8B, FSDP 8 x TP 8 (8 hosts), vanilla TP, bf16", "8b-8192", 8192, 96, (8, 8),
        ("dp", "tp"), "fsdp+tp", "selective", "h100-sxm-96gb-500w", 4378.0, _tt_step(4378.0, 96, 8192, 64), None,
        "not published",
        TT_ASYNC + " table 'Llama3 8b on 64 H100s', row None (bfloat16), Vanilla TP; local batch 12 per data-parallel"
        " rank (global 96), per-op SAC, seq 8192 from the llama3_8b.toml of that commit",
        "torch.compile was on (the 2024-12 table shows +16 % from compile on FSDP 8); sequence-parallel norms and"
        " loss parallel as torchtitan lays them out are priced only as the solver's free activations choose"),
    PublishedRun(
        "ap481-8b-dp16-tp8", "LLaMA-3 8B, dp 16 x tp 8 (16 hosts), torchtitan reference", "8b-8192", 8192, 32,
        (16, 8), ("dp", "tp"), "fsdp+tp", "selective", "h100-sxm-96gb-500w", 32 * 8192 / (128 * 0.3662), 0.3662,
        8.62, "max allocated (8.62 GiB; reserved 9.43 GiB)",
        AP_481 + ": min 366.2 ms (avg 414.1 ms); 32 layers, seq 8192, global batch 32",
        "the PR does not say the AC policy, compile or the GPU part (Meta H100 hosts on RoCE 400G, as its NCCL"
        " tables; the 96 GB 500 W profile is an ASSUMPTION); the step is the minimum of the run"),
)


GPU_README = "benchmarks/results/h100-2026-11-27/README.md"
LLAMA_1B_4L = ("examples.models.llama3:llama3_1b", {"n_layers": 4, "batch_size": 4, "seq_len": 2048})
MLP_4x16K = ("examples.models.mlp:small", {"dim": 4096, "hidden_dim": 16384, "n_layers": 4, "batch_size": 8192,
                                          "device": "meta"})


@dataclass(frozen=True, slots=True)
class OneGpuRun:
    """One step measured on one H100 and how it ran (``GPU_README``)."""

    key: str
    title: str
    model: tuple[str, dict]
    """``module:factory`` of ``examples.models`` and its keyword arguments (``dtype`` added)."""
    dtype: str
    optimizer: str
    optimizer_impl: str
    recompute: str
    step_s: float
    peak_bytes: float
    """``torch.cuda.max_memory_allocated`` over the timed steps."""
    reserved_bytes: float | None = None
    """``torch.cuda.max_memory_reserved``, where recorded."""
    note: str = ""


def _gpu_rows() -> tuple[OneGpuRun, ...]:
    """The README's tables: the four cases, then the steps by optimizer (GB = 1e9 bytes)."""
    rows = []
    by_optimizer = (
        ("llama-bf16", "LLaMA-1B-shaped, 4 layers, 4 x 2048, bf16", LLAMA_1B_4L, "bfloat16",
         {"none": (50.1, 10.68), "sgd": (51.0, 10.68), "foreach": (58.3, 12.71, 12.89), "fused": (53.3, 12.71),
          "for-loop": (56.7, 12.71)}),
        ("llama-fp32", "the same, fp32 (no TF32)", LLAMA_1B_4L, "float32",
         {"none": (538.0, 21.28), "foreach": (553.5, 25.33, 25.57), "fused": (544.5, 25.33)}),
        ("mlp-bf16", "MLP 4 x (4096 -> 16384 -> 4096), batch 8192, bf16", MLP_4x16K, "bfloat16",
         {"none": (38.4, 3.36), "sgd": (39.2, 3.36), "foreach": (50.9, 5.64, 6.87), "fused": (41.3, 5.50),
          "for-loop": (43.9, 5.50)}),
    )
    for key, title, model, dtype, table in by_optimizer:
        for how, figures in table.items():
            optimizer, impl = {"none": ("none", "auto"), "sgd": ("sgd", "foreach")}.get(how, ("adamw", how))
            label = {"none": "no optimizer", "sgd": "SGD (foreach)"}.get(how, f"AdamW {how}")
            note = "47.3 ms in another run" if (key, how) == ("mlp-bf16", "foreach") else ""
            rows.append(OneGpuRun(f"{key}-{how}", f"{title}; {label}", model, dtype, optimizer, impl, "none",
                                  figures[0] * 1e-3, figures[1] * 1e9, figures[2] * 1e9 if len(figures) > 2 else None,
                                  note))
    rows.append(OneGpuRun("llama-bf16-checkpoint", "LLaMA bf16, each layer in torch.utils.checkpoint; AdamW foreach",
                          LLAMA_1B_4L, "bfloat16", "adamw", "foreach", "full", 67.0e-3, 9.61e9,
                          note="priced as the recompute=\"full\" plan"))
    return tuple(rows)


ONE_GPU = _gpu_rows()


def price_one_gpu(run: OneGpuRun, traced=None) -> dict:
    """The estimate of one :data:`ONE_GPU` step on mesh (1,) with the shipped H100 profile."""
    from autoshard.search.solve import prepare, solve_prepared
    from autoshard.trace import trace_joint

    model, inputs = load(run.model[0], run.model[1], dtype=run.dtype)
    traced = traced or trace_joint(model, inputs, target_device="cuda")  # the kernels the H100 ran
    prep = prepare(model, inputs, (1,), ("dp",), profile="h100-sxm-80gb", optimizer=run.optimizer,
                   optimizer_impl=run.optimizer_impl, recompute="none" if run.recompute == "none" else "auto",
                   traced=traced)
    e = solve_prepared(prep, recompute=run.recompute, memory_limit=math.inf, time_limit=30).estimate
    return {"key": run.key, "step_s": e.step_s, "peak_bytes": e.peak_memory_bytes, "compute_s": e.compute_s,
            "recompute_s": e.recompute_s, "reserved_bytes": e.reserved_bytes}


def one_gpu_rows(runs: tuple[OneGpuRun, ...] = ONE_GPU) -> list[tuple[OneGpuRun, dict]]:
    """Every :data:`ONE_GPU` step priced in this process (one trace per model and dtype)."""
    from autoshard.trace import trace_joint

    traces: dict = {}
    out = []
    for run in runs:
        key = (run.model[0], run.dtype)
        if key not in traces:
            model, inputs = load(run.model[0], run.model[1], dtype=run.dtype)
            traces[key] = trace_joint(model, inputs, target_device="cuda")
        out.append((run, price_one_gpu(run, traces[key])))
    return out


def one_gpu_table(rows: list[tuple[OneGpuRun, dict]]) -> str:
    lines = ["| step | measured ms | estimate ms | error | measured peak GB | estimate peak GB | error "
             "| measured reserved GB | estimate reserved GB | error |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run, e in rows:
        note = f" ({run.note})" if run.note else ""
        est = e.get("reserved_bytes")
        reserved = (f"| {run.reserved_bytes / 1e9:.2f} | {est / 1e9:.2f} | {_pct(est, run.reserved_bytes)} |"
                    if run.reserved_bytes and est else f"| - | {est / 1e9:.2f} | - |" if est else "| - | - | - |")
        lines.append(f"| {run.key}: {run.title}{note} | {run.step_s * 1e3:.1f} | {e['step_s'] * 1e3:.1f} "
                     f"| {_pct(e['step_s'], run.step_s)} | {run.peak_bytes / 1e9:.2f} "
                     f"| {e['peak_bytes'] / 1e9:.2f} | {_pct(e['peak_bytes'], run.peak_bytes)} {reserved}")
    return "\n".join(lines)


class TitanRMSNorm(nn.Module):
    """torchtitan's RMSNorm as the 2024-12 runs ran it (torchtitan 9dec370 ``models/norms.py``,
    ``norm_type = "rmsnorm"``, no compile): ``x.float()``, ``pow``, ``mean``, ``rsqrt``, ``mul``,
    ``type_as``, ``* weight``, each its own kernel (and a backward of the same kind), where
    ``nn.RMSNorm`` traces for CUDA as one fused kernel. Takes over ``norm``'s weight (same name)."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.weight, self.eps = norm.weight, norm.eps if norm.eps is not None else 1e-6

    def forward(self, x):
        import torch

        y = x.float()
        return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def use_titan_norms(model: nn.Module) -> int:
    """Replace every ``nn.RMSNorm`` of ``model`` by a :class:`TitanRMSNorm` on its weight; how many."""
    count = 0
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.RMSNorm):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, TitanRMSNorm(module))
            count += 1
    return count


def _titan_forward(self, tokens, labels):
    """``examples.models.llama3.Llama.forward`` with torchtitan's loss: the logits are cast
    to fp32 before the cross entropy (torchtitan ``cross_entropy_loss``: ``pred.flatten(0, 1).float()``),
    so the loss and its gradient hold fp32 logits, as in the published runs."""
    import torch.nn.functional as F

    seq = tokens.shape[1]
    cos, sin = self.rope_cos[:seq], self.rope_sin[:seq]
    x = self.tok_embeddings(tokens)
    for layer in self.layers:
        x = layer(x, cos, sin)
    logits = F.linear(self.norm(x), self.output.weight)
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def run_one(run: PublishedRun, time_limit: float, baseline_only: bool = False) -> dict:
    """Price one published run (baseline and solved plan) in this process."""
    from autoshard.search.solve import prepare, solve_prepared
    from benchmarks.solve_time import build_llama

    t0 = time.perf_counter()
    cpu0 = time.process_time()
    model, inputs = build_llama(run.config, run.global_batch)
    model.forward = MethodType(_titan_forward, model)
    if run.titan_norm:
        use_titan_norms(model)
    row: dict = {"key": run.key}
    # the published layout runs FSDP2, which gathers a block's parameters with prefetch and
    # reduce-scatters a block's gradients in fp32 (torchtitan's mixed_precision_reduce)
    prep = prepare(model, inputs, run.mesh, run.dim_names, profile=run.profile, mixed_precision=True,
                   recompute="auto", gather="fsdp2", reduce_dtype="float32")
    base = solve_prepared(prep, baseline=run.baseline, recompute=run.recompute, memory_limit=1e30,
                          time_limit=time_limit, expandable_segments=run.expandable_segments)
    row["baseline"] = _estimate(base)
    row["headroom"] = prep.graph.profile.device.allocator_headroom
    if baseline_only:
        return row
    # the solved plan, priced as autoshard's runtime runs it (parameter copies per reader)
    prep = prepare(model, inputs, run.mesh, run.dim_names, profile=run.profile, mixed_precision=True,
                   recompute="auto", traced=prep.traced)
    try:
        plan = solve_prepared(prep, recompute="auto", time_limit=time_limit)
        row["plan"] = {**_estimate(plan), "portfolio": plan.options.get("portfolio"), "status": plan.solver.status,
                       "recompute_policy": plan.options.get("recompute")}
    except ValueError as exc:
        row["plan"] = {"error": str(exc).splitlines()[0][:200]}
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    row["cpu_s"] = round(time.process_time() - cpu0, 1)
    row["rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    return row


def _estimate(plan) -> dict:
    e = plan.estimate
    return {"step_s": e.step_s, "compute_s": e.compute_s, "comm_s": e.comm_s, "exposed_comm_s": e.exposed_comm_s,
            "recompute_s": e.recompute_s, "peak_gib": e.peak_memory_bytes / 2**30, "fits": e.fits,
            "recomputed": len(plan.recompute),
            "reserved_gib": None if e.reserved_bytes is None else e.reserved_bytes / 2**30}


def _pct(predicted: float, published: float) -> str:
    return f"{100 * (predicted - published) / published:+.1f} %"


def table(rows: list[tuple[PublishedRun, dict]]) -> str:
    head = ("| run | GPUs | global batch x seq | priced as | step s (published) | step s (predicted) "
            "| tokens/s/GPU (published) | tokens/s/GPU (predicted) | error | memory GiB (published) "
            "| peak GiB (predicted) | error | compute / exposed comm / recompute s |")
    lines = [head, "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for run, r in rows:
        for label, key in ((f"baseline {run.baseline}, {run.recompute} AC", "baseline"), ("solved plan", "plan")):
            e = r.get(key)
            if e is None and key == "plan" and "baseline" in r:  # --baseline-only
                continue
            if e is None or "error" in e or "error" in r:
                why = (e or {}).get("error") or r.get("error", "?")
                lines.append(f"| {run.key} | {run.gpus} | {run.global_batch} x {run.seq_len} | {label} | error: {why} |")
                continue
            tps = run.global_batch * run.seq_len / (e["step_s"] * run.gpus)
            if key == "plan":
                label += f" ({e['portfolio']} layout)" if e.get("portfolio") else ""
                label += f", {e['recomputed']} ops recomputed, {e['status']}"
            mem_pub = f"{run.memory_gib:.1f} ({run.memory_note})" if run.memory_gib is not None else "n/a"
            # a reserved figure is met by the allocator's replayed reservation (module docstring); the
            # flat headroom of the profile beside it
            flat = e["peak_gib"] * (1 + r.get("headroom", 0.0))
            predicted = e["peak_gib"]
            if run.memory_note == "max reserved":
                predicted = e["reserved_gib"] if e.get("reserved_gib") is not None else flat
            mem_err = _pct(predicted, run.memory_gib) if run.memory_gib is not None else "n/a"
            exposed = e["exposed_comm_s"] if e["exposed_comm_s"] is not None else e["comm_s"]
            lines.append(
                f"| {run.key} | {run.gpus} | {run.global_batch} x {run.seq_len} | {label} | {run.step_s:.3f} "
                f"| {e['step_s']:.3f} | {run.tokens_per_gpu_s:,.0f} | {tps:,.0f} | {_pct(tps, run.tokens_per_gpu_s)} "
                f"| {mem_pub} | {e['peak_gib']:.1f}"
                + (f" (reserved {predicted:.1f}; flat headroom {flat:.1f}, {_pct(flat, run.memory_gib)})"
                   if predicted != e["peak_gib"] else "") + f" | {mem_err} "
                f"| {e['compute_s']:.3f} / {exposed:.3f} / {e['recompute_s']:.3f} |")
    return "\n".join(lines)


def sources(runs: list[PublishedRun]) -> str:
    lines = ["| run | configuration | profile | source | what the prediction does not price |", "|---|---|---|---|---|"]
    for run in runs:
        mesh = " x ".join(f"{n} {m}" for n, m in zip(run.dim_names, run.mesh))
        lines.append(f"| {run.key} | {run.title}; mesh {mesh}; {run.baseline}, {run.recompute} AC | {run.profile} "
                     f"| {run.source} | {run.not_modeled} |")
    return "\n".join(lines)


def _child(key: str, time_limit: float, baseline_only: bool = False) -> dict:
    out = subprocess.run([sys.executable, "-m", "benchmarks.published_runs", "--child", key,
                          "--time-limit", str(time_limit)] + (["--baseline-only"] if baseline_only else []),
                         capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        return {"key": key, "error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--only", nargs="+", metavar="RUN", help="run keys: " + ", ".join(r.key for r in RUNS))
    parser.add_argument("--time-limit", type=float, default=30.0, help="solver seconds per plan (default 30)")
    parser.add_argument("-o", "--output", help="also write the tables (markdown) here")
    parser.add_argument("--one-gpu", action="store_true", help="the one-H100 steps (ONE_GPU) only")
    parser.add_argument("--baseline-only", action="store_true", help="price the published layouts only (no solve)")
    args = parser.parse_args(argv)
    import logging

    logging.basicConfig(level=logging.ERROR)
    if args.one_gpu:
        text = one_gpu_table(one_gpu_rows())
        print(text)
        if args.output:
            from solver.io import write_text_atomic

            write_text_atomic(args.output, text + "\n")
        return 0
    by_key = {r.key: r for r in RUNS}
    if args.child:
        print(json.dumps(run_one(by_key[args.child], args.time_limit, args.baseline_only)))
        return 0
    unknown = [k for k in args.only or () if k not in by_key]
    if unknown:
        print(f"error: --only: unknown run {unknown[0]!r} (known: {', '.join(by_key)})", file=sys.stderr)
        return 2
    runs = [by_key[k] for k in args.only] if args.only else list(RUNS)
    rows = []
    for run in runs:
        rows.append((run, _child(run.key, args.time_limit, args.baseline_only)))
        print(f"done {run.key}: {json.dumps(rows[-1][1])}", file=sys.stderr)
    text = table(rows) + "\n\n" + sources(runs)
    print(text)
    if args.output:
        from solver.io import write_text_atomic

        write_text_atomic(args.output, text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
