r"""Local search that honours the memory limit: construction, repair, 1- and 2-variable moves.

All moves work on a compiled graph through numba kernels (``solver.kernels``)
and keep a segment tree of the memory profile, so checking whether a move fits
costs O(terms of the variable x log T).

* ``greedy``: every variable takes its least-memory value (ties by cost), the
  start the contest's usage limit is built around (1.1 x its peak), made
  consistent (:func:`make_finite`), then :func:`repair` and descent.
* ``make_finite``: while an edge sits on a forbidden pair, move one of its
  ends to the value that leaves every edge of that end allowed with the
  least memory (ties by cost). Least-memory values chosen one by one can
  pair into forbidden combinations (a value that needs its neighbour in a
  particular state: a recomputed op needs its input held or recomputed), and
  repair moves one variable at a time, so it cannot leave such a start; the
  pass propagates the requirement along the edges instead.
* ``repair``: while the peak p exceeds the limit, move the variable/value
  with the best cost-per-byte freed at p, never raising another point above
  the current peak; a pass of least-memory moves is the fallback.
* ``one_opt``: each variable moves to its cheapest value given its
  neighbours, among the values that fit (slack per memory term computed once).
* ``pair_opt``: both ends of an edge move at once to the best pair
  (``g_u(a) + g_v(b) + M_uv(a, b)``), which escapes the local minima of 1-moves
  created by resharding costs (two ops that must change layout together).
* ``descend``: 1-opt and pair-opt until neither improves.

Every accepted move lowers the cost by more than rounding noise
(``solver.tolerance.descent_target``), so descent terminates.
"""

from __future__ import annotations

import time

import numba
import numpy as np

from solver.compiled import KernelArrays, memory_profile
from solver.kernels import (
    MemoryTree,
    apply_value,
    local_costs,
    local_costs_except,
    tree_argmax,
    tree_max,
)
from solver.tolerance import BIG, descent_target

__all__ = ["SearchState", "greedy", "repair", "one_opt", "pair_opt", "descend", "least_memory_values",
           "repaired_candidate", "make_finite"]

_descent_target = numba.njit(cache=True)(descent_target)


class SearchState(MemoryTree):
    """Values and the memory tree of their profile."""

    def __init__(self, arr: KernelArrays, x: np.ndarray, num_times: int | None = None) -> None:
        """``num_times`` (optional) must be the graph's number of points, ``arr.base.shape[0]``."""
        if num_times is not None and num_times != arr.base.shape[0]:
            raise ValueError(f"num_times: expected {arr.base.shape[0]} (the graph's points), got {num_times}")
        self.arr = arr
        self.x = np.ascontiguousarray(x, dtype=np.int64).copy()
        super().__init__(memory_profile(arr, self.x))

    def feasible(self) -> bool:
        return self.peak() <= self.arr.limit

    def take(self, other: "SearchState") -> None:
        """Adopt ``other``'s values and tree (no copy: ``other`` is not to be used after)."""
        self.x, self.tree, self.pend = other.x, other.tree, other.pend

    def copy(self) -> "SearchState":
        other = SearchState.__new__(SearchState)
        other.arr, other.num_times = self.arr, self.num_times
        other.x, other.tree, other.pend = self.x.copy(), self.tree.copy(), self.pend.copy()
        return other


@numba.njit(cache=True)
def least_memory_values(arr, length_weighted):  # pragma: no cover - compiled
    """Per variable, the value with the least memory (summed over its terms), ties by cost."""
    n = arr.dom.shape[0]
    x = np.zeros(n, dtype=np.int64)
    for v in range(n):
        d = arr.dom[v]
        best_use = np.inf
        best_cost = np.inf
        for b in range(d):
            use = 0.0
            for i in range(arr.var_term_off[v], arr.var_term_off[v + 1]):
                k = arr.var_term[i]
                w = (arr.term_t1[k] - arr.term_t0[k]) if length_weighted else 1.0
                use += w * arr.term_usage[arr.term_off[k] + b]
            c = arr.unary[arr.unary_off[v] + b]
            if use < best_use or (use == best_use and c < best_cost):
                best_use = use
                best_cost = c
                x[v] = b
    return x


@numba.njit(cache=True)
def _value_use(arr, v, b):  # pragma: no cover - compiled
    use = 0.0
    for i in range(arr.var_term_off[v], arr.var_term_off[v + 1]):
        k = arr.var_term[i]
        use += (arr.term_t1[k] - arr.term_t0[k]) * arr.term_usage[arr.term_off[k] + b]
    return use


