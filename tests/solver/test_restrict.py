"""Restricted domains (solver.restrict): every restricted labelling is the full labelling it
maps to, with the same cost and memory, and the restricted optimum is the best full
labelling over the allowed values (brute force)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from solver.restrict import from_restricted, restrict_values, to_restricted


def _random_allowed(rng, graph) -> list[np.ndarray]:
    return [np.sort(rng.choice(int(d), size=int(rng.integers(1, d + 1)), replace=False)) for d in graph.dom]


def test_restricted_labellings_keep_cost_and_memory(random_graphs):
    checked = 0
    for rng, graph in random_graphs(51, 40):
        allowed = _random_allowed(rng, graph)
        sub = restrict_values(graph, allowed)
        assert sub.dom.tolist() == [a.size for a in allowed]
        for values in itertools.product(*(range(int(d)) for d in sub.dom)):
            x = np.array(values, dtype=np.int64)
            full = from_restricted(allowed, x)
            assert np.array_equal(to_restricted(allowed, full), x)
            assert sub.cost(x) == graph.cost(full) or (np.isinf(sub.cost(x)) and np.isinf(graph.cost(full)))
            np.testing.assert_array_equal(sub.memory_profile(x), graph.memory_profile(full))
            checked += 1
    assert checked > 100


def test_restricted_optimum_is_the_best_over_the_allowed_values(random_graphs, graph_oracle):
    for rng, graph in random_graphs(52, 40):
        allowed = _random_allowed(rng, graph)
        best_sub, values = graph_oracle(restrict_values(graph, allowed))
        best_full = np.inf
        for full in itertools.product(*(a.tolist() for a in allowed)):
            x = np.array(full, dtype=np.int64)
            if not graph.num_times or graph.memory_profile(x).max() <= graph.limit:
                best_full = min(best_full, graph.cost(x))
        assert best_sub == pytest.approx(best_full) if np.isfinite(best_full) else np.isinf(best_sub)
        if values is not None:
            assert all(v in a for v, a in zip(from_restricted(allowed, values).tolist(), allowed))
