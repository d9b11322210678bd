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

(R6) Followers. If, on edge (u, w), every row a of M_uw has at most one
     finite entry f(a), every finite solution has x_w = f(x_u): merge w into u
     (c_u(a) += c_w(f(a)) + M_uw(a, f(a)), w's other edges and memory terms
     re-indexed through f; a row without a finite entry is a value of u that
     no finite solution takes, f(a) = 0 there). Likewise by columns. A leaf w
     (one neighbour u) is a follower too if, for every a, some b of smallest
     usage in every memory term of w attains min_b c_w(b) + M_uw(a, b); f(a)
     is the first such b (0 where every b is forbidden, again a value of u
     no finite solution takes): any other b costs no less and uses no less
     memory.
     (A row whose least-usage values are all forbidden while another value
     is finite has no such b, and the leaf does not follow.)

(R7) Dominated values. b dominates a in D_v when using b instead of a never
     costs more, whatever the neighbours choose, and never uses more memory:

         c_v(b) - c_v(a) + sum_w max_{x in D_w, M_vw(a,x) < inf} (M_vw(b,x) - M_vw(a,x)) <= 0
         and m_v(b) <= m_v(a) for every memory term of v.

     Replacing a by b in any solution keeps it feasible and no worse, so a can
     be removed. The relation is transitive (max of a sum <= sum of maxes), so
     all dominated values can go at once: values are examined in index order
     and a goes when a value still present dominates it, so of two equal
     values the later one stays.

(R8) Memory-free elimination (bucket elimination). A variable v without
     memory terms and with at most two neighbours is eliminated exactly:
     degree 0: x_v = argmin c_v; degree 1 (neighbour u):
     c_u(a) += min_b [c_v(b) + M_uv(a, b)]; degree 2 (neighbours u, w):
     a new edge N(a, c) = min_b [c_v(b) + M_uv(a, b) + M_vw(b, c)]. The
     argmin tables give x_v back once u (and w) are known. Degree 2 is applied
     only when the new table stays small (|D_u| |D_v| |D_w| bounded).

A pass applies R5, R2, R3, R6, R7 and R8 to the variables touched by the
previous pass (all of them at first), until nothing changes.

Implementation (``solver.reduction_passes``, one function per reduction).
R2, R6 (who follows whom) and R7 take their decisions in one numba kernel
call (``solver.reduction_kernels``) on a flat view of the variables they
visit (``solver.reduction_views``); R5 is one vectorised pass over all memory
terms. R6 and R7 are not confluent (which of two equal values stays, which
end of a two-way follower edge merges) and unary sums round in the order they
are made, so the kernels visit variables and neighbours in the iteration
order of the Python sets the passes keep, exactly as a loop over the
variables would: the reduced graph does not depend on how the decisions are
computed. The edits (restrict, fix, merge, eliminate) are ``WorkingGraph``'s.
"""

from __future__ import annotations

import gc
import logging
import time

import numpy as np

from solver.graph import WorkingGraph
from solver.problem import Problem
from solver.reduction_kernels import compile_kernels
from solver.reduction_passes import (
    InfeasibleError,
    SharedView,
    Touched,
    eliminate_memory_free,
    fold_single_values,
    merge_followers,
    normalise_memory,
    remove_dominated,
    remove_forbidden,
)
from solver.reduction_report import GraphSize, ReductionReport, graph_size

__all__ = ["InfeasibleError", "GraphSize", "ReductionReport", "reduce_problem", "graph_size"]

log = logging.getLogger(__name__)


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
    The flags switch reductions off (for tests and measurements). The first
    call in a process compiles the kernels (or loads them from numba's
    cache) before the clock starts: ``report.compile_seconds``, not part of
    ``report.seconds``.

    >>> p = Problem.from_dict({"nodes": [{"cost": [1, 2]}, {"cost": [0]}],
    ...     "edges": [{"src": 0, "dst": 1, "cost": [[5], [0]]}]})
    >>> graph, report = reduce_problem(p)
    >>> len(graph.unary), graph.constant
    (0, 2.0)
    """
    compile_seconds = compile_kernels()
    # The reductions allocate ~10^5 small objects (members, memory terms, sets)
    # and make no reference cycles; with a large heap, the collections those
    # allocations trigger rescan it over and over (0.3-0.9 s on the largest
    # IOPDDL instances). Cycles made elsewhere meanwhile are collected later.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _reduce(problem, dominance=dominance, followers=followers, elimination=elimination,
                       time_limit=time_limit, compile_seconds=compile_seconds)
    finally:
        if collecting:
            gc.enable()


def _reduce(problem: Problem, *, dominance: bool, followers: bool, elimination: bool,
            time_limit: float | None, compile_seconds: float) -> tuple[WorkingGraph, ReductionReport]:
    start = time.perf_counter()
    graph = WorkingGraph.from_problem(problem)
    report = ReductionReport(before=graph_size(graph), compile_seconds=compile_seconds)
    deadline = None if time_limit is None else start + time_limit
    for group in problem.ties:
        for member in group[1:]:
            if member != group[0]:
                graph.merge_into(member, group[0], np.arange(graph.domain_size(group[0])), identity=True)
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
        touched, shared = Touched(), SharedView()
        normalise_memory(graph, list(dirty), report)  # R5
        remove_forbidden(graph, dirty, touched, shared, report)  # R2
        fold_single_values(graph, dirty | touched.vars, touched, shared, report)  # R3
        if followers:
            merge_followers(graph, dirty | touched.vars, touched, shared, report)  # R6
        if dominance:
            remove_dominated(graph, dirty | touched.vars, touched, shared, report)  # R7
        if elimination:
            eliminate_memory_free(graph, dirty | touched.vars, touched, report)  # R8
        dirty = {v for v in touched.vars if v in graph.unary}
    report.counts["passes"] = passes
    report.after = graph_size(graph)
    report.seconds = time.perf_counter() - start
    return graph, report
