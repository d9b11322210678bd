r"""A window of variables as a problem of its own, the rest of the solution fixed.

For a set W of variables and a current assignment x, the window problem over
x_W is

    min  sum_{v in W} [c_v(x_v) + sum_{w not in W} M_vw(x_v, x_w)] + sum_{(u,v) in W} M_uv(x_u, x_v)
    s.t. at every point p covered by a segment of W:
         sum_{segments s of W at p} m_s(x_{v_s}) <= L - (mem_p(x) - mem^W_p(x))

i.e. unary costs absorb the edges to fixed neighbours, and the memory the
rest of the solution uses at p becomes the window's fixed memory. Any
solution of the window problem, spliced into x, is a solution of the full
problem whose cost differs by exactly the window's cost difference; so exact
solves of windows (large-neighbourhood search) only ever improve x.
"""

from __future__ import annotations

import math

import numpy as np

from solver.compiled import CompiledGraph

__all__ = ["extract_window", "grow_window"]


def extract_window(graph: CompiledGraph, x: np.ndarray, members: np.ndarray, profile: np.ndarray) -> CompiledGraph:
    """The window problem of ``members`` (sorted variable indices) around ``x``.

    ``profile`` is the memory at every point for ``x`` (``graph.memory_profile(x)``).
    Variable i of the result is ``members[i]``.
    """
    members = np.asarray(members, dtype=np.int64)
    n = graph.num_vars
    local = np.full(n, -1, dtype=np.int64)
    local[members] = np.arange(members.size)
    dom = graph.dom[members]
    unary_off = np.zeros(members.size + 1, dtype=np.int64)
    np.cumsum(dom, out=unary_off[1:])
    unary = np.concatenate([graph.unary_of(v) for v in members]).astype(np.float64)
    # edges: inside the window kept, to fixed neighbours folded into unary, others dropped
    inside_u = local[graph.edge_u] >= 0
    inside_v = local[graph.edge_v] >= 0
    constant = 0.0
    keep = np.flatnonzero(inside_u & inside_v)
    for e in np.flatnonzero(inside_u & ~inside_v):
        u = local[graph.edge_u[e]]
        unary[unary_off[u] : unary_off[u + 1]] += graph.edge_matrix(e)[:, x[graph.edge_v[e]]]
    for e in np.flatnonzero(~inside_u & inside_v):
        v = local[graph.edge_v[e]]
        unary[unary_off[v] : unary_off[v + 1]] += graph.edge_matrix(e)[x[graph.edge_u[e]], :]
    edge_u = local[graph.edge_u[keep]]
    edge_v = local[graph.edge_v[keep]]
    sizes = graph.edge_off[keep + 1] - graph.edge_off[keep]
    edge_off = np.zeros(keep.size + 1, dtype=np.int64)
    np.cumsum(sizes, out=edge_off[1:])
    edge_cost = (np.concatenate([graph.edge_cost[graph.edge_off[e] : graph.edge_off[e + 1]] for e in keep])
                 if keep.size else np.zeros(0))
    inc_var = np.concatenate([edge_u, edge_v])
    inc_edge = np.concatenate([np.arange(keep.size), np.arange(keep.size)])
    inc_other = np.concatenate([edge_v, edge_u])
    inc_is_u = np.concatenate([np.ones(keep.size, bool), np.zeros(keep.size, bool)])
    order = np.argsort(inc_var, kind="stable")
    adj_off = np.zeros(members.size + 1, dtype=np.int64)
    np.cumsum(np.bincount(inc_var, minlength=members.size), out=adj_off[1:])

    # memory: the window's segments, on the points they cover
    seg = np.flatnonzero(local[graph.term_var] >= 0) if graph.term_var.size else np.zeros(0, np.int64)
    if seg.size and math.isfinite(graph.limit):
        cover = np.zeros(graph.num_times + 1, dtype=np.int64)
        np.add.at(cover, graph.term_t0[seg], 1)
        np.add.at(cover, graph.term_t1[seg], -1)
        points = np.flatnonzero(np.cumsum(cover)[:-1] > 0)
        window_use = np.zeros(graph.num_times + 1)
        use = graph.term_usage[graph.term_off[seg] + x[graph.term_var[seg]]]
        np.add.at(window_use, graph.term_t0[seg], use)
        np.add.at(window_use, graph.term_t1[seg], -use)
        outside = profile - np.cumsum(window_use)[:-1]
        base = outside[points]
        t0 = np.searchsorted(points, graph.term_t0[seg], "left")
        t1 = np.searchsorted(points, graph.term_t1[seg], "left")
        term_var = local[graph.term_var[seg]]
        usages = [graph.term_usage_of(int(s)) for s in seg]
        limit = graph.limit
    else:
        points = np.zeros(0, dtype=np.int64)
        base = np.zeros(0)
        t0 = t1 = term_var = np.zeros(0, dtype=np.int64)
        usages = []
        limit = graph.limit
    term_off = np.zeros(len(usages) + 1, dtype=np.int64)
    np.cumsum([u.shape[0] for u in usages], out=term_off[1:])
    torder = np.argsort(term_var, kind="stable")
    var_term_off = np.zeros(members.size + 1, dtype=np.int64)
    np.cumsum(np.bincount(term_var, minlength=members.size), out=var_term_off[1:])
    return CompiledGraph(
        var_ids=graph.var_ids[members],
        dom=dom,
        unary_off=unary_off,
        unary=unary,
        edge_u=edge_u,
        edge_v=edge_v,
        edge_off=edge_off,
        edge_cost=edge_cost.astype(np.float64),
        adj_off=adj_off,
        adj_edge=inc_edge[order].astype(np.int64),
        adj_other=inc_other[order].astype(np.int64),
        adj_is_u=inc_is_u[order],
        num_times=int(points.size),
        term_var=term_var.astype(np.int64),
        term_t0=t0.astype(np.int64),
        term_t1=t1.astype(np.int64),
        term_off=term_off,
        term_usage=np.concatenate(usages).astype(np.float64) if usages else np.zeros(0),
        var_term_off=var_term_off,
        var_term=torder.astype(np.int64),
        base=base.astype(np.float64),
        time_points=points.astype(np.int64),
        limit=limit,
        constant=constant,
    )


def grow_window(graph: CompiledGraph, seed: int, max_choices: int, max_pairs: int,
                rng: np.random.Generator) -> np.ndarray:
    """A connected set of variables around ``seed``, grown breadth-first in random
    order until its values or edge entries would exceed the budgets."""
    chosen = {seed}
    choices = int(graph.dom[seed])
    pairs = 0
    frontier = [seed]
    while frontier:
        v = frontier.pop(int(rng.integers(len(frontier))))
        lo, hi = graph.adj_off[v], graph.adj_off[v + 1]
        for i in rng.permutation(np.arange(lo, hi)):
            w = int(graph.adj_other[i])
            if w in chosen:
                continue
            extra_pairs = sum(int(graph.dom[w] * graph.dom[graph.adj_other[j]])
                              for j in range(graph.adj_off[w], graph.adj_off[w + 1])
                              if int(graph.adj_other[j]) in chosen)
            if choices + graph.dom[w] > max_choices or pairs + extra_pairs > max_pairs:
                continue
            chosen.add(w)
            choices += int(graph.dom[w])
            pairs += extra_pairs
            frontier.append(w)
    return np.array(sorted(chosen), dtype=np.int64)
