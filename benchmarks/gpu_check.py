"""autoshard on one GPU: what a person with one GPU runs to see it work there.

    python benchmarks/gpu_check.py prepare            # on any machine with the solver: plans -> benchmarks/gpu_plans/
    python benchmarks/gpu_check.py run -o gpu.md      # on the GPU machine (no solver needed), ~5 min on one H100
    python benchmarks/gpu_check.py run --smoke        # the same flows, tiny, on the CPU (checks this script)

``run`` has five parts, in this order (``--parts a,b,c,d,k``); the report is
rewritten after each, so a run stopped by a time limit keeps what it finished:

a. **one GPU, one NCCL process**: LLaMA-1B-shaped (4 layers, batch 4 x 2048)
   in bf16 and fp32, the MLP (4 x 4096 -> 16384 -> 4096, batch 8192) in bf16,
   and the bf16 LLaMA with ``recompute="full"`` (eager: every layer in
   ``torch.utils.checkpoint``): eager torch vs ``autoshard``: median step time
   (forward, backward, AdamW as torch runs it by default, ``zero_grad``) after
   warm-up, peak ``torch.cuda.max_memory_allocated()``, the first step's loss
   against eager's, the plan's estimate beside each, and the step audited by
   :class:`~autoshard.runtime.device_audit.DeviceAudit` (tensors off the GPU,
   CPU kernels, host synchronisations);
b. **4 ranks sharing the GPU with gloo** (CUDA tensors; NCCL refuses ranks that
   share a GPU): the tiny LLaMA on 2x2 with the FSDP+TP layout and the solved
   plan, and on mesh 4 with FSDP and full recomputation: the loss and every
   gradient equal one device, and the collectives issued equal the plan's steps
   (the runtime tests' checks, ``benchmarks/common/equivalence.py``);
c. ``autoshard calibrate-hardware --check`` of the shipped profile on the ops
   of a LLaMA-1B-shaped layer (bf16, 2 x 2048, traced for this device, attention
   included): the held-out set issue 40's targets name;
d. ``calibrate-hardware --quick`` of this GPU (one rank), the profile written
   beside the report (``--keep``), then checked on the same ops as c;
k. the bf16 cases of a again with ``compile=True`` (inductor: a minute each);
r. runtime_step's comparisons (``--parts r``, not in the default list; ~3 min):
   ``benchmarks/runtime_step.py``'s MLP and LLaMA on 4 gloo ranks sharing the GPU
   (meshes 2x2 and 4), autoshard's plans (solved, DDP, FSDP, TP, FSDP+TP layouts;
   shipped, priced with ``cpu-gloo``) stepped in turn beside torch DDP, FSDP2 and
   TP, then the DDP plan on a mesh of one beside eager: issue 41's ratios on CUDA
   tensors (gloo copies through the host, so absolute speed means little; the
   ratios of a layout to its torch twin and the one-rank row do);
m. memory (``--parts m``, not in the default list): the eager steps of a with the
   caching allocator's history recorded (``torch.cuda.memory._record_memory_history``),
   its alloc/free trace replayed by ``costmodel.allocator.replay_trace`` beside
   ``max_memory_reserved`` (does the replay's rule set reproduce torch's reservation
   from torch's own trace?) and written beside the report as JSON
   (``alloc-trace-<case>.json``: action, size, stream per event) for comparing the
   plan's replay (``estimate.reserved_bytes``) with it offline.

The plans are solved beforehand (``prepare``) and shipped in
``benchmarks/gpu_plans/``: a GPU image may lack the solver's packages (pulp,
ortools). Their fingerprints hold the graph, which is the same on torch 2.11 and
2.13 for these models (checked), and the profile: re-run ``prepare`` after a
profile changes. On a GPU without a shipped profile of its own (an H200) the
plans' estimates are the H100's; part d measures the card itself.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/gpu_check.py`: re-executed as the module

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

from benchmarks import runtime_step as rs
from benchmarks.common.gloo import rank_group, spawn
from benchmarks.common.models import load
from benchmarks.common.timing import StepRun, device_sync, load_average, time_rounds, train_step

ROOT = Path(__file__).resolve().parents[1]
PLANS = ROOT / "benchmarks" / "gpu_plans"
PROFILE = "h100-sxm-80gb"
ONE_GPU = {  # case -> (model, its overrides, recompute)
    "llama1b-bf16": ("llama3.llama3_1b", {"n_layers": 4, "batch_size": 4, "seq_len": 2048, "dtype": "bfloat16"},
                     "none"),
    "llama1b-fp32": ("llama3.llama3_1b", {"n_layers": 4, "batch_size": 4, "seq_len": 2048}, "none"),
    "mlp-bf16": ("mlp.small", {"dim": 4096, "hidden_dim": 16384, "n_layers": 4, "batch_size": 8192,
                               "dtype": "bfloat16"}, "none"),
    "llama1b-bf16-recompute": ("llama3.llama3_1b", {"n_layers": 4, "batch_size": 4, "seq_len": 2048,
                                                    "dtype": "bfloat16"}, "full"),
}
SMOKE = {"llama-tiny": ("llama3.tiny", {}, "none"), "mlp-tiny": ("mlp.tiny", {}, "none"),
         "llama-tiny-recompute": ("llama3.tiny", {}, "full")}
COMPILED = ("llama1b-bf16", "mlp-bf16", "llama-tiny")
"""Cases also run with ``compile=True`` in part k (the targets name the bf16 ones; inductor takes a minute each)."""
HELD_OUT = ("examples.models.llama3:llama3_1b",
            {"n_layers": 1, "batch_size": 2, "seq_len": 2048, "dtype": "bfloat16"})
"""The held-out ops of parts c and d: issue 40's "LLaMA-1B-shaped ops" (the smoke keeps the default tiny model)."""
TINY_KW = {"batch_size": 4}
SHARED_GPU = {  # label -> (mesh, dim names, baseline or None, recompute)
    "llama-2x2-fsdp+tp": ((2, 2), ("dp", "tp"), "fsdp+tp", "none"),
    "llama-2x2-solved": ((2, 2), ("dp", "tp"), None, "auto"),
    "llama-4-fsdp-recompute": ((4,), ("dp",), "fsdp", "full"),
}


