"""The exact stage (solver.exact) on small graphs against brute force, for every backend:
lazily added memory rows, warm starts, graphs the reductions decided, and valid bounds."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from solver.compiled import assemble_graph
from solver.exact import solve_exact


def test_optimum_and_bound_match_brute_force(backend, random_graphs, graph_oracle):
    solved = 0
    for _, graph in random_graphs(71, 10, ties=False, pins=False):
        best, _ = graph_oracle(graph)
        result = solve_exact(graph, backend, deadline=time.perf_counter() + 20, threads=1,
                             lp_heuristic=bool(solved % 2))
        if math.isinf(best):
            assert result.status == "infeasible"
            continue
        assert result.status == "optimal", result.log
        assert result.cost == pytest.approx(best) and graph.cost(result.values) == pytest.approx(best)
        assert result.bound == pytest.approx(best)
        if graph.num_times:
            assert graph.memory_profile(result.values).max() <= graph.limit
        solved += 1
    assert solved >= 6


def memory_chain(limit: float):
    """Three variables in a chain; value 1 is cheaper and uses 2 units at every point instead of 1.
    With 3 <= limit < 6 the cheapest labelling does not fit and some variables must take 0."""
    edge = np.array([[0.0, 1.0], [1.0, 0.0]])
    return assemble_graph(var_ids=np.arange(3), unary=[np.array([2.0, 0.0])] * 3, edge_u=[0, 1], edge_v=[1, 2],
                          edge_costs=[edge, edge], term_var=[0, 1, 2], term_t0=[0, 0, 0], term_t1=[4, 4, 4],
                          term_usage=[np.array([1.0, 2.0])] * 3, base=np.zeros(4), time_points=np.arange(4),
                          limit=limit, constant=1.0)


def test_memory_rows_join_lazily_until_the_solution_fits(backend, graph_oracle):
    graph = memory_chain(limit=4.0)
    best, _ = graph_oracle(graph)
    result = solve_exact(graph, backend, deadline=time.perf_counter() + 20, lp_heuristic=False)
    assert result.status == "optimal" and result.cost == pytest.approx(best) == 6.0
    assert result.rounds == 2 and result.memory_points == 1  # the cheapest labelling broke one point


def test_a_feasible_warm_start_is_kept_and_an_infeasible_one_ignored(backend, graph_oracle):
    graph = memory_chain(limit=4.0)
    best, values = graph_oracle(graph)
    started = solve_exact(graph, backend, deadline=time.perf_counter() + 20, start=values)
    assert started.status == "optimal" and started.cost == pytest.approx(best)
    assert started.memory_points >= 1  # the start's highest points are posted from the first round
    ignored = solve_exact(graph, backend, deadline=time.perf_counter() + 20, start=np.array([1, 1, 1]))
    assert ignored.status == "optimal" and ignored.cost == pytest.approx(best)


def test_infeasible_and_decided_graphs(backend):
    assert solve_exact(memory_chain(limit=2.0), backend, deadline=time.perf_counter() + 20).status == "infeasible"
    empty = dict(var_ids=np.zeros(0, np.int64), unary=[], edge_u=[], edge_v=[], edge_costs=[], term_var=[],
                 term_t0=[], term_t1=[], term_usage=[], time_points=np.arange(1), constant=3.0)
    decided = solve_exact(assemble_graph(**empty, base=np.array([1.0]), limit=2.0), backend, deadline=math.inf)
    assert (decided.status, decided.cost, decided.bound) == ("optimal", 3.0, 3.0)
    over = solve_exact(assemble_graph(**empty, base=np.array([3.0]), limit=2.0), backend, deadline=math.inf)
    assert over.status == "infeasible" and over.values is None


def test_no_time_gives_the_warm_start_back(backend):
    graph = memory_chain(limit=4.0)
    start = np.array([0, 0, 0])
    result = solve_exact(graph, backend, deadline=time.perf_counter(), start=start)
    assert result.status == "timeout" and np.array_equal(result.values, start)
    assert result.cost == graph.cost(start) and result.bound <= result.cost
