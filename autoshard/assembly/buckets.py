r"""Buckets in the plan: which edges run their collective in a bucket, at what share of a latency
and on which route, and the gradient bucket cap the simulated step chooses.

Pricing and the grouping rule (torch-free, shared with the solver) are ``costmodel.buckets``;
this module applies them to one plan.

**Routes.** Two kinds of edges run their collective in a bucket (``costmodel.buckets.grouping``):

* gradient edges (op -> ``grad:<fqn>`` sink), share
  ``bucket_share(bytes_e, sum of all gradients' bytes, B)`` with ``B`` the
  graph's gradient bucket cap (the share ``autoshard.graph.builder`` prices);
* gather edges: a leaf (parameter, input, buffer) or a *leaf view* of one
  (a view op reading, through views only, a leaf: ``t(weight)``, which the
  schedule treats as the leaf, ``autoshard.program.schedule.leaf_views``) read by
  an op, share ``bucket_share(bytes_e, sum over gather edges, GATHER_CAPS[-1])``
  when the graph buckets at all (``bucket_bytes > 0``).

For both, the route is ``costmodel.buckets.routes.bucketed_route`` at that
share: the solver's prices (``autoshard.graph.edges``,
``autoshard.search.gather_objective``) and the plan's steps (:class:`EdgeRoutes`,
used by ``autoshard.assembly.assemble``) make the same choice, so the collectives
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

**Gradient bucket cap.** DDP fills gradient buckets in the order the backward makes the gradients and
launches each as soon as its last gradient is made, so that the reductions run
under the rest of the backward; its cap (25 MiB) trades the call latency a
bucket pays (fewer, larger buckets pay it less often) against the overlap
(smaller buckets start earlier, and only the last one waits after the
backward). That trade-off depends on the interconnect and on the compute left
after each gradient, which the simulation of the plan's step program
(``autoshard.program.actions.simulate_program``, ``costmodel.overlap``) prices. So
instead of a fixed cap the assembler groups the gradients with every cap of

    caps = GRADIENT_CAPS U {B}     (B: the graph's bucket_bytes, what the solver priced)

(``costmodel.buckets.grouping.group_buckets``: reverse-use order, a new bucket when
the cap would be passed), schedules each grouping as the runtime runs it (a
bucket issued right after its last member gradient, waited before the
optimizer step), and keeps the one with the shortest simulated step (ties: the
larger cap, fewer calls). Then the same caps with DDP's smaller first bucket
(``FIRST_CAPS``: 1 MiB; ``group_buckets(first_cap=...)``): the first gradients
the backward makes leave at once and their reduction runs under the rest of the
backward, for one more call latency; such a grouping replaces the best so far only
where its step simulates shorter, so plans change only where that is priced faster.
``B = 0`` turns buckets off, as before. The solver's
edge prices amortise latency over ``B``-sized buckets (``costmodel.buckets.grouping``):
an approximation the plan's estimate corrects, since it simulates the buckets
chosen here.

>>> gather_edges(["param", "op", "op", "op"], ["w", "aten.t.default", "aten.mm.default", "aten.mm.default"],
...              [(0, 1), (1, 2), (2, 3)])
[0, 1]
>>> GRADIENT_CAPS[0], GRADIENT_CAPS[-1]
(1048576, 67108864)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

from costmodel.buckets.grouping import (GATHER_CAPS, Bucket, bucket_share, bucketable_step, gatherable_step,
                                        group_buckets)
from costmodel.buckets.routes import bucketed_route
from costmodel.mesh import MeshSpec
from costmodel.redistribute import plan_redistribute
from costmodel.redistribute_steps import COLLECTIVE_STEPS, RedistributePlan
from hw_profiles import HardwareProfile

from autoshard.program.schedule import VIEW_OPS, Schedule, build_schedule, leaf_views

__all__ = ["LEAF_KINDS", "GRADIENT_CAPS", "FIRST_CAPS", "BucketCaps", "gather_edges", "EdgeRoutes", "reschedule",
           "candidate_caps", "choose_gradient_buckets"]

LEAF_KINDS = ("param", "input", "buffer")

GRADIENT_CAPS = (2**20, 4 * 2**20, 16 * 2**20, 25 * 2**20, 64 * 2**20)
"""Gradient bucket caps (bytes) the assembler tries beside the graph's own."""

FIRST_CAPS = (2**20,)
"""First-bucket caps (bytes) the assembler tries below each cap: DDP's ``dist._DEFAULT_FIRST_BUCKET_BYTES``."""


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
    """The route of every edge of an assembly graph (``autoshard.assembly.request.AssemblyGraph``)."""

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
        if graph.bucket_bytes > 0:  # gathers are bucketed (and priced so) only then (autoshard.search.solve)
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
    return schedule, pricing.simulate(schedule, redistributions, buckets, gathers)


@dataclass(frozen=True, slots=True)
class BucketCaps:
    """The caps a gradient grouping was formed with (``costmodel.buckets.grouping.group_buckets``)."""

    cap: int
    """Bytes a bucket may hold; 0: no buckets."""
    first_cap: int | None = None
    """Bytes the first bucket of each reduction kind may hold; None: ``cap``."""


def candidate_caps(cap: int) -> list[BucketCaps]:
    """The groupings :func:`choose_gradient_buckets` simulates, in the order ties keep:
    every cap of ``GRADIENT_CAPS`` and ``cap`` alone, larger first (fewer calls), then each
    with a first cap of ``FIRST_CAPS`` below it (module docstring).

    >>> [(c.first_cap, c.cap >> 20) for c in candidate_caps(25 * 2**20)][-2:]
    [(1048576, 16), (1048576, 4)]
    """
    caps = sorted(set(GRADIENT_CAPS) | {int(cap)}, reverse=True)
    return [BucketCaps(c) for c in caps] + [BucketCaps(c, f) for f in FIRST_CAPS for c in caps if f < c]


def choose_gradient_buckets(
    grads: Sequence[tuple[str, str, Sequence[Any]]],
    pricing: Any,
    redistributions: Sequence[Any],
    *,
    mesh: MeshSpec,
    profile: HardwareProfile,
    cap: int,
) -> tuple[tuple[Bucket, ...], BucketCaps]:
    """(buckets, their caps) with the shortest simulated step (module docstring).

    ``grads``: ``(sink, dtype, steps)`` of the gradient redistributions in the
    order the backward makes them; ``pricing``: the plan's
    ``autoshard.assembly.assemble.StepPricing``; ``redistributions``: the plan's.
    A candidate replaces an earlier one only when it simulates faster, so a
    first cap is taken only where its step is priced shorter."""
    if cap <= 0:
        return (), BucketCaps(0)
    best: tuple[float, BucketCaps, tuple[Bucket, ...]] | None = None
    seen: set[tuple] = set()
    views = leaf_views(pricing.view_candidates, redistributions)
    for candidate in candidate_caps(cap):
        buckets = group_buckets(grads, mesh, profile, candidate.cap, first_cap=candidate.first_cap)
        key = tuple(b.members for b in buckets)
        if key in seen:  # the same grouping as an earlier candidate: same step
            continue
        seen.add(key)
        schedule = build_schedule(pricing.node_names, redistributions, buckets, leaf_views=views)
        sim = pricing.simulate(schedule, redistributions, buckets)
        if best is None or sim.step_s < best[0] * (1 - 1e-9):
            best = (sim.step_s, candidate, buckets)
    assert best is not None  # at least one candidate was tried
    return best[2], best[1]