# --------------------------------------------------------------------------- prepare (CPU, solver)

def prepare_plans(smoke: bool = False) -> list[Path]:
    """Solve every plan ``run`` needs and write them under ``benchmarks/gpu_plans/``."""
    from autoshard.search.solve import prepare, solve_prepared

    written = []
    PLANS.mkdir(exist_ok=True)
    for name, (factory, kwargs, recompute) in (SMOKE if smoke else ONE_GPU).items():
        model, inputs = load(factory, kwargs, device="meta")
        prep = prepare(model, inputs, (1,), ("dp",), profile="cpu-gloo" if smoke else PROFILE, recompute=recompute)
        written.append(_save(solve_prepared(prep, recompute=recompute, time_limit=60), name, smoke))
    for label, (mesh, dims, baseline, recompute) in SHARED_GPU.items():
        model, inputs = load("llama3.tiny", TINY_KW, device="meta")
        prep = prepare(model, inputs, mesh, dims, profile="cpu-gloo", device_type="cpu" if smoke else "cuda",
                       recompute="none" if recompute == "none" else "auto")
        written.append(_save(solve_prepared(prep, baseline=baseline, recompute=recompute, time_limit=60), label,
                             smoke))
    return written + prepare_runtime_step_plans(smoke)


RUNTIME_STEP = {"models": ["mlp", "llama3"], "meshes": ["2x2", "4"]}
"""Part r: runtime_step's models and meshes (its plans shipped as ``rs-<model>-<mesh>-<kind>.json``)."""


