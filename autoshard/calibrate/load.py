"""The host's load while a calibration or a check runs.

Why: on a shared host, time measured while other jobs run is time the
profile then charges for every op. The shipped ``cpu-gloo`` was calibrated at
a load average of 5-8 from other jobs; on a quiet host of the same kind its
fit-set items re-measured at 0.87x (compute) and 0.76x (collectives) of
their figures, and its held-out errors doubled. So every calibration and
check records the load and says when it ran under foreign load.

What is recorded (:class:`hw_profiles.LoadRecord`, in the profile's
``calibration.load``):

* ``os.getloadavg()`` just before the first and just after the last item;
* every ``interval_s`` during the run (a sampling thread on rank 0): the
  1-minute load average, and the number of runnable threads that belong to
  none of the job's processes on this host (``/proc/*/task/*/stat`` state
  ``R``). The load average counts the job's own threads too (ranks x torch
  threads): it says how busy the host was, not who made it busy; the
  runnable count of other processes does;
* ``foreign_load`` = the mean of that count over the run: the average number
  of other threads competing for the cores. At or above ``threshold`` (0.5:
  another process running half the time or more) the calibration ran under
  foreign load: the profile's ``calibration.load.foreign`` is true, a
  warning is stored in ``calibration.warnings`` and printed, and the figures
  should be re-measured on a quiet host before they are shipped.

Where ``/proc`` is missing (not Linux) only the load averages are recorded.

>>> m = LoadMonitor(own_pids={os.getpid()}, own_threads=1, interval_s=0.01)
>>> m.start(); m.stop()
>>> m.record().own_threads
1
"""

from __future__ import annotations

import os
import statistics
import threading
from typing import Any

from hw_profiles import LoadRecord

__all__ = ["FOREIGN_THRESHOLD", "LoadMonitor", "foreign_runnable", "job_pids", "monitor_for"]

FOREIGN_THRESHOLD = 0.5
"""Mean runnable threads of other processes from which a run counts as loaded."""


def foreign_runnable(own_pids: set[int], proc: str = "/proc") -> int | None:
    """Runnable threads (state ``R``) of processes not in ``own_pids``; None
    without a readable ``/proc``.

    >>> foreign_runnable({os.getpid()}) is None or foreign_runnable({os.getpid()}) >= 0
    True
    """
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return None
    count = 0
    for pid in pids:
        if int(pid) in own_pids:
            continue
        try:
            tasks = os.listdir(f"{proc}/{pid}/task")
        except OSError:  # gone, or not ours to read
            continue
        for task in tasks:
            try:
                with open(f"{proc}/{pid}/task/{task}/stat", "rb") as handle:
                    stat = handle.read()
            except OSError:
                continue
            state = stat[stat.rfind(b")") + 2: stat.rfind(b")") + 3]  # the field after "(comm)"
            count += state == b"R"
    return count


class LoadMonitor:
    """Samples the host's load in a thread between :meth:`start` and
    :meth:`stop` (module docstring)."""

    def __init__(self, *, own_pids: set[int], own_threads: int, interval_s: float = 1.0) -> None:
        self.own_pids = set(own_pids)
        self.own_threads = own_threads
        self.interval_s = interval_s
        self.before: tuple[float, float, float] = (0.0, 0.0, 0.0)
        self.after: tuple[float, float, float] = (0.0, 0.0, 0.0)
        self.load1: list[float] = []
        self.foreign: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        self.load1.append(round(os.getloadavg()[0], 2))
        count = foreign_runnable(self.own_pids)
        if count is not None:
            self.foreign.append(float(count))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def start(self) -> None:
        self.before = tuple(round(v, 2) for v in os.getloadavg())
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="load-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        self.after = tuple(round(v, 2) for v in os.getloadavg())

    def record(self) -> LoadRecord:
        """What was seen (``foreign``: mean foreign runnable >= threshold)."""
        foreign_load = statistics.fmean(self.foreign) if self.foreign else 0.0
        keep = max(1, len(self.load1) // 60)  # at most ~60 samples in the profile
        return LoadRecord(
            cores=os.cpu_count() or 1,
            own_threads=self.own_threads,
            before=self.before,
            after=self.after,
            during_load1=tuple(self.load1[::keep]),
            foreign_runnable=tuple(self.foreign[::keep]),
            foreign_load=round(foreign_load, 3),
            threshold=FOREIGN_THRESHOLD,
            foreign=foreign_load >= FOREIGN_THRESHOLD,
        )


def job_pids(job: Any) -> set[int]:
    """Process ids of the job's ranks on this host (every rank must call:
    it is a collective on a distributed job)."""
    import socket

    mine = (socket.gethostname(), os.getpid())
    if not job.distributed:
        return {mine[1]}
    import torch.distributed as dist

    everyone: list[Any] = [None] * job.world
    dist.all_gather_object(everyone, mine)
    return {pid for host, pid in everyone if host == mine[0]}


def monitor_for(job: Any, threads: int) -> LoadMonitor | None:
    """A monitor on rank 0 (None elsewhere) for a run of ``job``; every
    rank must call it (it gathers the ranks' process ids)."""
    pids = job_pids(job)
    if job.rank != 0:
        return None
    return LoadMonitor(own_pids=pids, own_threads=max(1, job.local_world) * max(1, threads))
