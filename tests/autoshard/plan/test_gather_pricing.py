"""Gather buckets in the objective: leaf all-gather edges pay a share of one latency."""

from __future__ import annotations

import doctest

import numpy as np

import autoshard.plan.gather_pricing as gather_pricing
from autoshard.graph.problem import to_problem
from autoshard.plan.gather_pricing import gather_amortized_problem
from autoshard.plan.solve import prepare
from costmodel.bucketing import gatherable_step
from costmodel.collectives import collective_time_s
from costmodel.redistribute import plan_redistribute
from examples.models import mlp


def test_docstring_example():
    assert doctest.testmod(gather_pricing).failed == 0


def test_only_gatherable_pairs_of_leaf_edges_get_cheaper_by_a_share_of_their_latency():
    model, inputs = mlp.tiny(device="meta")
    prep = prepare(model, inputs, (4,), ("dp",), profile="cpu-gloo")
    graph = prep.graph
    problem = to_problem(graph)
    priced = gather_amortized_problem(graph, problem)
    assert gather_amortized_problem(graph, problem, cap=0) is problem
    changed = 0
    for j, (old, new) in enumerate(zip(problem.edges, priced.edges)):
        e = graph.edges[j]
        u, v = graph.nodes[e.src], graph.nodes[e.dst]
        if u.kind not in ("param", "input", "buffer") or v.kind != "op":
            assert new is old
            continue
        for a, b in zip(*np.nonzero(np.asarray(new.cost) != np.asarray(old.cost))):
            steps = plan_redistribute(u.strategies[a].output_placements[e.src_output],
                                      v.strategies[b].input_placements[e.dst_input], graph.mesh,
                                      tuple(e.tensor.shape), e.tensor.itemsize, graph.profile).steps
            step = gatherable_step(steps)
            assert step is not None  # only a single all_gather of plain shards is repriced
            latency = collective_time_s("all_gather", 0, step.mesh_dims, graph.mesh, graph.profile)
            saved = old.cost[a, b] - new.cost[a, b]
            assert 0 < saved <= latency * (1 + 1e-12)
            changed += 1
    assert changed, "the tiny MLP's FSDP-style gathers should be repriced"
