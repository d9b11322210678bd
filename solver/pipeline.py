"""``solve(problem)``: reductions, then the stages of ``solver.stages`` in order.

The problem is reduced exactly (``solver.reductions``) and compiled
(``solver.compiled``); the method is chosen by the size of the reduced
problem's integer program (``exact`` up to ``EXACT_MAX_COLUMNS`` columns,
``anytime`` beyond) and, when its treewidth is small, an elimination plan is
built. Then each stage of ``STAGES`` runs when its entry predicate holds:

1. ``heuristic``: a greedy start within the memory limit;
2. ``treedp``: bucket elimination, the optimum when no memory point binds;
3. ``colgen`` then ``restricted``: column generation's bound and prices, and
   the program over its columns' values (small treewidth with memory);
   ``lagrangian_first``: without those, a short Lagrangian pricing of memory
   before a program (it proves most memory-bound strategy graphs at once);
4. ``exact``: the whole integer program (lazy memory rows), warm-started;
5. ``wcsp``: toulbar2 with memory knapsacks, when the gap left is over 1 %;
6. ``lagrangian``: memory priced into a pairwise problem (no plan);
7. ``lns``: exact windows until the deadline.

The loop stops as soon as the incumbent is proven optimal (``is_proven``
within ``gap``). Time shares are named in ``solver.budget``. Every answer is
re-checked by ``solver.evaluate`` on the original problem before it is
returned; ``solution.stats["methods_run"]`` lists the stages that ran and
``stats["compile_seconds"]`` the numba compilation a first run paid.

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
from typing import Any, Callable, Sequence

import numpy as np

from solver.backends import DEFAULT_BACKEND, get_backend
from solver.budget import Budget
from solver.compiled import compile_graph
from solver.evaluate import evaluate
from solver.kernels import local_costs
from solver.localsearch import SearchState, descend, repair
from solver.jit import COMPILING_NOTE, CompileClock
from solver.problem import Problem
from solver.reductions import InfeasibleError, reduce_problem
from solver.solution import Solution, Status
from solver.stages import EXACT_MAX_COLUMNS, STAGES, Incumbent, Options, StageReport, View, program_columns, timed
from solver.tolerance import DEFAULT_GAP, FORBIDDEN, is_proven, over_limit

__all__ = ["solve", "METHODS", "EXACT_MAX_COLUMNS"]

log = logging.getLogger(__name__)

METHODS = ("auto", "exact", "anytime", "heuristic")

ProgressFn = Callable[[dict[str, Any]], None]


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
    initial: Sequence[int] | None = None,
) -> Solution:
    """Pick one strategy per node minimising total cost under the memory limit.

    ``time_limit`` counts from ``start_time`` (a ``time.perf_counter()``
    value, default now), so a caller can include file loading in it.
    ``threads`` defaults to all cores. ``inner`` picks the pairwise solver of
    the Lagrangian rounds (``trws``, the default, ``treedp`` or ``toulbar2``).
    ``gap``: relative gap at which a bound proves the cost optimal and the
    search stops (``solver.tolerance``).
    ``initial``: a choice (one strategy per node) to start from: when it is
    feasible and the reductions kept its values, it is the first incumbent
    (the exact stage starts from it); ``stats["initial"]`` says what became of
    it. ``progress(event)`` is called at every stage with a dict: ``stage``,
    ``seconds`` and, once known, ``cost`` (the incumbent) and ``bound``.
    Deterministic for a given ``seed`` and ``threads`` when the time limit is
    not reached.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r} (expected one of {', '.join(METHODS)})")
    get_backend(backend)  # fail early on an unknown or missing backend
    t0 = time.perf_counter() if start_time is None else start_time
    budget = Budget.for_problem(time_limit, start=t0, size=problem.num_nodes + problem.num_edges)
    options = Options(backend, threads or os.cpu_count() or 1, seed, method, inner, gap, exact_max_columns)
    run = _Run(problem, backend, t0, progress, {"method": method, "methods_run": []})
    stats = run.stats
    with run.clock.installed():
        run.emit("reduce")
        infeasible = _reduce_and_compile(run, budget)
        if infeasible is not None:
            return infeasible
        # a bound known from the start (each cost term at its cheapest): progress shows a gap at once
        run.inc = Incumbent(bound=run.graph.separable_bound())
        if initial is not None:
            if evaluate(problem, initial).feasible:
                run.inc, stats["initial"] = _warm_start(run.working, run.graph, initial, run.inc)
            else:
                stats["initial"] = "infeasible"
        view = View.build(run.graph, options, budget, run.emit)
        compiled = {"reduce+prepare": round(run.clock.seconds, 4)} if run.clock.seconds > 0 else {}
        stats["method"] = view.chosen
        if method in ("auto", "anytime") and run.graph.num_vars:
            stats["treedp"] = None if view.plan is None else {"width": view.plan.width, "work": view.plan.work}
        reports: list[StageReport] = []
        infeasible = _run_stages(run, view, budget, gap, reports)
        if infeasible is not None:
            return infeasible
        stats["stage_seconds"] = {r.label: round(r.seconds, 4) for r in reports}
        stats["compile_seconds_by_stage"] = compiled | {r.label: round(r.compile_seconds, 4)
                                                        for r in reports if r.compile_seconds > 0}
    inc = run.inc
    if inc.values is None:
        status = Status.TIMEOUT if budget.expired() else Status.INFEASIBLE
        return run.finish(status, None, _infeasible_message(view, reports))
    if is_proven(inc.cost, inc.bound, gap):
        return run.finish(Status.OPTIMAL, inc.values)
    return run.finish(Status.TIMEOUT if budget.expired(0.1) else Status.FEASIBLE, inc.values)


