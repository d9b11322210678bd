"""Exact solve of a compiled graph: the integer program of ``solver.ilp`` with lazy memory rows.

Round r solves the program with the active time points P_r; its bound is a
valid lower bound of the full problem (fewer rows = relaxation). If its
solution fits the memory limit at every kept point, it is feasible for the
full problem, and optimal when the round was solved to optimality; otherwise
the violated points join P_{r+1}. Rounds stop at the deadline with the best
feasible solution seen (the warm start included) and the best bound.

Before the first round's branch and bound, the LP relaxation (the backend's
LP solver) is rounded into an incumbent by ``solver.lpguide``, whose window
of fractional variables is solved here, exactly, as a smaller program.

>>> from solver.compiled import assemble_graph
>>> g = assemble_graph(var_ids=np.arange(2), unary=[np.array([0.0, 1.0]), np.array([2.0, 0.0])],
...     edge_u=[0], edge_v=[1], edge_costs=[np.array([[0.0, 3.0], [3.0, 0.0]])], term_var=[], term_t0=[],
...     term_t1=[], term_usage=[], base=np.zeros(0), time_points=np.zeros(0, np.int64), limit=np.inf,
...     constant=0.0)
>>> r = solve_exact(g, "cbc", deadline=time.perf_counter() + 30)
>>> r.status, r.values.tolist(), r.cost
('optimal', [1, 1], 1.0)

(tests/solver/test_exact.py checks it against brute force.)
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np

from solver.backends import get_backend
from solver.compiled import CompiledGraph
from solver.ilp import build_program
from solver.lpguide import round_and_fix
from solver.memory_points import initial_points, violated_points
from solver.tolerance import is_proven
from solver.budget import share_deadline

__all__ = ["ExactResult", "solve_exact"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ExactResult:
    """Best feasible values (or None), their cost, the best bound and how it ended."""

    values: np.ndarray | None
    cost: float | None
    bound: float
    status: str  # optimal | feasible | infeasible | timeout
    rounds: int = 0
    variables: int = 0
    constraints: int = 0
    nonzeros: int = 0
    build_seconds: float = 0.0
    solve_seconds: float = 0.0
    memory_points: int = 0
    log: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        """The figures a solution's stats show (the last lines of the backend log)."""
        return {"status": self.status, "rounds": self.rounds, "variables": self.variables,
                "constraints": self.constraints, "nonzeros": self.nonzeros, "memory_points": self.memory_points,
                "build_seconds": round(self.build_seconds, 3), "solve_seconds": round(self.solve_seconds, 3),
                "log": self.log[-6:]}


def solve_exact(
    graph: CompiledGraph,
    backend: str,
    *,
    deadline: float,
    threads: int = 1,
    start: np.ndarray | None = None,
    seed: int = 0,
    lp_heuristic: bool = True,
) -> ExactResult:
    """Solve to optimality or until ``deadline`` (a ``time.perf_counter()`` value).

    With ``lp_heuristic``, the first round solves the LP relaxation first (with
    the backend's LP solver) and builds an incumbent from it
    (``solver.lpguide``) before branch and bound.
    """
    if graph.num_vars == 0:  # the reductions decided everything
        values = np.zeros(0, dtype=np.int64)
        if violated_points(graph, values).size:
            return ExactResult(None, None, math.inf, "infeasible")
        cost = graph.cost(values)
        return ExactResult(values, cost, cost, "optimal")
    engine = get_backend(backend)
    best = None if start is None else np.asarray(start, dtype=np.int64)
    if best is not None and (violated_points(graph, best).size or not math.isfinite(graph.cost(best))):
        best = None  # a warm start must be feasible
    best_cost = math.inf if best is None else graph.cost(best)
    points = initial_points(graph, best)
    result = ExactResult(values=best, cost=None if best is None else best_cost, bound=-math.inf, status="timeout")
    while True:
        remaining = deadline - time.perf_counter()
        if remaining <= 0.05:
            break
        t0 = time.perf_counter()
        program = build_program(graph, points)
        result.build_seconds += time.perf_counter() - t0
        result.rounds += 1
        result.variables, result.constraints = program.num_vars, program.num_rows
        result.nonzeros, result.memory_points = program.num_nonzeros, int(points.size)
        if lp_heuristic and result.rounds == 1:
            improved = _lp_incumbent(graph, program, backend, deadline, threads, seed, result)
            if improved is not None and graph.cost(improved) < best_cost:
                best, best_cost = improved, graph.cost(improved)
        warm = program.solution_from_values(best, graph) if best is not None else None
        remaining = deadline - time.perf_counter()
        if remaining <= 0.05:  # building took what was left
            break
        outcome = engine.solve_program(program, time_limit=remaining, threads=threads, warm_start=warm, seed=seed)
        result.solve_seconds += outcome.seconds
        if outcome.bound is not None and math.isfinite(outcome.bound):
            result.bound = max(result.bound, min(outcome.bound, best_cost))
        line = (f"round {result.rounds}: {program.num_vars} vars, {program.num_rows} rows, "
                f"{points.size} memory points -> {outcome.status} obj={outcome.objective} bound={outcome.bound}")
        result.log.append(line)
        log.info(line)
        if outcome.status == "infeasible":
            # the relaxation is infeasible, so is the full problem
            result.status = "infeasible" if best is None else result.status
            break
        if outcome.z is None:
            break
        values = program.values_from_solution(outcome.z, graph)
        new_points = violated_points(graph, values)
        if new_points.size == 0:
            cost = graph.cost(values)
            if cost < best_cost:
                best, best_cost = values, cost
            if outcome.status == "optimal":
                result.bound = max(result.bound, min(cost, best_cost))
                result.status = "optimal" if is_proven(best_cost, result.bound) else "feasible"
                break
            break  # stopped by the time limit with a full-feasible solution
        points = np.union1d(points, new_points)
    result.values = best
    result.cost = None if best is None else best_cost
    if result.cost is not None:
        result.bound = min(result.bound, result.cost)
    if result.status == "timeout" and best is not None and is_proven(best_cost, result.bound):
        result.status = "optimal"
    return result


def _lp_incumbent(graph, program, backend, deadline, threads, seed, result):
    """Solve the LP relaxation (the backend's LP solver) and round it into an incumbent
    (solver.lpguide), whose window of fractional variables is solved by this module."""
    lp = get_backend(backend).solve_relaxation(
        program, time_limit=share_deadline("lp_relaxation", deadline) - time.perf_counter())
    result.log.append(f"LP relaxation: {lp.status} obj={lp.objective} in {lp.seconds:.2f}s")
    if lp.status != "optimal":
        return None
    result.bound = max(result.bound, lp.bound)
    window_deadline = share_deadline("lp_rounding", deadline)

    def solve_window(sub: CompiledGraph, start: np.ndarray, window_deadline: float) -> np.ndarray | None:
        return solve_exact(sub, backend, deadline=window_deadline, threads=threads, start=start, seed=seed,
                           lp_heuristic=False).values

    return round_and_fix(graph, program, lp.z, solve_window=solve_window, deadline=window_deadline, seed=seed)
