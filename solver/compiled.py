r"""Flat-array form of a reduced graph, for the search kernels and the ILP builders.

Variables are renumbered 0..n-1; domains, unary costs, edge matrices and
memory terms become flat numpy arrays with offsets (CSR), which numba kernels
read directly.

Time compression. Memory only grows at the start of an interval, so the peak
is reached at some start point; and the live set at a start s is contained in
the live set at the next start s' unless an interval ends in (s, s']. The
constraint is therefore needed only at the starts followed by an end before
the next start (the maximal cliques of the interval graph). Those points are
renumbered 0..T-1 and every term gets the half-open range [t0, t1) of points
it covers (never empty: a term [s, e) covers the first kept point >= s).

Redundant points. If even the most memory-hungry choice of every variable fits
under the limit at point p, the constraint at p can never bind; such points are
dropped (a term's points stay a contiguous range after dropping), and a term
left with no point is dropped from the memory model.

Disjoint segments. The terms of one variable (several after merging
followers) are re-cut into disjoint ranges with summed usage, and each range's
minimum moves to the fixed memory, so that at any point a variable has at most
one term: checking a move term by term is then exact.

>>> from solver.problem import Problem
>>> from solver.reductions import reduce_problem
>>> p = Problem.from_dict({"nodes": [{"cost": [1, 2], "memory": [5, 1], "live": [0, 2]},
...     {"cost": [1, 0], "memory": [1, 5], "live": [1, 3]}],
...     "edges": [{"src": 0, "dst": 1, "cost": [[0, 1], [1, 0]]}], "memory_limit": 7})
>>> graph, _ = reduce_problem(p, dominance=False, followers=False, elimination=False)
>>> c = compile_graph(graph)
>>> c.num_vars, c.num_times
(2, 1)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from solver.graph import WorkingGraph
from solver.tolerance import BIG, kernel_costs

__all__ = ["CompiledGraph", "KernelArrays", "compile_graph", "assemble_graph", "memory_profile", "segment_profile"]


class KernelArrays(NamedTuple):
    """The arrays of a :class:`CompiledGraph` as numba kernels take them (one argument).

    The same arrays as the graph's (shared, not copied), except that forbidden
    costs are :data:`~solver.tolerance.BIG` in ``unary`` and ``edge_cost`` and
    that no memory limit is ``limit = BIG``. Built once per graph, by
    :attr:`CompiledGraph.arrays`; numba cannot take the dataclass itself.
    """

    dom: np.ndarray
    unary_off: np.ndarray
    unary: np.ndarray
    edge_u: np.ndarray
    edge_v: np.ndarray
    edge_off: np.ndarray
    edge_cost: np.ndarray
    adj_off: np.ndarray
    adj_edge: np.ndarray
    adj_other: np.ndarray
    adj_is_u: np.ndarray
    term_var: np.ndarray
    term_t0: np.ndarray
    term_t1: np.ndarray
    term_off: np.ndarray
    term_usage: np.ndarray
    var_term_off: np.ndarray
    var_term: np.ndarray
    base: np.ndarray
    limit: float


def segment_profile(num_times: int, t0: np.ndarray, t1: np.ndarray, usage: np.ndarray) -> np.ndarray:
    """Memory at each of ``num_times`` points of segments ``[t0, t1)`` using ``usage`` each."""
    diff = np.zeros(num_times + 1)
    if usage.shape[0]:
        np.add.at(diff, t0, usage)
        np.add.at(diff, t1, -usage)
    return np.cumsum(diff)[:-1]


def memory_profile(graph: "CompiledGraph | KernelArrays", values: np.ndarray) -> np.ndarray:
    """Memory at every kept point for one value per variable (of a graph or its kernel arrays)."""
    use = graph.term_usage[graph.term_off[:-1] + values[graph.term_var]]
    return graph.base + segment_profile(graph.base.shape[0], graph.term_t0, graph.term_t1, use)


@dataclass(frozen=True, slots=True, eq=False)
class CompiledGraph:
    """Flat arrays of a reduced graph (see module docstring)."""

    var_ids: np.ndarray  # working-graph id of each compact variable
    dom: np.ndarray  # int64 (n,)
    unary_off: np.ndarray  # int64 (n+1,)
    unary: np.ndarray  # float64, inf = forbidden
    edge_u: np.ndarray  # int64 (m,)
    edge_v: np.ndarray  # int64 (m,)
    edge_off: np.ndarray  # int64 (m+1,), matrices row-major [d_u, d_v]
    edge_cost: np.ndarray  # float64
    adj_off: np.ndarray  # int64 (n+1,)
    adj_edge: np.ndarray  # int64, edge index per incidence
    adj_other: np.ndarray  # int64, the other endpoint
    adj_is_u: np.ndarray  # bool, True when this variable is the edge's u
    num_times: int
    term_var: np.ndarray  # int64 (k,)
    term_t0: np.ndarray  # int64 (k,) first point covered
    term_t1: np.ndarray  # int64 (k,) one past the last point
    term_off: np.ndarray  # int64 (k+1,), usage per value of term_var
    term_usage: np.ndarray  # float64
    var_term_off: np.ndarray  # int64 (n+1,)
    var_term: np.ndarray  # int64 terms per variable
    base: np.ndarray  # float64 (T,) memory that does not depend on any choice
    time_points: np.ndarray  # int64 (T,) original time of each point
    limit: float  # inf without a memory limit
    constant: float  # cost that does not depend on any choice
    _arrays: KernelArrays | None = field(default=None, init=False, repr=False)

    @property
    def arrays(self) -> KernelArrays:
        """The kernels' view of this graph (:class:`KernelArrays`), built on first use."""
        if self._arrays is None:
            arrays = KernelArrays(
                dom=self.dom, unary_off=self.unary_off, unary=kernel_costs(self.unary),
                edge_u=self.edge_u, edge_v=self.edge_v, edge_off=self.edge_off,
                edge_cost=kernel_costs(self.edge_cost), adj_off=self.adj_off, adj_edge=self.adj_edge,
                adj_other=self.adj_other, adj_is_u=self.adj_is_u, term_var=self.term_var,
                term_t0=self.term_t0, term_t1=self.term_t1, term_off=self.term_off,
                term_usage=self.term_usage, var_term_off=self.var_term_off, var_term=self.var_term,
                base=self.base, limit=self.limit if math.isfinite(self.limit) else BIG)
            object.__setattr__(self, "_arrays", arrays)
        return self._arrays

    @property
    def num_vars(self) -> int:
        return int(self.dom.shape[0])

    @property
    def num_edges(self) -> int:
        return int(self.edge_u.shape[0])

    def unary_of(self, var: int) -> np.ndarray:
        return self.unary[self.unary_off[var] : self.unary_off[var + 1]]

    def edge_matrix(self, edge: int) -> np.ndarray:
        du, dv = self.dom[self.edge_u[edge]], self.dom[self.edge_v[edge]]
        return self.edge_cost[self.edge_off[edge] : self.edge_off[edge + 1]].reshape(du, dv)

    def term_usage_of(self, term: int) -> np.ndarray:
        return self.term_usage[self.term_off[term] : self.term_off[term + 1]]

    def edge_entries(self, values: np.ndarray) -> np.ndarray:
        """Per edge, the index in ``edge_cost`` of the pair that ``values`` choose."""
        return self.edge_off[:-1] + values[self.edge_u] * self.dom[self.edge_v] + values[self.edge_v]

    def cost(self, values: np.ndarray) -> float:
        """Objective (constant included) of one value per variable."""
        total = self.constant + float(self.unary[self.unary_off[:-1] + values].sum())
        if self.num_edges:
            total += float(self.edge_cost[self.edge_entries(values)].sum())
        return total

    def separable_bound(self) -> float:
        """A lower bound on every assignment's cost, in one pass: the constant plus each
        variable's cheapest value plus each edge's cheapest entry, each taken on its own
        (memory ignored). Weak, but known from the start, so progress reports a gap at once.

        >>> from solver.graph import WorkingGraph
        >>> from solver.problem import Problem
        >>> g = compile_graph(WorkingGraph.from_problem(Problem.from_dict({"format": "autoshard.problem/1",
        ...     "nodes": [{"cost": [1, 5]}, {"cost": [2, 0]}], "edges": [{"src": 0, "dst": 1, "cost": [[0, 7], [3, 1]]}]})))
        >>> g.separable_bound(), min(g.cost(np.array(v)) for v in ([0, 0], [0, 1], [1, 0], [1, 1]))
        (1.0, 3.0)
        """
        total = self.constant
        if self.num_vars:
            total += float(np.minimum.reduceat(self.unary, self.unary_off[:-1]).sum())
        if self.num_edges:
            total += float(np.minimum.reduceat(self.edge_cost, self.edge_off[:-1]).sum())
        return total

    def cost_shares(self, values: np.ndarray) -> np.ndarray:
        """Per variable, its unary cost plus half of each of its edges' costs at ``values``
        (the shares add up to the cost without the constant)."""
        shares = self.unary[self.unary_off[:-1] + values].copy()
        if self.num_edges:
            half = 0.5 * self.edge_cost[self.edge_entries(values)]
            np.add.at(shares, self.edge_u, half)
            np.add.at(shares, self.edge_v, half)
        return shares

    def memory_profile(self, values: np.ndarray) -> np.ndarray:
        """Memory at every kept point for one value per variable (:func:`memory_profile`)."""
        return memory_profile(self, values)

    def values_to_dict(self, values: np.ndarray) -> dict[int, int]:
        return {int(v): int(x) for v, x in zip(self.var_ids, values)}