class _Run:
    """One call of :func:`solve`: its start, statistics, incumbent, the reduced and compiled
    problem once made, and the progress events it reports."""

    def __init__(self, problem: Problem, backend: str, t0: float, progress: ProgressFn | None,
                 stats: dict[str, Any]) -> None:
        self.problem, self.backend, self.t0, self.progress, self.stats = problem, backend, t0, progress, stats
        self.inc = Incumbent()
        self.reported = math.inf  # the last cost a progress event showed
        self.working: Any = None
        self.graph: Any = None
        self.clock = CompileClock(on_first=lambda: self.emit(COMPILING_NOTE))

    def emit(self, stage: str, **data: Any) -> None:
        # every event carries the best bound proven so far, once there is one
        if self.progress is not None:
            extra = {"bound": self.inc.bound} if math.isfinite(self.inc.bound) else {}
            self.progress({"stage": stage, "seconds": time.perf_counter() - self.t0, **extra, **data})
        if "cost" in data and data["cost"] is not None:
            self.reported = min(self.reported, data["cost"])

    def finish(self, status: Status, values: Any, message: str = "") -> Solution:
        """The solution of ``values`` (None: none), checked by ``evaluate`` on the original problem."""
        problem = self.problem
        choice = () if values is None else tuple(self.working.reconstruct(self.graph.values_to_dict(values)))
        cost = peak = None
        # a problem with no nodes has one solution, the empty choice (its cost is the constant)
        if choice or (not problem.num_nodes and status is not Status.INFEASIBLE):
            check = evaluate(problem, choice)
            cost, peak = check.cost, check.peak_memory_bytes
            if not check.feasible:
                raise RuntimeError(f"internal error: solver produced an infeasible choice: {check.violations[:3]}")
        bound = self.inc.bound if math.isfinite(self.inc.bound) and status is not Status.INFEASIBLE else None
        if status is Status.OPTIMAL or (bound is not None and cost is not None and bound > cost):
            bound = cost  # proven, or rounding in a backend made the bound exceed the cost
        self.stats["compile_seconds"] = round(self.clock.seconds, 4)
        return Solution(choice=choice, cost=cost, lower_bound=bound, status=status,
                        seconds=time.perf_counter() - self.t0, backend=self.backend, message=message,
                        peak_memory_bytes=peak, stats=self.stats)


