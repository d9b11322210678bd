r"""The integer program, built as sparse arrays, with memory rows added lazily.

On a compiled (reduced) graph with variables v, values a in D_v, edges
e = (u, v) with finite pairs F_e, and memory segments s (variable v_s, usage
m_s(a), kept time points P_s):

    minimise   K + sum_v sum_a c_v(a) x_va + sum_e sum_{(a,b) in F_e} M_e(a,b) y_eab

    (A) sum_a x_va = 1                                   for every variable v
    (B) sum_b y_eab = x_ua                               for every edge e, a in D_u
    (C) sum_a y_eab = x_vb                               for every edge e, b in D_v
    (D) sum_{s : p in P_s} sum_a m_s(a) x_{v_s a} <= L - base_p    for p in the active set
        x binary, y >= 0 (continuous)

(B) and (C) linearise the edge costs exactly: with x one-hot, the only
non-negative y whose rows sum to x_u and whose columns sum to x_v is the outer
product, so y_eab = x_ua x_vb. Pairs with infinite cost get no y at all, which
forbids them. Their LP relaxation is the local polytope of the pairwise
problem, tight on trees and nearly so on these graphs.

Lazy memory rows (D). A kept time point's row is added only when a solution
violates it: the program with a subset of rows is a relaxation, so its bound is
a valid lower bound of the full problem, and a solution that satisfies every
row of the full profile is optimal for the full problem when it is optimal for
the relaxation. Which points to start with and which to add are chosen by
``solver.memory_points``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.compiled import CompiledGraph

__all__ = ["LinearProgram", "build_program"]


@dataclass(frozen=True, slots=True, eq=False)
class LinearProgram:
    """``min c.z + constant`` s.t. rows (CSR) with senses ``'E'``/``'L'``; z[:num_binary] binary."""

    cost: np.ndarray  # (num_vars,)
    num_binary: int  # x variables come first and are binary; y are continuous in [0, 1]
    row_off: np.ndarray  # (num_rows + 1,)
    row_col: np.ndarray
    row_val: np.ndarray
    sense: np.ndarray  # (num_rows,) 'E' or 'L' as uint8 codes (ord)
    rhs: np.ndarray
    constant: float
    memory_points: np.ndarray  # active time points, in row order after the others
    y_entry: np.ndarray  # for each y column: index into graph.edge_cost

    @property
    def num_vars(self) -> int:
        return int(self.cost.shape[0])

    @property
    def num_rows(self) -> int:
        return int(self.rhs.shape[0])

    @property
    def num_nonzeros(self) -> int:
        return int(self.row_col.shape[0])

    def x_part(self, z: np.ndarray) -> np.ndarray:
        """The x (one-hot) columns of a solution."""
        return z[: self.num_binary]

    def values_from_solution(self, z: np.ndarray, graph: CompiledGraph) -> np.ndarray:
        """Per variable, the value of largest x (its value when x is integral)."""
        x = self.x_part(z)
        values = np.empty(graph.num_vars, dtype=np.int64)
        for v in range(graph.num_vars):
            values[v] = int(np.argmax(x[graph.unary_off[v] : graph.unary_off[v + 1]]))
        return values

    def solution_from_values(self, values: np.ndarray, graph: CompiledGraph) -> np.ndarray:
        """The full (x, y) vector of an assignment (for warm starts)."""
        z = np.zeros(self.num_vars)
        z[graph.unary_off[:-1] + values] = 1.0
        if self.y_entry.size:
            chosen = graph.edge_entries(values)
            pos = np.searchsorted(self.y_entry, chosen)
            ok = (pos < self.y_entry.size) & (self.y_entry[np.minimum(pos, self.y_entry.size - 1)] == chosen)
            z[self.num_binary + pos[ok]] = 1.0
        return z


def build_program(graph: CompiledGraph, points: np.ndarray) -> LinearProgram:
    """Rows (A)-(D) of the module docstring for the active memory ``points``."""
    n = graph.num_vars
    num_x = int(graph.unary_off[-1])
    finite_x = np.isfinite(graph.unary)
    cost_x = np.where(finite_x, graph.unary, 0.0)

    # y columns: finite pairs only
    y_entry = np.flatnonzero(np.isfinite(graph.edge_cost))
    num_y = y_entry.size
    cols_y = num_x + np.arange(num_y)
    sizes = np.diff(graph.edge_off)
    edge_of = np.repeat(np.arange(graph.num_edges), sizes)[y_entry] if num_y else np.zeros(0, np.int64)
    local = y_entry - graph.edge_off[edge_of]
    dv = graph.dom[graph.edge_v[edge_of]]
    ya = local // dv
    yb = local % dv

    rows_i: list[np.ndarray] = []
    rows_j: list[np.ndarray] = []
    rows_v: list[np.ndarray] = []
    senses: list[np.ndarray] = []
    rhs: list[np.ndarray] = []
    next_row = 0

    # (A) one value per variable; forbidden unary values are fixed to 0 by leaving them out
    var_of_x = np.repeat(np.arange(n), graph.dom)
    keep = finite_x
    rows_i.append(next_row + var_of_x[keep])
    rows_j.append(np.flatnonzero(keep))
    rows_v.append(np.ones(int(keep.sum())))
    senses.append(np.full(n, ord("E"), np.uint8))
    rhs.append(np.ones(n))
    next_row += n

    # (B) row sums, one row per (edge, value of u); (C) column sums, per (edge, value of v)
    for end, value_of_y in ((graph.edge_u, ya), (graph.edge_v, yb)):
        sizes_end = graph.dom[end]
        first = np.zeros(graph.num_edges + 1, dtype=np.int64)
        np.cumsum(sizes_end, out=first[1:])
        count = int(first[-1])
        edge_rows = np.repeat(np.arange(graph.num_edges), sizes_end)
        value_of_row = np.arange(count) - first[:-1][edge_rows]
        rows_i += [next_row + first[:-1][edge_of] + value_of_y, next_row + np.arange(count)]
        rows_j += [cols_y, graph.unary_off[end[edge_rows]] + value_of_row]
        rows_v += [np.ones(num_y), -np.ones(count)]
        senses.append(np.full(count, ord("E"), np.uint8))
        rhs.append(np.zeros(count))
        next_row += count

    # (D) memory rows at the active points
    points = np.unique(np.asarray(points, dtype=np.int64))
    if points.size and graph.term_var.size:
        for r, p in enumerate(points):
            segs = np.flatnonzero((graph.term_t0 <= p) & (p < graph.term_t1))
            for s in segs:
                var = graph.term_var[s]
                use = graph.term_usage[graph.term_off[s] : graph.term_off[s + 1]]
                nz = np.flatnonzero(use)
                rows_i.append(np.full(nz.size, next_row + r))
                rows_j.append(graph.unary_off[var] + nz)
                rows_v.append(use[nz])
        senses.append(np.full(points.size, ord("L"), np.uint8))
        rhs.append(graph.limit - graph.base[points])
        next_row += points.size
    else:
        points = np.zeros(0, dtype=np.int64)

    i = np.concatenate(rows_i).astype(np.int64)
    j = np.concatenate(rows_j).astype(np.int64)
    v = np.concatenate(rows_v)
    order = np.lexsort((j, i))
    i, j, v = i[order], j[order], v[order]
    row_off = np.zeros(next_row + 1, dtype=np.int64)
    np.cumsum(np.bincount(i, minlength=next_row), out=row_off[1:])
    cost = np.concatenate([cost_x, graph.edge_cost[y_entry]])
    return LinearProgram(
        cost=cost,
        num_binary=num_x,
        row_off=row_off,
        row_col=j,
        row_val=v,
        sense=np.concatenate(senses),
        rhs=np.concatenate(rhs),
        constant=graph.constant,
        memory_points=points,
        y_entry=y_entry,
    )