def assemble_graph(
    *,
    var_ids: np.ndarray,
    unary: list[np.ndarray],
    edge_u: np.ndarray,
    edge_v: np.ndarray,
    edge_costs: list[np.ndarray],
    term_var: np.ndarray,
    term_t0: np.ndarray,
    term_t1: np.ndarray,
    term_usage: list[np.ndarray],
    base: np.ndarray,
    time_points: np.ndarray,
    limit: float,
    constant: float,
) -> CompiledGraph:
    """A CompiledGraph from per-variable, per-edge and per-segment pieces: offsets,
    the CSR adjacency (each edge listed under both ends) and the variable -> segment
    index are derived here."""
    n = len(unary)
    m = len(edge_costs)
    dom = np.array([u.shape[0] for u in unary], dtype=np.int64)

    def offsets(sizes) -> np.ndarray:
        off = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(np.asarray(sizes, dtype=np.int64), out=off[1:])
        return off

    edge_u = np.asarray(edge_u, dtype=np.int64)
    edge_v = np.asarray(edge_v, dtype=np.int64)
    inc_var = np.concatenate([edge_u, edge_v])
    order = np.argsort(inc_var, kind="stable")
    term_var = np.asarray(term_var, dtype=np.int64)
    return CompiledGraph(
        var_ids=np.asarray(var_ids, dtype=np.int64),
        dom=dom,
        unary_off=offsets(dom),
        unary=np.concatenate(unary).astype(np.float64) if n else np.zeros(0),
        edge_u=edge_u,
        edge_v=edge_v,
        edge_off=offsets([c.size for c in edge_costs]),
        edge_cost=np.concatenate([c.ravel() for c in edge_costs]).astype(np.float64) if m else np.zeros(0),
        adj_off=offsets(np.bincount(inc_var, minlength=n)),
        adj_edge=np.concatenate([np.arange(m), np.arange(m)])[order].astype(np.int64),
        adj_other=np.concatenate([edge_v, edge_u])[order].astype(np.int64),
        adj_is_u=np.concatenate([np.ones(m, bool), np.zeros(m, bool)])[order],
        num_times=int(time_points.shape[0]),
        term_var=term_var,
        term_t0=np.asarray(term_t0, dtype=np.int64),
        term_t1=np.asarray(term_t1, dtype=np.int64),
        term_off=offsets([u.shape[0] for u in term_usage]),
        term_usage=np.concatenate(term_usage).astype(np.float64) if term_usage else np.zeros(0),
        var_term_off=offsets(np.bincount(term_var, minlength=n)),
        var_term=np.argsort(term_var, kind="stable").astype(np.int64),
        base=np.asarray(base, dtype=np.float64),
        time_points=np.asarray(time_points, dtype=np.int64),
        limit=limit,
        constant=constant,
    )


