"""Each reduction keeps the optimum, and the reduced graph prices and checks memory exactly.

For every random problem and every reduction switched on alone (and all
together): enumerating the reduced graph gives the brute-force optimum, and for
every enumerated assignment the compiled cost and memory feasibility equal an
independent evaluation of the reconstructed choice.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from solver import Problem, evaluate
from solver.compiled import compile_graph
from solver.reductions import InfeasibleError, reduce_problem

SETTINGS = {
    "basic": dict(dominance=False, followers=False, elimination=False),
    "dominance": dict(dominance=True, followers=False, elimination=False),
    "followers": dict(dominance=False, followers=True, elimination=False),
    "elimination": dict(dominance=False, followers=False, elimination=True),
    "all": dict(dominance=True, followers=True, elimination=True),
}


def enumerate_reduced(problem: Problem, **flags) -> float:
    try:
        working, report = reduce_problem(problem, **flags)
    except InfeasibleError:
        return math.inf
    graph = compile_graph(working)
    best = math.inf
    for values in itertools.product(*(range(int(d)) for d in graph.dom)):
        values = np.array(values, dtype=np.int64)
        choice = working.reconstruct(graph.values_to_dict(values))
        ev = evaluate(problem, choice)
        fits = graph.num_times == 0 or graph.memory_profile(values).max() <= graph.limit
        assert fits == (ev.peak_memory_bytes <= (problem.memory_limit if problem.memory_limit is not None
                                                  else math.inf)), (problem.to_dict(), values)
        cost = graph.cost(values)
        if math.isfinite(ev.cost) or math.isfinite(cost):
            assert cost == pytest.approx(ev.cost), (problem.to_dict(), values)
        if fits and ev.feasible:
            best = min(best, ev.cost)
    return best


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_reduction_keeps_the_optimum(setting, make_random_problem, oracle):
    rng = np.random.default_rng(sorted(SETTINGS).index(setting) + 10)
    for _ in range(120):
        problem = make_random_problem(rng)
        best, _ = oracle(problem)
        assert enumerate_reduced(problem, **SETTINGS[setting]) == pytest.approx(best), problem.to_dict()


def test_follower_chain_collapses_to_one_variable():
    # x1 = f(x0), x2 = g(x1): forbidden entries leave one finite pair per row
    inf = None
    p = Problem.from_dict({
        "nodes": [{"cost": [1, 2, 3], "memory": [3, 2, 1], "live": [0, 5]},
                  {"cost": [0, 5, 1], "memory": [1, 1, 4], "live": [2, 4]},
                  {"cost": [2, 2], "memory": [1, 7], "live": [3, 6]}],
        "edges": [{"src": 0, "dst": 1, "cost": [[0, inf, inf], [inf, inf, 1], [inf, 2, inf]]},
                  {"src": 1, "dst": 2, "cost": [[1, inf], [inf, 0], [3, inf]]}],
        "memory_limit": 9})
    working, report = reduce_problem(p, dominance=False, elimination=False)
    assert report.counts.get("R6_followers") == 2
    assert report.after.variables == 1


def test_dominated_value_is_removed_and_sizes_reported():
    p = Problem.from_dict({
        "nodes": [{"cost": [1, 5], "memory": [1, 2], "live": [0, 2]}, {"cost": [0, 0, 1]}],
        "edges": [{"src": 0, "dst": 1, "cost": [[0, 1, 2], [1, 1, 2]]}],
        "memory_limit": 10})
    working, report = reduce_problem(p, followers=False, elimination=False)
    assert report.counts["R7_dominated_values"] >= 1
    assert report.before.choices == 5 and report.after.choices < 5
    assert set(report.to_dict()) == {"before", "after", "counts", "seconds"}


def test_all_forbidden_is_reported_infeasible():
    p = Problem.from_dict({"nodes": [{"cost": [1, 2]}, {"cost": [1]}],
                           "edges": [{"src": 0, "dst": 1, "cost": [[None], [None]]}]})
    with pytest.raises(InfeasibleError):
        reduce_problem(p)


def test_leaf_does_not_follow_when_its_least_memory_values_are_forbidden():
    # Node 1 is a leaf of node 0 (node 2 keeps node 0 off the leaf list). With
    # node 0 on value 0, node 1's least-memory value is forbidden and its
    # cheapest value uses the most memory: fixing it there would lose the
    # optimum (node 1 on its middle value fits the limit).
    p = Problem.from_dict({
        "nodes": [{"cost": [0, 100]}, {"cost": [0, 0, 0], "memory": [5, 3, 1]},
                  {"cost": [0, 0], "memory": [1, 2]}],
        "edges": [{"src": 0, "dst": 1, "cost": [[5, 6, None], [7, None, 0]]},
                  {"src": 0, "dst": 2, "cost": [[0, 1], [1, 0]]}],
        "memory_limit": 5})
    working, report = reduce_problem(p, dominance=False, elimination=False)
    assert "R6_leaf_followers" not in report.counts
    assert enumerate_reduced(p) == 6
