"""The stages of a solve: each ``(view, incumbent, budget) -> StageResult``.

A stage sees the reduced problem through a :class:`View` (the compiled graph,
the options, and what was decided before any stage ran: the method, an
elimination plan when the treewidth is small, toulbar2's knapsack rows), the
best solution so far as an :class:`Incumbent` (values, cost, the best lower
bound and, after column generation, its dual prices), and its share of the
time as a :class:`solver.budget.Budget`. It returns its best values (never
worse than the incumbent it got), a lower bound valid for the whole reduced
problem, and a frozen :class:`StageReport`. The pipeline
(``solver.pipeline``) runs them in order, each behind a named entry
predicate, and stops as soon as the incumbent is proven optimal
(``solver.tolerance.is_proven``).

==============  ===========================================================
stage           what it adds
==============  ===========================================================
heuristic       greedy start within the memory limit (``solver.localsearch``)
treedp          the optimum by bucket elimination when no memory binds
colgen          Dantzig-Wolfe bound and prices, priced candidates
restricted      the integer program over column generation's values
lagrangian      (first) a short pricing of memory before the program, when no plan priced it
wcsp            (first) a short toulbar2 run before a large program (``WCSP_FIRST_COLUMNS``)
exact           the whole integer program, lazy memory rows (``solver.exact``)
wcsp            toulbar2 with memory knapsacks (``solver.wcsp``)
lagrangian      memory priced, TRW-S rounds and repairs (``solver.lagrangian``)
lns             exact windows until the deadline (``solver.anytime``)
==============  ===========================================================
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Callable, Mapping

import numpy as np

from solver.anytime import improve
from solver.budget import MIN_LNS_SECONDS, MIN_STAGE_SECONDS, Budget
from solver.colgen import column_generation, fix_by_reduced_cost, solve_restricted
from solver.compiled import CompiledGraph
from solver.exact import solve_exact
from solver.lagrangian import price_and_repair
from solver.localsearch import SearchState, greedy
from solver.restrict import from_restricted, restrict_values, to_restricted
from solver.tolerance import TINY, is_proven
from solver.treedp import EliminationPlan, plan_elimination, solve_plan
from solver.wcsp import solve_wcsp, solve_wcsp_lazy, wcsp_eligible, wcsp_lazy_eligible

__all__ = ["Options", "View", "Dual", "Incumbent", "StageReport", "StageResult", "Stage",
           "EXACT_MAX_COLUMNS", "WCSP_FIRST_COLUMNS", "WCSP_MIN_GAP"]

# auto: exact for programs up to EXACT_MAX_COLUMNS columns (then, if not proven
# optimal in half the time, the search stages), anytime beyond.
EXACT_MAX_COLUMNS = 150_000
# A program of at least this many columns gets a short toulbar2 run before it, where toulbar2 can post its
# knapsacks: measured on tiny LLaMA 2x2 (2026-12-06), CBC proved the unpinned 12K-column program in 0.3 s
# and left the 109K-column program under DDP's pins unproven after 4.1 s, which toulbar2 proved in 0.05 s.
# Below it CBC usually proves at once and toulbar2's fork would be the larger cost.
WCSP_FIRST_COLUMNS = 50_000
# toulbar2 runs when its model is small and the exact stage left a gap above
# this: it closes memory-bound problems whose LP bound is weak (IOPDDL V: LP
# bound 0.65 of the optimum, solved to the optimum in 300 s). With too many
# memory points to post (IOPDDL D: 15,373 after pruning) it runs with lazily
# added knapsacks, only after an exact stage.
WCSP_MIN_GAP = 0.01
# The elimination plan is built when one pass fits DP_PASSES times into the
# time left (about 3 ns per table entry and factor, measured on 2 cores).
DP_PASSES = 40
DP_SECONDS_PER_UNIT = 3e-9


@dataclass(frozen=True)
class Options:
    """The caller's choices, as ``solver.solve`` received them."""

    backend: str
    threads: int
    seed: int
    method: str  # auto | exact | anytime | heuristic
    inner: str | None
    gap: float
    exact_max_columns: int = EXACT_MAX_COLUMNS


