"""A training step against the sum of its own ops timed alone: is there a cost of a step
that the per-op prices miss? (CPU/gloo, every rank at once.)

On ``--ranks`` gloo ranks (one thread each), each rank runs forward+backward of the
benchmark model (``benchmarks/runtime_step.py``'s MLP or LLaMA) on its shard of the
batch, with no communication inside the step. Then, on the same ranks and in the
same minute, each aten op of that step (recorded by a ``TorchDispatchMode``) is timed
alone as the calibration times ops (``autoshard.calibrate.timing.measure``: all ranks
at once, in lockstep, trials of >= 10 ms). Steps are timed before and after (median of
7, each the slowest rank's, ``benchmarks.common.timing.time_rounds``). Printed: the steps, the sum of the ops
alone, step / sum, the minor page faults per step, the bytes of the step's op
outputs above a few sizes, rank 0's main-thread CPU in a step against the CPU its ops
take alone (every rank looping over each op at once), and the ops alone by aten op.

``--keep-memory`` starts the ranks with glibc told to keep its memory
(``MALLOC_MMAP_THRESHOLD_=32 MiB``, ``MALLOC_TRIM_THRESHOLD_`` and ``MALLOC_TOP_PAD_``
large: no allocation is returned to the system, so none is faulted in again):
what is left of the excess is not the allocator's.

    python benchmarks/step_vs_ops.py --model mlp
    python benchmarks/step_vs_ops.py --model llama3 --keep-memory

Findings: ``benchmarks/results/profile_correction.md``; the CPU comparison (a step's ops cost
1.8-2.7x their CPU alone, ~95 us per MiB they touch): ``benchmarks/results/calibration.md``.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/step_vs_ops.py`: re-executed as the module

import argparse
import os
import resource
import time
import tempfile
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks import runtime_step as rs
from benchmarks.common.gloo import spawn
from benchmarks.common.timing import load_average, time_rounds

KEEP_MEMORY = {"MALLOC_MMAP_THRESHOLD_": str(2**25), "MALLOC_TRIM_THRESHOLD_": str(2**34), "MALLOC_TOP_PAD_": str(2**30)}
VIEWS = ("view", "t.default", "transpose", "expand", "alias", "permute", "_unsafe_view", "detach")


class Recorder(TorchDispatchMode):
    """Every aten call of a step, with its arguments, and the bytes of the outputs it allocates."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list = []
        self.out_bytes: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.append((func, args, kwargs or {}))
        if not any(v in str(func) for v in VIEWS):
            outs = out if isinstance(out, (tuple, list)) else [out]
            self.out_bytes += [o.untyped_storage().nbytes() for o in outs if isinstance(o, torch.Tensor)]
        return out


def _worker(rank: int, world: int, model_key: str) -> dict | None:
    from autoshard.calibrate.timing import Job, Settings, measure

    job = Job(rank=rank, world=world, local_world=world, backend="gloo")
    model, inputs = rs._example(model_key)
    inputs = tuple(x.chunk(world, 0)[rank] for x in inputs)  # a data-parallel shard, no communication

    def step() -> None:
        model(*inputs).backward()
        for p in model.parameters():
            p.grad = None

    def steps(n: int) -> tuple[float, float]:
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        seconds = time_rounds({"step": step}, rounds=n, warmup=0)["step"].step_s
        return seconds, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / n

    for _ in range(3):
        step()
    rec = Recorder()
    with rec:
        step()
    before, faults = steps(7)
    settings = Settings(warmup=1, trials=3, min_trial_s=0.01)
    alone = [measure(job, lambda f=f, a=a, k=k: f(*a, **k), settings).seconds for f, a, k in rec.ops]
    after, _ = steps(7)
    cpu_alone = []  # this rank's own CPU per call of each op, every rank looping at once
    for f, a, k in rec.ops:
        f(*a, **k)
        c, reps = time.thread_time(), 0
        w = time.perf_counter()
        while time.perf_counter() - w < 0.005:
            f(*a, **k)
            reps += 1
        cpu_alone.append((time.thread_time() - c) / reps)
    c, w = time.thread_time(), time.perf_counter()
    for _ in range(7):
        step()
    step_cpu, step_wall = (time.thread_time() - c) / 7, (time.perf_counter() - w) / 7
    if rank != 0:
        return None
    above = {a: sum(b for b in rec.out_bytes if b >= a) for a in (2**17, 2**20, 2**22, 2**25)}
    by_op: dict[str, list[float]] = {}
    for (f, _, _), t in zip(rec.ops, alone):
        by_op.setdefault(str(f), [0, 0.0])
        by_op[str(f)][0] += 1
        by_op[str(f)][1] += t
    return {"before": before, "after": after, "alone": sum(alone), "ops": len(rec.ops), "faults": faults,
            "above": above, "by_op": by_op, "cpu_alone": sum(cpu_alone), "step_cpu": step_cpu, "step_wall": step_wall}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("mlp", "llama3"), default="mlp")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--keep-memory", action="store_true", help="glibc keeps its memory (no page faults)")
    args = parser.parse_args(argv)
    if args.keep_memory:
        os.environ.update(KEEP_MEMORY)  # the spawned ranks inherit it
    load = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        d = spawn(args.ranks, _worker, (args.model,), Path(tmp), timeout=None, collective_timeout_s=900)[0]
    step = (d["before"] + d["after"]) / 2
    print(f"{args.model}, {args.ranks} ranks{' (glibc keeps its memory)' if args.keep_memory else ''}; load "
          f"{load} before, {load_average()} after")
    print(f"  step {d['before'] * 1e3:.1f} / {d['after'] * 1e3:.1f} ms (before / after), its {d['ops']} ops alone "
          f"{d['alone'] * 1e3:.1f} ms: step / ops alone {step / d['alone']:.2f}, "
          f"excess per op {(step - d['alone']) / d['ops'] * 1e6:.0f} us")
    print(f"  minor page faults per step {d['faults']:.0f} ({d['faults'] * 4096 / 2**20:.1f} MiB); op outputs per step "
          + ", ".join(f">= {k // 1024} KiB: {v / 2**20:.1f} MiB" for k, v in ((int(k), v) for k, v in d["above"].items())))
    print(f"  rank 0 CPU: step {d['step_cpu'] * 1e3:.1f} ms (wall {d['step_wall'] * 1e3:.1f}), its ops alone "
          f"{d['cpu_alone'] * 1e3:.1f} ms: in-step / alone {d['step_cpu'] / d['cpu_alone']:.2f}")
    top = sorted(d["by_op"].items(), key=lambda kv: -kv[1][1])[:12]
    print("  ops alone by aten op (calls, ms): " + "; ".join(f"{k} {n} {t * 1e3:.2f}" for k, (n, t) in top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
