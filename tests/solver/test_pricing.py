"""Memory as prices (solver.pricing): the priced problem equals the Lagrangian at every
labelling, and its bound never exceeds the brute-force optimum (weak duality)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from solver.pricing import dual_bound, priced_unary, segment_prices


def _priced_cost(graph, unary, x) -> float:
    """F_lambda(x): the priced unary costs plus the edges (no constant)."""
    total = float(unary[graph.unary_off[:-1] + x].sum())
    return total + float(graph.edge_cost[graph.edge_entries(x)].sum()) if graph.num_edges else total


def _memory_graphs(random_graphs, seed, count):
    for rng, graph in random_graphs(seed, count):
        if graph.num_times and np.isfinite(graph.limit):
            yield rng, graph


def test_segment_prices_sum_the_points_each_segment_covers(random_graphs):
    for rng, graph in _memory_graphs(random_graphs, 41, 30):
        lam = rng.random(graph.num_times)
        expected = [lam[graph.term_t0[s]:graph.term_t1[s]].sum() for s in range(graph.term_var.size)]
        np.testing.assert_allclose(segment_prices(graph, lam), expected, rtol=1e-12, atol=1e-15)


def test_priced_problem_is_the_lagrangian_at_every_labelling(random_graphs):
    checked = 0
    for rng, graph in _memory_graphs(random_graphs, 42, 40):
        lam = rng.random(graph.num_times) * rng.choice([0.0, 0.1, 3.0])
        unary = priced_unary(graph, lam)
        for values in itertools.islice(itertools.product(*(range(int(d)) for d in graph.dom)), 50):
            x = np.array(values, dtype=np.int64)
            if not np.isfinite(graph.cost(x)):
                continue
            lagrangian = graph.cost(x) + float(lam @ (graph.memory_profile(x) - graph.limit))
            assert dual_bound(graph, lam, _priced_cost(graph, unary, x)) == pytest.approx(lagrangian, rel=1e-9)
            checked += 1
    assert checked > 50


def test_dual_bound_never_exceeds_the_optimum(random_graphs, graph_oracle):
    checked = 0
    for rng, graph in _memory_graphs(random_graphs, 43, 40):
        best, _ = graph_oracle(graph)
        if not np.isfinite(best):
            continue
        for _ in range(5):
            lam = rng.random(graph.num_times) * rng.choice([0.1, 1.0, 10.0])
            unary = priced_unary(graph, lam)
            priced_min = min(_priced_cost(graph, unary, np.array(v, dtype=np.int64))
                             for v in itertools.product(*(range(int(d)) for d in graph.dom)))
            assert dual_bound(graph, lam, priced_min) <= best + 1e-9 * max(1.0, abs(best))
            checked += 1
    assert checked > 20


def test_without_a_limit_unpriced_points_add_nothing_and_priced_ones_void_the_bound(random_graphs):
    """No memory limit (capacity inf at every point): multipliers 0 give the plain minimum (not nan,
    which 0 x inf made and later comparisons hid); any positive multiplier gives -inf (valid)."""
    from dataclasses import replace

    checked = 0
    for rng, graph in random_graphs(43, 30):
        if not graph.num_times:
            continue
        free = replace(graph, limit=float("inf"))
        lam = np.zeros(graph.num_times)
        with np.errstate(invalid="raise"):
            assert dual_bound(free, lam, 1.5) == 1.5 + free.constant
            lam[rng.integers(graph.num_times)] = 0.25
            assert dual_bound(free, lam, 1.5) == -np.inf
        checked += 1
    assert checked
