r"""Exact reductions of the strategy graph, applied before any search.

Notation: variable v has values a in D_v, unary cost c_v(a), memory terms
(I, m_v) (usage m_v(a) counted at every time of interval I); edge (u, w) has
matrix M_uw(a, b). The objective is

    F(x) = sum_v c_v(x_v) + sum_(u,w) M_uw(x_u, x_w)

subject to, at every time t, sum over terms live at t of m(x) <= L. Each
reduction below maps the problem to a smaller one with the same optimum and a
way back (``WorkingGraph`` records it); tests check each one against brute
force.

(R0) Ties. Nodes of a tie group must take the same value, so the group is one
     variable: merge every member into the first with the identity mapping.

(R1) Pins. ``x_v = k`` is forced: restrict D_v to {k}.

(R2) Forbidden values (arc consistency on infinite costs). A value a with
     c_v(a) = inf, or with M_vw(a, b) = inf for every b in D_w of some
     neighbour w, appears in no finite solution: remove it; repeat until no
     change. An empty domain proves that every choice uses a forbidden cost.

(R3) Single value. If D_v = {a}: c_v(a) goes to the constant, each edge row
     M_vw(a, .) is added to c_w, memory terms become fixed memory; drop v.

(R4) Parallel edges. M_uw and M'_uw on the same pair are one edge M + M'
     (done on insertion, in either orientation).

(R5) Memory normalisation. A term with usage m is split into the fixed part
     min_a m(a) (counted whatever the choice) and m - min m. A term whose
     residual is zero disappears; memory at every t is unchanged.

(R6) Followers. If, on edge (u, w), every row a of M_uw has exactly one
     finite entry f(a), every finite solution has x_w = f(x_u): merge w into u
     (c_u(a) += c_w(f(a)) + M_uw(a, f(a)), w's other edges and memory terms
     re-indexed through f). Likewise by columns. A leaf w (one neighbour u)
     whose best value given each a, f(a) = argmin_b c_w(b) + M_uw(a, b), also
     has the smallest usage in every memory term of w is a follower too: any
     other b costs no less and uses no less memory.

(R7) Dominated values. b dominates a in D_v when using b instead of a never
     costs more, whatever the neighbours choose, and never uses more memory:

         c_v(b) - c_v(a) + sum_w max_{x in D_w, M_vw(a,x) < inf} (M_vw(b,x) - M_vw(a,x)) <= 0
         and m_v(b) <= m_v(a) for every memory term of v.

     Replacing a by b in any solution keeps it feasible and no worse, so a can
     be removed. The relation is transitive (max of a sum <= sum of maxes), so
     all dominated values can go at once, keeping the lowest index among equal
     ones.

(R8) Memory-free elimination (bucket elimination). A variable v without
     memory terms and with at most two neighbours is eliminated exactly:
     degree 0: x_v = argmin c_v; degree 1 (neighbour u):
     c_u(a) += min_b [c_v(b) + M_uv(a, b)]; degree 2 (neighbours u, w):
     a new edge N(a, c) = min_b [c_v(b) + M_uv(a, b) + M_vw(b, c)]. The
     argmin tables give x_v back once u (and w) are known. Degree 2 is applied
     only when the new table stays small (|D_u| |D_v| |D_w| bounded).

Each pass visits the variables touched by the previous one, until nothing
changes.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import numba
import numpy as np

from solver.graph import MemoryTerm, WorkingGraph
from solver.problem import Problem

__all__ = ["InfeasibleError", "GraphSize", "ReductionReport", "reduce_problem", "graph_size"]

log = logging.getLogger(__name__)

# Degree-2 elimination builds a |D_u| x |D_w| table at |D_u||D_v||D_w| work.
MAX_ELIMINATION_WORK = 4_000_000
MAX_ELIMINATION_TABLE = 250_000


class InfeasibleError(ValueError):
    """Every choice uses a forbidden cost (found by reduction R2)."""


@dataclass(frozen=True, slots=True)
class GraphSize:
    """Size of a problem or of a reduced graph."""

    variables: int
    edges: int
    choices: int
    edge_pairs: int
    memory_terms: int

    def to_dict(self) -> dict[str, int]:
        return {
            "variables": self.variables,
            "edges": self.edges,
            "choices": self.choices,
            "edge_pairs": self.edge_pairs,
            "memory_terms": self.memory_terms,
        }


@dataclass(slots=True)
class ReductionReport:
    """What the reductions did: sizes before and after, and counts per reduction."""

    before: GraphSize
    after: GraphSize | None = None
    counts: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def count(self, key: str, amount: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + amount

    def to_dict(self) -> dict[str, object]:
        return {
            "before": self.before.to_dict(),
            "after": None if self.after is None else self.after.to_dict(),
            "counts": dict(sorted(self.counts.items())),
            "seconds": round(self.seconds, 4),
        }


def graph_size(graph: WorkingGraph) -> GraphSize:
    return GraphSize(
        variables=len(graph.unary),
        edges=len(graph.edges),
        choices=graph.num_choices(),
        edge_pairs=sum(int(m.size) for m in graph.edges.values()),
        memory_terms=sum(len(t) for t in graph.memory.values()),
    )


def reduce_problem(
    problem: Problem,
    *,
    dominance: bool = True,
    followers: bool = True,
    elimination: bool = True,
    time_limit: float | None = None,
) -> tuple[WorkingGraph, ReductionReport]:
    """Build the working graph of ``problem`` and apply the exact reductions.

    Raises :class:`InfeasibleError` when every choice uses a forbidden cost.
    The flags switch reductions off (for tests and measurements).

    >>> p = Problem.from_dict({"nodes": [{"cost": [1, 2]}, {"cost": [0]}],
    ...     "edges": [{"src": 0, "dst": 1, "cost": [[5], [0]]}]})
    >>> graph, report = reduce_problem(p)
    >>> len(graph.unary), graph.constant
    (0, 2.0)
    """
    start = time.perf_counter()
    graph = WorkingGraph.from_problem(problem)
    report = ReductionReport(before=graph_size(graph))
    deadline = None if time_limit is None else start + time_limit
    for group in problem.ties:
        for member in group[1:]:
            if member != group[0]:
                graph.merge_into(member, group[0], np.arange(graph.domain_size(group[0])))
                report.count("R0_tied")
    var_of = {member: group[0] for group in problem.ties for member in group}
    for node, value in sorted(problem.pins.items()):
        # Ties merged with the identity mapping, so values are still strategy indices.
        var = var_of.get(node, node)
        keep = np.flatnonzero(graph.members[var][0].table == value)
        if keep.size == 0:
            raise InfeasibleError(f"pins on tied nodes disagree (node {node} pinned to {value})")
        if graph.domain_size(var) > 1:
            graph.restrict(var, keep)
            report.count("R1_pinned")
    dirty = set(graph.unary)
    passes = 0
    while dirty:
        passes += 1
        if deadline is not None and time.perf_counter() > deadline:
            log.info("reductions stopped by the time limit after %d passes", passes)
            break
        touched: set[int] = set()
        for var in dirty:
            _normalise_memory(graph, var, report)
        _forbidden_pass(graph, dirty, touched, report)
        _single_value_pass(graph, dirty | touched, touched, report)
        if followers:
            _follower_pass(graph, dirty | touched, touched, report)
        if dominance:
            _dominance_pass(graph, dirty | touched, touched, report)
        if elimination:
            _elimination_pass(graph, dirty | touched, touched, report)
        dirty = {v for v in touched if v in graph.unary}
    report.counts["passes"] = passes
    report.after = graph_size(graph)
    report.seconds = time.perf_counter() - start
    return graph, report


# -- helpers ---------------------------------------------------------------
def _touch(graph: WorkingGraph, var: int, touched: set[int]) -> None:
    touched.add(var)
    touched.update(graph.neighbours.get(var, ()))


def _normalise_memory(graph: WorkingGraph, var: int, report: ReductionReport) -> None:
    """(R5): move the minimum of each term to fixed memory, drop zero residuals."""
    kept = []
    for term in graph.memory[var]:
        low = float(term.usage.min())
        if low > 0:
            graph.fixed_memory.append(MemoryTerm(term.start, term.end, np.array([low])))
        residual = term.usage - low
        if residual.any():
            kept.append(MemoryTerm(term.start, term.end, residual))
        else:
            report.count("R5_memory_terms_fixed")
    graph.memory[var] = kept


def _restrict(graph: WorkingGraph, var: int, keep: np.ndarray, touched: set[int]) -> None:
    if keep.size == 0:
        raise InfeasibleError(
            f"every strategy of node {graph.members[var][0].node if graph.members[var] else var} "
            "uses a forbidden cost (directly or with every strategy of a neighbour)"
        )
    graph.restrict(var, keep)
    _touch(graph, var, touched)


def _forbidden_pass(graph: WorkingGraph, candidates: set[int], touched: set[int], report: ReductionReport) -> None:
    """(R2) arc consistency on infinite costs, to a fixpoint.

    Candidates are checked against their unary costs and every neighbour; after
    that, a variable whose domain shrank only re-checks its neighbours against
    itself (AC-3 on arcs), so a hub is not rescanned whenever a neighbour moves.
    """

    def shrink(var: int, ok: np.ndarray) -> bool:
        if ok.all():
            return False
        report.count("R2_forbidden_values", int((~ok).sum()))
        _restrict(graph, var, np.flatnonzero(ok), touched)
        return True

    queue: list[int] = []
    for var in candidates:
        if var not in graph.unary:
            continue
        ok = np.isfinite(graph.unary[var])
        for other in graph.neighbours[var]:
            ok &= np.isfinite(graph.edge_matrix(var, other)).any(axis=1)
        if shrink(var, ok):
            queue.append(var)
    while queue:
        var = queue.pop()
        for other in list(graph.neighbours[var]):
            ok = np.isfinite(graph.edge_matrix(other, var)).any(axis=1)
            if shrink(other, ok):
                queue.append(other)


def _single_value_pass(graph: WorkingGraph, candidates: set[int], touched: set[int], report: ReductionReport) -> None:
    """(R3) fold variables with one value left."""
    for var in list(candidates):
        if var in graph.unary and graph.domain_size(var) == 1:
            neighbours = list(graph.neighbours[var])
            graph.fix(var)
            touched.update(neighbours)
            report.count("R3_single_value")


def _follower_pass(graph: WorkingGraph, candidates: set[int], touched: set[int], report: ReductionReport) -> None:
    """(R6) merge variables whose value is a function of one neighbour's.

    Follower relations form a forest (cycles of mutual followers are cut at
    one variable). Merging leaves into their leader one by one would move a
    chain's accumulated members and memory terms again at every step, so
    followers are merged root first: after a leader has merged into its root,
    its followers' edges lead to the root, and they merge there directly.
    """
    leader: dict[int, int] = {}
    for var in candidates:
        if var not in graph.unary:
            continue
        for other in graph.neighbours[var]:
            if var in leader and other in leader:
                continue
            finite = np.isfinite(graph.edge_matrix(other, var))  # [other value, var value]
            if var not in leader and (finite.sum(axis=1) <= 1).all():
                leader[var] = other  # var follows other
            elif other not in leader and (finite.sum(axis=0) <= 1).all():
                leader[other] = var
    depth: dict[int, int] = {}
    for start in list(leader):
        path, node = [], start
        while node in leader and node not in depth and node not in path:
            path.append(node)
            node = leader[node]
        if node in path:  # a cycle of followers: its entry becomes a root
            del leader[node]
            path = path[: path.index(node)]
            depth[node] = 0
        base = depth.get(node, 0)
        for offset, member in enumerate(reversed(path), start=1):
            depth[member] = base + offset
    for var in sorted(leader, key=depth.__getitem__):
        if var not in graph.unary:
            continue
        # The leader may have merged into its root by now; the edge moved there.
        target = graph.representative(leader[var])
        if target is None or target not in graph.neighbours[var]:
            continue
        finite = np.isfinite(graph.edge_matrix(target, var))
        if (finite.sum(axis=1) <= 1).all():
            _merge(graph, var, target, finite.argmax(axis=1), touched)
            report.count("R6_followers")
    for var in list(candidates):
        if var in graph.unary and len(graph.neighbours[var]) == 1:
            if _leaf_follower(graph, var, touched):
                report.count("R6_leaf_followers")


def _merge(graph: WorkingGraph, var: int, into: int, mapping: np.ndarray, touched: set[int]) -> None:
    neighbours = graph.neighbours[var] | {into}
    graph.merge_into(var, into, mapping)
    touched.update(n for n in neighbours if n in graph.unary)
    _touch(graph, into, touched)


def _leaf_follower(graph: WorkingGraph, var: int, touched: set[int]) -> bool:
    """A leaf whose cheapest value given each neighbour value also uses the least memory."""
    (other,) = graph.neighbours[var]
    total = graph.edge_matrix(other, var) + graph.unary[var][None, :]  # [other value, var value]
    least = np.ones(total.shape[1], dtype=bool)
    for term in graph.memory[var]:
        least &= term.usage == term.usage.min()
    mapping = np.where(least[None, :], total, np.inf).argmin(axis=1)
    rows = np.arange(total.shape[0])
    if not np.array_equal(total[rows, mapping], total.min(axis=1)):
        return False
    _merge(graph, var, other, mapping, touched)
    return True


def _dominance_pass(graph: WorkingGraph, candidates: set[int], touched: set[int], report: ReductionReport) -> None:
    """(R7) remove dominated values."""
    for var in list(candidates):
        if var not in graph.unary or graph.domain_size(var) < 2:
            continue
        d = graph.domain_size(var)
        blocks = [graph.edge_matrix(var, other) for other in graph.neighbours[var]]
        rows = np.concatenate(blocks, axis=1) if blocks else np.zeros((d, 0))
        bounds = np.cumsum([0] + [b.shape[1] for b in blocks]).astype(np.int64)
        terms = graph.memory[var]
        usage = np.stack([t.usage for t in terms], axis=1) if terms else np.zeros((d, 0))
        removed = _dominated_values(
            np.ascontiguousarray(graph.unary[var]),
            np.ascontiguousarray(rows, dtype=np.float64),
            bounds,
            np.ascontiguousarray(usage, dtype=np.float64),
        )
        if removed.any():
            report.count("R7_dominated_values", int(removed.sum()))
            _restrict(graph, var, np.flatnonzero(~removed), touched)


@numba.njit(cache=True)
def _dominated_values(unary, rows, bounds, usage):  # pragma: no cover - compiled
    # A value is dropped when a value not dropped yet dominates it. Among
    # mutually dominating values the first one examined goes and the other
    # stays; by transitivity every dropped value keeps a surviving dominator.
    d = unary.shape[0]
    removed = np.zeros(d, dtype=np.bool_)
    for a in range(d):
        if not np.isfinite(unary[a]):
            continue
        for b in range(d):
            if b == a or removed[b] or not np.isfinite(unary[b]):
                continue
            ok = True
            for k in range(usage.shape[1]):
                if usage[b, k] > usage[a, k]:
                    ok = False
                    break
            if not ok:
                continue
            slack = unary[b] - unary[a]
            for e in range(bounds.shape[0] - 1):
                worst = -np.inf  # stays -inf only if a is infeasible with this neighbour
                for x in range(bounds[e], bounds[e + 1]):
                    ra = rows[a, x]
                    if np.isfinite(ra):
                        diff = rows[b, x] - ra
                        if diff > worst:
                            worst = diff
                slack += worst
                if slack > 0:
                    break
            if slack <= 0:
                removed[a] = True
                break
    return removed


def _elimination_pass(graph: WorkingGraph, candidates: set[int], touched: set[int], report: ReductionReport) -> None:
    """(R8) exact elimination of memory-free variables of degree <= 2."""
    for var in list(candidates):
        if var not in graph.unary or graph.memory[var]:
            continue
        degree = len(graph.neighbours[var])
        if degree == 0:
            best = int(np.argmin(graph.unary[var]))
            graph.restrict(var, np.array([best]))
            graph.fix(var)
            report.count("R8_eliminated_isolated")
        elif degree == 1:
            (other,) = graph.neighbours[var]
            total = graph.remove_edge(other, var) + graph.unary[var][None, :]
            argmin = total.argmin(axis=1)
            graph.unary[other] = graph.unary[other] + total[np.arange(total.shape[0]), argmin]
            graph.eliminate(var, (other,), argmin)
            _touch(graph, other, touched)
            report.count("R8_eliminated_leaf")
        elif degree == 2:
            u, w = sorted(graph.neighbours[var])
            du, dv, dw = graph.domain_size(u), graph.domain_size(var), graph.domain_size(w)
            if du * dv * dw > MAX_ELIMINATION_WORK or du * dw > MAX_ELIMINATION_TABLE:
                continue
            left = graph.remove_edge(u, var)  # [u, v]
            right = graph.remove_edge(var, w)  # [v, w]
            total = left[:, :, None] + graph.unary[var][None, :, None] + right[None, :, :]
            argmin = total.argmin(axis=1)
            best = np.take_along_axis(total, argmin[:, None, :], axis=1)[:, 0, :]
            graph.eliminate(var, (u, w), argmin)
            graph.add_edge(u, w, best)
            _touch(graph, u, touched)
            _touch(graph, w, touched)
            report.count("R8_eliminated_series")