@dataclass(frozen=True, eq=False)
class View:
    """The reduced problem as the stages see it, and what was decided before they run."""

    graph: CompiledGraph
    options: Options
    chosen: str  # the method after "auto": exact | anytime | heuristic
    plan: EliminationPlan | None  # bucket elimination order, when the treewidth is small
    wcsp_rows: list | None  # toulbar2's knapsack rows, when few enough to post at once
    wcsp_lazy: bool  # toulbar2 with knapsacks added lazily, after the exact stage
    emit: Callable[..., None] = field(repr=False)

    @classmethod
    def build(cls, graph: CompiledGraph, options: Options, budget: Budget, emit: Callable[..., None]) -> "View":
        method = options.method
        chosen = method
        if method == "auto":
            chosen = "exact" if program_columns(graph) <= options.exact_max_columns else "anytime"
        plan = None
        if method in ("auto", "anytime") and graph.num_vars:
            # the order search gives up after a short while: graphs of large
            # treewidth (the IOPDDL ones) are recognised only by trying
            plan = plan_elimination(graph, max_work=int(budget.left() / DP_PASSES / DP_SECONDS_PER_UNIT),
                                    deadline=budget.share("elimination_order").deadline)
        searching = chosen in ("anytime", "exact") and method != "exact"
        rows = wcsp_eligible(graph) if searching else None
        # too many memory points to post at once: after an exact stage, knapsacks go in lazily
        lazy = rows is None and searching and chosen == "exact" and bool(graph.num_times) \
            and wcsp_lazy_eligible(graph)
        return cls(graph, options, chosen, plan, rows, lazy, emit)

    @property
    def searching(self) -> bool:
        """Whether the search stages (toulbar2, pricing, windows) may run after the first answer."""
        return self.chosen in ("anytime", "exact") and self.options.method != "exact"


def program_columns(graph: CompiledGraph) -> int:
    """Columns of the reduced problem's integer program (``solver.ilp``)."""
    return int(graph.unary_off[-1]) + int(np.isfinite(graph.edge_cost).sum())


@dataclass(frozen=True)
class Dual:
    """Column generation's memory prices (of its best bound) and the columns' values."""

    prices: np.ndarray | None
    """None when no pricing round ended before the deadline (a loaded machine): no value can be ruled out."""
    support: list


@dataclass(frozen=True, eq=False)
class Incumbent:
    """The best values so far (``None`` before the first feasible one), their cost, the best bound."""

    values: np.ndarray | None = None
    cost: float = math.inf
    bound: float = -math.inf
    dual: Dual | None = None
    source: str = ""
    """Where the values came from: a stage's label, ``initial`` (a warm start), ``""`` (none yet)."""

    def proven(self, gap: float) -> bool:
        return self.values is not None and is_proven(self.cost, self.bound, gap)

    def absorb(self, result: "StageResult", graph: CompiledGraph) -> "Incumbent":
        """The incumbent after a stage: its values when they cost no more than the incumbent's (a
        stage that does not start from the incumbent, the greedy, can return worse ones: taking
        them threw a warm start away, and toulbar2, which tries the incumbent's values first, then
        searched from the worse ones: tiny Mistral's overlap round 4.1 s instead of 1 s), the better bound."""
        values, cost, source = self.values, self.cost, self.source
        if result.best is not None:
            new_cost = graph.cost(result.best)
            if values is None or new_cost <= cost:
                values, cost, source = result.best, new_cost, result.report.label
        return Incumbent(values, cost, max(self.bound, result.bound),
                         result.dual if result.dual is not None else self.dual, source)


@dataclass(frozen=True)
class StageReport:
    """What a stage did: its entry in ``methods_run``, its figures, its time and compile time."""

    label: str
    details: Mapping[str, Any] | None = None
    seconds: float = 0.0
    compile_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "details": None if self.details is None else dict(self.details),
                "seconds": round(self.seconds, 4), "compile_seconds": round(self.compile_seconds, 4)}


