"""solver.stages ``wcsp_first``: a short toulbar2 run before a large integer program.

It enters only for programs of at least ``WCSP_FIRST_COLUMNS`` columns whose knapsacks toulbar2
can post, never in ``method="exact"`` (no search stages there); where it runs, the solve still
reaches the brute-force optimum (the threshold lowered so that small problems take the path).
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from solver import Problem, solve
from solver import stages
from solver.budget import Budget
from solver.compiled import compile_graph
from solver.graph import WorkingGraph
from solver.stages import Incumbent, Options, View, large_program_toulbar2_first
from solver.wcsp import wcsp_available

pytestmark = pytest.mark.skipif(not wcsp_available(), reason="pytoulbar2 not installed")


def _view(problem: Problem, method: str = "auto") -> View:
    graph = compile_graph(WorkingGraph.from_problem(problem))
    options = Options("cbc", 1, 0, method, None, 1e-9)
    return View.build(graph, options, Budget(deadline=time.perf_counter() + 60), lambda *a, **k: None)


def _chain(nodes: int, strategies: int, seed: int = 0) -> Problem:
    rng = np.random.default_rng(seed)
    return Problem.from_dict({
        "nodes": [{"cost": rng.integers(0, 50, strategies).tolist()} for _ in range(nodes)],
        "edges": [{"src": i, "dst": i + 1, "cost": rng.integers(0, 50, (strategies, strategies)).tolist()}
                  for i in range(nodes - 1)]})


def test_it_enters_for_a_large_program_only_and_never_in_exact_mode(monkeypatch):
    big = _view(_chain(16, 64))  # 15 x 64 x 64 = 61,440 pair columns: over the threshold, under EXACT_MAX
    assert big.chosen == "exact" and stages.program_columns(big.graph) >= stages.WCSP_FIRST_COLUMNS
    budget = Budget(deadline=time.perf_counter() + 60)
    inc = Incumbent(None, math.inf, -math.inf)
    assert large_program_toulbar2_first(big, inc, budget)
    assert not large_program_toulbar2_first(_view(_chain(16, 64), method="exact"), inc, budget)
    small = _view(_chain(4, 4))
    assert not large_program_toulbar2_first(small, inc, budget)
    assert not large_program_toulbar2_first(big, inc, Budget(deadline=time.perf_counter() + 0.5))  # no time
    monkeypatch.setattr(stages, "WCSP_FIRST_COLUMNS", 0)
    assert large_program_toulbar2_first(small, inc, budget)


def test_solves_that_take_it_reach_the_brute_force_optimum(monkeypatch, make_random_problem, oracle):
    monkeypatch.setattr(stages, "WCSP_FIRST_COLUMNS", 0)  # every program is "large": small ones take the path
    ran = 0
    for seed in range(40):
        problem = make_random_problem(np.random.default_rng(700 + seed), max_nodes=7, max_strategies=4)
        best, _ = oracle(problem)
        if not math.isfinite(best):
            continue
        solution = solve(problem, time_limit=5)
        assert solution.cost == pytest.approx(best)
        if "wcsp-first:toulbar2" in solution.stats["methods_run"]:
            ran += 1
            if ran == 4:
                break
    assert ran == 4
