"""How every calibration figure is timed: one protocol for compute and
collectives, on one process or on every rank of a job.

Why one protocol: the profile prices compute and communication in the same
step, so both must be measured the same way, and the same way a real
training step runs them. Under ``torchrun`` every rank runs the same
measurement at the same time: for collectives that is the only way, and for
compute it is what a real run sees (4 CPU ranks on 2 cores each get half a
core; the profile's device is then "one rank of this job").

Protocol of :func:`measure` (nccl-tests and Alpa do the same):

1. ``warmup`` calls, not timed (allocator, caches, lazy init, connections);
   then batches of calls are timed as a probe (max over ranks, batches
   growing until one lasts ``min_trial_s / 8``), which picks ``reps``
   (calls per trial) so that a trial lasts at least ``min_trial_s``, and the
   number of trials: ``trials``, fewer (at least 2) when they would exceed
   the item's time budget ``max_item_s``. Every rank derives the same
   numbers from the same probe (a collective must be called the same number
   of times on every rank);
2. the trials, each after a barrier so that all ranks start together;
   a trial's time is its mean time per call;
3. each trial's time over all ranks: from the first rank's start to the last
   rank's end on CPU ranks of one host (they read the same monotonic clock;
   ranks that the scheduler ran one after another, each alone on a core,
   must not look as fast as ranks that really ran side by side), else the
   slowest rank's own time (the slowest rank sets the step time);
4. trials farther than 3 scaled MADs from the median are dropped as outliers
   (a page-cache flush, another process); the result is the median of the rest.

On CUDA a trial is timed with CUDA events and ends with a synchronize; on CPU
with ``time.perf_counter``.

>>> job = Job.single()
>>> t = measure(job, lambda: sum(range(100)), Settings(warmup=1, trials=3, min_trial_s=1e-4))
>>> t.seconds > 0 and t.reps >= 1
True
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

__all__ = ["PROTOCOL", "Settings", "Timing", "Job", "measure", "reject_outliers", "shares_clock"]

PROTOCOL = 2
"""Version of :func:`measure`'s protocol; cached measurements (``correction_cache``) of another
version are measured again. 2: the probe times batches of calls (2026-11-29)."""


@dataclass(frozen=True, slots=True)
class Settings:
    """How hard to measure one item."""

    warmup: int = 2
    """Untimed calls before timing."""
    trials: int = 5
    """Timed trials (each the mean of ``reps`` calls)."""
    min_trial_s: float = 0.02
    """A trial lasts at least this long (short ones are dominated by timer and
    barrier skew; on a shared CPU, by the scheduler's time slice)."""
    max_reps: int = 16384
    """At most this many calls per trial."""
    max_item_s: float = math.inf
    """Time budget of one item: slow items (large collectives) get fewer
    trials (at least 2) and fewer warm-up calls."""

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.trials < 1 or not self.min_trial_s >= 0 or self.max_reps < 1 or not self.max_item_s > 0:
            raise ValueError(f"Settings: need warmup >= 0, trials >= 1, min_trial_s >= 0, max_reps >= 1, got {self}")


@dataclass(frozen=True, slots=True)
class Timing:
    """Seconds per call of one measured item."""

    seconds: float
    """Median over the kept trials of the time per call over all ranks."""
    trials: tuple[float, ...]
    """Every trial (over all ranks), outliers included."""
    rejected: int
    """Trials dropped as outliers."""
    reps: int
    """Calls per trial."""

    @property
    def spread(self) -> float:
        """(max - min) / median of the kept trials: how noisy the item was."""
        kept = reject_outliers(self.trials)
        return (max(kept) - min(kept)) / self.seconds if self.seconds > 0 else 0.0


def reject_outliers(values: Sequence[float], *, k: float = 3.0) -> list[float]:
    """The values within ``k`` scaled median absolute deviations of the median.

    >>> reject_outliers([1.0, 1.1, 0.9, 1.0, 9.0])
    [1.0, 1.1, 0.9, 1.0]
    """
    values = list(values)
    if len(values) < 3:
        return values
    median = statistics.median(values)
    mad = 1.4826 * statistics.median(abs(v - median) for v in values)
    if mad == 0:  # more than half the values are equal: nothing to measure the spread with
        return values
    return [v for v in values if abs(v - median) <= k * mad]


@dataclass(slots=True)
class Job:
    """This process's place in the job: rank, world size, device, and the
    few collectives that timing needs (barrier, max over ranks)."""

    rank: int = 0
    world: int = 1
    local_world: int = 1
    """Ranks on this host (they share its cores or GPUs)."""
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str | None = None
    """Process-group backend, None for a single process."""

    @classmethod
    def single(cls, device: str = "cpu") -> "Job":
        """A job of one process, no process group."""
        return cls(device=torch.device(device))

    @classmethod
    def from_env(cls, backend: str | None, *, timeout_s: float = 300.0) -> "Job":
        """Join the job described by torchrun's environment (``RANK``,
        ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``),
        or a single process when there is none. ``backend``: ``gloo``,
        ``nccl`` or None (nccl when CUDA is available, else gloo)."""
        if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
            if backend == "nccl":
                if not torch.cuda.is_available():
                    raise ValueError("--backend nccl: CUDA is not available on this machine")
                return cls.single("cuda")
            return cls.single("cpu")
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"--backend: expected gloo or nccl, got {backend!r}")
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if backend == "nccl":
            if not torch.cuda.is_available():
                raise ValueError("--backend nccl: CUDA is not available on this machine")
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
        else:
            device = torch.device("cpu")
        if not dist.is_initialized():
            from autoshard.runtime.process_group import init_process_group

            init_process_group(backend, timeout=timedelta(seconds=timeout_s),
                               device_id=device if backend == "nccl" else None)
        return cls(
            rank=dist.get_rank(),
            world=dist.get_world_size(),
            local_world=int(os.environ.get("LOCAL_WORLD_SIZE", str(dist.get_world_size()))),
            device=device,
            backend=backend,
        )

    @property
    def distributed(self) -> bool:
        return self.backend is not None

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def synchronize(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def barrier(self) -> None:
        if self.distributed:
            self.synchronize()
            dist.barrier()

    def _reduce(self, values: Sequence[float], op: Any) -> list[float]:
        if not self.distributed:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=op)
        return [float(v) for v in t.cpu()]

    def max_over_ranks(self, values: Sequence[float]) -> list[float]:
        """Element-wise max of ``values`` over every rank (identity on one process)."""
        return self._reduce(values, dist.ReduceOp.MAX if self.distributed else None)

    def min_over_ranks(self, values: Sequence[float]) -> list[float]:
        """Element-wise min of ``values`` over every rank."""
        return self._reduce(values, dist.ReduceOp.MIN if self.distributed else None)

    def all_agree(self, ok: bool) -> bool:
        """True when ``ok`` is true on every rank."""
        return self.min_over_ranks([1.0 if ok else 0.0])[0] > 0.5

    def close(self) -> None:
        """Destroy the job's process groups and join their threads before the
        interpreter exits (:mod:`autoshard.runtime.process_group` says why)."""
        if self.distributed:
            from autoshard.runtime.process_group import destroy_process_groups

            destroy_process_groups()


