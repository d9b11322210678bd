r"""Exact minimisation of a pairwise problem of small treewidth by variable elimination.

Problem. As in :mod:`solver.trws`: values a in D_i, unary costs theta_i(a) and
edge matrices theta_ij(a, b); minimise E(x) = sum_i theta_i(x_i) +
sum_(i,j) theta_ij(x_i, x_j), without the memory limit (callers price memory
into the unaries, see :mod:`solver.lagrangian`). ``inf`` marks a forbidden
entry and is carried through the sums.

Elimination. Variables are eliminated one at a time in an order pi chosen
greedily (fewest fill-in edges first, then the smallest table: the product of
the domains of the variable and its current neighbours). Eliminating v with
current neighbours S_v (the original ones plus fill-in from earlier
eliminations) builds its bag
table over B_v = {v} + S_v from the factors of its *bucket* (its unary, the
edges to neighbours eliminated after it, and the messages of earlier buckets
whose first remaining variable is v), and sends

    mu_v(s) = min_{a in D_v} [ theta_v(a) + sum_{f in bucket(v)} f(a, s) ],   s in prod_{u in S_v} D_u

to the bucket of the first variable of S_v eliminated after v. A variable
with S_v empty ends a connected component: mu_v is a number, and
min_x E(x) = sum of those numbers. Decoding walks pi backwards: every
variable of S_v is fixed before v, so x_v = argmin stored for (x_u)_{u in S_v}.
This is exact (bucket elimination, Dechter 1999); the cost is
sum_v |B_v| x (factors of v), exponential in the width of the order, so
:func:`plan_elimination` refuses graphs whose tables would be too large.

The plan depends only on the graph's structure; :func:`solve_plan` takes any
unary costs, which makes repeated solves under changing memory prices cheap
(one numba pass over the tables). :func:`min_marginals` adds a top-down pass
(outside messages) that gives, for every variable and value, the best energy
with that value fixed, which :mod:`solver.colgen` uses for reduced-cost fixing.

>>> from solver.problem import Problem
>>> from solver.reductions import reduce_problem
>>> from solver.compiled import compile_graph
>>> p = Problem.from_dict({"nodes": [{"cost": [1, 2]}, {"cost": [3, 0]}, {"cost": [0, 0]}],
...     "edges": [{"src": 0, "dst": 1, "cost": [[0, 5], [5, 0]]}, {"src": 1, "dst": 2, "cost": [[0, 1], [1, 0]]}]})
>>> g = compile_graph(reduce_problem(p, dominance=False, followers=False, elimination=False)[0])
>>> plan = plan_elimination(g)
>>> labels, value = solve_plan(plan, g)
>>> float(value + g.constant), labels.tolist()
(2.0, [1, 1, 1])
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass

import numba
import numpy as np

from solver.compiled import CompiledGraph
from solver.tolerance import REL_TOL

__all__ = ["EliminationPlan", "plan_elimination", "solve_plan", "min_marginals", "MAX_WORK", "MAX_TABLE"]

MAX_WORK = 1_500_000_000  # sum over buckets of table size x factors: about 3 ns each
MAX_TABLE = 4_000_000  # entries of the largest bag table

# factor kinds: where a factor's values live
_UNARY, _EDGE, _MESSAGE = 0, 1, 2


@dataclass(frozen=True, slots=True, eq=False)
class EliminationPlan:
    """Bucket elimination compiled to flat arrays (see the module docstring)."""

    order: np.ndarray  # int64 (n,) variables in elimination order
    bag_off: np.ndarray  # int64 (n+1,) offsets into bag_var / bag_dom per step
    bag_var: np.ndarray  # int64 bag variables, the eliminated one first
    bag_dom: np.ndarray  # int64 their domain sizes
    msg_off: np.ndarray  # int64 (n+1,) offsets of each step's message in the message buffer
    fac_off: np.ndarray  # int64 (n+1,) offsets into the factor arrays per step
    fac_kind: np.ndarray  # int64 _UNARY | _EDGE | _MESSAGE
    fac_base: np.ndarray  # int64 offset of the factor's table in its array
    fac_coef: np.ndarray  # int64 (factors, max bag) stride of each bag position in the factor's table
    fac_child: np.ndarray  # int64 step whose message the factor is, -1 for unary and edge factors
    width: int  # largest bag minus one
    work: int  # sum of table sizes x factors
    largest_table: int

    @property
    def num_vars(self) -> int:
        return int(self.order.shape[0])


def _elimination_order(graph: CompiledGraph, max_table: int, max_work: int,
                       deadline: float) -> tuple[list[int], list[list[int]]] | None:
    """Greedy min-fill order (ties: smallest table) and each variable's neighbours when
    eliminated; None when some table would exceed ``max_table``.

    Min-fill measured 26 % less table work than smallest-table-first on the
    transformer graphs of ``benchmarks/synthetic_graphs.py``.
    """
    n = graph.num_vars
    dom = graph.dom.astype(np.int64)
    adj: list[set[int]] = [set() for _ in range(n)]
    for u, v in zip(graph.edge_u.tolist(), graph.edge_v.tolist()):
        if u != v:
            adj[u].add(v)
            adj[v].add(u)
    logdom = np.log(np.maximum(dom, 1)).tolist()

    # a variable with more neighbours than this has a table over max_table
    # (domains are >= 2 after the reductions): no fill count needed, and the
    # search gives up early on graphs of large treewidth (IOPDDL: degrees in
    # the thousands after fill-in)
    max_degree = int(math.log2(max(max_table, 2)))

    def key(v: int) -> tuple[int, float]:
        nbrs = list(adj[v])
        if len(nbrs) > max_degree:
            return n * n, math.inf
        fill = sum(1 for i, a in enumerate(nbrs) for b in nbrs[i + 1:] if b not in adj[a])
        return fill, logdom[v] + sum(logdom[u] for u in nbrs)

    current = [key(v) for v in range(n)]
    heap = [(k, v) for v, k in enumerate(current)]
    heapq.heapify(heap)
    done = [False] * n
    order: list[int] = []
    scopes: list[list[int]] = []
    limit = math.log(max_table) + REL_TOL  # a table of max_table entries fits
    work = 0.0
    while heap:
        k, v = heapq.heappop(heap)
        if done[v] or k != current[v]:
            continue
        work += math.exp(k[1]) * (len(adj[v]) + 2)
        if k[1] > limit or work > max_work or time.perf_counter() > deadline:
            return None
        done[v] = True
        nbrs = sorted(adj[v])
        order.append(v)
        scopes.append(nbrs)
        for u in nbrs:
            adj[u].discard(v)
        # fill counts change for the neighbours (v left them) and, for each
        # fill-in edge (a, b), for the common neighbours of a and b
        touched = set(nbrs)
        for i, a in enumerate(nbrs):
            for b in nbrs[i + 1:]:
                if b not in adj[a]:
                    touched.update(adj[a] & adj[b])
                    adj[a].add(b)
                    adj[b].add(a)
        for u in touched:
            if not done[u]:
                current[u] = key(u)
                heapq.heappush(heap, (current[u], u))
    return order, scopes


def plan_elimination(graph: CompiledGraph, *, max_work: int = MAX_WORK, max_table: int = MAX_TABLE,
                     deadline: float | None = None) -> EliminationPlan | None:
    """Compile bucket elimination for ``graph``; None when it would exceed ``max_work`` or
    ``max_table``, or when finding the order runs past ``deadline`` (a ``time.perf_counter()`` value)."""
    found = _elimination_order(graph, max_table, max_work, math.inf if deadline is None else deadline)
    if found is None:
        return None
    order, scopes = found
    n = graph.num_vars
    dom = graph.dom.astype(np.int64)
    pos = np.empty(n, dtype=np.int64)
    pos[np.asarray(order, dtype=np.int64)] = np.arange(n)
    # each factor goes to the bucket of its first eliminated variable
    # (kind, base, vars, strides, child step)
    bucket: list[list[tuple[int, int, list[int], list[int], int]]] = [[] for _ in range(n)]
    for v in range(n):
        bucket[pos[v]].append((_UNARY, int(graph.unary_off[v]), [v], [1], -1))
    for e, (u, v) in enumerate(zip(graph.edge_u.tolist(), graph.edge_v.tolist())):
        first = min(pos[u], pos[v])
        bucket[first].append((_EDGE, int(graph.edge_off[e]), [u, v], [int(dom[v]), 1], -1))
    bag_off = [0]
    bag_var: list[int] = []
    msg_off = [0]
    width = 0
    work = 0
    largest = 1
    factors: list[tuple[int, int, list[int], int]] = []  # kind, base, coefficient per bag position, child
    fac_off = [0]
    for k, (v, scope) in enumerate(zip(order, scopes)):
        bag = [v] + sorted(scope, key=lambda u: pos[u])
        size = int(np.prod(dom[bag]))
        msg_size = size // int(dom[v])
        where = {u: i for i, u in enumerate(bag)}
        for kind, base, fvars, fstrides, child in bucket[k]:
            coef = [0] * len(bag)
            for u, s in zip(fvars, fstrides):
                coef[where[u]] += s
            factors.append((kind, base, coef, child))
        work += size * (len(bucket[k]) + 1)
        if work > max_work:
            return None
        largest = max(largest, size)
        width = max(width, len(scope))
        fac_off.append(len(factors))
        if scope:
            # the message is row-major over the scope in elimination order
            strides = [int(np.prod(dom[bag[i + 1:]])) for i in range(1, len(bag))]
            bucket[pos[bag[1]]].append((_MESSAGE, msg_off[-1], bag[1:], strides, k))
        msg_off.append(msg_off[-1] + msg_size)
        bag_var.extend(bag)
        bag_off.append(len(bag_var))
    coef = np.zeros((len(factors), width + 1), dtype=np.int64)
    for i, (_, _, c, _) in enumerate(factors):
        coef[i, : len(c)] = c
    bag_var_arr = np.asarray(bag_var, dtype=np.int64)
    return EliminationPlan(
        order=np.asarray(order, dtype=np.int64), bag_off=np.asarray(bag_off, dtype=np.int64),
        bag_var=bag_var_arr, bag_dom=dom[bag_var_arr] if bag_var else np.zeros(0, dtype=np.int64),
        msg_off=np.asarray(msg_off, dtype=np.int64), fac_off=np.asarray(fac_off, dtype=np.int64),
        fac_kind=np.asarray([f[0] for f in factors], dtype=np.int64),
        fac_base=np.asarray([f[1] for f in factors], dtype=np.int64), fac_coef=coef,
        fac_child=np.asarray([f[3] for f in factors], dtype=np.int64),
        width=width, work=work, largest_table=largest)


def _buffers(plan: EliminationPlan, graph: CompiledGraph, unary: np.ndarray | None):
    unary = graph.unary if unary is None else unary
    # one buffer [edge costs | unary costs | messages], so the kernel reads
    # every factor the same way (no branch per table entry)
    e, u = graph.edge_cost.size, graph.unary.size
    data = np.empty(e + u + int(plan.msg_off[-1]), dtype=np.float64)
    data[:e] = graph.edge_cost
    data[e:e + u] = unary
    shift = np.array([e, 0, e + u], dtype=np.int64)  # _UNARY, _EDGE, _MESSAGE
    base = plan.fac_base + shift[plan.fac_kind]
    argmin = np.empty(int(plan.msg_off[-1]), dtype=np.int32)
    return data, base, argmin, plan.msg_off + e + u


def solve_plan(plan: EliminationPlan, graph: CompiledGraph,
               unary: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """Optimal labels and min E of ``graph`` with ``unary`` costs (default: its own).

    ``unary`` is laid out as ``CompiledGraph.unary``; the value excludes the
    graph's constant, and is ``inf`` when every labelling uses a forbidden entry.
    """
    data, base, argmin, msg_at = _buffers(plan, graph, unary)
    labels = np.zeros(plan.num_vars, dtype=np.int64)
    value = _eliminate(plan.bag_off, plan.bag_var, plan.bag_dom, msg_at, plan.msg_off,
                       plan.fac_off, base, plan.fac_coef, data, argmin, labels)
    return labels, float(value)


def min_marginals(plan: EliminationPlan, graph: CompiledGraph,
                  unary: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """For every variable v and value a, min E over the labellings with x_v = a.

    Returns (min-marginals laid out as ``graph.unary``, optimal labels, min E),
    all without the graph's constant. A second, top-down pass over the
    elimination tree computes for every step k the *outside* message
    out_k(s) = min cost of the factors outside k's subtree given its scope s:
    for a step p and the message of its child c,

        out_c(s) = min_{b in B_p, b|S_c = s} [ sum_{f in bucket(p), f != mu_c} f(b) + out_p(b|S_p) ],

    with out = 0 at the last step of each component; then
    minmarg_v(a) = min_s [ table_v(a, s) + out_v(s) ] + the minima of the other components.
    """
    data, base, argmin, msg_at = _buffers(plan, graph, unary)
    labels = np.zeros(plan.num_vars, dtype=np.int64)
    value = _eliminate(plan.bag_off, plan.bag_var, plan.bag_dom, msg_at, plan.msg_off,
                       plan.fac_off, base, plan.fac_coef, data, argmin, labels)
    marg = np.full(graph.unary.size, np.inf)
    _outside(plan.bag_off, plan.bag_var, plan.bag_dom, msg_at, plan.msg_off, plan.fac_off, base, plan.fac_coef,
             plan.fac_child, data, graph.unary_off, marg)
    return marg, labels, float(value)


@numba.njit(cache=True, nogil=True, inline="always")
def _next_entry(digits, idx, fac_coef, f0, nf, bag_dom, b0, r):  # pragma: no cover - compiled
    """Step the bag's odometer (last position fastest) and every factor's index with it."""
    i = r - 1
    while i >= 0:
        digits[i] += 1
        for f in range(nf):
            idx[f] += fac_coef[f0 + f, i]
        if digits[i] < bag_dom[b0 + i]:
            return
        for f in range(nf):
            idx[f] -= fac_coef[f0 + f, i] * digits[i]
        digits[i] = 0
        i -= 1


@numba.njit(cache=True, nogil=True)
def _eliminate(bag_off, bag_var, bag_dom, msg_at, msg_off, fac_off, fac_base, fac_coef, data, argmin,
               labels):  # pragma: no cover - compiled
    n = bag_off.shape[0] - 1
    total = 0.0
    digits = np.zeros(fac_coef.shape[1], dtype=np.int64)
    nf_max = 1
    for k in range(n):
        nf_max = max(nf_max, fac_off[k + 1] - fac_off[k])
    idx = np.zeros(nf_max, dtype=np.int64)
    for k in range(n):
        b0, b1 = bag_off[k], bag_off[k + 1]
        r = b1 - b0
        f0, f1 = fac_off[k], fac_off[k + 1]
        nf = f1 - f0
        m0 = msg_at[k]
        a0 = msg_off[k]
        msize = msg_off[k + 1] - a0
        for j in range(msize):
            data[m0 + j] = np.inf
            argmin[a0 + j] = 0
        for i in range(r):
            digits[i] = 0
        for f in range(nf):
            idx[f] = fac_base[f0 + f]
        for a in range(bag_dom[b0]):
            for j in range(msize):
                val = 0.0
                for f in range(nf):
                    val += data[idx[f]]
                if val < data[m0 + j]:
                    data[m0 + j] = val
                    argmin[a0 + j] = a
                _next_entry(digits, idx, fac_coef, f0, nf, bag_dom, b0, r)
        if r == 1:
            total += data[m0]
    # decode backwards: the scope of each step is fixed before its variable
    for k in range(n - 1, -1, -1):
        b0, b1 = bag_off[k], bag_off[k + 1]
        j = 0
        for i in range(b0 + 1, b1):
            j = j * bag_dom[i] + labels[bag_var[i]]
        labels[bag_var[b0]] = argmin[msg_off[k] + j]
    return total


@numba.njit(cache=True, nogil=True)
def _outside(bag_off, bag_var, bag_dom, msg_at, msg_off, fac_off, fac_base, fac_coef, fac_child, data,
             unary_off, marg):  # pragma: no cover - compiled
    n = bag_off.shape[0] - 1
    out = np.full(msg_off[n], np.inf)
    # each step's component (the last step of it, where the scope is empty):
    # a min-marginal adds the minimum of every other component
    pos = np.empty(n, dtype=np.int64)
    for k in range(n):
        pos[bag_var[bag_off[k]]] = k
    root = np.empty(n, dtype=np.int64)
    total = 0.0
    for k in range(n - 1, -1, -1):
        if bag_off[k + 1] - bag_off[k] == 1:
            root[k] = k
            total += data[msg_at[k]]
        else:
            root[k] = root[pos[bag_var[bag_off[k] + 1]]]
    digits = np.zeros(fac_coef.shape[1], dtype=np.int64)
    nf_max = 1
    for k in range(n):
        nf_max = max(nf_max, fac_off[k + 1] - fac_off[k])
    idx = np.zeros(nf_max, dtype=np.int64)
    for p in range(n - 1, -1, -1):
        b0, b1 = bag_off[p], bag_off[p + 1]
        r = b1 - b0
        f0, f1 = fac_off[p], fac_off[p + 1]
        nf = f1 - f0
        o0 = msg_off[p]
        msize = msg_off[p + 1] - o0
        if r == 1:
            out[o0] = 0.0  # the last step of a component: nothing outside
        # skip = -1: the min-marginals of p's variable; skip = f: the outside message of that child
        for skip in range(-1, nf):
            if skip >= 0 and fac_child[f0 + skip] < 0:
                continue
            c0 = 0
            if skip >= 0:
                c0 = msg_off[fac_child[f0 + skip]]
            for i in range(r):
                digits[i] = 0
            for f in range(nf):
                idx[f] = fac_base[f0 + f]
            for a in range(bag_dom[b0]):
                best = np.inf
                for j in range(msize):
                    val = out[o0 + j]
                    for f in range(nf):
                        if f != skip:
                            val += data[idx[f]]
                    if skip < 0:
                        if val < best:
                            best = val
                    else:
                        ci = c0 + idx[skip] - fac_base[f0 + skip]
                        if val < out[ci]:
                            out[ci] = val
                    _next_entry(digits, idx, fac_coef, f0, nf, bag_dom, b0, r)
                if skip < 0:
                    own = data[msg_at[root[p]]]
                    if best == np.inf or own == np.inf:
                        marg[unary_off[bag_var[b0]] + a] = np.inf
                    else:
                        marg[unary_off[bag_var[b0]] + a] = best + (total - own)
