r"""Gather buckets in the solver's objective: a parameter gather pays a share of one latency.

The runtime issues parameter (leaf) all-gathers in gather buckets
(``costmodel.buckets.grouping``: FSDP2 gathers a layer at once), so a gather does not
pay a whole call latency of its own. The strategy graph prices every leaf edge
as if it did, which on a high-latency interconnect (gloo: ~1 ms per call)
makes the solver avoid gathering parameters even where a bucketed gather is
cheaper than the alternatives (all-reducing activations). As for gradient
buckets (``costmodel.buckets.grouping.bucket_share``), the edge is repriced with its
latency amortised over the bucket it would share:

    C'_e[a, b] = C_e[a, b] - cost_s(planner's route) + price(bucketed route),
    share_e = min(1, bytes_e / min(B, total))

with the bucketed route and its price from ``costmodel.buckets.routes`` (a
route of exactly one all_gather of plain shards, ``gatherable_step``, pays
``share_e`` of its latency, its time at 0 bytes; a per-dim chain cheaper alone
loses to one flattened gather in a bucket), ``bytes_e`` the gathered tensor,
``total`` the sum over all gather edges of the model (leaves and leaf views,
``autoshard.assembly.buckets.gather_edges``) and ``B`` the largest gather cap
the assembler tries (``GATHER_CAPS``). Other pairs and edges keep their cost; the
assembler runs the same routes (``autoshard.assembly.buckets.EdgeRoutes``). The plan's estimate
then prices the real buckets (the assembler groups them and picks the cap by
simulation), so the plan reports what runs (``gather_amortized_problem``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from costmodel.buckets.routes import bucketed_route
from costmodel.buckets.grouping import GATHER_CAPS, bucket_share, gatherable_step
from costmodel.redistribute import PlannerError, plan_redistribute
from solver import Problem
from solver.problem import Edge

from autoshard.graph.edges import distinct_values
from autoshard.assembly.buckets import LEAF_KINDS, gather_edges
from autoshard.assembly.graph_memo import GraphMemo

__all__ = ["LEAF_KINDS", "gather_amortized_problem"]

_DELTA_GRAPHS = 2
"""Strategy graphs whose gather deltas are kept, each held alive with them: the solves of one
call (the policies of ``recompute="auto"``, the expert baselines, the overlap rounds) price one
graph's gathers, a seeded search's seed another; more would keep large graphs in memory."""

_DELTAS: GraphMemo[dict] = GraphMemo(_DELTA_GRAPHS)
"""The delta tables of each graph."""


def gather_amortized_problem(graph: Any, problem: Problem, cap: int = GATHER_CAPS[-1]) -> Problem:
    """``problem`` (built from the strategy graph ``graph``) with its gather
    edges repriced (module docstring); matrices of equal inputs stay shared.
    The price changes depend on the graph alone (not on the problem's pins or
    recomputation policy), so they are computed once per graph and pair."""
    leaf = gather_edges([n.kind for n in graph.nodes], [n.target for n in graph.nodes],
                        [(e.src, e.dst) for e in graph.edges])
    if not leaf or cap <= 0:
        return problem
    total = float(sum(graph.edges[j].tensor.numel * graph.edges[j].tensor.itemsize for j in leaf))
    tables = _DELTAS.get(graph, lambda _: {})
    # (shape, itemsize, src, dst, share) -> bucketed price - planner's price
    deltas: dict[tuple, float] = tables.setdefault("pairs", {})

    def delta(shape: tuple[int, ...], itemsize: int, src: Any, dst: Any, share: float) -> float:
        key = (shape, itemsize, src, dst, share)
        if key not in deltas:
            try:
                alone = plan_redistribute(src, dst, graph.mesh, shape, itemsize, graph.profile).cost_s
                route = bucketed_route(src, dst, graph.mesh, shape, itemsize, graph.profile, share=share,
                                       accept=gatherable_step)
                deltas[key] = route.price_s - alone
            except PlannerError:  # no plan for this pair: its cost stays (forbidden or not)
                deltas[key] = 0.0
        return deltas[key]

    cache: dict[tuple, np.ndarray] = {}
    edges = list(problem.edges)
    for j in leaf:
        e = graph.edges[j]
        share = bucket_share(e.tensor.numel * e.tensor.itemsize, total, cap)
        if share >= 1.0:
            continue
        matrix = problem.edges[j].cost
        u, v = graph.nodes[e.src], graph.nodes[e.dst]
        key = (id(matrix), share, u.signature, v.signature, e.src_output, e.dst_input)
        new = cache.get(key)
        if new is None:
            cost = np.asarray(matrix, dtype=np.float64)
            shape = tuple(e.tensor.shape)
            # the edge's delta per (a, b), filled where some problem has a cost to change (nan: not yet)
            table = tables.setdefault(("edge", u.signature, v.signature, e.src_output, e.dst_input, shape,
                                       e.tensor.itemsize, share, cost.shape), np.full(cost.shape, np.nan))
            priced = np.isfinite(cost) & (cost > 0)
            rows, cols = np.nonzero(priced & np.isnan(table))
            if rows.size:
                # entries of one (src, dst) placement pair share their delta: each pair is looked up once
                # (strategies of a node repeat placements: the tiny Mistral's 40,000 entries are 5,900 pairs)
                srcs, src_of = distinct_values([s.output_placements[e.src_output] for s in u.strategies[:cost.shape[0]]])
                dsts, dst_of = distinct_values([s.input_placements[e.dst_input] for s in v.strategies[:cost.shape[1]]])
                pairs, inverse = np.unique(src_of[rows] * len(dsts) + dst_of[cols], return_inverse=True)
                values = np.array([delta(shape, e.tensor.itemsize, srcs[p // len(dsts)], dsts[p % len(dsts)], share)
                                   for p in pairs.tolist()], dtype=np.float64)
                table[rows, cols] = values[inverse.reshape(-1)]
            new = np.where(priced, np.maximum(0.0, cost + np.where(priced, table, 0.0)), cost)
            cache[key] = new
        edges[j] = Edge(problem.edges[j].src, problem.edges[j].dst, new)
    return Problem(nodes=problem.nodes, edges=tuple(edges), memory_limit=problem.memory_limit, ties=problem.ties,
                   pins=dict(problem.pins), name=problem.name)
