"""Jobs of ``autoshard serve``: a bounded queue, worker processes, progress, the cache in front.

Why this shape: solves are CPU-bound and may crash or run away, so each runs
in a worker process (``forkserver``: a fresh interpreter forked from one that
has the solver imported, so a replacement starts in well under a second and
inherits no server threads). One supervisor thread owns the workers: it hands
queued jobs to idle workers, reads their progress and results, kills a worker
whose job is cancelled or past its hard time limit, and starts a replacement
for every worker that dies. The HTTP threads only touch job records, under
one lock.

A job goes ``queued -> running -> done | failed | cancelled`` (``validating``
before ``queued`` while the server checks its body). Identical requests
(same cache key) in flight share one job; a key already in the cache makes a
job that is ``done`` at once. Finished results go to the cache and stay in
memory for the ``results_in_memory`` most recent jobs; older ones are read
back from the cache.

>>> # manager = JobManager(cache, workers=2, max_queue=64); manager.start()
>>> # job, created = manager.open("problem", key)
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import secrets
import signal
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any, Callable

from hw_profiles.json_input import parse_json

from autoshard.plan.options import DEFAULT_TIME_LIMIT_S
from autoshard.service.cache import ResultCache

__all__ = ["STATES", "FINAL_STATES", "Job", "QueueFull", "JobManager", "result_summary"]

log = logging.getLogger(__name__)

STATES = ("validating", "queued", "running", "done", "failed", "cancelled")
FINAL_STATES = ("done", "failed", "cancelled")
HARD_LIMIT_FACTOR = 1.5
HARD_LIMIT_GRACE_S = 10.0
"""A worker is killed when its job runs past ``time_limit * 1.5 + 10 s`` (a runaway solve)."""


class QueueFull(RuntimeError):
    """The queue holds ``max_queue`` jobs; ``retry_after_s`` is a guess of when a slot frees."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"the queue is full; retry in {retry_after_s} s")
        self.retry_after_s = retry_after_s


@dataclass(slots=True, eq=False)
class Job:
    """One request's solve (module docstring)."""

    id: str
    kind: str
    """``problem`` (result: an ``autoshard.solution/1``) or ``plan`` (``{"plan", "solution"}``)."""
    key: str
    options: dict[str, Any]
    state: str = "validating"
    created_at: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    cached: bool = False
    path: str | None = None
    """The JSON body on disk, while the job waits or runs."""
    nodes: int | None = None
    edges: int | None = None
    stage: str | None = None
    seconds: float = 0.0
    incumbent: float | None = None
    bound: float | None = None
    status: str | None = None
    """The solver's status (``optimal``, ``timeout``, ...) once done."""
    error: str | None = None
    worker_pid: int | None = None
    result: str | None = None

    def to_dict(self, queue_position: int | None = None) -> dict[str, Any]:
        """The ``GET /v1/jobs/{id}`` body."""
        gap = None
        if self.incumbent is not None and self.bound is not None:
            gap = 0.0 if self.incumbent == self.bound else \
                max(0.0, (self.incumbent - self.bound) / max(abs(self.incumbent), 1e-12))
        limit = float(self.options.get("time_limit") or 0.0)
        seconds = self.seconds
        if self.state == "running" and self.started_at is not None:
            seconds = max(seconds, time.time() - self.started_at)  # wall time, between solver events
        return {
            "id": self.id, "kind": self.kind, "state": self.state, "cached": self.cached,
            "created_at": self.created_at, "started_at": self.started_at, "finished_at": self.finished_at,
            "queue_position": queue_position, "nodes": self.nodes, "edges": self.edges,
            "time_limit": limit or None, "worker_pid": self.worker_pid,
            "progress": {"stage": self.stage, "seconds": round(seconds, 3),
                         "fraction": min(1.0, seconds / limit) if limit and self.state == "running"
                         else (1.0 if self.state == "done" else 0.0)},
            "incumbent": self.incumbent, "bound": self.bound, "gap": gap, "status": self.status,
            "error": self.error,
        }


