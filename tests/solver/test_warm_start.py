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



def test_a_warm_start_survives_the_greedy_stage_into_the_later_stages(oracle, make_random_problem, monkeypatch):
    """The greedy stage does not start from the incumbent: an optimal warm start is what the later
    stages get (once it was replaced by the greedy's values whatever their cost)."""
    import solver.stages as stages

    after_greedy: list[tuple[float, float, str]] = []
    real_absorb = stages.Incumbent.absorb

    def absorb(self, result, graph):
        after = real_absorb(self, result, graph)
        if result.report.label == "greedy":
            after_greedy.append((self.cost, after.cost, after.source))
        return after

    monkeypatch.setattr(stages.Incumbent, "absorb", absorb)
    checked = 0
    for seed in range(40):
        problem = make_random_problem(np.random.default_rng(seed), max_nodes=6, max_strategies=3)
        best, best_choice = oracle(problem)
        if best_choice is None:
            continue
        after_greedy.clear()
        sol = solve(problem, time_limit=10, initial=list(best_choice))
        assert sol.cost == pytest.approx(best)
        for before, after, source in after_greedy:
            assert after <= before + 1e-12
            checked += source == "initial"
    assert checked  # some greedy ran after a warm start and returned worse values, which were not taken
