"""Random small problems: every backend finds the brute-force optimum.

Both through ``solve`` (reductions, then the program) and through the exact
program alone on the unreduced graph, so the formulation itself is checked
even where reductions leave nothing to solve.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from solver import Status, evaluate, solve
from solver.compiled import compile_graph
from solver.exact import solve_exact
from solver.reductions import InfeasibleError, reduce_problem


def test_solve_matches_brute_force_on_random_problems(backend, make_random_problem, oracle):
    rng = np.random.default_rng(1234 if backend == "cbc" else 4321)
    checked = 0
    for _ in range(200):
        problem = make_random_problem(rng)
        best, _ = oracle(problem)
        s = solve(problem, backend=backend, method="exact", time_limit=30, threads=1)
        if math.isinf(best):
            assert s.status is Status.INFEASIBLE, (problem.to_dict(), s)
            continue
        assert s.status is Status.OPTIMAL, (problem.to_dict(), s)
        assert s.cost == pytest.approx(best), problem.to_dict()
        assert evaluate(problem, s.choice).feasible
        checked += 1
    assert checked > 100


def test_program_alone_matches_brute_force(backend, make_random_problem, oracle):
    rng = np.random.default_rng(99)
    for _ in range(100):
        problem = make_random_problem(rng, ties=False, pins=False)
        best, _ = oracle(problem)
        try:
            working, _ = reduce_problem(problem, dominance=False, followers=False, elimination=False)
        except InfeasibleError:
            assert math.isinf(best)
            continue
        graph = compile_graph(working, drop_redundant_times=False)
        result = solve_exact(graph, backend, deadline=time.perf_counter() + 30, threads=1)
        if math.isinf(best):
            assert result.status == "infeasible", problem.to_dict()
            continue
        assert result.status == "optimal", (problem.to_dict(), result.log)
        choice = working.reconstruct(graph.values_to_dict(result.values))
        assert evaluate(problem, choice).cost == pytest.approx(best)
        assert result.bound == pytest.approx(best)


def test_heuristic_is_feasible_and_never_below_optimum(make_random_problem, oracle):
    rng = np.random.default_rng(7)
    for _ in range(80):
        problem = make_random_problem(rng)
        best, _ = oracle(problem)
        s = solve(problem, method="heuristic", time_limit=10)
        if s.choice:
            ev = evaluate(problem, s.choice)
            assert ev.feasible and ev.cost >= best - 1e-9