def _report(label: str, details: Mapping[str, Any] | None = None) -> StageReport:
    return StageReport(label, None if details is None else MappingProxyType(dict(details)))


@dataclass(frozen=True, eq=False)
class StageResult:
    """A stage's best values (``None``: nothing better than the incumbent), its bound, its report."""

    best: np.ndarray | None
    bound: float
    report: StageReport
    infeasible: bool = False  # proven: no choice fits the memory limit
    dual: Dual | None = None

    def timed(self, seconds: float, compile_seconds: float) -> "StageResult":
        return replace(self, report=replace(self.report, seconds=seconds, compile_seconds=compile_seconds))


Predicate = Callable[[View, Incumbent, Budget], bool]
Run = Callable[[View, Incumbent, Budget], StageResult]


@dataclass(frozen=True)
class Stage:
    """A named step of the pipeline: it runs when ``enters`` holds."""

    name: str
    key: str | None  # where its details go in the solution's stats
    enters: Predicate
    run: Run


# -- the stages -----------------------------------------------------------------------------
def run_greedy(view: View, inc: Incumbent, budget: Budget) -> StageResult:
    g = view.graph
    state = greedy(view.graph.arrays, g.num_times, rng=np.random.default_rng(view.options.seed), deadline=budget.deadline)
    cost = g.cost(state.x)
    # feasible = within the memory limit and free of forbidden costs
    feasible = state.feasible() and math.isfinite(cost)
    details = {"feasible": feasible, "cost": cost if feasible else None, "peak": float(state.peak())}
    return StageResult(state.x.copy() if feasible else None, -math.inf, _report("greedy", details))


def run_treedp(view: View, inc: Incumbent, budget: Budget) -> StageResult:
    values, value = solve_plan(view.plan, view.graph)
    if not math.isfinite(value):
        return StageResult(None, -math.inf, _report("treedp"))
    # no memory point can bind: one elimination pass is the optimum
    return StageResult(values, view.graph.cost(values), _report("treedp"))


def run_colgen(view: View, inc: Incumbent, budget: Budget) -> StageResult:
    state = SearchState(view.graph.arrays, inc.values, view.graph.num_times)
    cg = column_generation(view.graph, state, view.plan, seed=view.options.seed,
                           on_improve=lambda c: view.emit("improved", cost=c),
                           deadline=budget.share("colgen").deadline)
    return StageResult(state.x.copy(), cg.bound, _report("colgen:treedp", cg.to_dict()),
                       dual=Dual(cg.prices, cg.support))


def run_restricted(view: View, inc: Incumbent, budget: Budget) -> StageResult:
    o = view.options
    values = solve_restricted(view.graph, inc.dual.support, inc.values, backend=o.backend, threads=o.threads,
                              seed=o.seed, deadline=budget.share("restricted").deadline)
    return StageResult(values, -math.inf, _report(f"restricted:{o.backend}"))


def run_wcsp_first(view: View, inc: Incumbent, budget: Budget) -> StageResult:
    """A short toulbar2 run before a large program (:data:`WCSP_FIRST_COLUMNS`): it proves many
    strategy graphs the program would spend its whole share on; what it leaves, the program starts from."""
    g, seed = view.graph, view.options.seed
    tb2 = solve_wcsp(g, deadline=budget.share("wcsp_first").deadline, start=inc.values, seed=seed,
                     rows=view.wcsp_rows, phase=inc.source not in ("", "greedy"))
    return _toulbar2_result(g, inc, tb2, "wcsp-first:toulbar2")


