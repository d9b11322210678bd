"""The independent evaluator (solver.evaluate) against the hand-worked fixture and a
time-step-by-time-step recount of memory."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from solver.evaluate import evaluate, peak_memory
from solver.problem import Problem


def test_hand_problem_costs_and_peaks(hand_problem):
    problem = Problem.from_dict(hand_problem)
    best = evaluate(problem, (1, 1, 1, 1, 1))
    assert (best.cost, best.node_cost, best.edge_cost) == (4.0, 4.0, 0.0)
    assert best.peak_memory_bytes == 9.0 and best.feasible
    zeros = evaluate(problem, (0, 0, 0, 0, 0))
    assert (zeros.cost, zeros.peak_memory_bytes) == (9.0, 5.0)


def test_violations_name_what_is_broken(hand_problem):
    hand_problem["memory_limit"] = 8
    hand_problem["pins"] = {"0": 0}
    hand_problem["nodes"][4]["cost"] = [5, None]
    problem = Problem.from_dict(hand_problem)
    e = evaluate(problem, (1, 1, 1, 1, 1))
    assert not e.feasible and e.forbidden == 1 and math.isinf(e.cost)
    text = " | ".join(e.violations)
    assert "forbidden strategy" in text and "pinned to 0" in text and "exceeds limit 8" in text
    with pytest.raises(ValueError, match="5 nodes"):
        evaluate(problem, (0, 0))
    with pytest.raises(ValueError, match=r"choice\[1\]"):
        evaluate(problem, (0, 7, 0, 0, 0))


def test_peak_is_the_maximum_over_every_time_step(make_random_problem):
    rng = np.random.default_rng(91)
    for _ in range(60):
        problem = make_random_problem(rng)
        for choice in itertools.islice(itertools.product(*(range(n.num_strategies) for n in problem.nodes)), 20):
            horizon = max([n.live[1] for n in problem.nodes if n.live is not None] + [1])
            steps = []
            for t in range(horizon + 1):
                steps.append(sum(float(n.memory_bytes[c]) for n, c in zip(problem.nodes, choice)
                                 if n.live is None or n.live[0] <= t < n.live[1]))
            peak, at = peak_memory(problem, choice)
            assert peak == max(steps)
            if at is not None:
                assert steps[at] == peak


def test_ties_must_agree(hand_problem):
    hand_problem["ties"] = [[0, 2]]
    problem = Problem.from_dict(hand_problem)
    assert evaluate(problem, (1, 1, 1, 1, 1)).feasible
    assert any("ties[0]" in v for v in evaluate(problem, (0, 1, 1, 1, 1)).violations)
