"""``recompute="auto"`` is never worse than the best fixed policy that fits
(``autoshard.search.recompute_search``): recomputation leaves the problem when it
cannot pay, and a search that ends worse than its start is not returned."""

from __future__ import annotations

import pytest
from solver import solve as solve_problem
from solver.evaluate import evaluate
from solver.solution import Status

from autoshard.graph.problem import to_problem
from autoshard.search import recompute_search
from autoshard.search.solve import InfeasibleMemoryError, prepare, solve_prepared
from examples.models import llama3

FIXED = ("none", "selective", "full")


@pytest.fixture(scope="module")
def prep():
    # activations dominate the peak at this batch, so a limit can make recomputation pay
    model, inputs = llama3.tiny(device="meta", n_layers=2, batch_size=32, seq_len=64)
    return prepare(model, inputs, (2,), ("dp",), profile="cpu-gloo")


@pytest.fixture(scope="module")
def fixed(prep):
    return {policy: solve_prepared(prep, memory_limit=1e30, time_limit=120, recompute=policy) for policy in FIXED}


def _tight(fixed) -> float:
    low, high = fixed["full"].estimate.peak_memory_bytes, fixed["none"].estimate.peak_memory_bytes
    assert low < high  # the fixture's premise: recomputation saves memory here
    return low + 0.5 * (high - low)


def _under(prep):
    return lambda policy, limit: to_problem(prep.graph, memory_limit=limit, recompute=policy)


def test_without_memory_pressure_recomputation_is_not_in_the_problem(prep, fixed) -> None:
    under = _under(prep)
    limit = 2.0 * fixed["none"].estimate.peak_memory_bytes
    answer = recompute_search.solve_auto(under("auto", limit), under, limit, 120.0, "cbc", 1e-4)
    assert answer.policy == "none" and answer.solution.stats["recompute_pruned"]
    # the problem handed back forbids every recomputation state: it is the "none" problem
    none_problem = under("none", limit)
    assert [list(n.cost) for n in answer.problem.nodes] == [list(n.cost) for n in none_problem.nodes]
    plan = solve_prepared(prep, memory_limit=limit, time_limit=120)
    assert plan.recompute == () and plan.estimate.step_s == pytest.approx(fixed["none"].estimate.step_s, rel=1e-9)


def test_a_search_that_ends_worse_than_its_start_is_not_returned(prep, fixed) -> None:
    under = _under(prep)
    limit = _tight(fixed)
    auto_problem = under("auto", limit)
    # ground truth: the fixed policies solved on their own; the cheapest that fits
    costs = {}
    for policy in FIXED:
        found = solve_problem(under(policy, limit), backend="cbc", time_limit=120, gap=1e-4)
        if found.choice:
            costs[policy] = evaluate(auto_problem, found.choice).cost
    assert costs and "none" not in costs  # keeping everything does not fit the limit
    real = solve_problem

    def worse_search(problem, **kwargs):  # the search over every state runs out of time on a poor choice
        found = real(problem, **kwargs)
        if problem is not auto_problem:
            return found
        poor = real(under("full", limit), backend="cbc", time_limit=1.0, gap=1.0)  # any fitting choice
        return type(found)(choice=poor.choice, cost=float(evaluate(auto_problem, poor.choice).cost) * 2 + 1.0,
                           lower_bound=found.lower_bound, status=Status.TIMEOUT, seconds=found.seconds,
                           backend=found.backend)

    answer = recompute_search.solve_auto(auto_problem, under, limit, 120.0, "cbc", 1e-4, solve=worse_search)
    assert answer.solution.stats.get("kept_fixed_policy")
    assert answer.solution.status is Status.TIMEOUT  # unproven, as the search it replaces
    assert evaluate(auto_problem, answer.solution.choice).feasible
    assert evaluate(auto_problem, answer.solution.choice).cost == pytest.approx(min(costs.values()), rel=1e-4)


@pytest.mark.parametrize("tight", [False, True], ids=["default-limit", "tight-limit"])
def test_auto_plan_is_no_worse_than_the_best_fixed_policy_that_fits(prep, fixed, tight) -> None:
    kwargs = {"memory_limit": _tight(fixed)} if tight else {}
    plans = dict(fixed)
    if tight:
        plans = {}
        for policy in FIXED:
            try:
                plans[policy] = solve_prepared(prep, time_limit=120, recompute=policy, **kwargs)
            except InfeasibleMemoryError:  # this policy does not fit the limit
                pass
    proven = [p for p in plans.values() if p.estimate.fits and p.solver.status == "optimal"]
    assert proven
    auto = solve_prepared(prep, time_limit=120, **kwargs)
    assert auto.estimate.fits
    assert auto.estimate.step_s <= min(p.estimate.step_s for p in proven) * (1 + 1e-6)


def test_tiny_hf_mistral_auto_is_the_plan_without_recomputation() -> None:
    pytest.importorskip("transformers")
    from examples.models import hf

    model, inputs = hf.hf_mistral()
    prep = prepare(model, inputs, (2, 2), ("dp", "tp"), profile="cpu-gloo")
    none = solve_prepared(prep, recompute="none", time_limit=120)
    auto = solve_prepared(prep, time_limit=120)
    assert auto.recompute == ()
    assert auto.estimate.step_s <= none.estimate.step_s * (1 + 1e-6)
