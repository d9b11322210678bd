r"""Memory as prices: Lagrangian relaxation of the memory rows, solved by an inner pairwise solver.

For multipliers lambda_p >= 0 on a set A of kept time points (zero
elsewhere), the relaxation D(lambda) of ``solver.pricing`` is a pairwise
problem without memory whose unary costs carry the prices; any lower bound
of its minimum gives a valid lower bound of the constrained optimum (weak
duality), for any lambda >= 0 and any A.

Each round solves the priced problem with an inner solver (TRW-S of
``solver.trws`` by default; on request ``toulbar2`` or the exact bucket
elimination of ``solver.treedp``, which the pipeline uses through
``solver.colgen`` instead; all return labels and a bound), then:

* the labels are repaired to the memory limit and descended
  (``solver.localsearch``): a feasible candidate for the incumbent;
* points where the labels exceed the limit join A;
* multipliers take a projected subgradient step of Polyak size,
  lambda_p <- max(0, lambda_p + theta (UB - D) / ||g||^2 g_p) with
  g_p = mem_p(x) - L, and theta halves after rounds without progress.

The rounds stop early when they stall: no better candidate and no rise of
the bound by 1 % of the gap UB - D for the ``lagrangian_patience`` share of
the stage (``solver.budget``); the windows that follow use the rest.

The prices steer the inner solver towards layouts that fit (the contest
winner's approach, with per-point rather than per-node prices, so that the
same rounds also give a lower bound).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np

from solver.compiled import CompiledGraph, KernelArrays
from solver.localsearch import SearchState, repaired_candidate
from solver.memory_points import initial_points, violated_points
from solver.pricing import dual_bound, priced_unary
from solver.tolerance import DEFAULT_GAP, REL_TOL, TINY, improves, is_proven
from solver.treedp import plan_elimination, solve_plan
from solver.trws import trws
from solver.trws_plan import plan_trws
from solver.wcsp import COST_RANGE, add_cost_functions
from solver.budget import share_deadline

__all__ = ["LagrangianReport", "price_and_repair", "inner_solver_names"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class LagrangianReport:
    rounds: int = 0
    stalled: bool = False  # stopped early: nothing moved for the patience share
    candidates: int = 0
    improved: int = 0
    bound: float = -math.inf
    inner: str = ""
    history: list[tuple[float, float, float]] = field(default_factory=list)  # (s, best, bound)

    def to_dict(self) -> dict[str, object]:
        return {"rounds": self.rounds, "stalled": self.stalled, "candidates": self.candidates,
                "improved": self.improved, "inner": self.inner, "bound": None if not math.isfinite(self.bound) else self.bound}


def inner_solver_names() -> list[str]:
    """Inner solvers available here."""
    names = ["trws", "treedp"]
    try:
        import pytoulbar2  # noqa: F401

        names.append("toulbar2")
    except ImportError:
        pass
    return names


class _TrwsInner:
    name = "trws"

    def __init__(self, arr: KernelArrays, iterations: int) -> None:
        self.arr = arr
        self.plan = plan_trws(arr)
        self.messages = None
        self.iterations = iterations

    def solve(self, unary: np.ndarray, deadline: float) -> tuple[np.ndarray, float]:
        result = trws(self.arr, unary=unary, iterations=self.iterations,
                      deadline=deadline, messages=self.messages, plan=self.plan)
        self.messages = result.messages
        return result.labels, float(result.lower_bound)


class _TreeDpInner:
    """Exact bucket elimination (``solver.treedp``) when the graph's treewidth allows it."""

    name = "treedp"

    def __init__(self, graph: CompiledGraph, plan) -> None:
        self.graph = graph
        self.plan = plan

    def solve(self, unary: np.ndarray, deadline: float) -> tuple[np.ndarray | None, float]:
        labels, value = solve_plan(self.plan, self.graph, unary)
        if not math.isfinite(value):
            return None, math.inf
        return labels, value