@numba.njit(cache=True)
def make_finite(arr, x, max_rounds):  # pragma: no cover - compiled
    """Move ends of edges on forbidden pairs (module docstring); returns the moves made."""
    n = arr.dom.shape[0]
    maxd = 1
    for v in range(n):
        maxd = max(maxd, arr.dom[v])
    buf = np.empty(maxd)
    moves = 0
    half = BIG / 2
    for _ in range(max_rounds):
        changed = False
        for e in range(arr.edge_u.shape[0]):
            u = arr.edge_u[e]
            v = arr.edge_v[e]
            if arr.edge_cost[arr.edge_off[e] + x[u] * arr.dom[v] + x[v]] < half:
                continue
            best_w = -1
            best_b = -1
            best_use = np.inf
            best_cost = np.inf
            for side in range(2):
                w = u if side == 0 else v
                local_costs(arr, x, w, buf)
                for b in range(arr.dom[w]):
                    if buf[b] >= half:
                        continue
                    use = _value_use(arr, w, b) - _value_use(arr, w, x[w])
                    if use < best_use or (use == best_use and buf[b] < best_cost):
                        best_use = use
                        best_cost = buf[b]
                        best_w = w
                        best_b = b
            if best_w >= 0:
                x[best_w] = best_b
                moves += 1
                changed = True
        if not changed:
            break
    return moves


@numba.njit(cache=True)
def _term_slacks(arr, tree, pend, v, limit, out):
    j = 0
    for i in range(arr.var_term_off[v], arr.var_term_off[v + 1]):
        k = arr.var_term[i]
        out[j] = limit - tree_max(tree, pend, arr.term_t0[k], arr.term_t1[k])
        j += 1


@numba.njit(cache=True)
def _value_fits(arr, v, old, new, slacks):
    j = 0
    for i in range(arr.var_term_off[v], arr.var_term_off[v + 1]):
        k = arr.var_term[i]
        delta = arr.term_usage[arr.term_off[k] + new] - arr.term_usage[arr.term_off[k] + old]
        if delta > slacks[j]:
            return False
        j += 1
    return True


@numba.njit(cache=True)
def one_opt(arr, x, tree, pend, order, enforce):  # pragma: no cover - compiled
    """One sweep of best-improvement 1-moves over ``order``; returns the number of moves."""
    maxd = 1
    maxt = 1
    for v in range(arr.dom.shape[0]):
        maxd = max(maxd, arr.dom[v])
        maxt = max(maxt, arr.var_term_off[v + 1] - arr.var_term_off[v])
    buf = np.empty(maxd)
    slacks = np.empty(maxt)
    moves = 0
    for v in order:
        d = arr.dom[v]
        if d < 2:
            continue
        local_costs(arr, x, v, buf)
        cur = buf[x[v]]
        has_terms = arr.var_term_off[v + 1] > arr.var_term_off[v]
        checked = False
        best = _descent_target(cur)
        best_b = -1
        # try values from the cheapest; the first that fits is the best move
        for _ in range(d):
            cand = -1
            cand_cost = best
            for b in range(d):
                if buf[b] < cand_cost:
                    cand_cost = buf[b]
                    cand = b
            if cand < 0:
                break
            if enforce and has_terms:
                if not checked:
                    _term_slacks(arr, tree, pend, v, arr.limit, slacks)
                    checked = True
                if not _value_fits(arr, v, x[v], cand, slacks):
                    buf[cand] = np.inf
                    continue
            best_b = cand
            break
        if best_b >= 0:
            apply_value(arr, tree, pend, x, v, best_b)
            moves += 1
    return moves


@numba.njit(cache=True)
def pair_opt(arr, x, tree, pend, edges, enforce, tries):  # pragma: no cover - compiled
    """One sweep of best-improvement moves of both ends of each edge in ``edges``.

    With ``enforce``, the best ``tries`` improving pairs are tried in order
    until one fits the memory limit.
    """
    maxd = 1
    for v in range(arr.dom.shape[0]):
        maxd = max(maxd, arr.dom[v])
    gu = np.empty(maxd)
    gv = np.empty(maxd)
    skip_a = np.empty(max(tries, 1), dtype=np.int64)
    skip_b = np.empty(max(tries, 1), dtype=np.int64)
    moves = 0
    for e in edges:
        u = arr.edge_u[e]
        v = arr.edge_v[e]
        du = arr.dom[u]
        dv = arr.dom[v]
        if du * dv < 2:
            continue
        local_costs_except(arr, x, u, e, gu)
        local_costs_except(arr, x, v, e, gv)
        xu = x[u]
        xv = x[v]
        off = arr.edge_off[e]
        cur = gu[xu] + gv[xv] + arr.edge_cost[off + xu * dv + xv]
        bound = _descent_target(cur)
        skipped = 0
        while skipped < tries:
            best = bound
            ba = -1
            bb = -1
            for a in range(du):
                ga = gu[a]
                if ga >= best:
                    continue
                row = off + a * dv
                for b in range(dv):
                    t = ga + gv[b] + arr.edge_cost[row + b]
                    if t < best:
                        excluded = False
                        for s in range(skipped):
                            if skip_a[s] == a and skip_b[s] == b:
                                excluded = True
                                break
                        if not excluded:
                            best = t
                            ba = a
                            bb = b
            if ba < 0:
                break
            apply_value(arr, tree, pend, x, u, ba)
            apply_value(arr, tree, pend, x, v, bb)
            if not enforce or (_terms_fit(arr, tree, pend, u) and _terms_fit(arr, tree, pend, v)):
                moves += 1
                break
            apply_value(arr, tree, pend, x, u, xu)
            apply_value(arr, tree, pend, x, v, xv)
            skip_a[skipped] = ba
            skip_b[skipped] = bb
            skipped += 1
    return moves


