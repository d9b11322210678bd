"""Overlap in the solver's objective: exposed costs by hand, slacks from the
previous plan's simulation, rounds that never keep a worse plan."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

import autoshard.search.overlap_objective as overlap_objective
from autoshard.graph.problem import to_problem
from autoshard.assembly.from_graph import assembly_graph
from autoshard.search.overlap_objective import edge_slack, exposed_matrix, overlap_problem, overlap_worthwhile
from autoshard.program.schedule import simulate_schedule
from autoshard.assembly.assemble import step_pricing
from autoshard.search.solve import prepare, solve_prepared
from examples.models import mlp


def test_exposed_cost_by_hand():
    cost = np.array([[0.0, 4.0, 1.0], [np.inf, 2.0, 3.0]])
    # slack 2: hidden min(c, 2); kappa 0 pays c - hidden, kappa 1 pays c, kappa 0.25 in between
    assert exposed_matrix(cost, 2.0, 0.0).tolist() == [[0.0, 2.0, 0.0], [np.inf, 0.0, 1.0]]
    assert exposed_matrix(cost, 2.0, 1.0).tolist() == cost.tolist()
    assert exposed_matrix(cost, 2.0, 0.25).tolist() == [[0.0, 2.5, 0.25], [np.inf, 0.5, 1.5]]


def test_overlap_is_skipped_where_it_gains_almost_nothing():
    assert overlap_worthwhile(0.0) and overlap_worthwhile(0.9)
    assert not overlap_worthwhile(0.97)  # cpu-gloo: ranks share cores with gloo's thread


def test_docstring_example():
    assert doctest.testmod(overlap_objective).failed == 0


@pytest.fixture(scope="module")
def fsdp_tiny():
    model, inputs = mlp.tiny(device="meta")
    prep = prepare(model, inputs, (4,), ("dp",), profile="h100-sxm-80gb")
    return prep, solve_prepared(prep, baseline="fsdp", time_limit=10, overlap_rounds=0)


def _choice(prep, plan):
    """The strategy index of every node, recovered from the plan (leaves and ops)."""
    graph = prep.graph
    by_name = {n.name: n for n in plan.nodes}
    choice = []
    for node in graph.nodes:
        if node.kind == "op":
            want = by_name[node.name]
            k = next(k for k, s in enumerate(node.strategies)
                     if tuple("".join(map(str, p)) if p is not None else None for p in s.output_placements) == want.out
                     and tuple("".join(map(str, p)) if p is not None else None for p in s.input_placements)
                     == want.inputs)
        else:
            text = {"param": plan.params, "input": plan.inputs, "buffer": plan.buffers}.get(node.kind, {}).get(
                node.target)
            if text is None and node.kind in ("grad", "opt_temp"):
                text = plan.params[node.target]
            k = next((k for k, s in enumerate(node.strategies)
                      if "".join(map(str, s.output_placements[0])) == text), 0)
        choice.append(k)
    return tuple(choice)


def test_slack_of_gradients_and_gathers_comes_from_the_simulated_schedule(fsdp_tiny):
    prep, plan = fsdp_tiny
    problem = to_problem(prep.graph, memory_limit=plan.estimate.memory_limit_bytes)
    choice = _choice(prep, plan)
    graph = assembly_graph(prep.graph)
    slack = edge_slack(graph, problem, choice, plan)
    pricing = step_pricing(graph, problem, choice)
    sim = simulate_schedule(plan.schedule, pricing.op_compute_s, plan.redistributions, plan.buckets,
                            tail_s=pricing.tail_s, gathers=plan.gather_buckets)
    end = sim.reached_s[-1]
    grads = [j for j, e in enumerate(graph.edges) if graph.nodes[e.dst].kind == "grad"]
    leaves = [j for j, e in enumerate(graph.edges)
              if graph.nodes[e.src].kind in ("param", "input", "buffer") and graph.nodes[e.dst].kind == "op"]
    assert set(grads) | set(leaves) == set(slack)
    # a reduction can hide behind at most the rest of the backward; the bucket issued after
    # the last gradient hides behind nothing
    assert all(0.0 <= slack[j] <= end for j in grads)
    assert min(slack[j] for j in grads) == 0.0
    # a scheduled gather's slack is its simulated window
    timing = {item.key: t for item, t in zip(plan.schedule.items, sim.timings)}
    gather_of = {m: g for g, b in enumerate(plan.gather_buckets) for m in b.members}
    for j in leaves:
        e = graph.edges[j]
        edge = (graph.nodes[e.src].name, graph.nodes[e.dst].name, e.dst_input)
        key = ("gather", gather_of[edge]) if edge in gather_of else ("edge", *edge)
        if key in timing:
            assert slack[j] == pytest.approx(max(0.0, timing[key].needed_s - timing[key].start_s))


def test_rewritten_problem_changes_only_slack_edges_and_keeps_sharing(fsdp_tiny):
    prep, plan = fsdp_tiny
    problem = to_problem(prep.graph)
    same = overlap_problem(problem, {}, 0.0)
    assert all(a is b for a, b in zip(same.edges, problem.edges))
    j = next(j for j, e in enumerate(prep.graph.edges) if prep.graph.nodes[e.dst].kind == "grad")
    shared = [k for k, e in enumerate(problem.edges) if e.cost is problem.edges[j].cost]
    rewritten = overlap_problem(problem, {k: 1e9 for k in shared}, 0.0)
    assert all(rewritten.edges[k].cost is rewritten.edges[shared[0]].cost for k in shared)
    assert np.all(rewritten.edges[j].cost[np.isfinite(problem.edges[j].cost)] == 0.0)  # all hidden
    others = [k for k in range(len(problem.edges)) if k not in shared]
    assert all(rewritten.edges[k] is problem.edges[k] for k in others)


def test_rounds_never_keep_a_worse_plan_and_say_how_many_ran():
    model, inputs = mlp.small(device="meta", dim=256, hidden_dim=1024, n_layers=2, batch_size=32)
    prep = prepare(model, inputs, (4,), ("dp",), profile="h100-sxm-80gb")
    first = solve_prepared(prep, time_limit=10, overlap_rounds=0)
    rounds = solve_prepared(prep, time_limit=10)
    assert rounds.estimate.step_s <= first.estimate.step_s * (1 + 1e-12)
    assert 1 <= rounds.options["overlap_rounds"] <= 2 and rounds.options["overlap_round"] in (0, 1, 2)