def _reduce_and_compile(run: _Run, budget: Budget) -> Solution | None:
    """Reduce the problem exactly and compile it into ``run``; the infeasible solution when
    the reductions or the memory no choice avoids prove there is none."""
    try:
        run.working, report = reduce_problem(run.problem, time_limit=budget.share("reduce").left())
    except InfeasibleError as exc:
        return run.finish(Status.INFEASIBLE, None, str(exc))
    run.stats["reduction"] = report.to_dict()
    graph = run.graph = compile_graph(run.working)
    run.stats["compiled"] = {"variables": graph.num_vars, "edges": graph.num_edges,
                             "time_points": graph.num_times, "memory_segments": int(graph.term_var.size),
                             "program_columns": program_columns(graph)}
    if graph.num_times and graph.base.max() > graph.limit:
        return run.finish(Status.INFEASIBLE, None,
                          f"memory limit {graph.limit:.6g} is below the memory that no choice avoids "
                          f"({graph.base.max():.6g}); the smallest achievable peak is at least that")
    return None


def _run_stages(run: _Run, view: View, budget: Budget, gap: float, reports: list[StageReport]) -> Solution | None:
    """Run the stages in order until the incumbent is proven (each stage's report appended to
    ``reports``); the infeasible solution when a stage proves there is none."""
    stats = run.stats
    for stage in STAGES:
        if run.inc.proven(gap):
            break
        if not stage.enters(view, run.inc, budget):
            continue
        run.emit(stage.name, **({} if run.inc.values is None else {"cost": run.inc.cost}))
        result = timed(stage, view, run.inc, budget, run.clock)
        reports.append(result.report)
        stats["methods_run"].append(result.report.label)
        if stage.key is not None and result.report.details is not None:
            stats[stage.key] = dict(result.report.details)
        if run.inc.values is None and result.best is not None:
            stats["first_feasible_seconds"] = round(time.perf_counter() - run.t0, 4)
        run.inc = run.inc.absorb(result, run.graph)
        if run.inc.values is not None and run.inc.cost < run.reported:
            run.emit("feasible" if math.isinf(run.reported) else "improved", cost=run.inc.cost)
        if result.infeasible:
            return run.finish(Status.INFEASIBLE, None, _infeasible_message(view, reports))
    return None


def _warm_start(working: Any, graph: Any, initial: Sequence[int], inc: Incumbent) -> tuple[Incumbent, str]:
    """The incumbent from a given choice, and what became of it: ``used``;
    ``completed`` (some of its values were reduced away, as dominated, and the
    variables took their cheapest value given the others, then a repair to the
    memory limit); ``infeasible`` (a forbidden cost or over the limit even so)."""
    values = working.project(initial)
    x = np.array([-1 if values[int(v)] is None else values[int(v)] for v in graph.var_ids], dtype=np.int64)
    missing = np.flatnonzero(x < 0)
    how = "used"
    if missing.size:
        how = "completed"
        arr = graph.arrays
        x[missing] = 0
        buf = np.empty(int(graph.dom.max()))
        for v in missing:  # the cheapest value given the others (a dominating value is among them)
            local_costs(arr, x, int(v), buf)
            x[v] = int(np.argmin(buf[: graph.dom[v]]))
        state = SearchState(arr, x, graph.num_times)
        if not state.feasible():
            repair(arr, state.x, state.tree, state.pend, 10_000)
            if state.feasible():
                descend(state, enforce=True)
        x = state.x
    cost = graph.cost(x)
    if not math.isfinite(cost) or cost >= FORBIDDEN:
        return inc, "infeasible"
    if graph.num_times and over_limit(graph.memory_profile(x) - graph.limit, graph.limit).any():
        return inc, "infeasible"
    return Incumbent(x, cost, inc.bound, inc.dual, "initial"), how


def _infeasible_message(view: View, reports: list[StageReport]) -> str:
    graph = view.graph
    floor = float(graph.base.max()) if graph.num_times else 0.0
    greedy = next((r.details for r in reports if r.label == "greedy"), None)
    reached = greedy["peak"] if greedy else math.nan
    return (f"no choice found within the memory limit {graph.limit:.6g}; the smallest achievable peak "
            f"is at least {floor:.6g} (the heuristic reached {reached:.6g})")
