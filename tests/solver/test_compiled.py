"""The compiled graph (solver.compiled) against the problem it came from: costs, memory
profiles, the kernels' view of the same arrays, and the one profile function."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from solver.compiled import assemble_graph, memory_profile, segment_profile
from solver.evaluate import evaluate
from solver.tolerance import BIG


def _labellings(graph, limit: int = 200):
    return itertools.islice(itertools.product(*(range(int(d)) for d in graph.dom)), limit)


def test_cost_and_peak_match_the_independent_evaluation(make_random_problem, unreduced):
    rng = np.random.default_rng(11)
    checked = 0
    for _ in range(40):
        problem = make_random_problem(rng)
        made = unreduced(problem)
        if made is None:
            continue
        working, graph = made
        for values in _labellings(graph):
            x = np.array(values, dtype=np.int64)
            check = evaluate(problem, working.reconstruct(graph.values_to_dict(x)))
            assert graph.cost(x) == pytest.approx(check.cost)
            if graph.num_times and problem.memory_limit is not None:
                # every time point kept: the profile's maximum is the peak whenever it matters
                over_compiled = graph.memory_profile(x).max() > graph.limit
                assert over_compiled == (check.peak_memory_bytes > problem.memory_limit)
            checked += 1
    assert checked > 200


def test_cost_shares_add_up_and_edge_entries_pick_the_pairs(random_graphs):
    for _, graph in random_graphs(12, 30):
        for values in _labellings(graph, 30):
            x = np.array(values, dtype=np.int64)
            picked = graph.edge_cost[graph.edge_entries(x)]
            by_matrix = [graph.edge_matrix(e)[x[graph.edge_u[e]], x[graph.edge_v[e]]] for e in range(graph.num_edges)]
            assert np.array_equal(picked, np.array(by_matrix, dtype=np.float64).reshape(-1))
            if np.isfinite(graph.cost(x)):
                assert graph.cost_shares(x).sum() + graph.constant == pytest.approx(graph.cost(x))


def test_kernel_arrays_are_the_graphs_own_with_forbidden_as_big(random_graphs):
    for _, graph in random_graphs(13, 20):
        arrays = graph.arrays
        assert graph.arrays is arrays  # built once
        assert arrays.dom is graph.dom and arrays.term_usage is graph.term_usage and arrays.base is graph.base
        assert np.array_equal(arrays.unary, np.where(np.isfinite(graph.unary), graph.unary, BIG))
        assert np.array_equal(arrays.edge_cost, np.where(np.isfinite(graph.edge_cost), graph.edge_cost, BIG))
        assert arrays.limit == (graph.limit if np.isfinite(graph.limit) else BIG)
        for values in _labellings(graph, 20):
            x = np.array(values, dtype=np.int64)
            assert np.array_equal(memory_profile(arrays, x), graph.memory_profile(x))


def test_segment_profile_is_the_sum_of_its_segments():
    rng = np.random.default_rng(14)
    for _ in range(50):
        points = int(rng.integers(1, 12))
        count = int(rng.integers(0, 8))
        t0 = rng.integers(0, points, size=count)
        t1 = t0 + rng.integers(1, points + 1, size=count)
        t1 = np.minimum(t1, points)
        usage = rng.integers(0, 9, size=count).astype(np.float64)
        expected = np.zeros(points)
        for a, b, u in zip(t0, t1, usage):
            expected[a:b] += u
        assert np.array_equal(segment_profile(points, t0, t1, usage), expected)


def test_assemble_graph_lists_each_edge_under_both_ends():
    graph = assemble_graph(var_ids=np.arange(3), unary=[np.zeros(2), np.zeros(3), np.zeros(2)],
                           edge_u=[0, 2], edge_v=[1, 1], edge_costs=[np.zeros((2, 3)), np.zeros((2, 3))],
                           term_var=[1], term_t0=[0], term_t1=[1], term_usage=[np.array([0.0, 1.0, 2.0])],
                           base=np.zeros(1), time_points=np.zeros(1, np.int64), limit=1.0, constant=0.0)
    neighbours = [sorted(graph.adj_other[graph.adj_off[v]:graph.adj_off[v + 1]].tolist()) for v in range(3)]
    assert neighbours == [[1], [0, 2], [1]]
    assert graph.var_term[graph.var_term_off[1]:graph.var_term_off[2]].tolist() == [0]
    assert graph.memory_profile(np.array([0, 2, 1])).tolist() == [2.0]
