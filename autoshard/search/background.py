"""Work that runs beside the solve in a forked process: the expert baselines.

A plan is never worse than the expert baselines (DDP, FSDP, TP, FSDP+TP), so every
unpinned solve also solves and simulates each of them: 8-11 s of a 26-33 s
LLaMA-3 8B solve on 2 cores, done after the search, on one core. Nothing in
them depends on the search, so they run in a forked child from the start and
the parent takes their plans when its own search and overlap rounds are done:
the same plans (each is solved as it would be afterwards, with the same time
shares of the same deadline), the two processes sharing the baselines (below).

The child inherits the prepared graph by fork (nothing is pickled on the way
in) and sends each result back as one JSON text (nothing is unpickled on the
way out).

Shared tasks. The work is a list of tasks (the baselines); each is run by whoever
claims it first (:meth:`Background.claim`, one byte per task in shared memory
under a lock). The child claims them first to last; the parent, once its own
search is done, claims them last to first and runs them itself, so neither waits
while the other works (LLaMA-3 8B on 2x4x8: the parent was idle 6 s of a 12.5 s
solve waiting for the last baseline).

The child is not a daemon: a solver backend forks a process of its own (toulbar2,
``solver.wcsp``), which a daemonic process may not. :meth:`Background.stop` ends it
(``solve_prepared`` calls it in a ``finally``). Forking needs a second core (else
the two would only take turns), the ``fork`` start method, and a process that is
not itself a multiprocessing worker (a mesh search's or the service's workers
share the cores with their siblings already: there the baselines run after the
search, in process, as before).

>>> job = Background.start(lambda claim: ({"x": n} for n in range(2) if claim(n)), tasks=2)
>>> job is None or job.collect(until=time.perf_counter() + 30) == ([{"x": 0}, {"x": 1}], True)
True
"""

from __future__ import annotations

import gc
import json
import logging
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["Background", "can_fork", "grace_s"]

GRACE_S = 2.0
"""How long past its deadline the parent waits for a result in flight (a baseline
started before the deadline ends its solve and assembly, as it would in process),
at most: :data:`GRACE_SHARE` of the call's time limit where that is less."""

GRACE_SHARE = 0.02
"""Share of the call's time limit the wait past the deadline may take (a 5 s limit waits
0.1 s, not 2 s: the time limit bounds the call within 5 %)."""


def grace_s(time_limit: float) -> float:
    """How long past its deadline the parent waits for the child, in a call limited to ``time_limit`` s.

    >>> grace_s(600.0), grace_s(5.0)
    (2.0, 0.1)
    """
    return min(GRACE_S, GRACE_SHARE * time_limit)


def can_fork() -> bool:
    """Whether a forked child would run beside this process (module docstring)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    # a multiprocessing worker (a mesh search's, the service's) already shares the cores with its siblings
    return (cores >= 2 and "fork" in multiprocessing.get_all_start_methods()
            and multiprocessing.parent_process() is None)


_FREE, _CHILD, _PARENT = 0, 1, 2

Claim = Callable[[int], bool]
"""``claim(task)``: whether the caller may run ``task`` (it was free; now the caller's)."""


def _claim(claims: Any, task: int, who: int) -> bool:
    with claims.get_lock():
        if claims[task] != _FREE:
            return False
        claims[task] = who
        return True


class Background:
    """A forked child producing JSON-able dicts; the parent collects them."""

    def __init__(self, process: Any, connection: Any, claims: Any) -> None:
        self._process, self._connection, self._claims = process, connection, claims

    @classmethod
    def start(cls, produce: Callable[[Claim], Iterable[dict[str, Any]]], tasks: int = 0) -> "Background | None":
        """Fork a child that sends every item ``produce(claim)`` yields, ``claim`` telling it which of
        the ``tasks`` shared tasks it may run (module docstring); None where :func:`can_fork` is
        false or the fork fails."""
        if not can_fork():
            return None
        context = multiprocessing.get_context("fork")
        claims = context.Array("b", max(tasks, 1))
        receive, send = context.Pipe(duplex=False)
        # the child's collections would touch every object the parent holds, copying its pages
        # (copy on write): what exists at the fork is left out of the child's collections
        gc.freeze()
        try:
            process = context.Process(target=_child, args=(produce, send, claims), daemon=False,
                                      name="autoshard-baselines")
            process.start()
        except OSError as exc:  # out of processes or memory: the work runs in process instead
            log.info("no background process (%s): the expert baselines run after the search", exc)
            return None
        finally:
            gc.unfreeze()
        send.close()
        return cls(process, receive, claims)

    def claim(self, task: int) -> bool:
        """Whether the parent may run ``task`` (the child has not claimed it); it is then the parent's."""
        return _claim(self._claims, task, _PARENT)

    def collect(self, until: float, grace: float = GRACE_S) -> tuple[list[dict[str, Any]], bool]:
        """Every item sent until the child ends or ``until`` (``time.perf_counter()``) plus
        ``grace`` seconds (:func:`grace_s`) pass, and whether the child finished without error;
        then stops it."""
        items: list[dict[str, Any]] = []
        complete = False
        try:
            while True:
                wait = max(0.0, until + grace - time.perf_counter())
                if not self._connection.poll(wait):
                    log.info("the expert baselines ran out of time: %d priced", len(items))
                    break
                message = json.loads(self._connection.recv_bytes().decode())
                if "error" in message:
                    log.warning("the expert baselines failed in the background: %s", message["error"])
                    break
                if message.get("done"):
                    complete = True
                    break
                items.append(message)
        except (EOFError, OSError):  # the child died (killed, out of memory)
            log.warning("the background process of the expert baselines ended without its results")
        finally:
            self.stop()
        return items, complete

    def stop(self) -> None:
        """End the child (if it still runs) and release the pipe."""
        if self._process.is_alive():
            self._process.kill()
        self._process.join(timeout=5)
        self._connection.close()


def _child(produce: Callable[[Claim], Iterable[dict[str, Any]]], send: Any, claims: Any) -> None:
    # A plan's JSON is larger than the pipe's buffer: sent from this thread, the child would wait for
    # the parent to read it (at the end of the parent's search) before starting its next task. A
    # sender thread writes while the child works on.
    outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()

    def sender() -> None:
        try:
            while (data := outbox.get()) is not None:
                send.send_bytes(data)
        except OSError:  # the parent closed the pipe (it stopped waiting)
            pass

    thread = threading.Thread(target=sender, name="autoshard-baselines-sender", daemon=True)
    thread.start()
    try:
        for item in produce(lambda task: _claim(claims, task, _CHILD)):
            outbox.put(json.dumps(item).encode())
        outbox.put(b'{"done": true}')
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which runs the work itself
        outbox.put(json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
    finally:
        outbox.put(None)
        thread.join()
        send.close()