def prepare_runtime_step_plans(smoke: bool) -> list[Path]:
    """runtime_step's plans (every layout, and the DDP plan on a mesh of one) traced for CUDA (the CPU for
    the smoke), priced with ``cpu-gloo`` and fused AdamW as part r steps them, with an index of what
    runtime_step reports beside each (prediction, collectives, peak)."""
    written, index = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        plans = rs.make_plans(RUNTIME_STEP["models"], RUNTIME_STEP["meshes"], Path(tmp), 8.0,
                              optimizer_impl="fused", device_type="cpu" if smoke else "cuda")
        plans.update(rs.make_plans(RUNTIME_STEP["models"], ["1"], Path(tmp), 8.0, kinds=("ddp",),
                                   optimizer_impl="fused", device_type="cpu" if smoke else "cuda"))
        for (mk, mesh_key, kind), info in plans.items():
            path = _plan_path(f"rs-{mk}-{mesh_key}-{kind}", smoke)
            path.write_bytes(Path(info["path"]).read_bytes())
            written.append(path)
            index[f"{mk}|{mesh_key}|{kind}"] = {k: v for k, v in info.items() if k != "path"}
    index_path = _plan_path("rs-index", smoke)
    index_path.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    return [*written, index_path]


def runtime_step_compare(device: torch.device, smoke: bool, tmp: Path, steps: int, warmup: int
                         ) -> list[dict[str, Any]]:
    """Part r: runtime_step's variants on 4 gloo ranks on ``device``, then one rank vs eager (module docstring).
    One row per (model, mesh) with issue 41's ratios; runtime_step's whole report in the row's ``report``."""
    index = json.loads(_plan_path("rs-index", smoke).read_text())
    plans = {tuple(key.split("|")): {**info, "path": str(_plan_path(f"rs-{key.replace('|', '-')}", smoke))}
             for key, info in index.items()}
    models, meshes = RUNTIME_STEP["models"], RUNTIME_STEP["meshes"]
    tmp.mkdir(parents=True, exist_ok=True)
    start, load_before = time.perf_counter(), load_average()
    measured, one = rs.measure_all(plans, models, meshes, tmp, steps=steps, warmup=warmup, opt_kind="fused",
                                   compile_=False, device=device.type)
    args = argparse.Namespace(steps=steps, warmup=warmup, optimizer="fused")
    report = rs._report(args, ["(gpu_check part r)"], models, meshes, plans, measured, one, 0.0,
                        time.perf_counter() - start, load_before, load_average(),
                        f"Plans shipped in benchmarks/gpu_plans (rs-*), priced with {rs.PROFILE}; ranks on {device}.")
    rows = []
    for mk in models:
        for mesh_key in meshes:
            get = lambda name: measured.get((mk, mesh_key, name), (float("nan"),) * 2)  # noqa: E731
            fastest, fastest_s = min(((n, get(n)[0]) for n in rs.HANDWRITTEN), key=lambda t: t[1])
            rows.append({"case": f"{mk} {mesh_key}", "as-ddp / torch-ddp": round(get("as-ddp")[0] / get("torch-ddp")[0], 3),
                         "as-fsdp / torch-fsdp2": round(get("as-fsdp")[0] / get("torch-fsdp2")[0], 3),
                         "solved / fastest": f"{get('as-solved')[0] / fastest_s:.3f} ({fastest})",
                         "solved ms": round(get("as-solved")[0] * 1e3, 2)})
    for mk in models:
        e, a = one[mk]["eager"], one[mk]["autoshard"]
        rows.append({"case": f"{mk} one rank", "autoshard / eager": round(a[0] / e[0], 3),
                     "eager ms": round(e[0] * 1e3, 2)})
    rows[0]["report"] = "\n".join(report)
    rows[0]["command"] = "runtime_step's full report (part r)"
    return rows


def _plan_path(name: str, smoke: bool) -> Path:
    return PLANS / f"{'smoke-' if smoke else ''}{name}.json"


