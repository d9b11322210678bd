"""Measure how much a collective in flight slows the compute beside it (the
profile's ``overlap.contention``, ``costmodel.overlap``), on CPU/gloo ranks.

Every rank (``--ranks`` gloo processes on loopback, one compute thread each)
times, after a barrier, for several (compute, message) sizes:

* ``C``: a loop of fp32 matmuls alone;
* ``D``: one all_reduce alone, issued asynchronously (``_c10d_functional``, as
  the runtime issues it: gloo runs it on its own thread) and waited;
* ``B``: the all_reduce issued, the same matmuls, then the wait.

Under the two-stream model both streams advance at rate ``1 / (1 + kappa)``
while both are busy, so ``B = max(C, D) + kappa * min(C, D)`` and

    kappa = (B - max(C, D)) / min(C, D)      (clipped to [0, 1]).

The table gives the medians over ``--trials`` (max over ranks per trial) and
kappa per size; the last line the median kappa, the value to put in the
profile. Pairs are chosen so that ``C`` and ``D`` are of the same order (the
estimate is most sensitive there).

    python benchmarks/overlap_contention.py            # 4 ranks, ~1 min on 2 cores
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/overlap_contention.py`: re-executed as the module

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from benchmarks.common.gloo import spawn
from benchmarks.common.timing import load_average, time_rounds

# (matmul size n, matmuls per trial, all_reduce elements)
SIZES = [(256, 12, 1 << 20), (384, 6, 1 << 21), (256, 24, 1 << 21), (512, 4, 1 << 22)]


def _worker(rank: int, world: int, trials: int) -> list:
    from torch.distributed import _functional_collectives  # noqa: F401 - registers _c10d_functional

    group = dist.group.WORLD.group_name
    results = []
    for n, reps, numel in SIZES:
        a, b = torch.randn(n, n), torch.randn(n, n)
        x = torch.randn(numel)

        def compute() -> None:
            for _ in range(reps):
                torch.mm(a, b)

        def comm_alone() -> None:
            torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_reduce(x, "sum", group))

        def both() -> None:
            y = torch.ops._c10d_functional.all_reduce(x, "sum", group)
            compute()
            torch.ops._c10d_functional.wait_tensor(y)

        times = time_rounds({"C": compute, "D": comm_alone, "B": both}, rounds=trials, warmup=2)
        results.append((n, reps, numel, {k: t.step_s for k, t in times.items()}))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--trials", type=int, default=7)
    args = parser.parse_args(argv)
    load_before = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        results = spawn(args.ranks, _worker, (args.trials,), Path(tmp), timeout=None, collective_timeout_s=120)[0]
    print(f"## Overlap contention, {args.ranks} gloo ranks x 1 thread on {os.cpu_count()} cores; "
          f"load average (1, 5, 15 min) before {load_before}, after {load_average()}\n")
    print("| matmul n x reps | all_reduce MiB | C ms | D ms | B ms | kappa |")
    print("|---|---:|---:|---:|---:|---:|")
    kappas = []
    for n, reps, numel, m in results:
        c, d, b = m["C"], m["D"], m["B"]
        kappa = min(1.0, max(0.0, (b - max(c, d)) / min(c, d)))
        kappas.append(kappa)
        print(f"| {n} x {reps} | {numel * 4 / 2**20:.0f} | {c * 1e3:.1f} | {d * 1e3:.1f} | {b * 1e3:.1f} | {kappa:.2f} |")
    print(f"\nmedian kappa: {statistics.median(kappas):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
