"""TRW-S (solver.trws) against brute force on small random graphs.

Every graph here has at most 8 variables with 2-4 values, so the minimum
energy is found by enumerating all labellings. Graphs are built directly as
:class:`solver.compiled.KernelArrays` (forbidden = BIG), except one test that goes
through the problem -> reductions -> compile pipeline.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from solver.compiled import compile_graph
from solver.compiled import KernelArrays as Arrays
from solver.compiled import assemble_graph
from solver.problem import Problem
from solver.reductions import reduce_problem
from solver.tolerance import BIG, FORBIDDEN
from solver.trws import trws
from solver.trws_plan import plan_trws

Edge = tuple[int, int, np.ndarray]


# -- helpers --------------------------------------------------------------------
def make_arrays(unaries: list[np.ndarray], edges: list[Edge]) -> Arrays:
    """Kernel arrays of a graph given per-variable unary costs and (u, v, [d_u, d_v] matrix) edges."""
    return assemble_graph(
        var_ids=np.arange(len(unaries)), unary=[np.asarray(c, dtype=np.float64) for c in unaries],
        edge_u=[u for u, _, _ in edges], edge_v=[v for _, v, _ in edges], edge_costs=[m for _, _, m in edges],
        term_var=[], term_t0=[], term_t1=[], term_usage=[], base=np.zeros(0),
        time_points=np.zeros(0, dtype=np.int64), limit=np.inf, constant=0.0).arrays


def energies(arr: Arrays, unary: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(every labelling as rows, its energy), forbidden entries counted as BIG."""
    costs = arr.unary if unary is None else unary
    labels = np.array(list(itertools.product(*[range(d) for d in arr.dom])), dtype=np.int64)
    total = costs[arr.unary_off[:-1] + labels].sum(axis=1)
    for e in range(arr.edge_u.shape[0]):
        u, v = arr.edge_u[e], arr.edge_v[e]
        total = total + arr.edge_cost[arr.edge_off[e] + labels[:, u] * arr.dom[v] + labels[:, v]]
    return labels, total


def optimum(arr: Arrays, unary: np.ndarray | None = None) -> float:
    return float(energies(arr, unary)[1].min())


def energy_of(arr: Arrays, labels: np.ndarray, unary: np.ndarray | None = None) -> float:
    """Unary terms, then edge terms, summed one at a time (forbidden entries count BIG)."""
    costs = arr.unary if unary is None else unary
    total = 0.0
    for v, x in enumerate(labels.tolist()):
        total += float(costs[arr.unary_off[v] + x])
    for e, (u, v) in enumerate(zip(arr.edge_u.tolist(), arr.edge_v.tolist())):
        total += float(arr.edge_cost[arr.edge_off[e] + labels[u] * arr.dom[v] + labels[v]])
    return total


def random_costs(rng: np.random.Generator, shape: tuple[int, ...], scale: float, forbidden: float) -> np.ndarray:
    costs = rng.integers(0, 100, size=shape).astype(np.float64) * scale
    costs[rng.random(shape) < forbidden] = BIG
    return costs


def random_graph(
    rng: np.random.Generator,
    *,
    kind: str,
    n: int | None = None,
    scale: float = 1.0,
    forbidden: float = 0.0,
) -> Arrays:
    """A random chain, tree or loopy graph; edge orientations (u, v) are random."""
    n = int(rng.integers(2, 9)) if n is None else n
    dom = rng.integers(2, 5, size=n)
    if kind == "chain":
        pairs = [(i, i + 1) for i in range(n - 1)]
    elif kind == "tree":
        perm = rng.permutation(n)  # so that parents are not always lower indices
        pairs = [(int(perm[int(rng.integers(0, i))]), int(perm[i])) for i in range(1, n)]
    else:
        pairs = sorted({tuple(sorted(map(int, rng.choice(n, 2, replace=False)))) for _ in range(2 * n)})
    edges = []
    for a, b in pairs:
        u, v = (a, b) if rng.random() < 0.5 else (b, a)
        edges.append((u, v, random_costs(rng, (int(dom[u]), int(dom[v])), scale, forbidden)))
    unaries = [random_costs(rng, (int(d),), scale, forbidden / 4) for d in dom]
    return make_arrays(unaries, edges)