def run_exact(view: View, inc: Incumbent, budget: Budget) -> StageResult:
    g, o = view.graph, view.options
    if view.chosen == "exact" and o.method == "exact":
        deadline = budget.deadline
    else:
        deadline = budget.share("exact" if view.wcsp_rows is None else "exact_before_wcsp").deadline
    allowed, extra = None, {}
    if inc.dual is not None and inc.dual.prices is not None and inc.values is not None:
        # only the values that can still beat the incumbent; the bound stays valid for the whole problem
        allowed = fix_by_reduced_cost(g, view.plan, inc.dual.prices, inc.cost, inc.values)
        extra["values_kept"] = sum(a.size for a in allowed)
        if extra["values_kept"] == int(g.dom.sum()):
            allowed = None
    if allowed is None:
        result = solve_exact(g, o.backend, deadline=deadline, threads=o.threads, start=inc.values, seed=o.seed)
    else:
        result = solve_exact(restrict_values(g, allowed), o.backend, deadline=deadline, threads=o.threads,
                             seed=o.seed, start=to_restricted(allowed, inc.values))
        if result.values is not None:
            result.values = from_restricted(allowed, result.values)
    bound = result.bound
    if result.status == "optimal" and result.values is not None:
        bound = g.cost(result.values)
    return StageResult(result.values, bound, _report(f"exact:{o.backend}", {**result.to_dict(), **extra}),
                       infeasible=result.status == "infeasible" and inc.values is None)


def run_wcsp(view: View, inc: Incumbent, budget: Budget) -> StageResult:
    g, seed = view.graph, view.options.seed
    # the greedy's values bound the search but are not its first values: toulbar2 trying them first
    # proved tiny Mistral 2x2 (253 variables) in 2.9 s, from its own order in 0.9 s (with the cost
    # bound alone: 1.1 s); a warm start's or a search stage's values it does try first (0.2 s)
    phase = inc.source not in ("", "greedy")
    if view.wcsp_rows is not None:
        tb2 = solve_wcsp(g, deadline=budget.share("wcsp").deadline, start=inc.values, seed=seed,
                         rows=view.wcsp_rows, phase=phase)
        label = "wcsp:toulbar2"
    else:
        tb2 = solve_wcsp_lazy(g, deadline=budget.share("wcsp_lazy").deadline, start=inc.values, seed=seed)
        label = "wcsp-lazy:toulbar2"
    return _toulbar2_result(g, inc, tb2, label)


def _toulbar2_result(g: CompiledGraph, inc: Incumbent, tb2: Any, label: str) -> StageResult:
    """A toulbar2 run's values where they beat the incumbent, its bound, and infeasibility where
    neither it nor the stages before found any values."""
    better = tb2.values if tb2.values is not None and (inc.values is None or g.cost(tb2.values) < inc.cost) \
        else None
    return StageResult(better, tb2.bound, _report(label, tb2.to_dict()),
                       infeasible=tb2.status == "infeasible" and inc.values is None and better is None)


def _lagrangian(view: View, inc: Incumbent, budget: Budget, share: str, label: str) -> StageResult:
    state = SearchState(view.graph.arrays, inc.values, view.graph.num_times)
    lag = price_and_repair(view.graph, state, deadline=budget.share(share).deadline,
                           seed=view.options.seed, inner=view.options.inner, gap=view.options.gap,
                           on_improve=lambda c: view.emit("improved", cost=c))
    return StageResult(state.x.copy(), lag.bound, _report(f"{label}:{lag.inner}", lag.to_dict()))


def run_lagrangian(view: View, inc: Incumbent, budget: Budget) -> StageResult:
    return _lagrangian(view, inc, budget, "lagrangian", "lagrangian")


def run_lagrangian_first(view: View, inc: Incumbent, budget: Budget) -> StageResult:
    """A few Lagrangian rounds before the program: they often prove what the program would take
    seconds to (an expert layout of LLaMA-3 8B on 8x8: 136 variables with 1,015 memory points,
    CBC 3.5 s; these rounds 0.03 s)."""
    return _lagrangian(view, inc, budget, "lagrangian_first", "lagrangian-first")


