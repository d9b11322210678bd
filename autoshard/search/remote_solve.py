"""Solving on an ``autoshard serve``: the whole plan there, or only the solver's problems.

Two ways a local ``solve`` uses a server (``SolveOptions.server``): without a
recomputation search the problem goes with its assembly section and comes back
as the plan (:func:`solve_on_server`, the same plan as solved here); with one,
the search runs here and each of its solves runs there (:func:`server_solver`),
and the plan is assembled here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Mapping

from autoshard.plan.format import Plan
from autoshard.plan.options import PLAN_GAP

__all__ = ["server_solver", "solve_on_server"]

Progress = Callable[[str, float, float], None]


def server_solver(server: str) -> Callable[..., Any]:
    """``solver.solve`` on an ``autoshard serve`` (``POST /v1/problems``). A server takes no warm
    start: the recomputation search's continued and seeded solves start afresh there, and (A2)
    still returns no worse than the best fixed policy (its check is on the costs)."""
    from autoshard.service.client import ServiceClient

    client = ServiceClient(server)

    def solve(problem: Any, *, backend: str, time_limit: float, gap: float,
              progress: Callable[[dict[str, Any]], None] | None = None, initial: Any = None) -> Any:
        on_status = None if progress is None else (lambda status: progress({"stage": status.get("state")}))
        return client.solve_problem(problem, on_progress=on_status, time_limit=time_limit, backend=backend,
                                    gap=gap)

    return solve


def solve_on_server(server: str, prep: Any, problem: Any, options: Mapping[str, Any], time_limit: float,
                     backend: str, progress: Progress | None) -> tuple[Plan | None, Any]:
    """(plan or None, solution) from an ``autoshard serve``: the problem goes with
    its assembly section (``autoshard.assembly.from_graph.plan_request``) and comes back as the plan.
    The request carries no timings (so a repeat is a cache hit); they are added here."""
    from autoshard.assembly.from_graph import plan_request
    from autoshard.service.client import ServiceClient

    body = plan_request(prep.graph, problem, fingerprint=prep.fingerprint, options=options, timings={},
                        solve={"time_limit": time_limit, "backend": backend, "gap": PLAN_GAP})

    def on_status(status: dict[str, Any]) -> None:
        if progress:
            progress("solve", min(float(status["progress"]["seconds"]), time_limit), time_limit)

    plan, solution = ServiceClient(server).solve_plan(body, on_progress=on_status)
    if plan is not None:
        plan = replace(plan, solver=replace(plan.solver, timings={**prep.timings, **plan.solver.timings}))
    return plan, solution
