r"""Overlap in the solver's objective: edges priced at what a schedule leaves unhidden.

The plan's estimate simulates the schedule on a compute and a communication
stream (``costmodel.overlap``), but the integer program prices every edge on
its own and cannot see a schedule. Two kinds of edges carry most of the
communication that a schedule hides, and for them the program gets an
approximation of their exposed cost:

* **gradient edges** (op -> ``grad:<fqn>``): the reduction (alone or in its
  bucket) runs while the rest of the backward computes;
* **leaf edges** (parameter, input or buffer -> op): the gather is prefetched
  ahead of its reader (``autoshard.program.schedule``).

For such an edge ``e`` with cost matrix ``C_e`` (seconds) the program sees

    C'_e[a, b] = max(0, C_e[a, b] - s_e) + kappa * min(C_e[a, b], s_e)

(``costmodel.overlap.exposed_cost_s``): the part of the collective that does
not fit in ``s_e`` seconds of compute beside it, plus the contention
slowdown of the part that does (``kappa``: the profile's
``overlap.contention``). The slack ``s_e`` is taken from the **previous
solve's** simulated schedule (it depends on every other choice, which the
program cannot express):

* ``e`` had a scheduled collective there (its own, or its gradient or gather
  bucket's): from the
  start of that collective on the communication stream to the time the
  compute stream reached its wait (``transfer_slack``: queueing behind other
  collectives included);
* a gradient edge without one: the compute from after its producer to the end
  of the backward (what a reduction issued there could hide behind);
* a leaf edge without one: the compute between the reader of the leaf edge
  ``d`` places earlier in reader order (``d`` the prefetch depth, at least 1)
  and its own reader, as the schedule's prefetch chain would give it.

Every other edge keeps its cost. So at the previous choice, the program's
cost of a scheduled gradient or gather is the simulation's exposed time of
that collective taken alone; the rest of the objective is unchanged.

**Rounds** (``autoshard.search.solve.solve_prepared``): solve; simulate the
plan; rewrite these edges with the slacks; solve again; stop when the choice
repeats or after ``overlap_rounds`` rounds. Every round's plan is priced by the
same simulation, and the plan with the shortest simulated step is kept (the
rewritten objective is an approximation: a round may be worse, never kept
then). When the profile's contention is near 1 (overlap gains less than
:data:`MIN_OVERLAP_GAIN` of a hidden collective) the rounds are skipped: the
rewrite would change no cost by more than that.

>>> exposed_matrix(np.array([[0.0, 3.0], [1.0, np.inf]]), 2.0, 0.5).tolist()
[[0.0, 2.0], [0.5, inf]]
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from costmodel.overlap import transfer_slack
from solver import Problem
from solver.problem import Edge

from autoshard.assembly.assemble import step_pricing
from autoshard.assembly.request import AssemblyGraph
from autoshard.program.actions import simulate_program

__all__ = ["MIN_OVERLAP_GAIN", "LEAF_KINDS", "overlap_worthwhile", "edge_slack", "exposed_matrix", "overlap_problem"]

MIN_OVERLAP_GAIN = 0.05
"""Skip the rounds when a fully hidden collective still costs more than
``1 - MIN_OVERLAP_GAIN`` of itself (contention above 0.95)."""

LEAF_KINDS = ("param", "input", "buffer")


def overlap_worthwhile(contention: float) -> bool:
    """Whether rewriting edge costs for overlap can change a cost by more than :data:`MIN_OVERLAP_GAIN`."""
    return 1.0 - contention >= MIN_OVERLAP_GAIN


def edge_slack(graph: AssemblyGraph, problem: Problem, choice: Sequence[int], plan: Any) -> dict[int, float]:
    """Edge index -> slack ``s_e`` (seconds) of every gradient and leaf edge, from
    ``plan``'s simulated schedule (module docstring); ``plan`` is the plan of ``choice``."""
    pricing = step_pricing(graph, problem, choice)
    schedule = plan.schedule
    program = pricing.program(schedule, plan.redistributions, plan.gather_buckets)
    sim = simulate_program(program, pricing.op_compute_s, plan.redistributions, plan.buckets,
                           tail_s=pricing.tail_s, contention=pricing.contention, gathers=plan.gather_buckets,
                           skew_s=pricing.skew_s)
    reached = sim.reached_s
    n = len(pricing.node_names)
    pos = {name: i for i, name in enumerate(pricing.node_names)}
    timing = {item.key: sim.timings[k] for k, item in enumerate(program.issued())}
    bucket_of = {m: b for b, bucket in enumerate(plan.buckets) for m in bucket.members}
    gather_of = {tuple(m): g for g, bucket in enumerate(plan.gather_buckets) for m in bucket.members}

    leaves = sorted((pos[graph.nodes[e.dst].name], j) for j, e in enumerate(graph.edges)
                    if graph.nodes[e.src].kind in LEAF_KINDS and graph.nodes[e.dst].kind == "op")
    depth = max(1, schedule.prefetch)
    chain = {j: reached[reader] - (reached[leaves[k - depth][0]] if k >= depth else 0.0)
             for k, (reader, j) in enumerate(leaves)}
    out: dict[int, float] = {}
    for j, e in enumerate(graph.edges):
        u, v = graph.nodes[e.src], graph.nodes[e.dst]
        if v.kind == "grad":
            key = ("bucket", bucket_of[v.name]) if v.name in bucket_of else ("edge", u.name, v.name, e.dst_input)
            if key in timing:
                out[j] = transfer_slack(timing[key])
            else:
                ready = pos[u.name] + 1 if u.name in pos else 0
                out[j] = max(0.0, reached[n] - reached[min(ready, n)])
        elif j in chain:
            edge = (u.name, v.name, e.dst_input)
            key = ("gather", gather_of[edge]) if edge in gather_of else ("edge", *edge)
            out[j] = transfer_slack(timing[key]) if key in timing else max(0.0, chain[j])
    return out


def exposed_matrix(cost: np.ndarray, slack_s: float, contention: float) -> np.ndarray:
    """``C'`` of the module docstring, elementwise (forbidden and zero entries kept)."""
    cost = np.asarray(cost, dtype=np.float64)
    hidden = np.minimum(cost, max(0.0, slack_s))
    out = cost - hidden + contention * hidden
    return np.where(np.isfinite(cost) & (cost > 0), out, cost)


def overlap_problem(problem: Problem, slack: Mapping[int, float], contention: float) -> Problem:
    """``problem`` with every edge of ``slack`` priced at its exposed cost; matrices
    shared by edges of equal slack stay shared."""
    cache: dict[tuple[int, float], np.ndarray] = {}
    edges = []
    for j, edge in enumerate(problem.edges):
        s = slack.get(j, 0.0)
        if s <= 0.0:
            edges.append(edge)
            continue
        key = (id(edge.cost), s)
        matrix = cache.get(key)
        if matrix is None:
            matrix = cache[key] = exposed_matrix(edge.cost, s, contention)
        edges.append(Edge(edge.src, edge.dst, matrix))
    return Problem(nodes=problem.nodes, edges=tuple(edges), memory_limit=problem.memory_limit, ties=problem.ties,
                   pins=dict(problem.pins), name=problem.name)