def _save(plan: Any, name: str, smoke: bool) -> Path:
    path = _plan_path(name, smoke)
    plan.save(path)
    print(f"{path.relative_to(ROOT)}: {plan.solver.status}, estimate {plan.estimate.step_s * 1e3:.2f} ms, "
          f"{plan.estimate.peak_memory_bytes / 1e9:.2f} GB")
    return path


# --------------------------------------------------------------------------- part a: one GPU


class _Checkpointed(torch.nn.Module):
    """A layer whose activations are recomputed in the backward (eager's ``recompute="full"``)."""

    def __init__(self, layer: torch.nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, *args: Any) -> Any:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.layer, *args, use_reentrant=False)


def _build(factory: str, kwargs: dict, device: torch.device) -> tuple[torch.nn.Module, Any]:
    torch.manual_seed(0)
    model, inputs = load(factory, kwargs, device=str(device))
    return model, tuple(x.to(device) for x in inputs)


def _time_steps(step: Callable[[], StepRun], device: torch.device, warmup: int, steps: int
                ) -> tuple[float, float, int]:
    """(first loss, median step seconds, peak bytes over the timed steps)."""
    first = float(step().loss)

    def reset_peak() -> None:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    timed = time_rounds({"step": step}, rounds=steps, warmup=warmup - 1, before_timed=reset_peak)["step"]
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    return first, timed.step_s, peak


def _train_step(module: torch.nn.Module, inputs: Any, device: torch.device) -> Callable[[], StepRun]:
    opt = torch.optim.AdamW(module.parameters(), lr=1e-4)  # torch's default implementation (foreach on GPUs)
    return train_step(module, inputs, opt, sync=device_sync(device))


