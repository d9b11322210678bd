"""The overlap contention a calibration measures itself: how much a collective
in flight slows the compute beside it (the profile's ``overlap.contention``,
``costmodel.overlap``).

Every rank times, on every rank at once (``autoshard.calibrate.timing.measure``:
after a barrier, max over ranks, median over trials), for a few
(compute, message) pairs chosen so that both take a similar time:

* ``C``: a loop of matmuls alone;
* ``D``: one all_reduce on the job's largest group, issued as the runtime issues
  it (``MeshComm``: asynchronous; gloo runs it on its own thread, NCCL on its own
  stream) and waited;
* ``B``: the all_reduce issued, the same matmuls, then the wait.

Under the two-stream model both streams advance at rate ``1 / (1 + kappa)`` while
both are busy, so ``B = max(C, D) + kappa * min(C, D)`` and

    kappa = (B - max(C, D)) / min(C, D)      clipped to [0, 1]

(:func:`contention_of`); the profile gets the median over the pairs.
Before this, ``benchmarks/overlap_contention.py`` measured it and the figure was
copied into ``cpu-gloo`` by hand, and a profile calibrate-hardware wrote had no
``overlap`` at all, which the loader reads as full overlap (contention 0). A
one-rank calibration has no collective to overlap: :func:`unmeasured_overlap`
says what it writes instead, and that it was not measured.
"""

from __future__ import annotations

import statistics
from typing import Any

import torch

from autoshard.calibrate.timing import Job, Settings, measure

__all__ = ["contention_of", "measure_contention", "unmeasured_overlap", "OVERLAP_PAIRS"]

OVERLAP_PAIRS = {
    # device type -> (matmul size n, matmuls per call, all_reduce fp32 elements): C and D of the same order
    "cpu": ((256, 12, 1 << 20), (384, 6, 1 << 21), (512, 4, 1 << 22)),
    "cuda": ((4096, 8, 1 << 26), (8192, 2, 1 << 27), (4096, 32, 1 << 28)),
}


def contention_of(compute_s: float, comm_s: float, both_s: float) -> float:
    """kappa from the three times (module docstring).

    >>> contention_of(1.0, 1.0, 2.0), contention_of(1.0, 0.5, 1.0), round(contention_of(1.0, 0.5, 1.2), 6)
    (1.0, 0.0, 0.4)
    """
    low = min(compute_s, comm_s)
    if low <= 0:
        return 0.0
    return min(1.0, max(0.0, (both_s - max(compute_s, comm_s)) / low))


def measure_contention(job: Job, groups: Any, settings: Settings) -> dict[str, Any]:
    """The profile's ``overlap`` entry, measured on ``groups`` (a
    :class:`~autoshard.calibrate.measure_collectives.Groups`); every rank calls it."""
    dims = max(groups.groups, key=groups.spec.group_size)
    comm, device = groups.comm, job.device
    dtype = torch.bfloat16 if job.is_cuda else torch.float32
    rows = []
    for n, reps, numel in OVERLAP_PAIRS["cuda" if job.is_cuda else "cpu"]:
        numel = min(numel, groups.max_bytes() // 4)
        a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
        x = torch.ones(numel, device=device)

        def compute() -> None:
            for _ in range(reps):
                torch.mm(a, b)

        def comm_alone() -> None:
            comm.wait(comm.all_reduce(x, "sum", dims, 4 * numel))

        def both() -> None:
            issued = comm.all_reduce(x, "sum", dims, 4 * numel)
            compute()
            comm.wait(issued)

        c, d, both_s = (measure(job, fn, settings).seconds for fn in (compute, comm_alone, both))
        rows.append((n, reps, numel, c, d, both_s, contention_of(c, d, both_s)))
    kappa = statistics.median(r[-1] for r in rows)
    detail = "; ".join(f"{n}^2 x {reps} mm {c * 1e3:.2f} ms, all_reduce {4 * numel / 2**20:.0f} MiB {d * 1e3:.2f} ms, "
                       f"both {both_s * 1e3:.2f} ms: {k:.2f}" for n, reps, numel, c, d, both_s, k in rows)
    ranks = groups.spec.group_size(dims)
    return {"contention": round(kappa, 3),
            "source": f"measured: median over {len(rows)} pairs of kappa = (B - max(C, D)) / min(C, D), "
                      f"all_reduce over {ranks} ranks beside matmuls (autoshard/calibrate/measure_overlap.py): "
                      f"{detail}"}


def unmeasured_overlap(job: Job, base: Any) -> dict[str, Any]:
    """What a calibration without a collective to overlap (one rank) writes: the
    base profile's figure where it has one, else the device kind's default, and
    in either case that it was not measured. CPU: 1 (nothing hidden: gloo's
    thread needs the cores the compute uses; ``cpu-gloo`` measured 0.84); GPU: 0
    (collectives on copy engines and NICs, the datasheet profiles' default)."""
    if base is not None and base.overlap is not None:
        return {"contention": base.overlap.contention,
                "source": f"not measured (one rank): copied from {base.name} ({base.overlap.source or 'no source'})"}
    if job.is_cuda:
        return {"contention": 0.0, "source": "not measured (one rank): 0, the GPU default (collectives on copy engines "
                                             "and NICs hide fully behind compute)"}
    return {"contention": 1.0, "source": "not measured (one rank): 1, nothing hidden (CPU ranks share cores with "
                                         "gloo's thread; cpu-gloo measured 0.84)"}
