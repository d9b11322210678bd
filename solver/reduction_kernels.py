r"""The numba kernels of the reductions (``solver.reductions``).

Each kernel runs on a flat view (``solver.reduction_views``) and takes the
decisions of one reduction for all the variables a stage visits: R2
(:func:`forbidden_closure`), R6 (:func:`follower_flags`,
:func:`follower_links`, :func:`follower_mapping`) and R7
(:func:`dominated_values`); :func:`compact` restricts the view's costs to the
values left, for the graph to take over.

Kernels take the locals to visit as an ``order`` array, and visit them and
their neighbours exactly as a loop over the Python sets of the passes does:
dominance (R7) and followers (R6) are not confluent (which of two mutually
dominating values stays, which end of a two-way follower edge merges depends
on the visiting order), unary sums round in visiting order, and R2's events
decide the order in which the next pass visits variables. Every decision is
the one the per-variable loop takes, and floating-point sums run in the same
order.

All kernels use ``cache=True``; :func:`compile_kernels` compiles them (or
loads them from numba's cache) once per process, so that the reductions can
report that time apart.
"""

from __future__ import annotations

import functools
import time

import numba
import numpy as np

from solver.graph import WorkingGraph
from solver.reduction_views import gather_terms, gather_view

__all__ = [
    "compile_kernels",
    "forbidden_closure",
    "compact",
    "follower_flags",
    "follower_links",
    "follower_mapping",
    "dominated_values",
    "CLOSED",
    "EMPTY",
    "NEEDS_ADJACENCY",
]

# Outcomes of forbidden_closure.
CLOSED = 0  # arc consistent; the events say what was removed
EMPTY = 1  # a domain became empty: the problem is infeasible
NEEDS_ADJACENCY = 2  # a variable whose neighbours are not loaded shrank; load them and rerun


# -- shared helpers -------------------------------------------------------------
@numba.njit(cache=True, inline="always")
def _entry(view, e, row_side, mine, theirs):
    """M(var, other)[mine, theirs] for edge e seen from var (row_side: var is the stored row)."""
    if row_side:
        return view.costs[view.edge_off[e] + mine * view.edge_cols[e] + theirs]
    return view.costs[view.edge_off[e] + theirs * view.edge_cols[e] + mine]


@numba.njit(cache=True)
def _has_finite(view, e, row_side, mine, other, alive):
    # Does value `mine` have a finite cost with some live value of `other`?
    start = view.val_off[other]
    for x in range(view.val_off[other + 1] - start):
        if alive[start + x] and np.isfinite(_entry(view, e, row_side, mine, x)):
            return True
    return False


# -- (R2) forbidden values -------------------------------------------------------
@numba.njit(cache=True)
def _drop(alive, start, d, ok):
    # Kill the live values i of [start, start + d) without ok[i]: (removed, left alive).
    removed, left = 0, 0
    for i in range(d):
        if alive[start + i]:
            if ok[i]:
                left += 1
            else:
                alive[start + i] = False
                removed += 1
    return removed, left


@numba.njit(cache=True)
def _shrunk(var, removed, event_var, event_removed, events, stack, top):
    # Record that `var` lost `removed` values and queue it to re-check its neighbours.
    event_var[events], event_removed[events] = var, removed
    stack[top] = var
    return events + 1, top + 1


