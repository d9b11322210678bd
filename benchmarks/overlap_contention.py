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

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

# (matmul size n, matmuls per trial, all_reduce elements)
SIZES = [(256, 12, 1 << 20), (384, 6, 1 << 21), (256, 24, 1 << 21), (512, 4, 1 << 22)]


def _worker(rank: int, world: int, init: str, out: str, trials: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
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

        rows = {"C": [], "D": [], "B": []}
        for trial in range(trials + 2):
            for key, fn in (("C", compute), ("D", comm_alone), ("B", both)):
                dist.barrier()
                t = time.perf_counter()
                fn()
                elapsed = torch.tensor([time.perf_counter() - t])
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                if trial >= 2:
                    rows[key].append(float(elapsed))
        results.append((n, reps, numel, {k: statistics.median(v) for k, v in rows.items()}))
    if rank == 0:
        torch.save(results, os.path.join(out, "result.pt"))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--trials", type=int, default=7)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_worker, args=(args.ranks, str(Path(tmp) / "store"), tmp, args.trials),
                           nprocs=args.ranks, start_method="spawn")
        results = torch.load(Path(tmp) / "result.pt", weights_only=False)
    load = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else ["?"]
    print(f"## Overlap contention, {args.ranks} gloo ranks x 1 thread on {os.cpu_count()} cores; "
          f"load average before/after: {' '.join(load)}\n")
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