def result_summary(kind: str, result: str) -> dict[str, Any]:
    """``status``, ``incumbent`` and ``bound`` of a result text (a solution, or
    ``{"plan", "solution"}`` for ``kind == "plan"``), as a worker reports them
    when it finishes; empty when the text is not such a result.

    >>> result_summary("problem", '{"status": "optimal", "cost": 12.0, "lower_bound": 12.0, "choice": [0]}')
    {'status': 'optimal', 'incumbent': 12.0, 'bound': 12.0}
    """
    try:
        data = parse_json(result)
    except ValueError:
        data = None
    solution = data.get("solution") if kind == "plan" and isinstance(data, dict) else data
    if not isinstance(solution, dict) or not isinstance(solution.get("status"), str):
        log.warning("cache: a stored %s result without a solver status", kind)
        return {}
    return {"status": solution["status"], "incumbent": _number(solution.get("cost")),
            "bound": _number(solution.get("lower_bound"))}


def _number(value: Any) -> float | None:
    """A finite number of a result, else None (the worker reports no cost as None too)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


@dataclass(slots=True, eq=False)
class _Worker:
    process: Any
    conn: Any
    ready: bool = False
    job: Job | None = None
    deadline: float = 0.0


def _kill(process: Any) -> None:
    """Kill a worker and whatever it started (its process group: a CBC child too)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        try:
            process.kill()
        except (ProcessLookupError, OSError, AttributeError):
            pass


