"""Warm start (``solve(initial=...)``): a feasible choice given to the solver is
taken as the first incumbent (or completed where reductions removed its values),
and the answer is never worse than it; an infeasible one is ignored."""

from __future__ import annotations

import numpy as np
import pytest

from solver import solve
from solver.evaluate import evaluate


@pytest.mark.parametrize("seed", range(12))
def test_a_feasible_initial_choice_is_never_beaten_by_the_answer(seed, oracle, make_random_problem):
    rng = np.random.default_rng(seed)
    best_choice = None
    while best_choice is None:  # a feasible random problem
        problem = make_random_problem(rng, max_nodes=5, max_strategies=3)
        best, best_choice = oracle(problem)
    # a feasible start that is not the optimum where one exists: the worst feasible choice found
    import itertools
    starts = [c for c in itertools.product(*(range(n.num_strategies) for n in problem.nodes))
              if np.isfinite(evaluate(problem, c).cost) and evaluate(problem, c).feasible]
    start = max(starts, key=lambda c: evaluate(problem, c).cost)
    sol = solve(problem, time_limit=10, initial=list(start))
    assert sol.stats["initial"] in {"used", "completed"}
    assert sol.cost <= evaluate(problem, start).cost + 1e-9
    assert sol.cost == pytest.approx(best)


def test_an_infeasible_initial_choice_is_ignored(oracle, make_random_problem):
    rng = np.random.default_rng(3)
    for _ in range(50):
        problem = make_random_problem(rng, max_nodes=5, max_strategies=3, forbidden=0.4)
        best, best_choice = oracle(problem)
        bad = [next((k for k, c in enumerate(n.cost) if not np.isfinite(c)), None) for n in problem.nodes]
        if best_choice is not None and any(b is not None for b in bad):
            break
    start = [b if b is not None else 0 for b in bad]
    sol = solve(problem, time_limit=10, initial=start)
    assert sol.stats.get("initial") in {None, "infeasible"}
    assert sol.cost == pytest.approx(best)