@numba.njit(cache=True)
def forbidden_closure(view, order, alive):  # pragma: no cover - compiled
    """(R2) arc consistency on infinite costs, as the per-variable AC-3 loop does it.

    The locals in ``order`` are checked against their unary costs and every
    neighbour; each one that shrinks is pushed on a stack, and a popped
    variable re-checks its neighbours against itself. ``alive`` (one flag per
    value) is updated in place. Returns ``(outcome, local, event_var,
    event_removed)``: CLOSED, EMPTY or NEEDS_ADJACENCY with the local it is
    about, and the shrink events (local, values removed) in order.
    """
    total = alive.shape[0]
    event_var = np.empty(total, dtype=np.int64)
    event_removed = np.empty(total, dtype=np.int64)
    stack = np.empty(total, dtype=np.int64)
    ok = np.empty(total, dtype=np.bool_)
    events = 0
    top = 0
    for c in order:
        start, d = view.val_off[c], view.val_off[c + 1] - view.val_off[c]
        for i in range(d):
            ok[i] = alive[start + i] and np.isfinite(view.unary[start + i])
        for k in range(view.adj_off[c], view.adj_off[c + 1]):
            for i in range(d):
                if ok[i]:
                    ok[i] = _has_finite(view, view.adj_edge[k], view.adj_row[k], i, view.adj_other[k], alive)
        removed, left = _drop(alive, start, d, ok)
        if removed:
            events, top = _shrunk(c, removed, event_var, event_removed, events, stack, top)
            if left == 0:
                return EMPTY, c, event_var[:events], event_removed[:events]
    while top:
        top -= 1
        v = stack[top]
        if v >= view.num_loaded:
            return NEEDS_ADJACENCY, v, event_var[:events], event_removed[:events]
        for k in range(view.adj_off[v], view.adj_off[v + 1]):
            o = view.adj_other[k]
            start, d = view.val_off[o], view.val_off[o + 1] - view.val_off[o]
            for i in range(d):
                # the edge seen from o: o is the row side iff v is not
                ok[i] = alive[start + i] and _has_finite(view, view.adj_edge[k], not view.adj_row[k], i, v, alive)
            removed, left = _drop(alive, start, d, ok)
            if removed:
                events, top = _shrunk(o, removed, event_var, event_removed, events, stack, top)
                if left == 0:
                    return EMPTY, o, event_var[:events], event_removed[:events]
    return CLOSED, -1, event_var[:events], event_removed[:events]


@numba.njit(cache=True)
def compact(view, alive):  # pragma: no cover - compiled
    """Unary costs and edge matrices of the view restricted to the ``alive`` values.

    Returns ``(unary_off, kept, unary, edge_changed, edge_off, edge_rows,
    costs)``: local L keeps the values ``kept[unary_off[L] : unary_off[L + 1]]``
    with costs ``unary[unary_off[L] : unary_off[L + 1]]``; an edge with a removed
    value at either end (``edge_changed``) becomes the row-major matrix at
    ``costs[edge_off[E] :]`` with ``edge_rows[E]`` rows (live rows by live
    columns, in order).
    """
    num_vars = view.dom.shape[0]
    live = np.zeros(num_vars, dtype=np.int64)
    for v in range(num_vars):
        live[v] = alive[view.val_off[v] : view.val_off[v + 1]].sum()
    unary_off = np.zeros(num_vars + 1, dtype=np.int64)
    for v in range(num_vars):
        unary_off[v + 1] = unary_off[v] + live[v]
    unary = np.empty(unary_off[num_vars])
    kept = np.empty(unary_off[num_vars], dtype=np.int64)
    at = 0
    for v in range(num_vars):
        for i in range(view.val_off[v + 1] - view.val_off[v]):
            if alive[view.val_off[v] + i]:
                unary[at] = view.unary[view.val_off[v] + i]
                kept[at] = i
                at += 1
    num_edges = view.edge_rows.shape[0]
    lo, hi = view.local[view.edge_lo], view.local[view.edge_hi]
    edge_changed = np.zeros(num_edges, dtype=np.bool_)
    edge_off = np.zeros(num_edges + 1, dtype=np.int64)
    for e in range(num_edges):
        edge_changed[e] = live[lo[e]] < view.dom[lo[e]] or live[hi[e]] < view.dom[hi[e]]
        edge_off[e + 1] = edge_off[e] + (live[lo[e]] * live[hi[e]] if edge_changed[e] else 0)
    costs = np.empty(edge_off[num_edges])
    for e in range(num_edges):
        if not edge_changed[e]:
            continue
        at = edge_off[e]
        rows_start, cols_start = view.val_off[lo[e]], view.val_off[hi[e]]
        for i in range(view.edge_rows[e]):
            if alive[rows_start + i]:
                row = view.edge_off[e] + i * view.edge_cols[e]
                for j in range(view.edge_cols[e]):
                    if alive[cols_start + j]:
                        costs[at] = view.costs[row + j]
                        at += 1
    return unary_off, kept, unary, edge_changed, edge_off, live[lo], costs


