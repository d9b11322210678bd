"""What one worker process of ``autoshard serve`` runs: read a job, solve it, send the result.

Why a process per worker: a solve that crashes (a backend's segfault, memory
exhausted) or runs away (past its time limit) must fail its own job only;
the server kills or loses the process and starts another. The worker talks
to the server over one ``multiprocessing`` pipe: it receives a task (a dict
naming the job, its kind, the path of its JSON body and the options), and
sends back small dicts - ``progress`` events (stage, seconds, incumbent,
bound; a burst of improvements thinned to one per ``PROGRESS_EVERY_S``) and one ``done`` (the result as
JSON text) or ``error`` (one line). The body is parsed here again, with the
same functions that validated it in the server, so the server never holds
a parsed problem.

>>> # the server starts it: ctx.Process(target=worker_main, args=(child_end,))
"""

from __future__ import annotations

import json
import os
import signal
import time
from multiprocessing.connection import Connection
from typing import Any

from solver.io import load_json, problem_from_json
from solver.pipeline import solve

from autoshard.assembly.assemble import assemble_plan
from autoshard.assembly.request import PlanRequest

__all__ = ["worker_main", "run_task", "PROGRESS_EVERY_S"]

PROGRESS_EVERY_S = 0.1
"""Improvements within a stage are sent at most this often (a new stage or bound at once)."""


def _warm_up() -> None:
    """Load the solver's compiled kernels (numba's disk cache) before the first job."""
    from solver.problem import Problem

    problem = Problem.from_dict({"nodes": [{"cost": [1, 2]}, {"cost": [3, 0]}],
                                 "edges": [{"src": 0, "dst": 1, "cost": [[0, 5], [5, 0]]}]})
    solve(problem, time_limit=5, threads=1)


def run_task(task: dict[str, Any], send: Any) -> dict[str, Any]:
    """Solve one task; ``send(message)`` gets the progress events. Returns the
    ``done`` message: ``result`` (JSON text), ``cost``, ``bound``, ``seconds``."""
    options = task["options"]
    data = load_json(task["path"])
    request = None
    if task["kind"] == "plan":
        request = PlanRequest.from_dict(data.get("autoshard"))
        problem = problem_from_json(data, "autoshard")
    else:
        problem = problem_from_json(data, options.get("format"))
    del data
    last: dict[str, Any] = {"at": 0.0, "stage": None, "bound": None}

    def progress(event: dict[str, Any]) -> None:
        # a new stage or a new bound always goes; repeated improvements at most every PROGRESS_EVERY_S
        now, stage, bound = time.monotonic(), event.get("stage"), _finite(event.get("bound"))
        if now - last["at"] >= PROGRESS_EVERY_S or stage != last["stage"] or bound != last["bound"]:
            last.update(at=now, stage=stage, bound=bound)
            send({"event": "progress", "job": task["job"], "stage": stage,
                  "seconds": float(event.get("seconds", 0.0)), "cost": _finite(event.get("cost")), "bound": bound})

    kwargs = {"backend": options["backend"], "time_limit": options["time_limit"], "gap": options["gap"],
              "seed": options["seed"], "threads": options["threads"], "progress": progress}
    if task["kind"] == "problem":
        kwargs.update(method=options["method"], inner=options["inner"])
    solution = solve(problem, **kwargs)
    out: dict[str, Any] = {"event": "done", "job": task["job"], "cost": _finite(solution.cost),
                           "bound": _finite(solution.lower_bound), "seconds": solution.seconds,
                           "status": solution.status.value}
    if request is None:
        out["result"] = json.dumps(solution.to_dict(), allow_nan=False)
        return out
    plan = None
    if solution.has_solution:
        start = time.perf_counter()
        timings = {**request.timings, "solve_s": round(solution.seconds, 4)}
        built = assemble_plan(request.assembly, problem, solution, fingerprint=request.fingerprint,
                              options=request.options, timings=timings)
        timings["plan_s"] = round(time.perf_counter() - start, 4)
        plan = built.to_dict()
        plan["solver"]["timings"] = timings
    out["result"] = json.dumps({"plan": plan, "solution": solution.to_dict()}, allow_nan=False)
    return out


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number and abs(number) != float("inf") else None


def worker_main(conn: Connection) -> None:
    """Serve tasks from ``conn`` until it closes (the server went away) or says ``None``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the server, which stops us
    os.setpgrp()  # our own process group: killing it takes a backend's child processes too
    try:
        _warm_up()
    except Exception:  # noqa: BLE001 - a cold start only costs time
        pass
    conn.send({"event": "ready", "pid": os.getpid()})
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        try:
            message = run_task(task, conn.send)
        except Exception as exc:  # noqa: BLE001 - the job fails, the worker lives on
            text = " ".join(str(exc).split()) or type(exc).__name__
            message = {"event": "error", "job": task.get("job"), "message": f"{type(exc).__name__}: {text}"}
        try:
            conn.send(message)
        except (EOFError, OSError):
            return