class JobManager:
    """Queue, workers and job records (module docstring). Thread-safe.

    ``on_finish(job)`` is called when a job reaches a final state (under the lock: keep it quick).
    """

    def __init__(self, cache: ResultCache, *, workers: int = 2, max_queue: int = 64, max_jobs: int = 10_000,
                 results_in_memory: int = 256, spool: str | None = None,
                 on_finish: Callable[[Job], None] | None = None) -> None:
        if workers < 1 or max_queue < 1:
            raise ValueError("workers and max_queue must be at least 1")
        self.cache = cache
        self.num_workers = workers
        self.max_queue = max_queue
        self.max_jobs = max_jobs
        self.results_in_memory = results_in_memory
        self.spool = spool or os.path.join(os.path.dirname(cache.root), "spool")
        os.makedirs(self.spool, exist_ok=True)
        self.on_finish = on_finish
        self.jobs: OrderedDict[str, Job] = OrderedDict()
        self.active: dict[str, Job] = {}  # key -> the job in flight for it
        self.queue: deque[Job] = deque()
        self.workers: list[_Worker] = []
        self.restarts = 0
        self._lock = threading.RLock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ctx = multiprocessing.get_context("forkserver")
        self._ctx.set_forkserver_preload(["autoshard.service.worker"])
        self._durations: deque[float] = deque(maxlen=50)

    # -- lifecycle -------------------------------------------------------------
    def start(self) -> None:
        """Start the workers and the supervisor thread."""
        for _ in range(self.num_workers):
            self.workers.append(self._spawn())
        self._thread = threading.Thread(target=self._supervise, name="autoshard-supervisor", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the supervisor and every worker (running jobs are cancelled)."""
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for w in self.workers:
            if w.process.is_alive():
                _kill(w.process)
            w.process.join(timeout=5)
            w.conn.close()
        with self._lock:
            for job in list(self.queue) + [w.job for w in self.workers if w.job is not None]:
                self._finish(job, "cancelled", error="the server stopped")
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _spawn(self) -> _Worker:
        from autoshard.service.worker import worker_main

        parent, child = self._ctx.Pipe(duplex=True)
        # not daemonic: a solve may start processes of its own (the CBC backend)
        process = self._ctx.Process(target=worker_main, args=(child,), name="autoshard-worker", daemon=False)
        process.start()
        child.close()
        return _Worker(process, parent)

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    # -- requests ---------------------------------------------------------------
    def open(self, kind: str, key: str) -> tuple[Job, bool]:
        """The job for ``key``: the one in flight (``created`` False) or a new one in
        ``validating`` (``created`` True); :class:`QueueFull` when no slot is left."""
        with self._lock:
            job = self.active.get(key)
            if job is not None:
                return job, False
            waiting = len(self.queue) + sum(1 for j in self.active.values() if j.state == "validating")
            if waiting >= self.max_queue:
                raise QueueFull(self.retry_after_s())
            job = Job(secrets.token_hex(12), kind, key, {})
            self.active[key] = job
            self._add(job)
            return job, True

    def cached(self, kind: str, key: str, result: str) -> Job:
        """A job answered from the cache: ``done`` at once, with the solver's
        status, cost and bound read from the stored result, as the job that
        solved it reported them. Parses ``result``: call it off the event loop."""
        summary = result_summary(kind, result)  # before the lock: a result may be megabytes
        with self._lock:
            job = Job(secrets.token_hex(12), kind, key, {}, state="done", cached=True, result=result,
                      finished_at=time.time(), **summary)
            self._add(job)
        return job

    def enqueue(self, job: Job, path: str, options: dict[str, Any], nodes: int, edges: int) -> None:
        """A validated job (body at ``path``) joins the queue."""
        with self._lock:
            if job.state != "validating":  # cancelled while its body was checked
                os.unlink(path)
                return
            job.path, job.options, job.nodes, job.edges, job.state = path, dict(options), nodes, edges, "queued"
            self.queue.append(job)
        self._wake()

    def reject(self, job: Job, message: str) -> None:
        """A job whose body did not validate."""
        with self._lock:
            self._finish(job, "failed", error=message)

    def cancel(self, job_id: str) -> Job | None:
        """Cancel a job (a running one's worker is killed and replaced); None if unknown."""
        with self._lock:
            job = self.jobs.get(job_id)
            if job is None or job.state in FINAL_STATES:
                return job
            for w in self.workers:
                if w.job is job:
                    w.ready, w.job = False, None  # dying: no new job until it is replaced
                    _kill(w.process)
            if job in self.queue:
                self.queue.remove(job)
            self._finish(job, "cancelled", error="cancelled by request")
        self._wake()
        return job

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self.jobs.get(job_id)

    def status(self, job_id: str) -> dict[str, Any] | None:
        """The job's ``to_dict`` with its place in the queue; None if unknown."""
        with self._lock:
            job = self.jobs.get(job_id)
            if job is None:
                return None
            position = self.queue.index(job) if job.state == "queued" else None
            return job.to_dict(position)

    def result(self, job: Job) -> str | None:
        """The result text of a ``done`` job (from memory or the cache); None if evicted."""
        return job.result if job.result is not None else self.cache.get(job.key)

    def counts(self) -> dict[str, int]:
        """Jobs by state, queue length, live workers, restarts."""
        with self._lock:
            by_state = {s: 0 for s in STATES}
            for job in self.jobs.values():
                by_state[job.state] += 1
            return {"states": by_state, "queue": len(self.queue),
                    "workers_alive": sum(1 for w in self.workers if w.process.is_alive()),
                    "workers_busy": sum(1 for w in self.workers if w.job is not None), "restarts": self.restarts}

    def retry_after_s(self) -> int:
        """Seconds until a queue slot likely frees: a worker finishes a job every
        ``mean job time / workers`` seconds (recent jobs; 5 s before any)."""
        mean = sum(self._durations) / len(self._durations) if self._durations else 5.0
        return int(min(max(math.ceil(mean / self.num_workers), 1), 120))

    # -- records ------------------------------------------------------------------
    def _add(self, job: Job) -> None:
        self.jobs[job.id] = job
        if len(self.jobs) > self.max_jobs:  # forget the oldest finished jobs
            for old_id in [i for i, j in self.jobs.items() if j.state in FINAL_STATES][: len(self.jobs) - self.max_jobs]:
                del self.jobs[old_id]

    def _finish(self, job: Job, state: str, *, error: str | None = None, result: str | None = None) -> None:
        """Move ``job`` to a final state (caller holds the lock)."""
        if job.state in FINAL_STATES:
            return
        job.state, job.error, job.finished_at, job.result = state, error, time.time(), result
        if self.active.get(job.key) is job:
            del self.active[job.key]
        if job.path:
            try:
                os.unlink(job.path)
            except OSError:
                pass
            job.path = None
        if job.started_at is not None and state == "done":
            self._durations.append(job.finished_at - job.started_at)
        # keep result texts of the most recent jobs only; the cache has the rest
        done = [j for j in reversed(self.jobs.values()) if j.result is not None and j is not job]
        for old in done[self.results_in_memory:]:
            if old.key in self.cache:
                old.result = None
        if self.on_finish is not None:
            self.on_finish(job)

    # -- supervisor --------------------------------------------------------------
    def _supervise(self) -> None:
        while not self._stop.is_set():
            try:
                self._step()
            except Exception:  # noqa: BLE001 - the supervisor must outlive any one bad message
                log.exception("supervisor step failed")
                time.sleep(0.1)

    def _step(self) -> None:
        self._dispatch()
        watch: list[Any] = [self._wake_r]
        for w in self.workers:
            watch += [w.conn, w.process.sentinel]
        for ready in wait(watch, timeout=0.25):
            if ready == self._wake_r:
                os.read(self._wake_r, 4096)
                continue
            for w in list(self.workers):
                if ready is w.conn:
                    self._receive(w)
                elif ready == w.process.sentinel:
                    self._replace(w)
        now = time.monotonic()
        with self._lock:
            for w in self.workers:
                if w.job is not None and now > w.deadline:
                    limit = w.job.options.get("time_limit")
                    self._finish(w.job, "failed", error=f"time limit: the solve ran past {HARD_LIMIT_FACTOR:g} x "
                                 f"its time limit of {limit:g} s + {HARD_LIMIT_GRACE_S:g} s and was killed")
                    w.ready, w.job = False, None
                    _kill(w.process)

    def _dispatch(self) -> None:
        with self._lock:
            for w in self.workers:
                if not self.queue:
                    return
                if w.job is None and w.ready and w.process.is_alive():
                    job = self.queue.popleft()
                    task = {"job": job.id, "kind": job.kind, "path": job.path, "options": job.options}
                    try:
                        w.conn.send(task)
                    except (OSError, ValueError):
                        self.queue.appendleft(job)
                        continue
                    job.state, job.started_at, job.worker_pid = "running", time.time(), w.process.pid
                    limit = float(job.options.get("time_limit") or DEFAULT_TIME_LIMIT_S)
                    w.job, w.deadline = job, time.monotonic() + limit * HARD_LIMIT_FACTOR + HARD_LIMIT_GRACE_S

    def _receive(self, w: _Worker) -> None:
        try:
            message = w.conn.recv()
        except (EOFError, OSError):
            self._replace(w)
            return
        finish: Job | None = None
        with self._lock:
            event = message.get("event")
            if event == "ready":
                w.ready = True
                return
            job = w.job
            if job is None or message.get("job") != job.id:
                return  # a message of a job cancelled meanwhile
            if event == "progress":
                job.stage, job.seconds = message.get("stage"), float(message.get("seconds") or 0.0)
                if message.get("cost") is not None:
                    job.incumbent = message["cost"]
                if message.get("bound") is not None:
                    job.bound = message["bound"]
                return
            w.job = None
            if event == "done":
                job.incumbent, job.bound, job.status = message.get("cost"), message.get("bound"), message.get("status")
                job.seconds, job.stage = float(message.get("seconds") or 0.0), "finished"
                finish = job
                result = message["result"]
            else:
                self._finish(job, "failed", error=str(message.get("message", "the solve failed")))
        if finish is not None:
            try:
                self.cache.put(finish.key, result)
            except OSError as exc:
                log.warning("cache: cannot store %s: %s", finish.key[:12], exc)
            with self._lock:
                self._finish(finish, "done", result=result)

    def _replace(self, w: _Worker) -> None:
        """A worker died (crash, kill, cancel): fail its job, reap what it started, start another."""
        _kill(w.process)
        w.process.join(timeout=1)
        code = w.process.exitcode
        with self._lock:
            if w not in self.workers:
                return
            if w.job is not None:
                how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
                self._finish(w.job, "failed", error=f"the worker process died ({how}) while solving")
                w.job = None
            self.workers.remove(w)
            w.conn.close()
            if not self._stop.is_set():
                self.workers.append(self._spawn())
                self.restarts += 1
