r"""The route of a redistribution that may join a bucket, chosen at its bucketed price.

The planner (``costmodel.redistribute``) prices every tensor alone, and alone a
chain of per-dim steps may be cheapest: on ``cpu-gloo`` two 2-rank all_gathers
price below one 4-rank all_gather (its per-step latency grows with the group).
But a bucket (``costmodel.buckets.grouping``) holds only redistributions of ONE
collective (gradients: one all_reduce or reduce_scatter, then local slices;
parameter gathers: one all_gather of plain shards), and a bucket member pays
only ``share`` of that collective's call latency ``L`` (the rest is paid once by
the bucket). A two-step chain cannot join a bucket and pays every latency in
full: priced alone it wins, priced as it runs it loses (LLaMA's FSDP layout on
2x2: 119 collectives per step, where the flattened route bucketed gives a few).

So for a redistribution that the runtime would bucket, the route is

    route = argmin over r in {planner's route} U R1 of  price(r),
    price(r) = cost_s(r) - (1 - share) * L(r)   if r is bucketable (``accept``)
             = cost_s(r)                        otherwise,

with ``R1`` the routes of exactly one collective (any group of mesh dims the
planner may use, flattened ones included) followed only by local steps, and
``L(r)`` that collective's time at 0 bytes. Ties keep the planner's route, and
so does a planner's route that is itself bucketable: two bucketable routes
both pay a share of one latency, and their amortised prices differ only
through the linear approximation (a member is priced at its own size, where a
small all_reduce takes the tree's bandwidth term and the bucket the ring's),
which would tip the choice by the approximation's error alone. The
solver's edge prices (``autoshard.graph.edges`` for gradients,
``autoshard.search.gather_objective`` for gathers) and the plan's steps
(``autoshard.assembly.buckets``) both come from this function, so the route
priced is the route run; the plan's estimate then prices the real buckets.

>>> from hw_profiles import load
>>> from costmodel.buckets.grouping import gatherable_step
>>> gloo, mesh = load("cpu-gloo"), MeshSpec((2, 2))
>>> alone = bucketed_route("S(0)S(0)", "RR", mesh, (128, 128), 4, gloo, share=1.0, accept=gatherable_step)
>>> [s.mesh_dims for s in alone.plan.steps]   # alone: two 2-rank gathers are cheaper on gloo
[(1,), (0,)]
>>> shared = bucketed_route("S(0)S(0)", "RR", mesh, (128, 128), 4, gloo, share=0.05, accept=gatherable_step)
>>> [s.mesh_dims for s in shared.plan.steps]  # in a bucket: one flattened gather
[(0, 1)]
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Sequence

from costmodel.collectives import collective_time_s
from costmodel.mesh import MeshSpec
from costmodel.placements import Partial, Placement, Replicate, Shard, StridedShard
from costmodel.redistribute import _normalize, on_clear, plan_redistribute
from costmodel.redistribute_search import canonical, search_graph
from costmodel.redistribute_steps import COLLECTIVE_STEPS, LOCAL_STEPS, RedistributePlan, RedistributeStep
from hw_profiles import HardwareProfile

__all__ = ["BucketedRoute", "bucketed_route", "one_collective_routes"]

Accept = Callable[[Sequence[RedistributeStep]], "RedistributeStep | None"]


@dataclass(frozen=True, slots=True)
class BucketedRoute:
    """A route and the price it was chosen at."""

    plan: RedistributePlan
    """The steps (``plan.cost_s``: their time alone, what the plan file records)."""
    price_s: float
    """``plan.cost_s`` less the call latency a bucket pays for it (module docstring)."""


def one_collective_routes(
    src: str | Sequence[Placement],
    dst: str | Sequence[Placement],
    mesh: MeshSpec,
    shape: Sequence[int],
    itemsize: int,
    profile: HardwareProfile,
) -> tuple[RedistributePlan, ...]:
    """Every route from ``src`` to ``dst`` that issues one collective (a step of
    the planner's search from ``src``) followed by the planner's steps to ``dst``
    when those are all local; the collective's price is the planner's own."""
    src_t, dst_t, mesh_spec, shape_t = _normalize(src, dst, mesh, shape, itemsize)
    return _routes(src_t, dst_t, mesh_spec, shape_t, itemsize, profile)


@lru_cache(maxsize=16384)
def _routes(src: tuple[Placement, ...], dst: tuple[Placement, ...], mesh: MeshSpec, shape: tuple[int, ...],
            itemsize: int, profile: HardwareProfile) -> tuple[RedistributePlan, ...]:
    start, goal = canonical(src, mesh), canonical(dst, mesh)
    if start == goal:
        return ()
    both = src + dst  # the search graph of this pair, as plan_redistribute builds it
    ops = tuple(sorted({p.reduce_op for p in both if isinstance(p, Partial)}))
    strided = tuple(sorted({p for p in both if isinstance(p, StridedShard)}, key=str))
    graph = search_graph(mesh, shape, itemsize, profile, True, ops, strided)
    out = []
    for target, cost, step in graph.out_edges(graph.state_id(start)):
        if step.collective not in COLLECTIVE_STEPS:
            continue
        state = graph.states[target]
        if state == goal:
            out.append(RedistributePlan((step,), cost, src, dst))
            continue
        if not _locally_reachable(state, goal):  # the planner's rest has a collective: not a route
            continue
        rest = plan_redistribute(state, dst, mesh, shape, itemsize, profile)
        if all(s.collective in LOCAL_STEPS for s in rest.steps):
            out.append(RedistributePlan((step, *rest.steps), cost + rest.cost_s, src, dst))
    return tuple(out)


def _locally_reachable(state: tuple[Placement, ...], goal: tuple[Placement, ...]) -> bool:
    """Whether local steps alone may turn ``state`` into ``goal`` (both canonical). Per mesh dim,
    local steps (``costmodel.redistribute_search`` E5-E7) only go ``R -> anything``,
    ``S(d) -> P(sum)`` and ``_S(d,sf) -> S(d) -> P(sum)``; a plan of local steps only is one
    such change per dim, so where a dim needs another the planner's rest holds a collective
    and need not be searched (a necessary condition: the plan decides the rest)."""
    for a, b in zip(state, goal):
        if a == b or isinstance(a, Replicate):
            continue
        if isinstance(a, Shard) and b == _SUM:
            continue
        if isinstance(a, StridedShard) and (b == Shard(a.dim) or b == _SUM):
            continue
        return False
    return True


_SUM = Partial("sum")


def _latency(plan: RedistributePlan, accept: Accept, mesh: MeshSpec, profile: HardwareProfile) -> float | None:
    """The call latency of the route's bucketable collective (None: a bucket does not take the route)."""
    step = accept(plan.steps)
    return None if step is None else collective_time_s(step.collective, 0, step.mesh_dims, mesh, profile)


def _price(plan: RedistributePlan, latency: float | None, share: float) -> float:
    if latency is None or share >= 1.0:
        return plan.cost_s
    return max(0.0, plan.cost_s - (1.0 - share) * latency)


@lru_cache(maxsize=65536)
def _candidates(src: tuple[Placement, ...], dst: tuple[Placement, ...], mesh: MeshSpec, shape: tuple[int, ...],
                itemsize: int, profile: HardwareProfile, accept: Accept,
                ) -> tuple[tuple[RedistributePlan, float | None], ...]:
    """The planner's route, then (when a bucket would not take it) every one-collective route, each
    with its bucketable latency: what the price at any share is made of (a model's edges ask the
    same pair at many shares, one per tensor size)."""
    planner = plan_redistribute(src, dst, mesh, shape, itemsize, profile)
    first = (planner, _latency(planner, accept, mesh, profile))
    if first[1] is not None:
        return (first,)
    return (first, *((r, _latency(r, accept, mesh, profile)) for r in _routes(src, dst, mesh, shape, itemsize, profile)))


def bucketed_route(
    src: str | Sequence[Placement],
    dst: str | Sequence[Placement],
    mesh: MeshSpec,
    shape: Sequence[int],
    itemsize: int,
    profile: HardwareProfile,
    *,
    share: float,
    accept: Accept,
) -> BucketedRoute:
    """The route of a redistribution that pays ``share`` of a bucketable
    collective's latency (module docstring); ``accept`` says which routes a bucket
    takes (``costmodel.buckets.grouping.bucketable_step`` or ``gatherable_step``)."""
    if share >= 1.0:
        best = plan_redistribute(src, dst, mesh, shape, itemsize, profile)
        return BucketedRoute(best, best.cost_s)
    src_t, dst_t, mesh_spec, shape_t = _normalize(src, dst, mesh, shape, itemsize)
    (best, latency), *others = _candidates(src_t, dst_t, mesh_spec, shape_t, itemsize, profile, accept)
    best_price = _price(best, latency, share)
    for route, route_latency in others:
        price = _price(route, route_latency, share)
        if price < best_price - 1e-12:
            best, best_price = route, price
    return BucketedRoute(best, best_price)


def clear_cache() -> None:
    """Forget the cached routes and candidates (``costmodel.redistribute.clear_cache`` calls it)."""
    _routes.cache_clear()
    _candidates.cache_clear()


on_clear(clear_cache)
