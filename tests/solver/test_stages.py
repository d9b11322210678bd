"""solver.stages: the stage list, its entry predicates, the incumbent it threads through."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from solver import Problem, solve
from solver.budget import Budget
from solver.compiled import compile_graph
from solver.graph import WorkingGraph
from solver.stages import (STAGES, Incumbent, Options, StageReport, StageResult, View, run_greedy,
                           toulbar2_can_close_gap)


def _view(problem: Problem, method: str = "auto") -> View:
    graph = compile_graph(WorkingGraph.from_problem(problem))
    options = Options("cbc", 1, 0, method, None, 1e-9)
    return View.build(graph, options, Budget(deadline=time.perf_counter() + 60), lambda *a, **k: None)


def test_stage_names_are_unique_and_in_pipeline_order():
    names = [s.name for s in STAGES]
    assert len(set(names)) == len(names)
    assert names[0] == "heuristic" and names[-1] == "lns"
    assert names.index("colgen") < names.index("restricted") < names.index("exact")


def test_incumbent_takes_a_stage_values_when_no_worse_keeps_its_own_otherwise_and_the_better_bound(hand_problem):
    problem = Problem.from_dict(hand_problem)
    view = _view(problem)
    g = view.graph
    choices = [np.array(c, dtype=np.int64) for c in np.ndindex(*(int(d) for d in g.dom))]
    choices = sorted((c for c in choices if math.isfinite(g.cost(c))), key=g.cost)
    cheap, dear = choices[0], choices[-1]
    assert g.cost(cheap) < g.cost(dear)
    inc = Incumbent(dear, g.cost(dear), bound=1.0, source="initial")
    lower = StageResult(None, 0.5, StageReport("x"))
    assert inc.absorb(lower, g).bound == 1.0 and inc.absorb(lower, g).values is dear
    after = inc.absorb(StageResult(cheap, 2.0, StageReport("y")), g)
    assert after.values is cheap and after.cost == g.cost(cheap) and after.bound == 2.0 and after.source == "y"
    # a stage that does not start from the incumbent (the greedy) can return worse values: a warm start stays
    kept = after.absorb(StageResult(dear, 0.0, StageReport("greedy")), g)
    assert kept.values is cheap and kept.source == "y" and kept.bound == 2.0
    assert Incumbent().absorb(StageResult(dear, 0.0, StageReport("greedy")), g).source == "greedy"
    assert not Incumbent().proven(1e-9)
    assert Incumbent(cheap, 3.0, 3.0 - 1e-12).proven(1e-9)


def test_greedy_stage_reports_its_peak_and_fits_the_limit(hand_problem):
    hand_problem["memory_limit"] = 8
    view = _view(Problem.from_dict(hand_problem))
    result = run_greedy(view, Incumbent(), Budget(deadline=math.inf))
    assert result.report.label == "greedy"
    assert result.best is not None and result.report.details["peak"] <= 8
    with pytest.raises(TypeError):
        result.report.details["peak"] = 0  # frozen: stats are copied out, never changed in place


def test_toulbar2_is_skipped_when_the_gap_is_already_small(hand_problem):
    view = _view(Problem.from_dict(hand_problem))
    values = np.zeros(view.graph.num_vars, dtype=np.int64)
    tight = Incumbent(values, 100.0, 99.5)
    assert not toulbar2_can_close_gap(view, tight, Budget(deadline=math.inf))


def test_heuristic_method_runs_only_the_greedy_stage(hand_problem):
    solution = solve(Problem.from_dict(hand_problem), method="heuristic", time_limit=10)
    assert solution.stats["methods_run"] == ["greedy"]


def test_stats_list_each_stage_once_with_its_time(make_random_problem):
    rng = np.random.default_rng(3)
    for _ in range(10):
        solution = solve(make_random_problem(rng), time_limit=10)
        runs = solution.stats["methods_run"]
        assert len(runs) == len(set(runs))
        assert set(solution.stats.get("stage_seconds", {})) == set(runs)
        assert solution.stats["compile_seconds"] >= 0.0


def test_proven_incumbent_stops_the_stage_list():
    # no memory and a chain: the exact program proves it at once, no search stage follows
    p = Problem.from_dict({"nodes": [{"cost": [1, 2]}, {"cost": [3, 0]}, {"cost": [2, 2]}],
                           "edges": [{"src": 0, "dst": 1, "cost": [[0, 5], [5, 0]]}]})
    solution = solve(p, time_limit=10, method="exact")
    assert solution.status.value == "optimal"
    assert not any(r.startswith(("lns", "lagrangian", "wcsp")) for r in solution.stats["methods_run"])


def test_lagrangian_rounds_run_before_a_program_whose_memory_no_plan_priced(hand_problem):
    """``lagrangian_first`` enters where the exact stage would solve a memory-bound program without an
    elimination plan's prices, and its bound and values are valid against brute force."""
    from dataclasses import replace

    from solver.stages import program_with_memory_unpriced, run_lagrangian_first

    hand_problem["memory_limit"] = 8
    view = replace(_view(Problem.from_dict(hand_problem)), plan=None)
    g = view.graph
    assert view.chosen == "exact" and g.num_times
    start = run_greedy(view, Incumbent(), Budget(deadline=math.inf)).best
    inc = Incumbent(start, g.cost(start), source="greedy")
    budget = Budget(deadline=time.perf_counter() + 10)
    assert program_with_memory_unpriced(view, inc, budget)
    assert not program_with_memory_unpriced(replace(view, chosen="anytime"), inc, budget)
    assert not program_with_memory_unpriced(view, Incumbent(), budget)
    result = run_lagrangian_first(view, inc, budget)
    feasible = [np.array(c, dtype=np.int64) for c in np.ndindex(*(int(d) for d in g.dom))]
    feasible = [c for c in feasible if math.isfinite(g.cost(c)) and (g.memory_profile(c) <= g.limit + 1e-9).all()]
    best = min(g.cost(c) for c in feasible)
    assert result.report.label.startswith("lagrangian-first:")
    assert result.bound <= best + 1e-9 <= g.cost(result.best) + 2e-9
    assert (g.memory_profile(result.best) <= g.limit + 1e-9).all()