def run_lns(view: View, inc: Incumbent, budget: Budget) -> StageResult:
    o = view.options
    state = SearchState(view.graph.arrays, inc.values, view.graph.num_times)
    report = improve(view.graph, view.graph.arrays, state, backend=o.backend, deadline=budget.deadline, threads=o.threads,
                     seed=o.seed, on_improve=lambda c: view.emit("improved", cost=c))
    return StageResult(state.x.copy(), -math.inf, _report(f"lns:{o.backend}", report.to_dict()))


# -- entry predicates -------------------------------------------------------------------------
def always(view: View, inc: Incumbent, budget: Budget) -> bool:
    return True


def memory_cannot_bind(view: View, inc: Incumbent, budget: Budget) -> bool:
    g = view.graph
    return view.plan is not None and (g.num_times == 0 or not math.isfinite(g.limit))


def memory_binds_with_plan(view: View, inc: Incumbent, budget: Budget) -> bool:
    return view.plan is not None and inc.values is not None and bool(view.graph.num_times) \
        and budget.has(MIN_STAGE_SECONDS)


def columns_to_combine(view: View, inc: Incumbent, budget: Budget) -> bool:
    return inc.dual is not None and bool(inc.dual.support) and budget.has(MIN_STAGE_SECONDS)


def exact_chosen_or_nothing_found(view: View, inc: Incumbent, budget: Budget) -> bool:
    return view.chosen == "exact" or (inc.values is None and view.chosen != "heuristic")


def large_program_toulbar2_first(view: View, inc: Incumbent, budget: Budget) -> bool:
    return view.chosen == "exact" and view.searching and view.wcsp_rows is not None \
        and program_columns(view.graph) >= WCSP_FIRST_COLUMNS and budget.has(MIN_STAGE_SECONDS)


def toulbar2_can_close_gap(view: View, inc: Incumbent, budget: Budget) -> bool:
    if view.wcsp_rows is None and not (view.wcsp_lazy and inc.values is not None):
        return False
    if inc.values is not None and math.isfinite(inc.bound) \
            and inc.cost - inc.bound <= WCSP_MIN_GAP * max(abs(inc.cost), TINY):
        return False  # the LP bound is already tight: the rest goes to local improvement
    return budget.has(MIN_STAGE_SECONDS)


def memory_unpriced(view: View, inc: Incumbent, budget: Budget) -> bool:
    # with a plan, column generation already priced memory exactly
    return view.searching and inc.values is not None and bool(view.graph.num_times) and view.plan is None


def program_with_memory_unpriced(view: View, inc: Incumbent, budget: Budget) -> bool:
    return view.chosen == "exact" and memory_unpriced(view, inc, budget)


def time_for_windows(view: View, inc: Incumbent, budget: Budget) -> bool:
    return view.searching and inc.values is not None and budget.has(MIN_LNS_SECONDS)


STAGES: tuple[Stage, ...] = (
    Stage("heuristic", "greedy", always, run_greedy),
    Stage("treedp", None, memory_cannot_bind, run_treedp),
    Stage("colgen", "colgen", memory_binds_with_plan, run_colgen),
    Stage("restricted", None, columns_to_combine, run_restricted),
    Stage("lagrangian_first", "lagrangian_first", program_with_memory_unpriced, run_lagrangian_first),
    Stage("wcsp_first", "wcsp_first", large_program_toulbar2_first, run_wcsp_first),
    Stage("exact", "exact", exact_chosen_or_nothing_found, run_exact),
    Stage("wcsp", "wcsp", toulbar2_can_close_gap, run_wcsp),
    Stage("lagrangian", "lagrangian", memory_unpriced, run_lagrangian),
    Stage("lns", "anytime", time_for_windows, run_lns),
)
"""The stages in the order they run; each at most once."""


def timed(stage: Stage, view: View, inc: Incumbent, budget: Budget, clock) -> StageResult:
    """Run ``stage``, recording its wall time and the numba compile time it paid (``clock``)."""
    start, compiled = time.perf_counter(), clock.seconds
    result = stage.run(view, inc, budget)
    return result.timed(time.perf_counter() - start, clock.seconds - compiled)
