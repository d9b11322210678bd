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

from solver.compiled import CompiledGraph, assemble_graph, segment_profile

__all__ = ["extract_window", "grow_window", "memory_partner"]


def extract_window(graph: CompiledGraph, x: np.ndarray, members: np.ndarray, profile: np.ndarray) -> CompiledGraph:
    """The window problem of ``members`` (sorted variable indices) around ``x``.

    ``profile`` is the memory at every point for ``x`` (``graph.memory_profile(x)``).
    Variable i of the result is ``members[i]``.
    """
    members = np.asarray(members, dtype=np.int64)
    local = np.full(graph.num_vars, -1, dtype=np.int64)
    local[members] = np.arange(members.size)
    unary = [graph.unary_of(int(v)).copy() for v in members]
    # edges: inside the window kept, to fixed neighbours folded into unary costs
    inside_u = local[graph.edge_u] >= 0
    inside_v = local[graph.edge_v] >= 0
    for e in np.flatnonzero(inside_u & ~inside_v):
        unary[local[graph.edge_u[e]]] += graph.edge_matrix(e)[:, x[graph.edge_v[e]]]
    for e in np.flatnonzero(~inside_u & inside_v):
        unary[local[graph.edge_v[e]]] += graph.edge_matrix(e)[x[graph.edge_u[e]], :]
    keep = np.flatnonzero(inside_u & inside_v)

    # memory: the window's segments, on the points they cover, above what the
    # rest of the solution uses there
    seg = np.flatnonzero(local[graph.term_var] >= 0) if graph.term_var.size else np.zeros(0, np.int64)
    points = np.zeros(0, dtype=np.int64)
    base = np.zeros(0)
    t0 = t1 = np.zeros(0, dtype=np.int64)
    if seg.size and math.isfinite(graph.limit):
        points = _covered_points(graph, seg)
        use = graph.term_usage[graph.term_off[seg] + x[graph.term_var[seg]]]
        base = (profile - segment_profile(graph.num_times, graph.term_t0[seg], graph.term_t1[seg], use))[points]
        t0 = np.searchsorted(points, graph.term_t0[seg], "left")
        t1 = np.searchsorted(points, graph.term_t1[seg], "left")
    else:
        seg = np.zeros(0, np.int64)
    return assemble_graph(
        var_ids=graph.var_ids[members],
        unary=unary,
        edge_u=local[graph.edge_u[keep]],
        edge_v=local[graph.edge_v[keep]],
        edge_costs=[graph.edge_matrix(int(e)) for e in keep],
        term_var=local[graph.term_var[seg]],
        term_t0=t0,
        term_t1=t1,
        term_usage=[graph.term_usage_of(int(s)) for s in seg],
        base=base,
        time_points=graph.time_points[points],
        limit=graph.limit,
        constant=0.0,
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


def memory_partner(graph: CompiledGraph, x: np.ndarray, members: np.ndarray, profile: np.ndarray,
                   rng: np.random.Generator) -> int | None:
    """A variable outside ``members`` that could free memory where the window is tightest.

    A window grown along edges holds the memory of the rest fixed, so at a point
    where the limit binds it can only swap layouts of equal or smaller memory.
    The tightest point p covered by the window's segments is found, and a
    variable with a segment live at p whose current value uses more there than
    its smallest value is drawn (weighted by what it could free); a window grown
    around it too can move memory from one part of the graph to the other.
    ``None`` when the window covers no point or no variable could free memory there.
    """
    if not graph.term_var.size or not math.isfinite(graph.limit):
        return None
    inside = np.zeros(graph.num_vars, dtype=bool)
    inside[members] = True
    seg = np.flatnonzero(inside[graph.term_var])
    if not seg.size:
        return None
    covered = _covered_points(graph, seg)
    if not covered.size:
        return None
    point = int(covered[np.argmax(profile[covered])])
    live = np.flatnonzero((graph.term_t0 <= point) & (graph.term_t1 > point) & ~inside[graph.term_var])
    if not live.size:
        return None
    use = graph.term_usage[graph.term_off[live] + x[graph.term_var[live]]]
    smallest = np.minimum.reduceat(graph.term_usage, graph.term_off[:-1])[live]
    free = use - smallest
    if not (free > 0).any():
        return None
    return int(graph.term_var[live[rng.choice(live.size, p=free / free.sum())]])


def _covered_points(graph: CompiledGraph, seg: np.ndarray) -> np.ndarray:
    """The memory points at which at least one of the segments ``seg`` is live."""
    cover = np.zeros(graph.num_times + 1, dtype=np.int64)
    np.add.at(cover, graph.term_t0[seg], 1)
    np.add.at(cover, graph.term_t1[seg], -1)
    return np.flatnonzero(np.cumsum(cover)[:-1] > 0)