# -- (R6) followers ---------------------------------------------------------------
@numba.njit(cache=True)
def follower_flags(view, alive):  # pragma: no cover - compiled
    """Per stored edge: does every row (column) have at most one finite entry?

    Only the ``alive`` values count (rows and columns of values removed since
    the view was gathered are gone from the graph). Every row at most one
    finite: the column end is a function of the row end.
    """
    num_edges = view.edge_rows.shape[0]
    rows_ok = np.ones(num_edges, dtype=np.bool_)
    cols_ok = np.ones(num_edges, dtype=np.bool_)
    for e in range(num_edges):
        r, c, off = view.edge_rows[e], view.edge_cols[e], view.edge_off[e]
        row_alive = view.val_off[view.local[view.edge_lo[e]]]
        col_alive = view.val_off[view.local[view.edge_hi[e]]]
        col_count = np.zeros(c, dtype=np.int64)
        for i in range(r):
            if not alive[row_alive + i]:
                continue
            count = 0
            for j in range(c):
                if alive[col_alive + j] and np.isfinite(view.costs[off + i * c + j]):
                    count += 1
                    col_count[j] += 1
            if count > 1:
                rows_ok[e] = False
        for j in range(c):
            if col_count[j] > 1:
                cols_ok[e] = False
                break
    return rows_ok, cols_ok


@numba.njit(cache=True)
def follower_links(view, order, rows_ok, cols_ok, gone):  # pragma: no cover - compiled
    """(R6) who follows whom, as the loop over candidates and their neighbours finds it.

    Visiting edge (var, other): if var has no leader yet and every value of
    other allows at most one value of var, var follows other; else if other
    has none and the converse holds, other follows var. Neighbours ``gone``
    from the graph since the view was gathered (folded by R3) are skipped.
    Returns ``(follower, leader)`` local indices in the order the links were
    made.
    """
    num_vars = view.dom.shape[0]
    has_leader = np.zeros(num_vars, dtype=np.bool_)
    follower = np.empty(num_vars, dtype=np.int64)
    leader = np.empty(num_vars, dtype=np.int64)
    links = 0
    for c in order:
        for k in range(view.adj_off[c], view.adj_off[c + 1]):
            o = view.adj_other[k]
            if gone[o] or (has_leader[c] and has_leader[o]):
                continue
            e = view.adj_edge[k]
            # M(o, c) is the stored matrix if o is the row side, else its transpose
            c_follows = cols_ok[e] if view.adj_row[k] else rows_ok[e]
            o_follows = rows_ok[e] if view.adj_row[k] else cols_ok[e]
            if not has_leader[c] and c_follows:
                has_leader[c] = True
                follower[links], leader[links] = c, o
                links += 1
            elif not has_leader[o] and o_follows:
                has_leader[o] = True
                follower[links], leader[links] = o, c
                links += 1
    return follower[:links], leader[:links]


@numba.njit(cache=True)
def follower_mapping(stored, transposed):  # pragma: no cover - compiled
    """The map f with x_var = f(x_leader), or an empty array if var does not follow.

    ``stored`` is the edge's matrix, ``[leader value, var value]`` (or the
    transpose if ``transposed``). var follows if every row has at most one
    finite entry; f picks it (the first value if the row has none).
    """
    rows = stored.shape[1] if transposed else stored.shape[0]
    cols = stored.shape[0] if transposed else stored.shape[1]
    mapping = np.zeros(rows, dtype=np.int64)
    for i in range(rows):
        count = 0
        for j in range(cols):
            if np.isfinite(stored[j, i] if transposed else stored[i, j]):
                if count == 0:
                    mapping[i] = j
                count += 1
        if count > 1:
            return mapping[:0]
    return mapping


