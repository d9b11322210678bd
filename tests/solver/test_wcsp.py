"""toulbar2 with memory knapsacks (solver.wcsp) against brute force, and its point pruning."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from solver.compiled import compile_graph
from solver.evaluate import evaluate
from solver.io import load_problem
from solver.problem import Problem
from solver.reductions import InfeasibleError, reduce_problem
from solver.wcsp import knapsack_groups, knapsack_rows, solve_wcsp, wcsp_available, wcsp_eligible

needs_toulbar2 = pytest.mark.skipif(not wcsp_available(), reason="pytoulbar2 not installed")


def _compiled(problem: Problem):
    """Reduced and compiled graph, or None when the reductions already prove it infeasible."""
    try:
        working, _ = reduce_problem(problem)
    except InfeasibleError:
        return None, None
    return working, compile_graph(working)


def _cover(graph, t: int) -> set[int]:
    return set(np.nonzero((graph.term_t0 <= t) & (graph.term_t1 > t))[0].tolist())


@pytest.mark.parametrize("seed", range(40))
def test_kept_knapsacks_imply_every_memory_point(seed, make_random_problem):
    rng = np.random.default_rng(seed)
    problem = make_random_problem(rng, max_nodes=8, max_strategies=3)
    if problem.memory_limit is None:
        return
    _, graph = _compiled(problem)
    if graph is None:
        return
    kept = knapsack_groups(graph)
    capacity = graph.limit - graph.base
    for t in range(graph.num_times):
        cover = _cover(graph, t)
        if not cover:
            continue
        assert any(cover <= _cover(graph, lo) and cap <= capacity[t] + 1e-9 for lo, cap in kept), t


def test_nested_points_keep_only_the_tightest():
    # three nested intervals: the middle point covers all of them and is tightest
    nodes = [{"cost": [0, 1], "memory": [4, 1], "live": [0, 6]},
             {"cost": [0, 1], "memory": [4, 1], "live": [1, 5]},
             {"cost": [0, 1], "memory": [4, 1], "live": [2, 4]}]
    problem = Problem.from_dict({"nodes": nodes, "edges": [], "memory_limit": 7})
    graph = compile_graph(reduce_problem(problem, dominance=False, followers=False, elimination=False)[0],
                          drop_redundant_times=False)
    rows = knapsack_rows(graph)
    assert len(rows) == 1 and len(rows[0][1]) == 3


@needs_toulbar2
@pytest.mark.parametrize("seed", range(60))
def test_wcsp_matches_brute_force(seed, make_random_problem, oracle):
    rng = np.random.default_rng(1000 + seed)
    problem = make_random_problem(rng, max_nodes=6, max_strategies=4)
    best, _ = oracle(problem)
    working, graph = _compiled(problem)
    if graph is None:
        assert not math.isfinite(best)
        return
    if graph.num_vars == 0:
        return
    result = solve_wcsp(graph, deadline=time.perf_counter() + 10)
    if not math.isfinite(best):
        assert result.values is None
        return
    assert result.values is not None, result
    choice = working.reconstruct(graph.values_to_dict(result.values))
    check = evaluate(problem, choice)
    assert check.feasible
    assert check.cost == pytest.approx(best)
    assert result.status == "optimal"
    assert result.bound <= best + 1e-9


@needs_toulbar2
def test_wcsp_from_a_start_proves_it_optimal_or_improves_it(make_random_problem, oracle):
    for seed in range(20):
        problem = make_random_problem(np.random.default_rng(500 + seed), max_nodes=6)
        best, choice = oracle(problem)
        working, graph = _compiled(problem)
        if graph is None or graph.num_vars == 0 or choice is None:
            continue
        start = np.array([0] * graph.num_vars)  # may be infeasible: then no start is given
        fits = not graph.num_times or np.all(graph.memory_profile(start) <= graph.limit)
        result = solve_wcsp(graph, deadline=time.perf_counter() + 10,
                            start=start if fits and math.isfinite(graph.cost(start)) else None)
        final = result.values if result.values is not None else start
        assert graph.cost(final) == pytest.approx(best)
        assert result.bound <= best + 1e-9


@needs_toulbar2
def test_wcsp_bound_is_valid_with_fractional_costs(oracle):
    rng = np.random.default_rng(7)
    nodes = [{"cost": (rng.random(3) * 1e-4).tolist(), "memory": rng.integers(1, 9, 3).tolist(), "live": [i, i + 3]}
             for i in range(6)]
    edges = [{"src": i, "dst": i + 1, "cost": (rng.random((3, 3)) * 1e-4).tolist()} for i in range(5)]
    problem = Problem.from_dict({"nodes": nodes, "edges": edges, "memory_limit": 18})
    best, _ = oracle(problem)
    working, graph = _compiled(problem)
    result = solve_wcsp(graph, deadline=time.perf_counter() + 10)
    assert result.values is not None
    cost = evaluate(problem, working.reconstruct(graph.values_to_dict(result.values))).cost
    assert cost == pytest.approx(best, rel=1e-9)
    assert result.bound <= best + 1e-12
    assert result.bound == pytest.approx(best, rel=1e-6)


@needs_toulbar2
def test_wcsp_stops_at_the_deadline_and_keeps_its_best():
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "shared" / "iopddl" / "asplos-2025-iopddl-V.json.gz"
    if not path.exists():
        pytest.skip("IOPDDL instances not present")
    working, graph = _compiled(load_problem(path))
    rows = wcsp_eligible(graph)
    assert rows is not None
    start = time.perf_counter()
    result = solve_wcsp(graph, deadline=start + 3.0, rows=rows)
    assert time.perf_counter() - start < 4.0
    assert result.status == "timeout"
    if result.values is not None:
        assert np.all(graph.memory_profile(result.values) <= graph.limit)


@needs_toulbar2
def test_anytime_pipeline_runs_wcsp_and_reaches_the_optimum(make_random_problem, oracle):
    from solver import solve

    ran = 0
    for seed in range(30):
        problem = make_random_problem(np.random.default_rng(900 + seed), max_nodes=7, max_strategies=4)
        best, _ = oracle(problem)
        if problem.memory_limit is None or not math.isfinite(best):
            continue
        solution = solve(problem, method="anytime", time_limit=5)
        assert solution.cost == pytest.approx(best)
        if "wcsp:toulbar2" in solution.stats["methods_run"]:
            ran += 1
            assert solution.status.value == "optimal"  # toulbar2 proved it
            if ran == 3:
                break
    assert ran == 3


@needs_toulbar2
def test_lazy_knapsacks_reach_the_brute_force_optimum(make_random_problem, oracle):
    from solver.wcsp import solve_wcsp_lazy

    proved = 0
    for seed in range(40):
        problem = make_random_problem(np.random.default_rng(2000 + seed), max_nodes=7, max_strategies=4)
        best, _ = oracle(problem)
        working, graph = _compiled(problem)
        if graph is None or graph.num_vars == 0 or not graph.num_times or not math.isfinite(best):
            continue
        start = None
        for x in np.ndindex(*graph.dom):  # any feasible start, as the pipeline's greedy gives
            x = np.array(x)
            if np.all(graph.memory_profile(x) <= graph.limit) and math.isfinite(graph.cost(x)):
                start = x
                break
        result = solve_wcsp_lazy(graph, deadline=time.perf_counter() + 6, start=start)
        final = result.values if result.values is not None else start
        assert np.all(graph.memory_profile(final) <= graph.limit)
        assert result.bound <= best + 1e-9
        if result.status == "optimal":
            proved += 1
            assert graph.cost(final) == pytest.approx(best)
        if proved == 8:
            break
    assert proved == 8


def test_wcsp_report_is_strict_json_without_a_bound():
    import json

    from solver.wcsp import WcspResult

    text = json.dumps(WcspResult(values=None, bound=-math.inf, status="timeout").to_dict(), allow_nan=False)
    assert json.loads(text)["bound"] is None
