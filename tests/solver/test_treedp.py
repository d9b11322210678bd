"""Bucket elimination (solver.treedp) against brute force on small random graphs.

Graphs have at most 7 variables with 1-4 values, dense enough to have cycles
and fill-in, some with forbidden (inf) entries and parallel edges; the
minimum energy and every min-marginal are found by enumerating all labellings.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from solver.compiled import CompiledGraph, assemble_graph
from solver.treedp import min_marginals, plan_elimination, solve_plan


def random_graph(seed: int, *, forbidden: bool = False) -> CompiledGraph:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 8))
    dom = rng.integers(1, 5, size=n)
    unary = [rng.uniform(0, 10, size=d) for d in dom]
    pairs = [(u, v) for u in range(n) for v in range(u + 1, n) if rng.random() < 0.5]
    if pairs and rng.random() < 0.3:
        pairs.append(pairs[0])  # a parallel edge
    costs = []
    for u, v in pairs:
        m = rng.uniform(0, 10, size=(dom[u], dom[v]))
        if forbidden:
            m[rng.random(m.shape) < 0.25] = np.inf
        costs.append(m)
    if forbidden:
        for c in unary:
            c[rng.random(c.shape) < 0.2] = np.inf
    empty = np.zeros(0, dtype=np.int64)
    return assemble_graph(var_ids=np.arange(n), unary=unary, edge_u=np.array([p[0] for p in pairs], dtype=np.int64),
                          edge_v=np.array([p[1] for p in pairs], dtype=np.int64), edge_costs=costs,
                          term_var=empty, term_t0=empty, term_t1=empty, term_usage=[], base=np.zeros(0),
                          time_points=empty, limit=np.inf, constant=0.0)


def energies(graph: CompiledGraph) -> dict[tuple[int, ...], float]:
    return {x: graph.cost(np.array(x, dtype=np.int64))
            for x in itertools.product(*(range(int(d)) for d in graph.dom))}


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("forbidden", [False, True])
def test_elimination_matches_brute_force_minimum_and_labels(seed: int, forbidden: bool) -> None:
    graph = random_graph(seed, forbidden=forbidden)
    plan = plan_elimination(graph)
    assert plan is not None
    labels, value = solve_plan(plan, graph)
    best = min(energies(graph).values())
    if not np.isfinite(best):
        assert value == np.inf
        return
    assert value == pytest.approx(best, rel=1e-12, abs=1e-12)
    assert graph.cost(labels) == pytest.approx(best, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("forbidden", [False, True])
def test_min_marginals_match_brute_force(seed: int, forbidden: bool) -> None:
    graph = random_graph(seed, forbidden=forbidden)
    plan = plan_elimination(graph)
    unary = graph.unary + np.random.default_rng(seed + 1000).uniform(-1, 1, size=graph.unary.size)
    priced = assemble_graph(var_ids=graph.var_ids, unary=[unary[graph.unary_off[v]:graph.unary_off[v + 1]]
                                                          for v in range(graph.num_vars)],
                            edge_u=graph.edge_u, edge_v=graph.edge_v,
                            edge_costs=[graph.edge_matrix(e) for e in range(graph.num_edges)],
                            term_var=graph.term_var, term_t0=graph.term_t0, term_t1=graph.term_t1, term_usage=[],
                            base=graph.base, time_points=graph.time_points, limit=graph.limit, constant=0.0)
    marg, labels, value = min_marginals(plan, graph, unary)
    table = energies(priced)
    for v in range(graph.num_vars):
        for a in range(int(graph.dom[v])):
            expected = min(e for x, e in table.items() if x[v] == a)
            if np.isfinite(expected):
                assert marg[graph.unary_off[v] + a] == pytest.approx(expected, rel=1e-12, abs=1e-12)
            else:
                assert marg[graph.unary_off[v] + a] == np.inf
    assert value == pytest.approx(min(table.values()), rel=1e-12, abs=1e-12) or not np.isfinite(value)


def test_plan_refuses_tables_over_the_limit() -> None:
    """A clique of 6 variables with 4 values needs a table of 4^6 entries."""
    n = 6
    pairs = [(u, v) for u in range(n) for v in range(u + 1, n)]
    empty = np.zeros(0, dtype=np.int64)
    graph = assemble_graph(var_ids=np.arange(n), unary=[np.zeros(4)] * n,
                           edge_u=np.array([p[0] for p in pairs]), edge_v=np.array([p[1] for p in pairs]),
                           edge_costs=[np.ones((4, 4))] * len(pairs), term_var=empty, term_t0=empty,
                           term_t1=empty, term_usage=[], base=np.zeros(0), time_points=empty, limit=np.inf,
                           constant=0.0)
    assert plan_elimination(graph, max_table=4 ** 5) is None
    assert plan_elimination(graph, max_table=4 ** 6) is not None
    assert plan_elimination(graph, max_work=100) is None


def test_chain_of_many_variables_is_width_one() -> None:
    n = 200
    rng = np.random.default_rng(0)
    empty = np.zeros(0, dtype=np.int64)
    graph = assemble_graph(var_ids=np.arange(n), unary=[rng.uniform(0, 1, 3) for _ in range(n)],
                           edge_u=np.arange(n - 1), edge_v=np.arange(1, n),
                           edge_costs=[rng.uniform(0, 1, (3, 3)) for _ in range(n - 1)], term_var=empty,
                           term_t0=empty, term_t1=empty, term_usage=[], base=np.zeros(0), time_points=empty,
                           limit=np.inf, constant=0.0)
    plan = plan_elimination(graph)
    assert plan.width == 1
    # Viterbi along the chain as the reference
    best = graph.unary_of(0).copy()
    for e in range(n - 1):
        best = (best[:, None] + graph.edge_matrix(e)).min(axis=0) + graph.unary_of(e + 1)
    labels, value = solve_plan(plan, graph)
    assert value == pytest.approx(best.min(), rel=1e-12)
    assert graph.cost(labels) == pytest.approx(best.min(), rel=1e-12)