def plant(rng: np.random.Generator, arr: Arrays) -> Arrays:
    """``arr`` with one random labelling made finite (cost 50 per term), so a finite one exists."""
    planted = rng.integers(0, arr.dom)
    unary = arr.unary.copy()
    unary[arr.unary_off[:-1] + planted] = 50.0
    cost = arr.edge_cost.copy()
    cost[arr.edge_off[:-1] + planted[arr.edge_u] * arr.dom[arr.edge_v] + planted[arr.edge_v]] = 50.0
    return arr._replace(unary=unary, edge_cost=cost)


def assert_consistent(arr: Arrays, res, unary: np.ndarray | None = None) -> float:
    """Bound <= optimum <= labels' energy == reported energy; returns the optimum."""
    best = optimum(arr, unary)
    scale = max(1.0, abs(best))
    assert res.lower_bound <= best + 1e-9 * scale
    assert res.labels_energy == pytest.approx(energy_of(arr, res.labels, unary), rel=1e-12)
    assert res.labels_energy >= best - 1e-9 * scale
    assert np.all(np.isfinite(res.messages)) and np.isfinite(res.lower_bound)
    return best


# -- bound and labels against brute force ----------------------------------------
@pytest.mark.parametrize("seed", range(40))
def test_bound_never_exceeds_the_optimum_on_loopy_graphs(seed: int) -> None:
    rng = np.random.default_rng(seed)
    arr = random_graph(rng, kind="loopy", forbidden=0.2 if seed % 2 else 0.0)
    for iterations in (1, 3, 30):
        assert_consistent(arr, trws(arr, iterations=iterations, tol=-1))


@pytest.mark.parametrize("seed", range(30))
def test_bound_history_never_decreases(seed: int) -> None:
    arr = random_graph(np.random.default_rng(100 + seed), kind="loopy")
    res = trws(arr, iterations=40, tol=-1)
    history = res.bound_history
    assert np.all(np.diff(history) >= -1e-9 * np.maximum(1.0, np.abs(history[1:])))
    assert res.lower_bound == history.max()


@pytest.mark.parametrize("seed", range(30))
def test_bound_and_labels_are_optimal_on_trees_for_any_order(seed: int) -> None:
    rng = np.random.default_rng(200 + seed)
    arr = random_graph(rng, kind="tree")
    order = rng.permutation(arr.dom.shape[0]) if seed % 2 else None
    res = trws(arr, iterations=200, order=order)
    best = assert_consistent(arr, res)
    assert res.lower_bound == pytest.approx(best, rel=1e-9, abs=1e-9)
    assert res.labels_energy == best


@pytest.mark.parametrize("seed", range(20))
def test_labels_are_optimal_on_chains(seed: int) -> None:
    # along the chain every weight is 1: one iteration is exact dynamic programming
    arr = random_graph(np.random.default_rng(300 + seed), kind="chain")
    res = trws(arr, iterations=3, tol=-1)
    best = assert_consistent(arr, res)
    assert res.labels_energy == best
    assert res.lower_bound == pytest.approx(best, rel=1e-12)


@pytest.mark.parametrize("seed", range(10))
def test_costs_of_1e12_keep_their_precision(seed: int) -> None:
    arr = random_graph(np.random.default_rng(400 + seed), kind="tree", n=8, scale=1e12 + 0.37)
    res = trws(arr, iterations=200, tol=-1)  # the default tol would stop at a 1e-9 gap
    best = assert_consistent(arr, res)
    assert res.lower_bound == pytest.approx(best, rel=1e-12)


