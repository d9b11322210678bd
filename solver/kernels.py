"""Numba kernels shared by the search methods: the memory tree and move evaluation.

Kernels take a compiled graph as one :class:`~solver.compiled.KernelArrays`
named tuple (``graph.arrays``), where a forbidden cost is
:data:`~solver.tolerance.BIG` (a large finite number) instead of ``inf`` so
that differences of two forbidden costs are 0, not NaN; any total of at
least ``BIG`` means "uses a forbidden cost" (``solver.tolerance``).

Memory profile: a segment tree over the T kept time points supporting
``add(l, r, delta)`` on a range and ``max(l, r)`` over a range, each
O(log T), written without recursion (numba's cache does not handle recursive
kernels). ``tree[node]`` is the maximum over the node's range *excluding* the
pending adds of its ancestors; ``pend[node]`` is an add still owed to the
node's children. A query first pushes the pending adds down the two boundary
paths, which hold every ancestor of the nodes it reads. :class:`MemoryTree`
is the Python handle on one tree.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["MemoryTree", "local_costs", "local_costs_except", "apply_value", "tree_build", "tree_add", "tree_max",
           "tree_argmax"]


# -- segment tree -------------------------------------------------------------
@numba.njit(cache=True)
def tree_size(num_times):
    size = 1
    while size < max(num_times, 1):
        size *= 2
    return size


@numba.njit(cache=True)
def tree_build(values):
    size = tree_size(values.shape[0])
    tree = np.full(2 * size, -np.inf)
    pend = np.zeros(2 * size)
    tree[size : size + values.shape[0]] = values
    for node in range(size - 1, 0, -1):
        tree[node] = max(tree[2 * node], tree[2 * node + 1])
    return tree, pend


@numba.njit(cache=True)
def _apply(tree, pend, node, delta, size):
    tree[node] += delta
    if node < size:
        pend[node] += delta


@numba.njit(cache=True)
def _rebuild(tree, pend, node, size):
    while node > 1:
        node >>= 1
        tree[node] = max(tree[2 * node], tree[2 * node + 1]) + pend[node]


@numba.njit(cache=True)
def _push(tree, pend, node, size):
    # move the pending adds of node's ancestors down, root first
    height = 0
    while (1 << height) < size:
        height += 1
    for shift in range(height, 0, -1):
        i = node >> shift
        if pend[i] != 0.0:
            _apply(tree, pend, 2 * i, pend[i], size)
            _apply(tree, pend, 2 * i + 1, pend[i], size)
            pend[i] = 0.0


@numba.njit(cache=True)
def tree_add(tree, pend, l, r, delta):
    """Add ``delta`` at every point of [l, r)."""
    if delta == 0.0 or r <= l:
        return
    size = tree.shape[0] // 2
    lo = l + size
    hi = r + size
    while lo < hi:
        if lo & 1:
            _apply(tree, pend, lo, delta, size)
            lo += 1
        if hi & 1:
            hi -= 1
            _apply(tree, pend, hi, delta, size)
        lo >>= 1
        hi >>= 1
    _rebuild(tree, pend, l + size, size)
    _rebuild(tree, pend, r - 1 + size, size)


@numba.njit(cache=True)
def tree_max(tree, pend, l, r):
    """Maximum over [l, r) (``-inf`` for an empty range)."""
    if r <= l:
        return -np.inf
    size = tree.shape[0] // 2
    _push(tree, pend, l + size, size)
    _push(tree, pend, r - 1 + size, size)
    lo = l + size
    hi = r + size
    res = -np.inf
    while lo < hi:
        if lo & 1:
            res = max(res, tree[lo])
            lo += 1
        if hi & 1:
            hi -= 1
            res = max(res, tree[hi])
        lo >>= 1
        hi >>= 1
    return res


@numba.njit(cache=True)
def tree_argmax(tree, pend):
    """(maximum over all points, a point where it is reached)."""
    node = 1
    size = tree.shape[0] // 2
    while node < size:
        left = 2 * node
        # children values are relative to this node's pending add; compare them
        if tree[left] >= tree[left + 1]:
            node = left
        else:
            node = left + 1
    return tree[1], node - size


# -- state helpers ------------------------------------------------------------
@numba.njit(cache=True)
def local_costs(arr, x, v, out):
    """out[b] = unary_v(b) + sum over edges of v of M(b, x_other)."""
    local_costs_except(arr, x, v, -1, out)


@numba.njit(cache=True)
def local_costs_except(arr, x, v, skip_edge, out):
    """As local_costs without edge ``skip_edge``; summing it out instead would
    lose every other term next to a forbidden (BIG) entry."""
    d = arr.dom[v]
    base = arr.unary_off[v]
    for b in range(d):
        out[b] = arr.unary[base + b]
    for i in range(arr.adj_off[v], arr.adj_off[v + 1]):
        e = arr.adj_edge[i]
        if e == skip_edge:
            continue
        w = arr.adj_other[i]
        off = arr.edge_off[e]
        if arr.adj_is_u[i]:
            dw = arr.dom[w]
            xw = x[w]
            for b in range(d):
                out[b] += arr.edge_cost[off + b * dw + xw]
        else:
            start = off + x[w] * d
            for b in range(d):
                out[b] += arr.edge_cost[start + b]


@numba.njit(cache=True)
def apply_value(arr, tree, pend, x, v, new):
    """Set x[v] = new, updating the memory tree."""
    old = x[v]
    if old == new:
        return
    for i in range(arr.var_term_off[v], arr.var_term_off[v + 1]):
        k = arr.var_term[i]
        delta = arr.term_usage[arr.term_off[k] + new] - arr.term_usage[arr.term_off[k] + old]
        tree_add(tree, pend, arr.term_t0[k], arr.term_t1[k], delta)
    x[v] = new


class MemoryTree:
    """Python handle on one segment tree over a memory profile (module docstring)."""

    def __init__(self, values: np.ndarray) -> None:
        self.tree, self.pend = tree_build(np.asarray(values, dtype=np.float64))
        self.num_times = int(values.shape[0])

    def add(self, lo: int, hi: int, delta: float) -> None:
        tree_add(self.tree, self.pend, lo, hi, float(delta))

    def max(self, lo: int, hi: int) -> float:
        return float(tree_max(self.tree, self.pend, lo, hi))

    def argmax(self) -> tuple[float, int]:
        value, point = tree_argmax(self.tree, self.pend)
        return float(value), int(point)

    def peak(self) -> float:
        """The maximum over all points (0 without points)."""
        return float(tree_argmax(self.tree, self.pend)[0]) if self.num_times else 0.0