def _window(job: Job, fn: Callable[[], Any], reps: int) -> tuple[float, float]:
    """``(start, end)`` of ``reps`` calls of ``fn`` on this rank: CUDA event
    time from 0 on a GPU, ``time.perf_counter`` (``CLOCK_MONOTONIC``, the same
    clock for every process of a host) on CPU."""
    if job.is_cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return 0.0, start.elapsed_time(end) / 1e3
    begin = time.perf_counter()
    for _ in range(reps):
        fn()
    return begin, time.perf_counter()


def shares_clock(job: Job) -> bool:
    """Whether the ranks' trial windows can be compared on one clock: CPU
    ranks of one host. There a trial lasts from the first rank's start to the
    last rank's end, so that ranks which the scheduler ran one after another
    (each alone on a core) are not mistaken for ranks that ran side by side.

    >>> shares_clock(Job.single())
    True
    """
    return not job.is_cuda and job.local_world == job.world


def _probe(job: Job, fn: Callable[[], Any], settings: Settings) -> float:
    """Seconds per call of ``fn`` (the slowest rank's own clock), from batches of
    calls growing 8x until one lasts ``min_trial_s / 8`` (or reaches ``max_reps``).

    Why batches: a probe of one call timed a microsecond op together with
    whatever else happened on that core then; with 4 ranks on 2 cores the
    slowest rank's single call was 5-20x the op, so its trials got 5-20x too
    few calls and lasted ~2 ms, about a scheduler time slice, and the ranks'
    start skew after the barrier went into every call (1-element ops timed
    3-7 us, round to round, for a ~1 us op run alone)."""
    n = 1
    while True:
        begin, end = _window(job, fn, n)
        seconds = max(job.max_over_ranks([end - begin])[0], 1e-9)  # the same on every rank: the same loop
        if seconds >= settings.min_trial_s / 8 or n >= settings.max_reps:
            return seconds / n
        n = min(8 * n, settings.max_reps)


def measure(job: Job, fn: Callable[[], Any], settings: Settings) -> Timing:
    """Seconds per call of ``fn``, timed on every rank of ``job`` at once
    (module docstring). Every rank must call this with the same ``fn`` kind
    and ``settings``: it issues collectives of its own.

    >>> measure(Job.single(), lambda: None, Settings(warmup=0, trials=1, min_trial_s=0)).reps
    1
    """
    if settings.warmup:
        fn()
    job.synchronize()
    job.barrier()
    probe = _probe(job, fn, settings)  # every rank derives the same reps and trials
    if probe * settings.warmup < settings.max_item_s / 4:  # slow items: the two calls above warmed them up
        for _ in range(settings.warmup - 1):
            fn()
    reps = max(1, min(settings.max_reps, math.ceil(settings.min_trial_s / probe)))
    budget = settings.max_item_s / (reps * probe)  # trials that fit the item's time budget
    trials_n = settings.trials if budget >= settings.trials else max(min(settings.trials, 2), int(budget))
    windows = []
    for _ in range(trials_n):
        job.barrier()
        windows.append(_window(job, fn, reps))
    if shares_clock(job):  # first start to last end, over every rank
        ends = job.max_over_ranks([e for _, e in windows])
        starts = [-v for v in job.max_over_ranks([-b for b, _ in windows])]
        worst = tuple((e - b) / reps for b, e in zip(starts, ends))
    else:  # clocks of different hosts (or GPUs' events) do not compare: the slowest rank's own time
        worst = tuple(job.max_over_ranks([(e - b) / reps for b, e in windows]))
    kept = reject_outliers(worst)
    return Timing(statistics.median(kept), worst, len(worst) - len(kept), reps)