def test_stops_early_once_the_gap_closes() -> None:
    arr = random_graph(np.random.default_rng(7), kind="chain", n=8)
    res = trws(arr, iterations=100)
    assert res.iterations <= 3
    assert res.labels_energy == res.lower_bound == optimum(arr)


# -- forbidden entries -----------------------------------------------------------
@pytest.mark.parametrize("seed", range(30))
def test_labels_avoid_forbidden_entries_on_trees(seed: int) -> None:
    rng = np.random.default_rng(500 + seed)
    arr = plant(rng, random_graph(rng, kind="tree", forbidden=0.6))
    best = optimum(arr)
    res = trws(arr, iterations=100)
    assert_consistent(arr, res)
    assert res.labels_energy < FORBIDDEN
    assert res.lower_bound == pytest.approx(best, rel=1e-9)


def test_labels_on_loopy_graphs_with_a_planted_solution_are_almost_always_finite() -> None:
    # Sequential labelling can walk into a dead end on a loopy graph (the
    # relaxation is not tight there), so this is a rate, not a guarantee;
    # the bound stays valid either way.
    finite = 0
    for seed in range(40):
        rng = np.random.default_rng(600 + seed)
        arr = plant(rng, random_graph(rng, kind="loopy", forbidden=0.5))
        res = trws(arr, iterations=50)
        assert_consistent(arr, res)
        finite += res.labels_energy < FORBIDDEN
    assert finite >= 37


def test_no_finite_labelling_gives_a_bound_of_big_without_nan() -> None:
    # two values each, every pair forbidden
    arr = make_arrays([np.zeros(2), np.zeros(2), np.zeros(3)],
                      [(0, 1, np.full((2, 2), BIG)), (1, 2, np.zeros((2, 3)))])
    res = trws(arr, iterations=10)
    assert res.lower_bound == BIG
    assert res.labels_energy >= BIG
    assert res.labels_energy == energy_of(arr, res.labels)
    assert np.all(np.isfinite(res.messages))


def test_inf_in_the_unary_override_counts_as_forbidden() -> None:
    arr = make_arrays([np.zeros(3), np.zeros(2)], [(0, 1, np.arange(6.0).reshape(3, 2))])
    unary = np.array([np.inf, np.inf, 7.0, 0.0, 1.0])
    res = trws(arr, unary=unary, iterations=5)
    assert res.labels.tolist() == [2, 0]
    assert res.lower_bound == res.labels_energy == 7.0 + 4.0


# -- warm starts and unary overrides ------------------------------------------------
@pytest.mark.parametrize("seed", range(10))
def test_warm_start_is_at_least_as_good_as_a_cold_start_with_the_same_iterations(seed: int) -> None:
    arr = random_graph(np.random.default_rng(700 + seed), kind="loopy", n=8)
    cold = trws(arr, iterations=10, tol=-1)
    first = trws(arr, iterations=4, tol=-1)
    warm = trws(arr, iterations=6, tol=-1, messages=first.messages)
    assert warm.lower_bound >= cold.lower_bound - 1e-9 * max(1.0, abs(cold.lower_bound))
    assert_consistent(arr, warm)


@pytest.mark.parametrize("seed", range(20))
def test_warm_start_from_other_unaries_keeps_the_bound_valid(seed: int) -> None:
    # messages from unaries that forbid values the new unaries allow must not
    # carry "forbidden" over: the first pass alone must still give a valid bound
    rng = np.random.default_rng(800 + seed)
    arr = random_graph(rng, kind="loopy", forbidden=0.1)
    old = arr.unary.copy()
    old[rng.random(old.shape) < 0.4] = BIG
    new = arr.unary + rng.integers(0, 50, size=arr.unary.shape)
    previous = trws(arr, unary=old, iterations=20, tol=-1)
    for iterations in (1, 20):
        res = trws(arr, unary=new, iterations=iterations, tol=-1, messages=previous.messages)
        assert_consistent(arr, res, new)


