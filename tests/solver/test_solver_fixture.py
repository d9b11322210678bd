"""The hand-worked 5-node problem (conftest.py) and one-field variants, on every backend."""

from __future__ import annotations

import pytest

from solver import Problem, Status, evaluate, solve


@pytest.mark.parametrize("method", ["exact", "auto"])
def test_unconstrained_optimum_is_the_hand_computed_one(hand_problem, backend, method):
    s = solve(Problem.from_dict(hand_problem), backend=backend, method=method, time_limit=30)
    assert s.status is Status.OPTIMAL
    assert s.choice == (1, 1, 1, 1, 1)
    assert s.cost == 4
    assert s.lower_bound == 4
    assert s.peak_memory_bytes == 9


def test_memory_limit_forces_the_expensive_layout(hand_problem, backend):
    hand_problem["memory_limit"] = 8
    s = solve(Problem.from_dict(hand_problem), backend=backend, time_limit=30)
    assert (s.status, s.choice, s.cost, s.peak_memory_bytes) == (Status.OPTIMAL, (0, 0, 0, 0, 0), 9, 5)


def test_infeasible_limit_reports_the_smallest_peak(hand_problem, backend):
    hand_problem["memory_limit"] = 4
    s = solve(Problem.from_dict(hand_problem), backend=backend, time_limit=30)
    assert s.status is Status.INFEASIBLE
    assert s.choice == ()
    assert "5" in s.message


def test_pin_is_honoured(hand_problem, backend):
    hand_problem["pins"] = {"4": 0}
    s = solve(Problem.from_dict(hand_problem), backend=backend, time_limit=30)
    assert s.choice[4] == 0 and s.cost == 9


def test_forbidden_pair_is_avoided(hand_problem, backend):
    hand_problem["edges"][3]["cost"][1][1] = None
    s = solve(Problem.from_dict(hand_problem), backend=backend, time_limit=30)
    assert (s.choice[3], s.choice[4]) != (1, 1)
    assert s.cost == 9


def test_tie_forces_equal_strategies(hand_problem, backend):
    hand_problem["ties"] = [[1, 3]]
    hand_problem["memory_limit"] = 8
    s = solve(Problem.from_dict(hand_problem), backend=backend, time_limit=30)
    assert s.choice[1] == s.choice[3]
    assert s.cost == 9


def test_reported_cost_matches_independent_evaluation(hand_problem, backend):
    hand_problem["memory_limit"] = 8
    p = Problem.from_dict(hand_problem)
    s = solve(p, backend=backend, time_limit=30)
    ev = evaluate(p, s.choice)
    assert ev.feasible and ev.cost == s.cost and ev.peak_memory_bytes == s.peak_memory_bytes


def test_heuristic_never_beats_the_optimum(hand_problem):
    hand_problem["memory_limit"] = 8
    p = Problem.from_dict(hand_problem)
    h = solve(p, method="heuristic", time_limit=30)
    assert h.cost >= 9 and evaluate(p, h.choice).feasible
