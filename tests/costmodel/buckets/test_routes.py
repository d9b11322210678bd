"""costmodel.buckets.routes: every route is exact on simulated shards, issues one
collective, and the bucketed choice follows the amortised price."""

from __future__ import annotations

import itertools

import pytest

from costmodel.buckets.routes import bucketed_route, one_collective_routes
from costmodel.buckets.grouping import bucketable_step, gatherable_step
from costmodel.collectives import collective_time_s
from costmodel.mesh import MeshSpec
from costmodel.redistribute import plan_redistribute
from costmodel.redistribute_steps import COLLECTIVE_STEPS, LOCAL_STEPS
from hw_profiles import load

from tests.costmodel.test_redistribute import _check_plan

GLOO = load("cpu-gloo")
PAIRS = [("S(0)S(0)", "RR"), ("S(1)S(1)", "RR"), ("P(sum)P(sum)", "S(0)S(0)"), ("P(sum)P(sum)", "RR"),
         ("S(0)R", "RR"), ("P(sum)R", "S(0)R"), ("RS(0)", "RR")]


@pytest.mark.parametrize("src,dst", PAIRS)
def test_every_one_collective_route_is_exact_and_issues_one_collective(src, dst):
    mesh, shape = MeshSpec((2, 2)), (8, 12)
    routes = one_collective_routes(src, dst, mesh, shape, 4, GLOO)
    assert routes
    for route in routes:
        kinds = [s.collective for s in route.steps]
        assert kinds[0] in COLLECTIVE_STEPS and all(k in LOCAL_STEPS for k in kinds[1:])
        assert route.cost_s == pytest.approx(sum(s.cost_s for s in route.steps))
        _check_plan(route, src, dst, mesh.shape, shape)


@pytest.mark.parametrize("src,dst,accept", [("S(0)S(0)", "RR", gatherable_step),
                                             ("P(sum)P(sum)", "S(0)S(0)", bucketable_step)])
def test_the_route_is_the_cheapest_at_its_bucketed_price(src, dst, accept):
    mesh, shape = MeshSpec((2, 2)), (64, 256)
    alone = plan_redistribute(src, dst, mesh, shape, 4, GLOO)
    assert accept(alone.steps) is None  # on cpu-gloo the per-dim chain is cheaper alone
    assert bucketed_route(src, dst, mesh, shape, 4, GLOO, share=1.0, accept=accept).plan == alone
    for share in (0.9, 0.5, 0.1, 0.01):
        chosen = bucketed_route(src, dst, mesh, shape, 4, GLOO, share=share, accept=accept)
        prices = [alone.cost_s]
        for r in one_collective_routes(src, dst, mesh, shape, 4, GLOO):
            step = accept(r.steps)
            latency = 0.0 if step is None else collective_time_s(step.collective, 0, step.mesh_dims, mesh, GLOO)
            prices.append(max(0.0, r.cost_s - (1 - share) * latency))
        assert chosen.price_s == pytest.approx(min(prices))
        _check_plan(chosen.plan, src, dst, mesh.shape, shape)
    bucketed = bucketed_route(src, dst, mesh, shape, 4, GLOO, share=0.01, accept=accept)
    assert accept(bucketed.plan.steps).mesh_dims == (0, 1)  # one collective on the flattened group


def test_a_1d_mesh_keeps_the_planners_route():
    mesh = MeshSpec((4,))
    for (src, dst), share in itertools.product([("S(0)", "R"), ("P(sum)", "R")], (1.0, 0.1)):
        accept = gatherable_step if src.startswith("S") else bucketable_step
        route = bucketed_route(src, dst, mesh, (64, 64), 4, GLOO, share=share, accept=accept)
        assert route.plan == plan_redistribute(src, dst, mesh, (64, 64), 4, GLOO)


def test_clearing_the_redistribution_caches_forgets_the_bucketed_routes_too():
    from costmodel.buckets import routes as bucketed_routes
    from costmodel.redistribute import clear_cache

    clear_cache()
    one_collective_routes("S(0)S(0)", "RR", MeshSpec((2, 2)), (8, 12), 4, GLOO)
    assert bucketed_routes._routes.cache_info().currsize >= 1
    clear_cache()
    assert bucketed_routes._routes.cache_info().currsize == 0
    assert bucketed_routes._candidates.cache_info().currsize == 0