def allocator_traces(cases: dict, device: torch.device, keep: Path, warmup: int) -> list[dict[str, Any]]:
    """Part m: each case's eager steps (model built, ``warmup`` + 1 steps) with the allocator's history
    recorded, replayed by ``costmodel.allocator.replay_trace``, beside what torch reserved."""
    from costmodel.allocator import replay_trace

    if device.type != "cuda":
        return [{"case": "-", "skipped": "needs CUDA (the caching allocator's trace)"}]
    rows = []
    for name, (factory, kwargs, recompute) in cases.items():
        if recompute != "none":
            continue
        _free(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_reserved(device)
        torch.cuda.memory._record_memory_history(max_entries=2_000_000)
        try:
            model, inputs = _build(factory, kwargs, device)
            step = _train_step(model, inputs, device)
            for _ in range(warmup + 1):
                step()
            snapshot = torch.cuda.memory._snapshot()
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        reserved = torch.cuda.max_memory_reserved(device) - before
        allocated = torch.cuda.max_memory_allocated(device)
        trace = [(e["action"], int(e["addr"]), int(e["size"]), int(e.get("stream", 0)))
                 for e in snapshot["device_traces"][device.index or 0]]
        peaks = replay_trace(trace)
        (keep / f"alloc-trace-{name}.json").write_text(json.dumps(
            {"case": name, "max_memory_reserved": reserved, "max_memory_allocated": allocated,
             "events": [[a, size, stream] for a, _, size, stream in trace if a in ("alloc", "free_completed")]}))
        rows.append({"case": name, "events": len(trace), "reserved GB": round(reserved / 1e9, 3),
                     "replayed GB": round(peaks.reserved_bytes / 1e9, 3),
                     "error": f"{100 * (peaks.reserved_bytes - reserved) / reserved:+.1f} %" if reserved else "-",
                     "allocated GB": round(allocated / 1e9, 3), "replayed allocated GB":
                     round(peaks.allocated_bytes / 1e9, 3)})
        del model, inputs, step
        _free(device)
    return rows


def _free(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def one_gpu_case(name: str, factory: Callable[..., Any], kwargs: dict, recompute: str, device: torch.device, *,
                 smoke: bool, warmup: int, steps: int, compiled: bool = False,
                 eager: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Eager (unless ``eager`` holds its row already) and autoshard, compiled or not: one row each."""
    from torch.distributed.device_mesh import init_device_mesh

    from autoshard import autoshard
    from autoshard.plan.format import Plan
    from autoshard.runtime.device_audit import DeviceAudit

    path = _plan_path(name, smoke)
    plan = Plan.load(path)
    rows = []
    if eager is None:
        model, inputs = _build(factory, kwargs, device)
        if recompute == "full":
            model.layers = torch.nn.ModuleList(_Checkpointed(layer) for layer in model.layers)
        eager_loss, eager_s, eager_peak = _time_steps(_train_step(model, inputs, device), device, warmup, steps)
        eager = {"case": name, "variant": "eager", "step_ms": eager_s * 1e3, "peak_GB": eager_peak / 1e9,
                 "loss": eager_loss}
        rows.append(eager)
        del model
        _free(device)
    mesh = init_device_mesh(device.type, (1,), mesh_dim_names=("dp",))
    model, inputs = _build(factory, kwargs, device)
    sharded = autoshard(model, mesh, inputs, plan=path, profile=plan.fingerprint.profile.split("@")[0],
                        cache_dir=False, compile=compiled)
    step = _train_step(sharded, inputs, device)
    loss, seconds, peak = _time_steps(step, device, warmup, steps)
    with DeviceAudit(device) as audit:  # a step of the per-rank program as it now runs
        step()
    est = plan.estimate
    eager_s, eager_peak, eager_loss = eager["step_ms"] / 1e3, eager["peak_GB"] * 1e9, eager["loss"]
    rows.append({"case": name, "variant": "autoshard" + (" compile" if compiled else ""),
                 "step_ms": seconds * 1e3, "peak_GB": peak / 1e9, "loss": loss,
                 "vs_eager": seconds / eager_s, "peak_vs_eager": (peak / eager_peak) if eager_peak else None,
                 "loss_equal": abs(loss - eager_loss) <= 2e-2 * max(1.0, abs(eager_loss)),
                 "estimate_ms": est.step_s * 1e3, "estimate_GB": est.peak_memory_bytes / 1e9,
                 "audit": "; ".join(sorted(set(audit.problems))) or "clean"})
    del sharded, model, step
    _free(device)
    return rows


# --------------------------------------------------------------------------- part b: 4 ranks, one GPU


def shared_gpu_ranks(device: str, smoke: bool, tmp: Path) -> list[dict[str, Any]]:
    """The tiny LLaMA on 4 gloo ranks sharing ``device``: one row per plan."""
    from autoshard.plan.format import Plan
    from benchmarks.common.equivalence import assert_matches_one_device, equivalence, planned_collectives_issued

    meshes: dict[tuple, list[dict]] = {}
    for label, (mesh, dims, _, _) in SHARED_GPU.items():
        job = {"label": label, "factory": "llama3.tiny", "plan": str(_plan_path(label, smoke)), "kwargs": TINY_KW}
        meshes.setdefault((mesh, dims), []).append(job)
    results = spawn(4, equivalence, (list(meshes.items()), None, False, device), tmp, timeout=240)
    rows = []
    for label in SHARED_GPU:
        row: dict[str, Any] = {"case": label}
        for check, fn in (("loss and gradients equal one device", lambda: assert_matches_one_device(results, label)),
                          ("collectives are the plan's steps", lambda: planned_collectives_issued(
                              Plan.load(_plan_path(label, smoke)), results, label))):
            try:
                fn()
                row[check] = "yes"
            except AssertionError as exc:
                row[check] = f"NO: {' '.join(str(exc).split())[:200]}"
        row["collectives per rank"] = len(results[0][label]["trace"])
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- parts c, d: calibration

_DIST_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def _calibrate(args: list[str], timeout: float) -> tuple[int, str]:
    """``autoshard calibrate-hardware ARGS`` in a fresh process: (exit code, the output's last lines)."""
    # a launcher's MASTER_PORT and WORLD_SIZE (torchrun's) seen by the child would make it join that job
    env = {k: v for k, v in os.environ.items() if k not in _DIST_ENV}
    cmd = [sys.executable, "-m", "autoshard.cli", "calibrate-hardware", *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired as exc:
        return 124, f"timed out after {timeout:.0f} s: {' '.join(str(exc.stdout or '').split()[-40:])}"
    return done.returncode, " / ".join((done.stdout + done.stderr).strip().splitlines()[-6:])


def _held_out(smoke: bool) -> list[str]:
    return [] if smoke else ["--model", HELD_OUT[0], "--model-kwargs", json.dumps(HELD_OUT[1])]


def calibration_check(profile: str, keep: Path, smoke: bool, timeout: float) -> list[dict[str, Any]]:
    """``calibrate-hardware --check PROFILE`` (one rank) on the held-out ops."""
    report = keep / f"check-{Path(profile).stem}.md"
    args = ["--check", profile, "--nproc-per-node", "1", "--report", str(report), *_held_out(smoke)]
    code, tail = _calibrate(args, timeout)
    return [{"command": "calibrate-hardware " + " ".join(args), "exit": code, "output": tail,
             "report": report.read_text() if report.exists() else ""}]


def calibration_quick(keep: Path, smoke: bool, timeout: float) -> list[dict[str, Any]]:
    """``calibrate-hardware --quick`` of this device (one rank), then its check on the held-out ops."""
    profile = keep / ("measured-cpu.json" if smoke else "measured-1rank.json")
    args = ["--quick", "--nproc-per-node", "1", "-o", str(profile), "--measurements",
            str(keep / f"{profile.stem}-measurements.json"), "--report", str(keep / f"{profile.stem}-fit.md")]
    if not smoke:
        args += ["--base", PROFILE]
    code, tail = _calibrate(args, timeout)
    fit = keep / f"{profile.stem}-fit.md"
    rows = [{"command": "calibrate-hardware " + " ".join(args), "exit": code, "output": tail,
             "report": fit.read_text() if fit.exists() else ""}]
    if code == 0:
        rows += calibration_check(str(profile), keep, smoke, timeout)
    return rows


# --------------------------------------------------------------------------- report


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no rows)\n"
    keys = list(dict.fromkeys(k for r in rows for k in r if k != "report"))

    def cell(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(cell(r.get(k, "")) for k in keys) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _device_profile(cuda: bool) -> str:
    """The shipped profile whose estimates part a compares with (the plans were priced with it)."""
    if not cuda:
        return "cpu-gloo"
    name = torch.cuda.get_device_name(0)
    if "H100" not in name:
        log(f"{name}: no shipped profile of its own; the estimates are {PROFILE}'s (part d measures this card)")
    return PROFILE


def log(text: str) -> None:
    print(text, flush=True)


def run(args: argparse.Namespace) -> int:

    if args.smoke and not all(_plan_path(n, True).exists() for n in [*SMOKE, *SHARED_GPU]):
        prepare_plans(smoke=True)  # the smoke's plans are made here, not shipped (they follow cpu-gloo)
    cuda = torch.cuda.is_available() and not args.smoke
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    profile = _device_profile(cuda)
    out = [f"# gpu_check: {torch.cuda.get_device_name(0) if cuda else 'CPU (smoke)'}, torch {torch.__version__}, "
           f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC\n"]
    failed = False
    cases = SMOKE if args.smoke else ONE_GPU
    eager_rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as one_rank:
        keep = Path(args.keep) if args.keep else Path(args.output).resolve().parent if args.output else Path(tmp)
        keep.mkdir(parents=True, exist_ok=True)
        for part in args.parts.split(","):
            start = time.perf_counter()
            try:
                if part in ("a", "k") and not torch.distributed.is_initialized():  # this process, a group of one
                    one_rank.enter_context(rank_group(0, 1, Path(tmp) / "one-rank-store", backend="nccl" if cuda
                                                      else "gloo", device=device.type, threads=None))
                if part == "a":
                    rows = []
                    for name, (f, kw, rc) in cases.items():
                        case_rows = one_gpu_case(name, f, kw, rc, device, smoke=args.smoke, warmup=args.warmup,
                                                 steps=args.steps)
                        eager_rows[name] = case_rows[0]
                        rows += case_rows
                    failed |= any(r.get("loss_equal") is False or r.get("audit", "clean") != "clean" for r in rows)
                    title = "a. one GPU, one NCCL process: eager vs autoshard"
                elif part == "b":
                    rows = shared_gpu_ranks(device.type, args.smoke, Path(tmp) / "b")
                    failed |= any(str(v).startswith("NO") for r in rows for v in r.values())
                    title = "b. 4 gloo ranks sharing the device"
                elif part == "c":
                    rows = calibration_check(profile, keep, args.smoke, timeout=240)
                    failed |= rows[0]["exit"] != 0
                    title = f"c. calibrate-hardware --check of the shipped {profile}"
                elif part == "d":
                    rows = calibration_quick(keep, args.smoke, timeout=240)
                    failed |= any(r["exit"] != 0 for r in rows)
                    title = "d. calibrate-hardware --quick of this device, then --check of what it wrote"
                elif part == "r":
                    if args.smoke and not _plan_path("rs-index", True).exists():
                        prepare_runtime_step_plans(smoke=True)
                    rows = runtime_step_compare(device, args.smoke, Path(tmp) / "r", args.steps, args.warmup)
                    title = "r. runtime_step's layouts vs torch DDP / FSDP2 / TP, 4 gloo ranks sharing the device"
                elif part == "m":
                    rows = allocator_traces(cases, device, keep, args.warmup)
                    title = "m. the caching allocator's own trace, replayed"
                elif part == "k":
                    rows = [r for name, (f, kw, rc) in cases.items() if name in COMPILED
                            for r in one_gpu_case(name, f, kw, rc, device, smoke=args.smoke, warmup=args.warmup,
                                                  steps=args.steps, compiled=True, eager=eager_rows.get(name))]
                    failed |= any(r.get("loss_equal") is False or r.get("audit", "clean") != "clean" for r in rows)
                    title = "k. one GPU: autoshard with compile=True"
                else:
                    raise ValueError(f"--parts: unknown part {part!r} (a, b, c, d, k, m, r)")
            except Exception as exc:  # noqa: BLE001 - one part failing must not hide the others
                failed = True
                rows, title = [{"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"}], f"{part}. FAILED"
                traceback.print_exc()
            out.append(f"\n## {title} ({time.perf_counter() - start:.0f} s)\n\n{_table(rows)}")
            for row in rows:
                if row.get("report"):
                    out.append(f"\n<details><summary>{row['command'][:80]}</summary>\n\n{row['report']}\n</details>\n")
            log("".join(out[-1:]))
            if args.output:  # after every part: a run stopped by its time limit keeps what it finished
                Path(args.output).write_text("".join(out))
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="solve the plans run needs (needs the solver)")
    p.add_argument("--smoke", action="store_true", help="the tiny CPU plans of run --smoke")
    r = sub.add_parser("run", help="the checks (on the GPU machine)")
    r.add_argument("--parts", default="a,b,c,d,k")
    r.add_argument("--smoke", action="store_true", help="tiny models on the CPU, gloo (checks this script)")
    r.add_argument("--warmup", type=int, default=3)
    r.add_argument("--steps", type=int, default=5)
    r.add_argument("-o", "--output")
    r.add_argument("--keep", help="folder for part d's profile and the check reports (default: the report's folder)")
    args = parser.parse_args()
    if args.command == "prepare":
        prepare_plans(smoke=args.smoke)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
