"""Large-neighbourhood search (solver.anytime): from any feasible start it never worsens nor
breaks the memory limit, and a window that covers a small connected graph finds its
brute-force optimum."""

from __future__ import annotations

import time

import numpy as np
import pytest

from solver.anytime import improve
from solver.compiled import assemble_graph
from solver.localsearch import SearchState, least_memory_values, repair


def chain_graph(rng: np.random.Generator, n: int = 5):
    """A chain of ``n`` variables with 3 values, random costs and one memory point that binds."""
    usage = [rng.integers(1, 6, size=3).astype(np.float64) for _ in range(n)]
    limit = float(sum(u.min() for u in usage) + 0.5 * sum(u.max() - u.min() for u in usage))
    return assemble_graph(
        var_ids=np.arange(n), unary=[rng.integers(0, 20, size=3).astype(np.float64) for _ in range(n)],
        edge_u=list(range(n - 1)), edge_v=list(range(1, n)),
        edge_costs=[rng.integers(0, 20, size=(3, 3)).astype(np.float64) for _ in range(n - 1)],
        term_var=list(range(n)), term_t0=[0] * n, term_t1=[1] * n, term_usage=usage,
        base=np.zeros(1), time_points=np.zeros(1, np.int64), limit=limit, constant=0.0)


def feasible_start(graph) -> SearchState:
    state = SearchState(graph.arrays, least_memory_values(graph.arrays, True))
    repair(graph.arrays, state.x, state.tree, state.pend, 1000)
    assert state.feasible()
    return state


@pytest.mark.parametrize("seed", range(3))
def test_a_window_over_the_whole_chain_reaches_the_optimum(seed, graph_oracle):
    rng = np.random.default_rng(seed)
    graph = chain_graph(rng)
    best, _ = graph_oracle(graph)
    state = feasible_start(graph)
    start_cost = graph.cost(state.x)
    seen = []
    report = improve(graph, graph.arrays, state, backend="cbc", deadline=time.perf_counter() + 0.8, seed=seed,
                     on_improve=seen.append)
    assert report.windows >= 1
    assert graph.cost(state.x) == pytest.approx(best)
    assert state.feasible() and graph.memory_profile(state.x).max() <= graph.limit
    # costs only go down, and every reported improvement is a real one
    costs = [c for _, c in report.history]
    assert costs[0] == start_cost and all(b < a for a, b in zip(costs, costs[1:]))
    assert seen == costs[1:]


def test_the_state_stays_feasible_on_random_graphs(random_graphs, graph_oracle):
    runs = 0
    for _, graph in random_graphs(111, 50, max_nodes=6):
        if runs == 2 or graph.num_vars < 2 or not graph.num_times:
            continue
        state = SearchState(graph.arrays, least_memory_values(graph.arrays, True))
        repair(graph.arrays, state.x, state.tree, state.pend, 1000)
        if not state.feasible() or not np.isfinite(graph.cost(state.x)):
            continue
        before = graph.cost(state.x)
        improve(graph, graph.arrays, state, backend="cbc", deadline=time.perf_counter() + 0.7, seed=runs)
        assert graph.cost(state.x) <= before and graph.cost(state.x) >= graph_oracle(graph)[0] - 1e-9
        assert graph.memory_profile(state.x).max() <= graph.limit
        # the tree was kept in step with the values
        assert [state.max(t, t + 1) for t in range(graph.num_times)] == list(graph.memory_profile(state.x))
        runs += 1
    assert runs == 2


def test_coupled_window_takes_half_around_a_memory_partner_only_when_the_limit_binds():
    from solver.anytime import _window

    # two chains 0-1-2 and 3-4-5 with no edge between them, sharing one memory point
    usage = [np.array([1.0, 4.0])] * 6
    def graph(limit):
        return assemble_graph(
            var_ids=np.arange(6), unary=[np.array([1.0, 0.0])] * 6, edge_u=[0, 1, 3, 4], edge_v=[1, 2, 4, 5],
            edge_costs=[np.zeros((2, 2))] * 4, term_var=list(range(6)), term_t0=[0] * 6, term_t1=[1] * 6,
            term_usage=usage, base=np.zeros(1), time_points=np.zeros(1, np.int64), limit=limit, constant=0.0)
    x = np.array([0, 0, 0, 1, 1, 1])  # memory 3 + 12 = 15
    rng = np.random.default_rng(0)
    tight = graph(15.0)
    assert set(_window(tight, x, tight.memory_profile(x), 0, 4, 100, rng, coupled=False)) <= {0, 1, 2}
    coupled = _window(tight, x, tight.memory_profile(x), 0, 4, 100, rng, coupled=True)
    assert set(coupled) & {0, 1, 2} and set(coupled) & {3, 4, 5}
    loose = graph(100.0)  # far from the limit: no partner, one connected window
    assert set(_window(loose, x, loose.memory_profile(x), 0, 4, 100, rng, coupled=True)) <= {0, 1, 2}