class _Toulbar2Inner:
    """pytoulbar2 on the priced problem: limited discrepancy search, then complete search."""

    name = "toulbar2"

    def __init__(self, graph: CompiledGraph) -> None:
        self.graph = graph
        finite = graph.edge_cost[np.isfinite(graph.edge_cost)]
        self.edge_total = float(np.abs(finite).sum())

    def solve(self, unary: np.ndarray, deadline: float) -> tuple[np.ndarray | None, float]:
        import pytoulbar2

        g = self.graph
        seconds = max(1, int(deadline - time.perf_counter()))
        shift = np.minimum.reduceat(np.where(np.isfinite(unary), unary, np.inf), g.unary_off[:-1])
        priced = unary - np.repeat(shift, g.dom)
        # costs are integers in toulbar2: scale the total to COST_RANGE (costs may
        # be seconds); forbidden entries get a cost above any finite total
        total = float(np.abs(priced[np.isfinite(priced)]).sum()) + self.edge_total
        scale = COST_RANGE / max(total, TINY)
        top = 4.0 * COST_RANGE
        cfn = pytoulbar2.CFN(ubinit=top, vac=0, verbose=-1, seed=1)
        cfn.Option.lds = 4
        add_cost_functions(cfn, g, priced, scale, top)
        rounded = 0.5 * (g.num_vars + g.num_edges)  # each function rounded by at most 1/2
        try:
            result = cfn.Solve(timeLimit=seconds)
        except Exception as exc:  # toulbar2 signals an empty search space by raising
            log.debug("toulbar2: %s", exc)
            return None, -math.inf
        bound = (float(cfn.GetDDualBound()) - rounded) / scale + float(shift.sum())
        if not result:
            return None, bound
        return np.asarray(result[0], dtype=np.int64), bound


def price_and_repair(
    graph: CompiledGraph,
    state: SearchState,
    *,
    deadline: float,
    inner: str | None = None,
    seed: int = 0,
    max_rounds: int = 10_000,
    on_improve=None,
    gap: float = DEFAULT_GAP,
) -> LagrangianReport:
    """Improve the feasible ``state`` in place by Lagrangian rounds until ``deadline``,
    or until the bound proves the best cost within ``gap`` (``solver.tolerance``)."""
    arr = state.arr
    rng = np.random.default_rng(seed)
    plan = None
    if inner == "treedp":
        plan = plan_elimination(graph)  # None when the treewidth is too large: TRW-S instead
    if plan is not None:
        solver = _TreeDpInner(graph, plan)
    elif inner == "toulbar2":
        solver = _Toulbar2Inner(graph)
    else:
        solver = _TrwsInner(arr, iterations=40)  # measured best on the large IOPDDL graphs
    report = LagrangianReport(inner=solver.name)
    start = time.perf_counter()
    best_cost = graph.cost(state.x)
    if graph.num_times == 0 or graph.num_vars == 0:
        return report
    active = initial_points(graph, state.x, count=16)
    lam = np.zeros(graph.num_times)
    theta = 1.0
    stale = 0
    patience = share_deadline("lagrangian_patience", deadline, now=start, stage_start=start) - start
    moved = start  # when the incumbent or the bound last moved
    while report.rounds < max_rounds and time.perf_counter() < deadline - 0.05:
        if time.perf_counter() - moved > patience:
            report.stalled = True
            break
        report.rounds += 1
        unary = priced_unary(graph, lam)
        round_deadline = share_deadline("lagrangian_round", deadline)
        labels, inner_bound = solver.solve(unary, round_deadline)
        dual = dual_bound(graph, lam, inner_bound)
        if math.isfinite(dual) and dual > report.bound:
            if not math.isfinite(report.bound) or dual - report.bound > 0.01 * (best_cost - report.bound):
                moved = time.perf_counter()
            report.bound = dual
        if labels is None:
            break
        profile = graph.memory_profile(labels)
        # candidate: repair and descend the priced labels under the real costs
        candidate = repaired_candidate(arr, labels, graph.num_times, rng=rng, deadline=deadline)
        if candidate is not None:
            report.candidates += 1
        if candidate is not None and improves(graph.cost(candidate.x), best_cost):
            best_cost = graph.cost(candidate.x)
            state.take(candidate)
            report.improved += 1
            moved = time.perf_counter()
            stale = 0
            if on_improve is not None:
                on_improve(best_cost)
        else:
            stale += 1
        report.history.append((time.perf_counter() - start, best_cost, report.bound))
        if is_proven(best_cost, report.bound, gap):
            break
        # multipliers: projected subgradient on the active points, Polyak step
        new_points = violated_points(graph, labels, per_round=20)
        active = np.union1d(active, new_points)
        g = profile[active] - graph.limit
        norm = float(g @ g)
        if norm <= 0:
            break  # the priced optimum fits everywhere: the relaxation is tight there
        # Polyak step: the distance to the best cost (its own name: it once
        # rebound the proof ``gap`` above, which stopped every run after two
        # rounds, IOPDDL K 0.98 -> 1.10 of the best known)
        step = max(best_cost - dual, REL_TOL * abs(best_cost)) if math.isfinite(dual) else abs(best_cost)
        lam[active] = np.maximum(0.0, lam[active] + theta * step / norm * g)
        if stale >= 5:
            theta = max(theta / 2, 1e-4)
            stale = 0
        log.debug("lagrangian round %d: best %.6g bound %.6g theta %.3g active %d",
                  report.rounds, best_cost, report.bound, theta, active.size)
    return report
