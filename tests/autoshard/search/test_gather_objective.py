"""Gather buckets in the objective: leaf all-gather edges pay a share of one latency."""

from __future__ import annotations

import doctest

import numpy as np

import autoshard.search.gather_objective as gather_objective
from autoshard.graph.problem import to_problem
from autoshard.search.gather_objective import gather_amortized_problem
from autoshard.search.solve import prepare
from autoshard.assembly.buckets import gather_edges
from costmodel.buckets.routes import bucketed_route, one_collective_routes
from costmodel.buckets.grouping import gatherable_step
from costmodel.collectives import collective_time_s
from costmodel.redistribute import plan_redistribute
from examples.models import mlp


def test_docstring_example():
    assert doctest.testmod(gather_objective).failed == 0


def _leaf_priced(mesh_shape, names):
    model, inputs = mlp.tiny(device="meta")
    graph = prepare(model, inputs, mesh_shape, names, profile="cpu-gloo").graph
    problem = to_problem(graph)
    return graph, problem, gather_amortized_problem(graph, problem)


def test_only_gather_edges_get_cheaper_by_the_bucketed_route_price():
    graph, problem, priced = _leaf_priced((4,), ("dp",))
    assert gather_amortized_problem(graph, problem, cap=0) is problem
    gathers = set(gather_edges([n.kind for n in graph.nodes], [n.target for n in graph.nodes],
                               [(e.src, e.dst) for e in graph.edges]))
    changed = 0
    for j, (old, new) in enumerate(zip(problem.edges, priced.edges)):
        e = graph.edges[j]
        u, v = graph.nodes[e.src], graph.nodes[e.dst]
        if j not in gathers:
            assert new is old
            continue
        for a, b in zip(*np.nonzero(np.asarray(new.cost) != np.asarray(old.cost))):
            src = u.strategies[a].output_placements[e.src_output]
            dst = v.strategies[b].input_placements[e.dst_input]
            shape = tuple(e.tensor.shape)
            alone = plan_redistribute(src, dst, graph.mesh, shape, e.tensor.itemsize, graph.profile)
            step = gatherable_step(one_step := bucketed_route(
                src, dst, graph.mesh, shape, e.tensor.itemsize, graph.profile, share=0.5,
                accept=gatherable_step).plan.steps)
            assert step is not None, one_step  # only a route of one all_gather of plain shards gets cheaper
            latency = collective_time_s("all_gather", 0, step.mesh_dims, graph.mesh, graph.profile)
            saved = old.cost[a, b] - new.cost[a, b]
            # on a 1-D mesh the bucketed route is the planner's own: at most one latency is saved
            assert 0 < saved <= latency * (1 + 1e-12)
            assert alone.steps == one_step
            changed += 1
    assert changed, "the tiny MLP's FSDP-style gathers should be repriced"


def test_on_2x2_a_bucketed_flattened_gather_is_priced_below_the_per_dim_chain():
    # cpu-gloo prices two 2-rank gathers below one 4-rank gather; in a bucket the 4-rank one pays
    # a share of its latency, the chain (which no bucket takes) both of its own
    graph, problem, priced = _leaf_priced((2, 2), ("dp", "tp"))
    found = 0
    for j, (old, new) in enumerate(zip(problem.edges, priced.edges)):
        if new is old:
            continue
        e = graph.edges[j]
        u, v = graph.nodes[e.src], graph.nodes[e.dst]
        for a, b in zip(*np.nonzero(np.asarray(new.cost) < np.asarray(old.cost))):
            src = u.strategies[a].output_placements[e.src_output]
            dst = v.strategies[b].input_placements[e.dst_input]
            alone = plan_redistribute(src, dst, graph.mesh, tuple(e.tensor.shape), e.tensor.itemsize, graph.profile)
            if [s.mesh_dims for s in alone.steps] != [(1,), (0,)]:
                continue
            latency = collective_time_s("all_gather", 0, (0, 1), graph.mesh, graph.profile)
            fused = [r for r in one_collective_routes(src, dst, graph.mesh, tuple(e.tensor.shape),
                                                      e.tensor.itemsize, graph.profile)
                     if [s.mesh_dims for s in r.steps] == [(0, 1)]]
            assert len(fused) == 1 and fused[0].cost_s > alone.cost_s  # dearer alone
            assert new.cost[a, b] < old.cost[a, b]
            assert new.cost[a, b] >= old.cost[a, b] - alone.cost_s + fused[0].cost_s - latency - 1e-12
            found += 1
    assert found, "S(0)S(0) -> RR weights on 2x2 gather in two per-dim steps alone"
