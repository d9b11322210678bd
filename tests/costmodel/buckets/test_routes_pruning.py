"""costmodel.buckets.routes skips the planner's search from a state that local steps cannot
turn into the target: the one-collective routes are exactly those of searching every state."""

from __future__ import annotations

import itertools
import random

import pytest

from costmodel.buckets import routes
from costmodel.mesh import MeshSpec
from costmodel.placements import Partial, StridedShard, parse_placements
from costmodel.redistribute import clear_cache, plan_redistribute
from costmodel.redistribute_search import canonical, search_graph
from costmodel.redistribute_steps import COLLECTIVE_STEPS, LOCAL_STEPS, RedistributePlan
from hw_profiles import load

GLOO = load("cpu-gloo")
H100 = load("h100-sxm-80gb")


def _reference_routes(src, dst, mesh, shape, itemsize, profile):
    """The routes as before the pruning: the planner searched from every one-collective state."""
    start, goal = canonical(src, mesh), canonical(dst, mesh)
    if start == goal:
        return ()
    both = src + dst
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
        rest = plan_redistribute(state, dst, mesh, shape, itemsize, profile)
        if all(s.collective in LOCAL_STEPS for s in rest.steps):
            out.append(RedistributePlan((step, *rest.steps), cost + rest.cost_s, src, dst))
    return tuple(out)


@pytest.mark.parametrize("mesh,shape,profile,extra", [
    (MeshSpec((4,)), (8, 12), GLOO, ()),
    (MeshSpec((2, 2)), (8, 12), GLOO, ()),
    (MeshSpec((2, 4)), (6, 16, 5), H100, ("_S(1,sf=2)R",)),
    (MeshSpec((2, 2, 2)), (16, 8), GLOO, ("R_S(0,sf=2)R", "RR_S(0,sf=2)")),
    (MeshSpec((2, 2, 2), strides=(1, 4, 2)), (4, 3, 16), H100, ()),
])
def test_pruned_routes_are_the_routes_of_searching_every_state(mesh, shape, profile, extra) -> None:
    per_dim = ["R", "P(sum)", "P(avg)", "P(max)"] + [f"S({d})" for d in range(len(shape))]
    texts = ["".join(p) for p in itertools.product(per_dim, repeat=mesh.ndim)]
    random.Random(len(shape)).shuffle(texts)
    placements = [parse_placements(t) for t in texts[:14] + list(extra)]
    clear_cache()
    found = 0
    for src, dst in itertools.product(placements, repeat=2):
        ours = routes._routes(src, dst, mesh, shape, 4, profile)
        assert ours == _reference_routes(src, dst, mesh, shape, 4, profile), (src, dst)
        found += len(ours)
    assert found > 10


@pytest.mark.parametrize("state,goal,reachable", [
    ("RR", "S(0)P(max)", True), ("S(0)R", "P(sum)S(1)", True), ("R_S(0,sf=2)", "S(0)S(0)", True),
    ("R_S(0,sf=2)", "RP(max)", False), ("R_S(0,sf=2)", "RP(sum)", True), ("S(0)R", "RR", False), ("P(sum)R", "RR", False),
    ("S(0)R", "S(1)R", False), ("RP(max)", "RP(sum)", False),
])
def test_local_reach_per_mesh_dim(state, goal, reachable) -> None:
    assert routes._locally_reachable(parse_placements(state), parse_placements(goal)) is reachable
