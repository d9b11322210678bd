r"""The edges whose redistributions the runtime buckets, their share of a latency, and their routes.

Two kinds of edges run their collective in a bucket (``costmodel.bucketing``):

* gradient edges (op -> ``grad:<fqn>`` sink), share
  ``bucket_share(bytes_e, sum of all gradients' bytes, B)`` with ``B`` the
  graph's gradient bucket cap (the share ``autoshard.graph.builder`` prices);
* gather edges: a leaf (parameter, input, buffer) or a *leaf view* of one
  (a view op reading, through views only, a leaf: ``t(weight)``, which the
  schedule treats as the leaf, ``autoshard.plan.schedule.leaf_views``) read by
  an op, share ``bucket_share(bytes_e, sum over gather edges, GATHER_CAPS[-1])``
  when the graph buckets at all (``bucket_bytes > 0``).

For both, the route is ``costmodel.bucketed_routes.bucketed_route`` at that
share: the solver's prices (``autoshard.graph.edges``,
``autoshard.plan.gather_pricing``) and the plan's steps (:class:`EdgeRoutes`,
used by ``autoshard.plan.assemble``) make the same choice, so the collectives
the runtime issues are those priced. (One approximation stays: the solver
prices a leaf view's gather as bucketed whatever the view's own input edge
does, while the schedule takes a view as a leaf only where that input is not
redistributed (``leaf_views``); the plan's estimate simulates the buckets that
run.)

**Settling.** Which gathers share buckets is decided after the routes (the
assembler simulates gather caps, and may take none; a gradient may be left
alone in its bucket). An edge routed for a bucket that then joined none would
run a route dearer alone than the planner's: :meth:`EdgeRoutes.settle` puts
such edges back on the planner's route, :func:`reschedule` simulates the plan
again, and the assembler keeps whichever simulates faster (a per-dim chain,
cheaper alone, may not be in the schedule: its first steps are waited at once).

>>> gather_edges(["param", "op", "op", "op"], ["w", "aten.t.default", "aten.mm.default", "aten.mm.default"],
...              [(0, 1), (1, 2), (2, 3)])
[0, 1]
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Sequence

from costmodel.bucketed_routes import bucketed_route
from costmodel.bucketing import GATHER_CAPS, bucket_share, bucketable_step, gatherable_step
from costmodel.redistribute import plan_redistribute
from costmodel.steps import COLLECTIVE_STEPS, RedistributePlan

from autoshard.plan.schedule import VIEW_OPS, Schedule, build_schedule, simulate_schedule

__all__ = ["LEAF_KINDS", "gather_edges", "EdgeRoutes", "reschedule"]

LEAF_KINDS = ("param", "input", "buffer")


def gather_edges(kinds: Sequence[str], targets: Sequence[str], edges: Sequence[tuple[int, int]]) -> list[int]:
    """Indices of the gather edges (module docstring) among ``edges`` ``(src, dst)``
    of nodes with ``kinds`` and ``targets``, in edge order."""
    inputs: dict[int, list[int]] = {}
    for src, dst in edges:
        inputs.setdefault(dst, []).append(src)
    leafish = [False] * len(kinds)
    for i, (kind, target) in enumerate(zip(kinds, targets)):  # nodes are in graph order: inputs come first
        reads = inputs.get(i, ())
        leafish[i] = kind in LEAF_KINDS or (kind == "op" and target in VIEW_OPS and len(reads) == 1
                                            and leafish[reads[0]])
    return [j for j, (src, dst) in enumerate(edges) if leafish[src] and kinds[dst] == "op"]


class EdgeRoutes:
    """The route of every edge of an assembly graph (``autoshard.plan.assemble.AssemblyGraph``)."""

    def __init__(self, graph: Any) -> None:
        self.graph = graph
        kinds = [n.kind for n in graph.nodes]
        sizes = [math.prod(e.shape) * e.itemsize for e in graph.edges]
        self.shares: dict[int, tuple[float, Any]] = {}
        """Edge -> (share, which routes a bucket takes) for the edges that may join a bucket."""
        grads = [j for j, e in enumerate(graph.edges) if kinds[e.dst] == "grad"]
        total = float(sum(sizes[j] for j in grads))
        for j in grads:
            self.shares[j] = (bucket_share(sizes[j], total, graph.bucket_bytes), bucketable_step)
        if graph.bucket_bytes > 0:  # gathers are bucketed (and priced so) only then (autoshard.plan.solve)
            gathers = gather_edges(kinds, [n.target for n in graph.nodes], [(e.src, e.dst) for e in graph.edges])
            total = float(sum(sizes[j] for j in gathers))
            for j in gathers:
                self.shares[j] = (bucket_share(sizes[j], total, GATHER_CAPS[-1]), gatherable_step)
        self.rerouted: dict[tuple[str, str, int], RedistributePlan] = {}
        """(producer, reader, reader input) -> the planner's route, for the edges given another one."""

    def route(self, j: int, src: Any, dst: Any) -> RedistributePlan:
        """The steps of edge ``j`` from placements ``src`` to ``dst``."""
        e, graph = self.graph.edges[j], self.graph
        share, accept = self.shares.get(j, (1.0, bucketable_step))
        chosen = bucketed_route(src, dst, graph.mesh, e.shape, e.itemsize, graph.profile, share=share,
                                accept=accept).plan
        alone = plan_redistribute(src, dst, graph.mesh, e.shape, e.itemsize, graph.profile)
        if chosen.steps != alone.steps:
            key = (graph.nodes[e.src].name, graph.nodes[e.dst].name, e.dst_input)
            self.rerouted[key] = alone
        return chosen

    def settle(self, redistributions: Sequence[Any], buckets: Sequence[Any],
               gathers: Sequence[Any]) -> tuple[list[Any], float, float]:
        """``redistributions`` with every rerouted edge that joined no bucket back on
        the planner's route, and the change in the seconds of their collectives and of
        their local steps (module docstring)."""
        bucketed = {m for b in buckets for m in b.members}
        gathered = {tuple(m) for g in gathers for m in g.members}
        out, comm, local = [], 0.0, 0.0
        for r in redistributions:
            key = (r.tensor, r.to, r.input_index)
            alone = self.rerouted.get(key)
            if alone is None or r.to in bucketed or key in gathered or r.reuses is not None:
                out.append(r)
                continue
            comm += alone.comm_s - sum(s.cost_s for s in r.steps if s.collective in COLLECTIVE_STEPS)
            local += alone.local_s - sum(s.cost_s for s in r.steps if s.collective not in COLLECTIVE_STEPS)
            out.append(replace(r, steps=alone.steps, cost_s=alone.cost_s))
        return out, comm, local


def reschedule(pricing: Any, redistributions: Sequence[Any], buckets: Sequence[Any], gathers: Sequence[Any],
               schedule: Schedule) -> tuple[Schedule, Any]:
    """``schedule`` (its prefetch depth and leaf views) rebuilt for ``redistributions``, and its simulation."""
    schedule = build_schedule(pricing.node_names, redistributions, buckets, prefetch=schedule.prefetch,
                              gathers=gathers, leaf_views=schedule.leaf_views)
    return schedule, simulate_schedule(schedule, pricing.op_compute_s, redistributions, buckets,
                                       tail_s=pricing.tail_s, contention=pricing.contention, gathers=gathers,
                                       skew_s=pricing.skew_s)
