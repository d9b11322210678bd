r"""Weighted-CSP search with pytoulbar2 (optional extra) on the whole compiled graph.

Model. One toulbar2 variable per compiled variable, x_v in {0..d_v-1}; a unary
cost function c_v and a pairwise one c_uv per edge (costs scaled by s and
rounded to integers, forbidden entries at toulbar2's top); the memory limit
as one knapsack constraint per kept point p:

    sum_{terms k covering p} u_k(x_{var(k)})  <=  L - base_p

exact when usages are integers (bytes, as in practice: the capacity is
rounded down); otherwise usages are rounded down and the capacity up, a
relaxation, so that toulbar2's bounds and proofs stay valid. Every assignment
it returns is re-checked against the real limit. Points are pruned first: the cover set
only changes at term boundaries, so points between two boundaries keep the
tightest capacity; and of two adjacent groups where one's cover contains the
other's (only starts, or only ends, at the boundary between them), the
smaller cover with the looser capacity is implied and dropped. Unlike the
local-polytope ILP, toulbar2 branches on the variables with soft arc
consistency and knapsack propagation, which is what closes memory-bound
instances whose LP bound is weak (IOPDDL V: LP 0.65 of the optimum).

Bound. With F cost functions, each rounded by at most 1/2, a toulbar2 dual
bound B gives the valid bound (B - F/2) / s + constant (B / s + constant
when the costs are integers that need no scaling, as in the IOPDDL files).

Deadline. toulbar2's own limit counts CPU seconds and its search cannot be
interrupted from Python, so it runs in a forked child whose standard output
is a pipe: every improving solution it prints is read as it comes, and the
child is killed at the deadline, keeping the last complete solution.

>>> # see tests/solver/test_wcsp.py for worked examples
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import select
import time
from dataclasses import dataclass

import numpy as np

from solver.compiled import CompiledGraph
from solver.memory_points import initial_points, violated_points
from solver.tolerance import TINY, fits_limit, floor_tolerant
from solver.budget import share_deadline

__all__ = ["WcspResult", "add_cost_functions", "knapsack_groups", "knapsack_rows", "solve_wcsp", "solve_wcsp_lazy", "wcsp_available",
           "wcsp_eligible", "wcsp_lazy_eligible"]

log = logging.getLogger(__name__)

# Sizes beyond which building the toulbar2 model costs more than it brings
# (measured: V, 328 variables and 144 knapsacks, builds in under a second).
MAX_VARS = 5000
MAX_KNAPSACKS = 1500
MAX_KNAPSACK_ENTRIES = 2_000_000
MAX_TABLE_ENTRIES = 5_000_000
COST_RANGE = 1e15  # scaled costs stay far below 2^63


@dataclass(slots=True)
class WcspResult:
    """Best values found (or None when toulbar2 found nothing better), bound, and how it ended."""

    values: np.ndarray | None
    bound: float
    status: str  # optimal | timeout | infeasible | error
    solutions: int = 0
    knapsacks: int = 0
    seconds: float = 0.0
    last: np.ndarray | None = None  # toulbar2's last solution before the memory re-check

    def to_dict(self) -> dict[str, object]:
        return {"status": self.status, "solutions": self.solutions, "knapsacks": self.knapsacks,
                "bound": self.bound if math.isfinite(self.bound) else None,  # JSON has no infinity
                "seconds": round(self.seconds, 3)}


def wcsp_available() -> bool:
    try:
        import pytoulbar2  # noqa: F401
    except ImportError:
        return False
    return True


def knapsack_groups(graph: CompiledGraph) -> list[tuple[int, float]]:
    """(first point, capacity) of each memory constraint not implied by another (module docstring)."""
    if not graph.num_times or not graph.term_var.size or not math.isfinite(graph.limit):
        return []
    T = graph.num_times
    cuts = np.unique(np.concatenate([graph.term_t0, graph.term_t1, [0, T]]))
    cuts = cuts[(cuts >= 0) & (cuts <= T)]
    capacity = np.minimum.reduceat(graph.limit - graph.base, cuts[:-1])
    # prefix counts: how many terms start (end) at points <= t
    starts = np.concatenate([[0], np.cumsum(np.bincount(graph.term_t0, minlength=T + 1))])
    ends = np.concatenate([[0], np.cumsum(np.bincount(graph.term_t1, minlength=T + 1))])

    def inside(a: int, b: int) -> bool:  # cover(a) within cover(b), a before b: no term ends in (a, b]
        return ends[b + 1] == ends[a + 1]

    def contains(a: int, b: int) -> bool:  # cover(b) within cover(a), a before b: no term starts in (a, b]
        return starts[b + 1] == starts[a + 1]

    groups = [(int(lo), float(c)) for lo, c in zip(cuts[:-1], capacity)]
    while True:
        kept: list[tuple[int, float]] = []
        for g in groups:
            while kept and inside(kept[-1][0], g[0]) and kept[-1][1] >= g[1]:
                kept.pop()  # the earlier constraint is implied by g
            if kept and contains(kept[-1][0], g[0]) and g[1] >= kept[-1][1]:
                continue  # g is implied by the earlier one
            kept.append(g)
        if len(kept) == len(groups):
            return kept
        groups = kept


def knapsack_rows(graph: CompiledGraph, groups: list[tuple[int, float]] | None = None) -> list[tuple[float, np.ndarray]]:
    """(capacity, terms covering it) of each memory constraint kept by ``knapsack_groups``."""
    groups = knapsack_groups(graph) if groups is None else groups
    rows = []
    for lo, capacity in groups:
        terms = _covering_terms(graph, lo)
        if terms.size:
            rows.append((capacity, terms))
    return rows


def _covering_terms(graph: CompiledGraph, point: int) -> np.ndarray:
    return np.nonzero((graph.term_t0 <= point) & (graph.term_t1 > point))[0]


def wcsp_eligible(graph: CompiledGraph) -> list[tuple[float, np.ndarray]] | None:
    """The knapsack rows of ``graph`` when its toulbar2 model is small enough to be worth building, else None."""
    if not wcsp_available() or graph.num_vars == 0 or graph.num_vars > MAX_VARS:
        return None
    if int(graph.edge_cost.size) + int(graph.unary.size) > MAX_TABLE_ENTRIES:
        return None
    groups = knapsack_groups(graph)
    if len(groups) > MAX_KNAPSACKS:
        return None
    rows = knapsack_rows(graph, groups)
    entries = sum(int(graph.dom[graph.term_var[terms]].sum()) for _, terms in rows)
    return rows if entries <= MAX_KNAPSACK_ENTRIES else None


def wcsp_lazy_eligible(graph: CompiledGraph) -> bool:
    """Whether toulbar2 with knapsacks added lazily (``solve_wcsp_lazy``) is worth trying on ``graph``."""
    return (wcsp_available() and 0 < graph.num_vars <= MAX_VARS
            and int(graph.edge_cost.size) + int(graph.unary.size) <= MAX_TABLE_ENTRIES)


def solve_wcsp_lazy(
    graph: CompiledGraph,
    *,
    deadline: float,
    start: np.ndarray,
    seed: int = 0,
) -> WcspResult:
    """``solve_wcsp`` with only some memory points, for graphs with too many to post at once.

    Round r posts the knapsacks of points P_r (the start's highest points,
    then every point a round's solution exceeded) and searches below the best
    feasible cost so far; the model is a relaxation, so its bound is valid.
    Rounds are short (a third of the time left, at least 2 s): restarting
    toulbar2 from a better incumbent was measured to pay (IOPDDL D: 1.0736
    -> 1.0062 of the best known in 90 s from a greedy start).
    """
    t0 = time.perf_counter()
    capacity = graph.limit - graph.base
    rows_at = {int(t): (float(capacity[t]), _covering_terms(graph, int(t))) for t in initial_points(graph, start)}
    best = np.asarray(start, dtype=np.int64).copy()
    total = WcspResult(values=None, bound=-math.inf, status="timeout")
    while time.perf_counter() < deadline - 1.0:
        rows = [rows_at[t] for t in sorted(rows_at)]
        result = solve_wcsp(graph, deadline=share_deadline("wcsp_lazy_round", deadline),
                            start=best, seed=seed + total.solutions, rows=rows)
        total.solutions += result.solutions
        total.knapsacks = len(rows)
        total.bound = max(total.bound, result.bound)
        if result.values is not None and graph.cost(result.values) < graph.cost(best):
            best = result.values
            total.values = best
        exceeded = violated_points(graph, result.last) if result.last is not None else np.zeros(0, dtype=np.int64)
        if exceeded.size:
            rows_at.update((int(t), (float(capacity[t]), _covering_terms(graph, int(t)))) for t in exceeded)
        elif result.status in ("optimal", "optimal_start"):
            total.status = "optimal"  # the relaxation's optimum fits everywhere
            break
    total.seconds = time.perf_counter() - t0
    return total


def _scale(graph: CompiledGraph) -> tuple[float, bool, float]:
    """Factor that makes costs toulbar2 integers, whether that is exact (integral costs), and the
    sum of absolute finite costs."""
    finite_u = graph.unary[np.isfinite(graph.unary)]
    finite_e = graph.edge_cost[np.isfinite(graph.edge_cost)]
    total = float(np.abs(finite_u).sum() + np.abs(finite_e).sum())
    integral = bool(np.all(finite_u == np.round(finite_u)) and np.all(finite_e == np.round(finite_e)))
    if integral and total <= COST_RANGE:
        return 1.0, True, total
    return COST_RANGE / max(total, TINY), False, total


def add_cost_functions(cfn, graph: CompiledGraph, unary: np.ndarray, scale: float, forbidden: float) -> None:
    """Variables, unary and pairwise cost functions of ``graph`` in a pytoulbar2 ``CFN``.

    Costs are multiplied by ``scale`` and rounded (toulbar2 costs are
    integers); non-finite entries cost ``forbidden``. ``unary`` replaces the
    graph's own unary costs (the Lagrangian prices them).
    """
    for v in range(graph.num_vars):
        cfn.AddVariable(f"v{v}", range(int(graph.dom[v])))
    for v in range(graph.num_vars):
        u = unary[graph.unary_off[v] : graph.unary_off[v + 1]] * scale
        cfn.AddFunction([v], np.where(np.isfinite(u), np.round(u), forbidden).tolist())
    for e in range(graph.num_edges):
        m = graph.edge_matrix(e).ravel() * scale
        cfn.AddFunction([int(graph.edge_u[e]), int(graph.edge_v[e])],
                        np.where(np.isfinite(m), np.round(m), forbidden).tolist())


def solve_wcsp(
    graph: CompiledGraph,
    *,
    deadline: float,
    start: np.ndarray | None = None,
    seed: int = 0,
    rows: list[tuple[float, np.ndarray]] | None = None,
    phase: bool = True,
) -> WcspResult:
    """Search for values cheaper than ``start`` (or any feasible ones) until ``deadline`` (perf_counter);
    ``phase``: toulbar2 tries ``start``'s values first (good when they are near the optimum, a
    warm start's; a poor start's misleads it, pipeline ``run_wcsp``).

    Returned values are checked against the memory limit and forbidden
    costs here; the bound is valid whatever the child managed to report.
    """
    t0 = time.perf_counter()
    rows = knapsack_rows(graph) if rows is None else rows
    scale, exact, cost_total = _scale(graph)
    rounding = 0.0 if exact else 0.5 * (graph.num_vars + graph.num_edges)
    ub = None
    if start is not None and math.isfinite(graph.cost(start)):
        # toulbar2 only reports assignments strictly below its initial upper bound
        ub = _rounded_cost(graph, start, scale)
    # above any finite total, or the start's cost when there is one
    top = float(2 * cost_total * scale + 1e6) if ub is None else float(ub)
    read_fd, write_fd = os.pipe()
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_child, args=(graph, rows, scale, top, start if phase else None, seed, deadline, write_fd),
                        daemon=True)
    child.start()
    os.close(write_fd)
    best, solutions, bound_raw, finished, expired, errored = None, 0, None, False, False, False
    buffer = b""
    try:
        while True:
            wait = deadline - time.perf_counter()
            if wait <= 0:
                break
            ready, _, _ = select.select([read_fd], [], [], min(wait, 0.5))
            if not ready:
                continue
            data = os.read(read_fd, 1 << 20)
            if not data:
                break
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                parsed = _parse_line(line, graph.num_vars)
                if parsed is None:
                    continue
                kind, payload = parsed
                if kind == "values":
                    best, solutions = payload, solutions + 1
                elif kind == "bound":
                    bound_raw = payload
                elif payload == "finished":
                    finished = True
                elif payload == "time-limit":
                    expired = True
                elif payload == "error":
                    errored = True
    finally:
        os.close(read_fd)
        if child.is_alive():
            child.kill()
        child.join()
    values = None
    if best is not None and best.shape[0] == graph.num_vars and np.all(best < graph.dom) and np.all(best >= 0):
        fits = not graph.num_times or fits_limit(graph.memory_profile(best), graph.limit)
        if fits and math.isfinite(graph.cost(best)):
            values = best
        else:
            log.info("toulbar2 values exceed the limit at a point left out, or use a forbidden cost")
    complete = finished and not expired and not errored
    bound = -math.inf
    if bound_raw is not None:
        bound = (bound_raw - rounding) / scale + graph.constant
    status = "timeout"
    if complete and best is not None:
        status = "optimal"  # toulbar2 proved its last solution optimal
        bound = max(bound, (_rounded_cost(graph, best, scale) - rounding) / scale + graph.constant)
    elif complete and ub is not None:
        status = "optimal_start"  # nothing strictly below the start's rounded cost exists
        bound = max(bound, (ub - rounding) / scale + graph.constant)
    elif complete:
        status = "infeasible"
    return WcspResult(values=values, bound=bound, status=status, solutions=solutions,
                      knapsacks=len(rows), seconds=time.perf_counter() - t0, last=best)


def _rounded_cost(graph: CompiledGraph, values: np.ndarray, scale: float) -> int:
    total = int(np.round(graph.unary[graph.unary_off[:-1] + values] * scale).sum())
    if graph.num_edges:
        total += int(np.round(graph.edge_cost[graph.edge_entries(values)] * scale).sum())
    return total


def _parse_line(line: bytes, num_vars: int):
    text = line.decode("ascii", "replace").strip()
    if text.startswith("autoshard-bound "):
        return "bound", float(text.split()[1])
    if text.startswith("autoshard-status "):
        return "status", text.split()[1]
    if text.startswith("Time limit expired"):
        return "status", "time-limit"
    parts = text.split()
    if len(parts) == num_vars and all(p.isdigit() for p in parts):
        return "values", np.array([int(p) for p in parts], dtype=np.int64)
    return None


def _child(graph, rows, scale, top, start, seed, deadline, write_fd) -> None:  # pragma: no cover - runs forked
    os.dup2(write_fd, 1)  # toulbar2 prints each improving solution on standard output
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    out = os.fdopen(1, "w", buffering=1)
    try:
        import pytoulbar2

        # virtual arc consistency halves the proof of the knapsack-free tiny decoders (HF Mistral / LLaMA
        # on 2x2 without a limit: 1.6 -> 0.74 CPU s; Whisper 0.29 -> 0.42); with knapsacks (the memory-bound
        # IOPDDL instances it was tuned on) it was not measured, so those keep toulbar2's default
        cfn = pytoulbar2.CFN(ubinit=top, vac=0 if rows else 1, verbose=0, seed=seed + 1)
        cfn.Option.solutionBasedPhaseSaving = True
        add_cost_functions(cfn, graph, graph.unary, scale, top + 1)
        for capacity, terms in rows:
            tuples, integral = [], True
            for k in terms:
                v = int(graph.term_var[k])
                for value, use in enumerate(graph.term_usage_of(int(k))):
                    integral = integral and float(use).is_integer()
                    if use >= 1:
                        tuples.append((v, value, int(math.floor(use))))
            # integer usages: sum <= c  iff  sum <= floor(c), exact; otherwise relax
            cap = floor_tolerant(capacity) if integral else math.ceil(capacity)
            if tuples:
                cfn.AddGeneralizedLinearConstraint(tuples, "<=", int(cap))
        if start is not None:
            for v, value in enumerate(start):
                cfn.CFN.wcsp.setBestValue(v, int(value))  # phase saving: try the start's values first
        seconds = max(1, int(deadline - time.perf_counter()))
        result = None
        try:
            result = cfn.Solve(showSolutions=1, timeLimit=seconds)
        except Exception as exc:  # toulbar2 raises on an empty search space
            print(f"autoshard-status error {exc}", file=out)
        out.flush()
        bound = float(cfn.GetDDualBound())
        print(f"autoshard-bound {bound!r}", file=out)
        if result:
            print(" ".join(str(int(x)) for x in result[0]), file=out)
        # complete unless toulbar2 printed that its time limit expired (read by the parent)
        print("autoshard-status finished", file=out)
    finally:
        out.flush()
        os._exit(0)
