"""The move kernels (solver.kernels) against plain numpy on the compiled graph: local costs
with and without one edge, and value changes that keep the memory tree equal to the profile."""

from __future__ import annotations

import numpy as np

from solver.kernels import MemoryTree, apply_value, local_costs, local_costs_except
from solver.tolerance import kernel_costs


def _expected_local(graph, x, v, skip=-1):
    """unary_v(b) + sum over the edges of v (but ``skip``) of M(b, x_other), from the matrices."""
    out = kernel_costs(graph.unary_of(v)).copy()
    for e in range(graph.num_edges):
        if e == skip:
            continue
        m = kernel_costs(graph.edge_matrix(e))
        if graph.edge_u[e] == v:
            out += m[:, x[graph.edge_v[e]]]
        elif graph.edge_v[e] == v:
            out += m[x[graph.edge_u[e]], :]
    return out


def test_local_costs_match_the_edge_matrices(random_graphs):
    checked = 0
    for rng, graph in random_graphs(21, 60, max_nodes=7):
        arr = graph.arrays
        x = rng.integers(0, graph.dom)
        out = np.empty(int(graph.dom.max()))
        for v in range(graph.num_vars):
            d = int(graph.dom[v])
            local_costs(arr, x, v, out)
            np.testing.assert_allclose(out[:d], _expected_local(graph, x, v), rtol=1e-12)
            for i in range(graph.adj_off[v], graph.adj_off[v + 1]):
                e = int(graph.adj_edge[i])
                local_costs_except(arr, x, v, e, out)
                np.testing.assert_allclose(out[:d], _expected_local(graph, x, v, skip=e), rtol=1e-12)
            checked += 1
    assert checked > 100


def test_apply_value_keeps_the_tree_equal_to_the_profile(random_graphs):
    for rng, graph in random_graphs(22, 40, max_nodes=7):
        if graph.num_times == 0:
            continue
        arr = graph.arrays
        x = rng.integers(0, graph.dom)
        tree = MemoryTree(graph.memory_profile(x))
        for _ in range(10):
            v = int(rng.integers(graph.num_vars))
            apply_value(arr, tree.tree, tree.pend, x, v, int(rng.integers(graph.dom[v])))
            profile = graph.memory_profile(x)
            assert [tree.max(t, t + 1) for t in range(graph.num_times)] == list(profile)
            assert tree.peak() == profile.max()
            assert tree.argmax()[0] == profile.max()


def test_memory_tree_peak_without_points():
    assert MemoryTree(np.zeros(0)).peak() == 0.0
