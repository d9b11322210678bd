"""Local search and windows: moves keep the memory limit, descent never raises the cost,
and a window's cost change is the full problem's cost change."""

from __future__ import annotations

import numpy as np

from solver.compiled import compile_graph
from solver.localsearch import SearchState, descend, greedy, repair
from solver.reductions import InfeasibleError, reduce_problem
from solver.window import extract_window


def _compiled(problem):
    working, _ = reduce_problem(problem, dominance=False, followers=False, elimination=False)
    return working, compile_graph(working, drop_redundant_times=False)


def test_descent_never_raises_cost_and_keeps_feasibility(make_random_problem):
    rng = np.random.default_rng(5)
    for _ in range(150):
        problem = make_random_problem(rng, max_nodes=8)
        try:
            working, graph = _compiled(problem)
        except InfeasibleError:
            continue
        arr = graph.arrays
        state = SearchState(arr, rng.integers(0, graph.dom), graph.num_times)
        if not state.feasible():
            continue
        before = graph.cost(state.x)
        descend(state, enforce=True, rng=rng)
        assert graph.cost(state.x) <= before + 1e-9
        assert state.feasible()
        # the tree still matches a recomputed profile
        if graph.num_times:
            leaves = [state.max(t, t + 1) for t in range(graph.num_times)]
            assert np.allclose(leaves, graph.memory_profile(state.x))


def test_repair_reaches_the_limit_from_the_most_hungry_start(make_random_problem):
    rng = np.random.default_rng(6)
    repaired = 0
    for _ in range(150):
        problem = make_random_problem(rng, max_nodes=8, forbidden=0.0)
        try:
            working, graph = _compiled(problem)
        except InfeasibleError:
            continue
        if graph.num_times == 0:
            continue
        arr = graph.arrays
        hungry = np.array([int(np.argmax(graph.unary_of(v))) for v in range(graph.num_vars)], dtype=np.int64)
        state = SearchState(arr, hungry, graph.num_times)
        if repair(arr, state.x, state.tree, state.pend, 10_000):
            assert graph.memory_profile(state.x).max() <= graph.limit
            repaired += 1
    assert repaired > 20


def test_greedy_start_is_feasible_when_least_memory_fits(make_random_problem):
    rng = np.random.default_rng(8)
    for _ in range(100):
        problem = make_random_problem(rng, max_nodes=8)
        try:
            working, graph = _compiled(problem)
        except InfeasibleError:
            continue
        arr = graph.arrays
        state = greedy(arr, graph.num_times, rng=rng)
        least = SearchState(arr, np.zeros(graph.num_vars, dtype=np.int64), graph.num_times)
        if graph.num_times and graph.base.max() <= graph.limit and least.feasible():
            assert state.feasible()


def test_window_cost_difference_equals_full_cost_difference(make_random_problem):
    rng = np.random.default_rng(9)
    for _ in range(100):
        problem = make_random_problem(rng, max_nodes=8, forbidden=0.0)
        try:
            working, graph = _compiled(problem)
        except InfeasibleError:
            continue
        if graph.num_vars < 2:
            continue
        x = rng.integers(0, graph.dom).astype(np.int64)
        members = np.sort(rng.choice(graph.num_vars, size=int(rng.integers(1, graph.num_vars + 1)), replace=False))
        sub = extract_window(graph, x, members, graph.memory_profile(x))
        y = x.copy()
        y[members] = rng.integers(0, graph.dom[members])
        assert graph.cost(y) - graph.cost(x) == np.float64(sub.cost(y[members]) - sub.cost(x[members])) or \
            abs((graph.cost(y) - graph.cost(x)) - (sub.cost(y[members]) - sub.cost(x[members]))) < 1e-6
        if graph.num_times and sub.num_times:
            full_ok = graph.memory_profile(y).max() <= graph.limit
            # the window sees only its own points; outside them nothing changed
            sub_ok = sub.memory_profile(y[members]).max() <= sub.limit
            untouched = graph.memory_profile(x)
            if untouched.max() <= graph.limit:
                assert full_ok == sub_ok


def test_greedy_leaves_a_least_memory_start_that_pairs_into_a_forbidden_combination():
    """A chain a -> b -> c where the cheapest memory for each alone is a pair the
    edges forbid (a value of b needs a "held" or "recomputed" value of a, as a
    recomputed op needs its input): one-variable repair cannot leave such a
    start, ``make_finite`` moves the end that costs least memory, and greedy
    then finds the feasible choice."""
    from solver.localsearch import make_finite
    from solver.problem import Problem

    inf = float("inf")
    # values: 0 keep (short), 1 hold (long), 2 recompute (short, twice again)
    fwd = {"cost": [1.0, 1.0, 2.0], "memory": [1, 4, 2], "live": [0, 4]}
    saved = {"cost": [1.0, 2.0], "memory": [9, 1], "live": [0, 4]}  # keep (long) / recompute
    # a recomputed reader needs its input held or recomputed (rows: the input's value, columns: the reader's)
    ab = [[0.0, 0.0, inf], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    bc = [[0.0, inf], [0.0, 0.0], [0.0, 0.0]]
    problem = Problem.from_dict({"nodes": [fwd, fwd, saved],
                                 "edges": [{"src": 0, "dst": 1, "cost": ab}, {"src": 1, "dst": 2, "cost": bc}],
                                 "memory_limit": 8})
    working, graph = _compiled(problem)
    arr = graph.arrays
    from solver.localsearch import least_memory_values

    start = least_memory_values(arr, True)
    assert not np.isfinite(graph.cost(start))  # keep, keep, recompute: forbidden
    stuck = SearchState(arr, start, graph.num_times)
    repair(arr, stuck.x, stuck.tree, stuck.pend, 1000)
    assert not np.isfinite(graph.cost(stuck.x))
    x = start.copy()
    assert make_finite(arr, x, 100) >= 1  # b held (recomputing it would need a held too)
    assert np.isfinite(graph.cost(x))
    state = greedy(arr, graph.num_times)
    assert state.feasible() and np.isfinite(graph.cost(state.x))
