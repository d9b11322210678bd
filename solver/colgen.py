r"""Memory as prices, solved to the best price: column generation over exact pairwise solutions.

When the pairwise problem without memory can be minimised exactly
(:mod:`solver.treedp`), the best Lagrangian bound is the Dantzig-Wolfe bound

    DW = min { sum_j alpha_j F(x^j) :  sum_j alpha_j mem_p(x^j) <= L  (p kept),
               sum_j alpha_j = 1,  alpha >= 0 },   x^j ranging over all labellings,

which is at least the LP relaxation of :mod:`solver.ilp` (conv of labellings
is inside the local polytope). Column generation computes it:

* the master LP holds the columns found so far (the incumbent first, so it is
  feasible) and the rows of the points in A; from it come alpha and duals
  lambda_p >= 0 (rows) and mu (convexity). It is solved as the LP relaxation
  of a backend (``solver.backends``; :data:`MASTER_LP_BACKEND`, GLOP);
* pricing solves min_x F(x) + sum_p lambda_p mem_p(x) exactly; by weak
  duality, for any lambda >= 0,

      D(lambda) = min_x [F(x) + sum_p lambda_p (mem_p(x) - L)]  <=  optimum,

  which is the bound reported (the best over all rounds); the minimiser joins
  the master as a new column;
* a point where the master's mixture exceeds the limit joins A (separation);
* prices are smoothed (Wentges): pricing uses beta lambda_center +
  (1 - beta) lambda_master, lambda_center the prices of the best D so far,
  which damps the oscillation of plain Kelley cutting planes.

It stops when D(lambda) meets the master's value (the bound is then DW, up
to the tolerance) or at the deadline. Every priced labelling is also a
primal candidate: repaired to the limit, descended (``solver.localsearch``),
and kept when it beats the incumbent.

Price and branch (:func:`solve_restricted`). The master's mixture is
fractional; integer solutions near it come from the integer program of
``solver.exact`` over the values the mixed columns (and the incumbent) use,

    x_v in V_v = { x^j_v : alpha_j > 0 } + { incumbent_v },

typically 1-2 values per variable, which CBC solves or nearly solves fast.
Its bound is a bound of the restricted problem only, never reported.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np

from solver.backends import ProgramBackend, get_backend
from solver.compiled import CompiledGraph
from solver.exact import solve_exact
from solver.ilp import LinearProgram
from solver.localsearch import SearchState, repaired_candidate
from solver.memory_points import initial_points
from solver.pricing import dual_bound, priced_unary
from solver.restrict import from_restricted, restrict_values, to_restricted
from solver.tolerance import LP_ZERO, ROUND_OFF, TINY, improves, not_ruled_out, over_limit
from solver.treedp import EliminationPlan, min_marginals, solve_plan
from solver.budget import share_deadline

__all__ = ["ColumnGenerationReport", "column_generation", "solve_restricted", "fix_by_reduced_cost"]

log = logging.getLogger(__name__)

SMOOTHING = 0.5
CANDIDATE_EXCESS = 0.1  # priced labels at most this far over the limit (relative) become candidates,
CANDIDATE_ANY_VARS = 5000  # or any priced labels on graphs up to this many variables
CONVERGED = 1e-6  # relative distance between master value and bound (of the incumbent's cost)
# The master LP is solved every round: GLOP (the cpsat backend's LP) solves it in
# the process in about 2 ms; CBC would start its binary each time (about 20 ms),
# and the duals the CBC binary prints are not those of its optimal basis.
MASTER_LP_BACKEND = "cpsat"


@dataclass(slots=True)
class ColumnGenerationReport:
    rounds: int = 0
    columns: int = 0
    rows: int = 0
    improved: int = 0
    bound: float = -math.inf
    master: float = math.inf
    converged: bool = False
    seconds: float = 0.0
    history: list[tuple[float, float, float]] = field(default_factory=list)  # (s, best, bound)
    support: list[np.ndarray] = field(default_factory=list)  # labellings the last master mixes
    prices: np.ndarray | None = None  # multipliers of the best bound

    def to_dict(self) -> dict[str, object]:
        return {"rounds": self.rounds, "columns": self.columns, "rows": self.rows, "improved": self.improved,
                "bound": None if not math.isfinite(self.bound) else self.bound,
                "master": None if not math.isfinite(self.master) else self.master,
                "converged": self.converged, "seconds": round(self.seconds, 3)}


def _master_program(costs: list[float], usage: np.ndarray,
                    capacity: np.ndarray) -> tuple[LinearProgram, float, np.ndarray]:
    """The master LP over the columns, scaled to O(1) so that the LP solver's tolerances are
    relative: ``(program, cost scale, row scales)``. Rows: one per point of ``capacity``
    (``sum_j alpha_j usage[j] <= capacity``), then the convexity row ``sum_j alpha_j = 1``."""
    cscale = max(max(abs(c) for c in costs), TINY)
    mscale = np.maximum(np.abs(capacity), 1.0)
    rows, cols = np.nonzero(usage.T)  # row-major: each point's columns in order
    counts = np.bincount(rows, minlength=capacity.shape[0])
    row_off = np.zeros(capacity.shape[0] + 2, dtype=np.int64)
    np.cumsum(np.append(counts, len(costs)), out=row_off[1:])
    program = LinearProgram(
        cost=np.array(costs) / cscale, num_binary=0, row_off=row_off,
        row_col=np.concatenate([cols, np.arange(len(costs))]).astype(np.int64),
        row_val=np.concatenate([usage.T[rows, cols] / mscale[rows], np.ones(len(costs))]),
        sense=np.array([ord("L")] * capacity.shape[0] + [ord("E")], dtype=np.uint8),
        rhs=np.append(capacity / mscale, 1.0), constant=0.0,
        memory_points=np.zeros(0, dtype=np.int64), y_entry=np.zeros(0, dtype=np.int64))
    return program, cscale, mscale


def _solve_master(engine: ProgramBackend, costs: list[float], usage: np.ndarray, capacity: np.ndarray,
                  deadline: float):
    """The master LP; returns (value, alpha, lambda on the rows) or None if not solved."""
    program, cscale, mscale = _master_program(costs, usage, capacity)
    result = engine.solve_relaxation(program, time_limit=max(deadline - time.perf_counter(), 0.01))
    if result.status != "optimal" or result.duals is None:
        return None
    lam = np.maximum(-result.duals[: capacity.shape[0]], 0.0) * cscale / mscale
    return result.objective * cscale, result.z, lam


def column_generation(
    graph: CompiledGraph,
    state: SearchState,
    plan: EliminationPlan,
    *,
    deadline: float,
    seed: int = 0,
    max_rounds: int = 100_000,
    on_improve=None,
    lp_backend: str = MASTER_LP_BACKEND,
) -> ColumnGenerationReport:
    """Bound the constrained optimum by DW and improve the feasible ``state`` in place (see module docstring).

    The master LP is solved by ``lp_backend`` (``solver.backends``), which must report duals."""
    report = ColumnGenerationReport()
    start = time.perf_counter()
    if graph.num_times == 0 or graph.num_vars == 0 or not math.isfinite(graph.limit):
        return report
    arr = state.arr
    engine = get_backend(lp_backend)
    rng = np.random.default_rng(seed)
    capacity = graph.limit - graph.base  # what the choices may use at each point

    def usage_of(x: np.ndarray) -> np.ndarray:
        return graph.memory_profile(x) - graph.base

    best_cost = graph.cost(state.x)
    costs: list[float] = [best_cost]
    usages: list[np.ndarray] = [usage_of(state.x)]
    pool: list[np.ndarray] = [state.x.copy()]
    active = np.unique(initial_points(graph, state.x, count=16))
    center = np.zeros(graph.num_times)
    tol = CONVERGED * max(abs(best_cost), TINY)
    while report.rounds < max_rounds and time.perf_counter() < deadline - 0.05:
        usage = np.stack(usages)
        master = _solve_master(engine, costs, usage[:, active], capacity[active], deadline)
        if master is None:
            log.debug("column generation: master LP not solved")
            break
        value, alpha, lam_rows = master
        report.master = value
        report.support = [pool[j] for j in np.flatnonzero(alpha > LP_ZERO)]
        mixture = alpha @ usage
        over = over_limit(mixture - capacity, graph.limit)
        over[active] = False
        if over.any():  # separation: the mixture breaks a point not in the master yet
            excess = np.where(over, mixture - capacity, -np.inf)
            new = np.argsort(-excess)[: min(int(over.sum()), 20)]
            active = np.union1d(active, new)
            continue
        lam_master = np.zeros(graph.num_times)
        lam_master[active] = lam_rows
        prices = SMOOTHING * center + (1 - SMOOTHING) * lam_master if report.rounds else lam_master
        report.rounds += 1
        unary = priced_unary(graph, prices)
        labels, inner = solve_plan(plan, graph, unary)
        if not math.isfinite(inner):
            break  # no labelling avoids forbidden costs; the caller's incumbent says otherwise
        dual = dual_bound(graph, prices, inner)
        if dual > report.bound:
            report.bound = dual
            center = prices
            report.prices = prices
        cost = graph.cost(labels)
        costs.append(cost)
        usages.append(usage_of(labels))
        pool.append(labels)
        # primal: the priced labels, repaired to the limit and descended. On
        # large graphs only when they are near the limit: repairing the first
        # rounds' labels (7x over it) took minutes on 60,000 variables
        excess = float(np.max((usages[-1] - capacity) / np.maximum(capacity, 1.0)))
        candidate = None
        if excess <= CANDIDATE_EXCESS or graph.num_vars <= CANDIDATE_ANY_VARS:
            candidate = repaired_candidate(
                arr, labels, graph.num_times, rng=rng,
                deadline=share_deadline("colgen_candidate", deadline))
        if candidate is not None and improves(graph.cost(candidate.x), best_cost, rel=ROUND_OFF):
            best_cost = graph.cost(candidate.x)
            state.take(candidate)
            costs.append(best_cost)
            usages.append(usage_of(candidate.x))
            pool.append(candidate.x.copy())
            report.improved += 1
            if on_improve is not None:
                on_improve(best_cost)
        report.history.append((time.perf_counter() - start, best_cost, report.bound))
        log.debug("column generation round %d: master %.9g bound %.9g best %.9g rows %d",
                  report.rounds, value, report.bound, best_cost, active.size)
        if value - report.bound <= tol or report.bound >= best_cost - tol:
            report.converged = True
            break
    report.columns = len(costs)
    report.rows = int(active.size)
    report.seconds = time.perf_counter() - start
    return report


def solve_restricted(
    graph: CompiledGraph,
    support: list[np.ndarray],
    incumbent: np.ndarray,
    *,
    backend: str,
    deadline: float,
    threads: int = 1,
    seed: int = 0,
) -> np.ndarray | None:
    """Best labelling found by the exact solver over the values of ``support`` and ``incumbent``
    (see the module docstring); None when it found nothing better than ``incumbent``."""
    columns = np.stack([incumbent] + list(support))
    allowed = [np.unique(columns[:, v]) for v in range(graph.num_vars)]
    sub = restrict_values(graph, allowed)
    result = solve_exact(sub, backend, deadline=deadline, threads=threads, seed=seed,
                         start=to_restricted(allowed, incumbent))
    log.info("restricted program over %d values: %s cost %s", sum(a.size for a in allowed), result.status,
             result.cost)
    if result.values is None:
        return None
    values = from_restricted(allowed, result.values)
    if improves(graph.cost(values), graph.cost(incumbent), rel=ROUND_OFF):
        return values
    return None


def fix_by_reduced_cost(graph: CompiledGraph, plan: EliminationPlan, prices: np.ndarray, upper: float,
                        keep: np.ndarray) -> list[np.ndarray]:
    """Values that can still be part of a solution cheaper than ``upper`` (Lagrangian reduced-cost fixing).

    For any feasible x with x_v = a and any prices lambda >= 0,

        F(x) >= F(x) + sum_p lambda_p (mem_p(x) - L)  >=  minmarg^lambda_v(a) - sum_p lambda_p (L - base_p),

    the min-marginal of the priced problem (:func:`solver.treedp.min_marginals`)
    plus the constant. A value whose right-hand side exceeds ``upper`` (the
    cost of a known feasible solution) appears in no better solution and is
    dropped; the values of ``keep`` (that solution) always stay. Returns the
    sorted values left per variable.
    """
    marg, _, _ = min_marginals(plan, graph, priced_unary(graph, prices))
    alive = not_ruled_out(dual_bound(graph, prices, marg), upper)
    alive[graph.unary_off[:-1] + keep] = True
    return [np.flatnonzero(alive[graph.unary_off[v]:graph.unary_off[v + 1]]) for v in range(graph.num_vars)]