def _kept_points(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Start points followed by an end before the next start (maximal live sets)."""
    if starts.size == 0:
        return np.zeros(1, dtype=np.int64)
    uniq = np.unique(starts)
    nxt = np.append(uniq[1:], np.iinfo(np.int64).max)
    sorted_ends = np.sort(ends)
    # an end e with s < e <= next start
    first_after = np.searchsorted(sorted_ends, uniq, side="right")
    has_end = first_after < sorted_ends.size
    has_end[has_end] = sorted_ends[first_after[has_end]] <= nxt[has_end]
    return uniq[has_end]


def _disjoint_segments(terms: list[tuple[int, int, np.ndarray]]) -> list[tuple[int, int, np.ndarray]]:
    """Cut overlapping ranges with usage vectors into disjoint ranges with summed usage."""
    if len(terms) == 1:
        return terms
    cuts = np.unique(np.array([t0 for t0, _, _ in terms] + [t1 for _, t1, _ in terms]))
    diff = np.zeros((cuts.shape[0], terms[0][2].shape[0]))
    for t0, t1, usage in terms:
        diff[np.searchsorted(cuts, t0)] += usage
        diff[np.searchsorted(cuts, t1)] -= usage
    level = np.cumsum(diff, axis=0)
    segments: list[tuple[int, int, np.ndarray]] = []
    for i in range(cuts.shape[0] - 1):
        usage = level[i]
        if not usage.any():
            continue
        if segments and segments[-1][1] == cuts[i] and np.array_equal(segments[-1][2], usage):
            segments[-1] = (segments[-1][0], int(cuts[i + 1]), usage)
        else:
            segments.append((int(cuts[i]), int(cuts[i + 1]), usage))
    return segments


def compile_graph(graph: WorkingGraph, *, drop_redundant_times: bool = True) -> CompiledGraph:
    """Flatten a (reduced) working graph; see the module docstring."""
    var_ids = np.array(sorted(graph.unary), dtype=np.int64)
    index = {int(v): i for i, v in enumerate(var_ids)}
    keys = sorted(graph.edges, key=lambda k: (index[k[0]], index[k[1]]))

    # Memory: time points from every interval (fixed ones included). The terms' bounds, ranges and
    # largest usages are taken as arrays (fixed terms first, then the variables' in variable order:
    # the order every sum below adds them in); an 8B graph has ~10^5 terms per compile.
    var_terms = [(index[v], t) for v in var_ids.tolist() for t in graph.memory[v]]
    fixed_terms = list(graph.fixed_memory)
    terms = fixed_terms + [t for _, t in var_terms]
    n_fixed, n_terms = len(fixed_terms), len(terms)
    bounded = np.fromiter((t.start is not None for t in terms), dtype=bool, count=n_terms)
    starts = np.fromiter((t.start if t.start is not None else 0 for t in terms), dtype=np.int64, count=n_terms)
    ends = np.fromiter((t.end if t.start is not None else 0 for t in terms), dtype=np.int64, count=n_terms)
    points = _kept_points(starts[bounded], ends[bounded])
    limit = math.inf if graph.memory_limit is None else float(graph.memory_limit)

    def point_ranges(pts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every term's kept points ``[t0, t1)``: all of them for a term without bounds."""
        t0 = np.where(bounded, np.searchsorted(pts, starts, "left"), 0)
        t1 = np.where(bounded, np.searchsorted(pts, ends, "left"), pts.shape[0])
        return t0.astype(np.int64), t1.astype(np.int64)

    fixed_usage = np.array([float(t.usage[0]) for t in fixed_terms], dtype=np.float64)
    if drop_redundant_times and math.isfinite(limit) and points.size:
        sizes = np.fromiter((t.usage.shape[0] for _, t in var_terms), dtype=np.int64, count=len(var_terms))
        most = (np.maximum.reduceat(np.concatenate([t.usage for _, t in var_terms]).astype(np.float64),
                                    np.concatenate([[0], np.cumsum(sizes)[:-1]]))
                if var_terms else np.zeros(0))
        t0, t1 = point_ranges(points)
        worst = segment_profile(points.shape[0], t0, t1, np.concatenate([fixed_usage, most]))
        points = points[worst > limit]
        if points.size == 0:
            points = np.zeros(0, dtype=np.int64)
    t0, t1 = point_ranges(points)
    base = (segment_profile(points.shape[0], t0[:n_fixed], t1[:n_fixed], fixed_usage) if points.size
            else np.zeros(0))

    # One variable's terms may overlap (merged followers): re-cut them into
    # disjoint segments with summed usage, so that a kernel checking one
    # segment at a time sees the variable's whole usage at every point.
    by_var: dict[int, list[tuple[int, int, np.ndarray]]] = {}
    for k in np.nonzero(t1[n_fixed:] > t0[n_fixed:])[0].tolist():
        var, term = var_terms[k]
        by_var.setdefault(var, []).append((int(t0[n_fixed + k]), int(t1[n_fixed + k]), term.usage))
    lows: list[tuple[int, int, float]] = []
    term_var, term_t0, term_t1, usages = [], [], [], []
    for var in sorted(by_var):
        for t0, t1, usage in _disjoint_segments(by_var[var]):
            low = float(usage.min())
            if low > 0:  # (R5) again: the part every value uses is fixed memory
                lows.append((t0, t1, low))
                usage = usage - low
            if usage.any():
                term_var.append(var)
                term_t0.append(t0)
                term_t1.append(t1)
                usages.append(usage)
    if points.size:
        low = np.array(lows, dtype=np.float64).reshape(-1, 3)  # (t0, t1, usage) rows
        base = base + segment_profile(points.shape[0], low[:, 0].astype(np.int64), low[:, 1].astype(np.int64),
                                      low[:, 2])
    return assemble_graph(
        var_ids=var_ids,
        unary=[graph.unary[v] for v in var_ids.tolist()],
        edge_u=np.array([index[u] for u, _ in keys], dtype=np.int64),
        edge_v=np.array([index[w] for _, w in keys], dtype=np.int64),
        edge_costs=[graph.edges[k] for k in keys],
        term_var=np.array(term_var, dtype=np.int64),
        term_t0=np.array(term_t0, dtype=np.int64),
        term_t1=np.array(term_t1, dtype=np.int64),
        term_usage=usages,
        base=base,
        time_points=points,
        limit=limit,
        constant=float(graph.constant),
    )