@pytest.mark.parametrize("seed", range(10))
def test_unary_override_equals_a_graph_with_those_unaries(seed: int) -> None:
    rng = np.random.default_rng(900 + seed)
    arr = random_graph(rng, kind="loopy")
    unary = arr.unary + rng.integers(0, 200, size=arr.unary.shape)
    by_override = trws(arr, unary=unary, iterations=20, tol=-1)
    by_graph = trws(arr._replace(unary=unary), iterations=20, tol=-1)
    assert by_override.lower_bound == by_graph.lower_bound
    assert by_override.labels_energy == by_graph.labels_energy
    assert_consistent(arr, by_override, unary)
    assert not np.array_equal(by_override.messages, trws(arr, iterations=20, tol=-1).messages)


def test_a_prebuilt_plan_gives_the_same_result() -> None:
    rng = np.random.default_rng(11)
    arr = random_graph(rng, kind="loopy", n=8)
    order = rng.permutation(8)
    plain = trws(arr, iterations=15, tol=-1, order=order)
    planned = trws(arr, iterations=15, tol=-1, plan=plan_trws(arr, order=order))
    assert plain.lower_bound == planned.lower_bound
    np.testing.assert_array_equal(plain.messages, planned.messages)


# -- shapes of graphs -------------------------------------------------------------
def test_variables_without_edges_take_their_cheapest_value() -> None:
    arr = make_arrays([np.array([3.0, 1.0, 2.0]), np.array([5.0]), np.array([0.0, 4.0]), np.array([2.0, 2.5])],
                      [(2, 3, np.array([[9.0, 0.0], [0.0, 9.0]]))])
    res = trws(arr, iterations=5)
    assert res.labels.tolist() == [1, 0, 0, 1]
    assert res.lower_bound == res.labels_energy == 1.0 + 5.0 + 0.0 + 2.5


def test_a_problem_through_reductions_and_compile() -> None:
    problem = Problem.from_dict({
        "nodes": [{"cost": [4, 1, 3]}, {"cost": [0, 2]}, {"cost": [1, 1, None]}, {"cost": [5, 0]}],
        "edges": [
            {"src": 0, "dst": 1, "cost": [[0, 3], [6, 0], [1, 1]]},
            {"src": 1, "dst": 2, "cost": [[2, 0, 1], [0, None, 4]]},
            {"src": 2, "dst": 3, "cost": [[0, 7], [3, 0], [1, 1]]},
            {"src": 3, "dst": 0, "cost": [[1, 0, 2], [0, 5, 0]]},
        ],
    })
    graph, _ = reduce_problem(problem, dominance=False, followers=False, elimination=False)
    compiled = compile_graph(graph)
    arr = compiled.arrays
    res = trws(arr, iterations=50)
    assert_consistent(arr, res)
    assert res.labels_energy + compiled.constant == pytest.approx(compiled.cost(res.labels))


def test_deadline_in_the_past_runs_one_iteration() -> None:
    arr = random_graph(np.random.default_rng(12), kind="loopy", n=8)
    res = trws(arr, iterations=50, tol=-1, deadline=time.perf_counter() - 1.0)
    assert res.iterations == 1
    assert res.bound_history.shape == (1,)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"iterations": 0}, "iterations"),
        ({"order": np.array([0, 0, 1])}, "order"),
        ({"messages": np.zeros(3)}, "messages"),
        ({"unary": np.zeros(2)}, "unary"),
    ],
)
def test_bad_arguments_raise_naming_the_field(kwargs: dict, field: str) -> None:
    arr = make_arrays([np.zeros(2), np.zeros(2), np.zeros(2)], [(0, 1, np.zeros((2, 2)))])
    with pytest.raises(ValueError, match=field):
        trws(arr, **kwargs)