@numba.njit(cache=True)
def _terms_fit(arr, tree, pend, v):
    for i in range(arr.var_term_off[v], arr.var_term_off[v + 1]):
        k = arr.var_term[i]
        if tree_max(tree, pend, arr.term_t0[k], arr.term_t1[k]) > arr.limit:
            return False
    return True


@numba.njit(cache=True)
def repair(arr, x, tree, pend, max_steps):  # pragma: no cover - compiled
    """Lower the peak until it fits; returns True when the memory limit holds."""
    n = arr.dom.shape[0]
    maxd = 1
    for v in range(n):
        maxd = max(maxd, arr.dom[v])
    buf = np.empty(maxd)
    use_p = np.empty(maxd)
    num_terms = arr.term_t0.shape[0]
    covers_var = np.zeros(n, dtype=np.bool_)
    for _ in range(max_steps):
        peak, p = tree_argmax(tree, pend)
        if peak <= arr.limit:
            return True
        for v in range(n):
            covers_var[v] = False
        for k in range(num_terms):
            if arr.term_t0[k] <= p and p < arr.term_t1[k]:
                covers_var[arr.term_var[k]] = True
        best_ratio = np.inf
        best_v = -1
        best_b = -1
        for v in range(n):
            if not covers_var[v]:
                continue
            d = arr.dom[v]
            for b in range(d):
                use_p[b] = 0.0
            for i in range(arr.var_term_off[v], arr.var_term_off[v + 1]):
                k = arr.var_term[i]
                if arr.term_t0[k] <= p and p < arr.term_t1[k]:
                    for b in range(d):
                        use_p[b] += arr.term_usage[arr.term_off[k] + b]
            local_costs(arr, x, v, buf)
            xv = x[v]
            for b in range(d):
                freed = use_p[xv] - use_p[b]
                if freed <= 0.0:
                    continue
                ratio = (buf[b] - buf[xv]) / freed
                if ratio < best_ratio:
                    # never raise another point of v's terms above the current peak
                    ok = True
                    for i in range(arr.var_term_off[v], arr.var_term_off[v + 1]):
                        k = arr.var_term[i]
                        delta = arr.term_usage[arr.term_off[k] + b] - arr.term_usage[arr.term_off[k] + xv]
                        if delta > 0.0 and tree_max(tree, pend, arr.term_t0[k], arr.term_t1[k]) + delta >= peak:
                            ok = False
                            break
                    if ok:
                        best_ratio = ratio
                        best_v = v
                        best_b = b
        if best_v < 0:
            return False
        apply_value(arr, tree, pend, x, best_v, best_b)
    peak, p = tree_argmax(tree, pend)
    return peak <= arr.limit


def descend(
    state: SearchState,
    *,
    enforce: bool = True,
    pairs: bool = True,
    rng: np.random.Generator | None = None,
    max_rounds: int = 1000,
    deadline: float | None = None,
    tries: int = 3,
) -> int:
    """1-opt and pair-opt sweeps until no move improves; returns the number of moves."""
    arr = state.arr
    n = arr.dom.shape[0]
    all_edges = np.arange(arr.edge_u.shape[0], dtype=np.int64)
    total = 0
    for _ in range(max_rounds):
        order = rng.permutation(n).astype(np.int64) if rng is not None else np.arange(n, dtype=np.int64)
        moves = one_opt(arr, state.x, state.tree, state.pend, order, enforce)
        if pairs and all_edges.size:
            edges = rng.permutation(all_edges) if rng is not None else all_edges
            moves += pair_opt(arr, state.x, state.tree, state.pend, edges, enforce, tries)
        total += moves
        if moves == 0 or (deadline is not None and time.perf_counter() > deadline):
            break
    return total


def repaired_candidate(arr: KernelArrays, labels: np.ndarray, num_times: int, *,
                       rng: np.random.Generator | None = None, deadline: float | None = None) -> SearchState | None:
    """``labels`` (e.g. a priced problem's optimum) repaired to the memory limit and descended
    under the real costs; None when the repair cannot make them fit."""
    candidate = SearchState(arr, labels, num_times)
    repair(arr, candidate.x, candidate.tree, candidate.pend, 100_000)
    if not candidate.feasible():
        return None
    descend(candidate, enforce=True, rng=rng, deadline=deadline)
    return candidate if candidate.feasible() else None


def greedy(arr: KernelArrays, num_times: int, *, rng: np.random.Generator | None = None,
           deadline: float | None = None) -> SearchState:
    """Least-memory start, repaired and descended (see module docstring)."""
    start = least_memory_values(arr, True)
    make_finite(arr, start, 1000)
    state = SearchState(arr, start, num_times)
    if num_times:
        repair(arr, state.x, state.tree, state.pend, 100_000)
    descend(state, enforce=state.feasible(), rng=rng, deadline=deadline)
    return state
