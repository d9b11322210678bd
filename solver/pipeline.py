"""``solve(problem)``: reductions, a feasible start, then exact or anytime search.

When the reduced graph has small treewidth (``solver.treedp`` finds an
elimination order whose tables fit the time left), the pairwise problem
without memory is minimised exactly by bucket elimination: that alone is the
optimum when no memory point can bind; otherwise column generation
(``solver.colgen``) prices the memory rows to the Dantzig-Wolfe bound, the
integer program over the values its mixed columns use gives a solution near
it, and Lagrangian reduced-cost fixing drops the values that cannot beat
that solution before the exact stage. (Transformer-shaped training graphs
take this path; the IOPDDL graphs have too large a treewidth.)

The method is then chosen by the size of the reduced problem's integer
program (``solver.ilp``): when it has at most ``exact_max_columns`` columns
the whole program is solved with the chosen backend (memory rows added
lazily, ``solver.exact``), warm-started from the best solution so far;
otherwise the anytime search of ``solver.anytime`` improves it until the time
limit, solving windows exactly with the same backend. What the exact stage
leaves unproven goes, in order, to toulbar2 with memory as knapsack
constraints (``solver.wcsp``, when pytoulbar2 is installed and the model is
small), to Lagrangian pricing of the memory limit (``solver.lagrangian``,
skipped after column generation) and to the windows of ``solver.anytime``.
Every answer is re-checked by ``solver.evaluate`` on the original problem
before it is returned; the stages that ran are listed in
``solution.stats["methods_run"]``.

>>> from solver.problem import Problem
>>> p = Problem.from_dict({"nodes": [{"cost": [1, 2]}, {"cost": [3, 0]}],
...     "edges": [{"src": 0, "dst": 1, "cost": [[0, 5], [5, 0]]}]})
>>> s = solve(p, time_limit=10)
>>> s.choice, s.cost, s.status.value
((1, 1), 2.0, 'optimal')
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any, Callable

import numpy as np

from solver.anytime import improve
from solver.backends import DEFAULT_BACKEND, get_backend
from solver.colgen import column_generation, fix_by_reduced_cost, solve_restricted
from solver.compiled import CompiledGraph, compile_graph
from solver.evaluate import evaluate
from solver.exact import solve_exact
from solver.kernels import to_arrays
from solver.lagrangian import price_and_repair
from solver.localsearch import greedy
from solver.problem import Problem
from solver.reductions import InfeasibleError, reduce_problem
from solver.solution import Solution, Status
from solver.tolerance import DEFAULT_GAP, is_proven
from solver.treedp import plan_elimination, solve_plan
from solver.wcsp import solve_wcsp, solve_wcsp_lazy, wcsp_eligible, wcsp_lazy_eligible
from solver.window import from_restricted, restrict_values, to_restricted

__all__ = ["solve", "METHODS", "EXACT_MAX_COLUMNS"]

log = logging.getLogger(__name__)

METHODS = ("auto", "exact", "anytime", "heuristic")
# auto: exact for programs up to EXACT_MAX_COLUMNS columns (then, if not proven
# optimal in half the time, the anytime stages), anytime beyond.
EXACT_MAX_COLUMNS = 150_000
# toulbar2 (solver.wcsp) runs when its model is small and the exact stage left a
# gap above this: it closes memory-bound problems whose LP bound is weak
# (IOPDDL V: LP bound 0.65 of the optimum, solved to the optimum in 300 s).
# With too many memory points to post (IOPDDL D: 15,373 after pruning) it
# runs with lazily added knapsacks, only after an exact stage.
WCSP_MIN_GAP = 0.01
# Graphs of small treewidth are minimised exactly by bucket elimination
# (solver.treedp): alone when no memory point can bind, as the pricing step of
# column generation (solver.colgen) otherwise. The plan is built when one
# elimination pass fits DP_PASSES times into the time left (about 3 ns per
# table entry and factor, measured on 2 cores).
DP_PASSES = 40
DP_SECONDS_PER_UNIT = 3e-9
PLAN_SECONDS = 15.0  # the 60,000-node transformer graph needs about 8 s

ProgressFn = Callable[[dict[str, Any]], None]


def _program_columns(graph: CompiledGraph) -> int:
    return int(graph.unary_off[-1]) + int(np.isfinite(graph.edge_cost).sum())


def solve(
    problem: Problem,
    *,
    backend: str = DEFAULT_BACKEND,
    time_limit: float = 60.0,
    threads: int | None = None,
    seed: int = 0,
    method: str = "auto",
    start_time: float | None = None,
    progress: ProgressFn | None = None,
    exact_max_columns: int = EXACT_MAX_COLUMNS,
    inner: str | None = None,
    gap: float = DEFAULT_GAP,
) -> Solution:
    """Pick one strategy per node minimising total cost under the memory limit.

    ``time_limit`` counts from ``start_time`` (a ``time.perf_counter()``
    value, default now), so a caller can include file loading in it.
    ``threads`` defaults to all cores. ``inner`` picks the pairwise solver of
    the Lagrangian rounds (``trws``, the default, ``treedp`` or ``toulbar2``).
    ``gap``: relative gap at which a bound proves the cost optimal and the
    search stops (``solver.tolerance``).
    ``progress(event)`` is called at every stage with a dict: ``stage``,
    ``seconds`` and, once known, ``cost`` (the incumbent) and ``bound``.
    Deterministic for a given ``seed`` and ``threads`` when the time limit is
    not reached.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r} (expected one of {', '.join(METHODS)})")
    get_backend(backend)  # fail early on an unknown or missing backend
    t0 = time.perf_counter() if start_time is None else start_time
    # Leave time to rebuild the choice, check it and write it (about 5 us per
    # node and edge, measured on the IOPDDL instances) and for a stage to stop
    # (a killed backend) before the limit.
    finish_margin = 1.0 + 1e-5 * (problem.num_nodes + problem.num_edges)
    deadline = t0 + max(time_limit - finish_margin, 0.5 * time_limit)
    threads = threads or os.cpu_count() or 1
    stats: dict[str, Any] = {"method": method, "methods_run": []}
    bound = -math.inf  # best lower bound so far (raised by the stages below)

    def emit(stage: str, **data: Any) -> None:
        # every event carries the best bound proven so far, once there is one
        if progress is not None:
            extra = {"bound": bound} if math.isfinite(bound) else {}
            progress({"stage": stage, "seconds": time.perf_counter() - t0, **extra, **data})

    def finish(status: Status, choice: tuple[int, ...], bound: float | None, message: str = "") -> Solution:
        cost = peak = None
        # a problem with no nodes has one solution, the empty choice (its cost is the constant)
        if choice or (not problem.num_nodes and status is not Status.INFEASIBLE):
            check = evaluate(problem, choice)
            cost, peak = check.cost, check.peak_memory_bytes
            if not check.feasible:
                raise RuntimeError(f"internal error: solver produced an infeasible choice: {check.violations[:3]}")
        if bound is not None and cost is not None and bound > cost:
            bound = cost  # rounding in a backend must not make the bound exceed the cost
        return Solution(choice=choice, cost=cost, lower_bound=bound, status=status,
                        seconds=time.perf_counter() - t0, backend=backend, message=message,
                        peak_memory_bytes=peak, stats=stats)

    emit("reduce")
    try:
        working, report = reduce_problem(problem, time_limit=max(0.25 * (deadline - time.perf_counter()), 1.0))
    except InfeasibleError as exc:
        return finish(Status.INFEASIBLE, (), None, str(exc))
    stats["reduction"] = report.to_dict()
    graph = compile_graph(working)
    arr = to_arrays(graph)
    stats["compiled"] = {"variables": graph.num_vars, "edges": graph.num_edges,
                         "time_points": graph.num_times, "memory_segments": int(graph.term_var.size),
                         "program_columns": _program_columns(graph)}

    def to_choice(values: np.ndarray) -> tuple[int, ...]:
        return tuple(working.reconstruct(graph.values_to_dict(values)))

    if graph.num_times and graph.base.max() > graph.limit:
        return finish(Status.INFEASIBLE, (), None,
                      f"memory limit {graph.limit:.6g} is below the memory that no choice avoids "
                      f"({graph.base.max():.6g}); the smallest achievable peak is at least that")

    emit("heuristic")
    rng = np.random.default_rng(seed)
    state = greedy(arr, graph.num_times, rng=rng, deadline=deadline)
    stats["methods_run"].append("greedy")
    # feasible = within the memory limit and free of forbidden costs
    best = state.x.copy() if state.feasible() and math.isfinite(graph.cost(state.x)) else None
    if best is not None:
        stats["first_feasible_seconds"] = round(time.perf_counter() - t0, 4)
        stats["heuristic_cost"] = graph.cost(best)
        emit("feasible", cost=graph.cost(best))
    plan = prices = None  # prices: the column generation's multipliers of its best bound
    if method in ("auto", "anytime") and graph.num_vars:
        budget = max(deadline - time.perf_counter(), 0.0)
        # the order search gives up after a short while: graphs of large
        # treewidth (the IOPDDL ones) are recognised only by trying
        plan = plan_elimination(graph, max_work=int(budget / DP_PASSES / DP_SECONDS_PER_UNIT),
                                deadline=time.perf_counter() + min(PLAN_SECONDS, 0.05 * budget))
        stats["treedp"] = None if plan is None else {"width": plan.width, "work": plan.work}
    if plan is not None and (graph.num_times == 0 or not math.isfinite(graph.limit)):
        # no memory point can bind: one elimination pass is the optimum
        emit("treedp")
        values, value = solve_plan(plan, graph)
        stats["methods_run"].append("treedp")
        if math.isfinite(value):
            return finish(Status.OPTIMAL, to_choice(values), graph.cost(values))
    if plan is not None and best is not None and graph.num_times and time.perf_counter() < deadline - 1.0:
        emit("colgen", cost=graph.cost(best))
        state = _state_for(arr, graph, best)
        cg = column_generation(graph, state, plan, seed=seed, on_improve=lambda c: emit("improved", cost=c),
                               deadline=time.perf_counter() + 0.4 * (deadline - time.perf_counter()))
        stats["methods_run"].append("colgen:treedp")
        stats["colgen"] = cg.to_dict()
        bound = max(bound, cg.bound)
        best = state.x.copy()
        if cg.support and not is_proven(graph.cost(best), bound, gap) \
                and time.perf_counter() < deadline - 1.0:
            emit("restricted", cost=graph.cost(best))
            values = solve_restricted(graph, cg.support, best, backend=backend, threads=threads, seed=seed,
                                      deadline=time.perf_counter() + 0.5 * (deadline - time.perf_counter()))
            stats["methods_run"].append(f"restricted:{backend}")
            if values is not None:
                best = values
                emit("improved", cost=graph.cost(best))
        if is_proven(graph.cost(best), bound, gap):
            return finish(Status.OPTIMAL, to_choice(best), graph.cost(best))
        prices = cg.prices
    chosen = method
    if method == "auto":
        chosen = "exact" if _program_columns(graph) <= exact_max_columns else "anytime"
    stats["method"] = chosen

    wcsp_rows = wcsp_eligible(graph) if chosen in ("anytime", "exact") and method != "exact" else None
    # too many memory points to post at once: after an exact stage, knapsacks go in lazily
    wcsp_lazy = wcsp_rows is None and chosen == "exact" and method != "exact" and bool(graph.num_times) \
        and wcsp_lazy_eligible(graph)
    if chosen == "exact" or (best is None and chosen != "heuristic"):
        emit("exact", backend=backend)
        # a small program gets up to half the time (a third when toulbar2 comes
        # next) to finish or prove alone; what it leaves goes to the search
        # below, from its best solution
        share = 0.5 if wcsp_rows is None else 1 / 3
        exact_deadline = deadline if chosen == "exact" and method == "exact" else \
            time.perf_counter() + share * (deadline - time.perf_counter())
        allowed = None
        if prices is not None and best is not None:
            # the exact stage only needs the values that can still beat the
            # incumbent; its bound stays valid for the whole problem
            allowed = fix_by_reduced_cost(graph, plan, prices, graph.cost(best), best)
            stats["colgen"]["values_kept"] = sum(a.size for a in allowed)
            if stats["colgen"]["values_kept"] == int(graph.dom.sum()):
                allowed = None
        if allowed is None:
            result = solve_exact(graph, backend, deadline=exact_deadline, threads=threads, start=best, seed=seed)
        else:
            result = solve_exact(restrict_values(graph, allowed), backend, deadline=exact_deadline, threads=threads,
                                 seed=seed, start=to_restricted(allowed, best))
            if result.values is not None:
                result.values = from_restricted(allowed, result.values)
        stats["methods_run"].append(f"exact:{backend}")
        stats["exact"] = {"rounds": result.rounds, "variables": result.variables, "constraints": result.constraints,
                          "nonzeros": result.nonzeros, "memory_points": result.memory_points,
                          "build_seconds": round(result.build_seconds, 3),
                          "solve_seconds": round(result.solve_seconds, 3), "log": result.log[-6:]}
        bound = max(bound, result.bound)
        if result.status == "infeasible":
            return finish(Status.INFEASIBLE, (), None, _infeasible_message(graph, state))
        if result.values is not None:
            best = result.values
            if result.status == "optimal":
                return finish(Status.OPTIMAL, to_choice(best), graph.cost(best))
            if "first_feasible_seconds" not in stats:
                stats["first_feasible_seconds"] = round(time.perf_counter() - t0, 4)

    use_wcsp = wcsp_rows is not None or (wcsp_lazy and best is not None)
    if use_wcsp and best is not None and math.isfinite(bound) \
            and graph.cost(best) - bound <= WCSP_MIN_GAP * max(abs(graph.cost(best)), 1e-300):
        use_wcsp = False  # the LP bound is already tight: the rest goes to local improvement
    if use_wcsp and time.perf_counter() < deadline - 1.0:
        emit("wcsp", cost=None if best is None else graph.cost(best))
        if wcsp_rows is not None:
            tb2 = solve_wcsp(graph, deadline=time.perf_counter() + 0.6 * (deadline - time.perf_counter()),
                             start=best, seed=seed, rows=wcsp_rows)
            stats["methods_run"].append("wcsp:toulbar2")
        else:
            tb2 = solve_wcsp_lazy(graph, deadline=time.perf_counter() + 0.8 * (deadline - time.perf_counter()),
                                  start=best, seed=seed)
            stats["methods_run"].append("wcsp-lazy:toulbar2")
        stats["wcsp"] = tb2.to_dict()
        bound = max(bound, tb2.bound)
        if tb2.values is not None and (best is None or graph.cost(tb2.values) < graph.cost(best)):
            best = tb2.values
            stats.setdefault("first_feasible_seconds", round(time.perf_counter() - t0, 4))
            emit("improved", cost=graph.cost(best))
        if best is not None and is_proven(graph.cost(best), bound, gap):
            return finish(Status.OPTIMAL, to_choice(best), graph.cost(best))
        if tb2.status == "infeasible" and best is None:
            return finish(Status.INFEASIBLE, (), None, _infeasible_message(graph, state))

    if best is not None and is_proven(graph.cost(best), bound, gap):
        return finish(Status.OPTIMAL, to_choice(best), graph.cost(best))
    if chosen in ("anytime", "exact") and method != "exact" and best is not None and graph.num_times \
            and plan is None:  # with a plan, column generation already priced memory exactly
        emit("lagrangian", cost=graph.cost(best))
        state = _state_for(arr, graph, best)
        lag_deadline = time.perf_counter() + 0.7 * (deadline - time.perf_counter())
        lag = price_and_repair(graph, state, deadline=lag_deadline, seed=seed, inner=inner, gap=gap,
                               on_improve=lambda c: emit("improved", cost=c))
        stats["methods_run"].append(f"lagrangian:{lag.inner}")
        stats["lagrangian"] = lag.to_dict()
        bound = max(bound, lag.bound)
        best = state.x.copy()

    if best is not None and is_proven(graph.cost(best), bound, gap):
        return finish(Status.OPTIMAL, to_choice(best), graph.cost(best))
    if chosen in ("anytime", "exact") and method != "exact" and best is not None \
            and time.perf_counter() < deadline - 0.1:
        emit("lns", cost=graph.cost(best))
        state = _state_for(arr, graph, best)
        report_any = improve(graph, arr, state, backend=backend, deadline=deadline, threads=threads, seed=seed,
                             on_improve=lambda c: emit("improved", cost=c))
        stats["methods_run"].append(f"lns:{backend}")
        stats["anytime"] = report_any.to_dict()
        best = state.x.copy()

    if best is None:
        status = Status.TIMEOUT if time.perf_counter() >= deadline else Status.INFEASIBLE
        return finish(status, (), None if not math.isfinite(bound) else bound, _infeasible_message(graph, state))
    cost = graph.cost(best)
    final_bound = bound if math.isfinite(bound) else None
    if final_bound is not None and is_proven(cost, final_bound, gap):
        return finish(Status.OPTIMAL, to_choice(best), cost)
    status = Status.TIMEOUT if time.perf_counter() >= deadline - 0.1 else Status.FEASIBLE
    return finish(status, to_choice(best), final_bound)


def _state_for(arr, graph: CompiledGraph, values: np.ndarray):
    from solver.localsearch import SearchState

    return SearchState(arr, values, graph.num_times)


def _infeasible_message(graph: CompiledGraph, state) -> str:
    floor = float(graph.base.max()) if graph.num_times else 0.0
    reached = state.peak() if state is not None else math.nan
    return (f"no choice found within the memory limit {graph.limit:.6g}; the smallest achievable peak "
            f"is at least {floor:.6g} (the heuristic reached {reached:.6g})")