# -- (R7) dominated values ----------------------------------------------------------
@numba.njit(cache=True)
def dominated_values(view, order, term_off, usage_off, usage, alive):  # pragma: no cover - compiled
    """(R7) remove dominated values of each local of ``order`` in turn; values removed per position.

    A local sees its neighbours' domains as left by the locals before it
    (``alive`` is updated in place). Its rows ``M_cw(a, .)`` over the live
    values of every neighbour w, in neighbour order, are copied side by side
    first, so that the pairwise test reads contiguous memory. Memory terms
    of the i-th local of ``order`` are those of :func:`gather_terms`.
    """
    removed_count = np.zeros(order.shape[0], dtype=np.int64)
    for pos in range(order.shape[0]):
        c = order[pos]
        start, d = view.val_off[c], view.val_off[c + 1] - view.val_off[c]
        if d < 2:
            continue
        first, last = view.adj_off[c], view.adj_off[c + 1]
        bounds = np.zeros(last - first + 1, dtype=np.int64)
        for k in range(first, last):
            o = view.adj_other[k]
            bounds[k - first + 1] = bounds[k - first] + alive[view.val_off[o] : view.val_off[o + 1]].sum()
        rows = np.empty((d, bounds[-1]))
        for k in range(first, last):
            o, e, row_side = view.adj_other[k], view.adj_edge[k], view.adj_row[k]
            col = bounds[k - first]
            for x in range(view.val_off[o + 1] - view.val_off[o]):
                if alive[view.val_off[o] + x]:
                    for a in range(d):
                        rows[a, col] = _entry(view, e, row_side, a, x)
                    col += 1
        terms = np.empty((d, term_off[pos + 1] - term_off[pos]))
        for t in range(term_off[pos], term_off[pos + 1]):
            for a in range(d):
                terms[a, t - term_off[pos]] = usage[usage_off[t] + a]
        removed = _dominated(view.unary[start : start + d], rows, bounds, terms)
        for a in range(d):
            if removed[a]:
                alive[start + a] = False
                removed_count[pos] += 1
    return removed_count


@numba.njit(cache=True)
def _dominated(unary, rows, bounds, usage):  # pragma: no cover - compiled
    # A value is dropped when a value not dropped yet dominates it. Among
    # mutually dominating values the first one examined goes and the other
    # stays; by transitivity every dropped value keeps a surviving dominator.
    # Sums run in neighbour order, as the statement of R7 writes them.
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
                            # worst only grows and rounding is monotone: the
                            # block would end with slack > 0, so stop here
                            if slack + worst > 0:
                                break
                slack += worst
                if slack > 0:
                    break
            if slack <= 0:
                removed[a] = True
                break
    return removed


# -- compilation ------------------------------------------------------------------
@functools.cache
def _compile() -> float:
    from solver.problem import Problem

    start = time.perf_counter()
    problem = Problem.from_dict({
        "nodes": [{"cost": [1, 2], "memory": [1, 2]}, {"cost": [0, 0, 1]}],
        "edges": [{"src": 0, "dst": 1, "cost": [[0, 1, None], [1, 1, 2]]}],
    })
    graph = WorkingGraph.from_problem(problem)
    view = gather_view(graph, [0, 1])
    order = np.arange(2)
    alive = np.ones(int(view.val_off[-1]), dtype=np.bool_)
    forbidden_closure(view, order, alive)
    compact(view, alive)
    follower_links(view, order, *follower_flags(view, alive), np.zeros(2, dtype=np.bool_))
    follower_mapping(graph.edges[(0, 1)], False)
    dominated_values(view, order, *gather_terms(graph, [0, 1]), alive)
    return time.perf_counter() - start


def compile_kernels() -> float:
    """Compile the kernels (or load them from numba's on-disk cache), once per process.

    Returns the seconds that took on the first call and 0.0 afterwards, so
    that callers can report it apart from the time of the reductions.
    """
    first = _compile.cache_info().currsize == 0
    seconds = _compile()
    return seconds if first else 0.0
