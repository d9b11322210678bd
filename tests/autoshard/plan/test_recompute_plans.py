"""Recomputation in plans: the policies users run, the solver's own choice under a
memory limit, the plan's ``recompute`` list, ``explain``'s summary."""

from __future__ import annotations

import pytest

from autoshard.graph.states import RECOMPUTE
from autoshard.plan.explain import explain_text
from autoshard.plan.format import Plan
from autoshard.search.solve import compare_baselines, prepare, solve_prepared
from examples.models import llama3

LAYERS = 4


@pytest.fixture(scope="module")
def prep():
    model, inputs = llama3.tiny(device="meta", n_layers=LAYERS, batch_size=32, seq_len=64)
    return prepare(model, inputs, (1,), profile="cpu-gloo")


@pytest.fixture(scope="module")
def plans(prep):
    return {policy: solve_prepared(prep, memory_limit=1e30, time_limit=20, recompute=policy)
            for policy in ("none", "full", "selective", "every:2")}


def _recomputable(prep) -> set[str]:
    return {n.name for n in prep.graph.nodes if n.kind == "op" and RECOMPUTE in n.states}


def _region(prep, name: str) -> str:
    node = prep.graph.nodes[prep.graph.index[name]]
    return prep.graph.regions[node.region].name


def test_regions_are_the_layers(prep) -> None:
    assert [r.name for r in prep.graph.regions] == [f"layers.{i}" for i in range(LAYERS)]


def test_none_recomputes_nothing_and_full_every_op_that_can_be(prep, plans) -> None:
    assert plans["none"].recompute == () and plans["none"].estimate.recompute_s == 0
    assert plans["none"].estimate.peak_without_recompute_bytes is None
    assert set(plans["full"].recompute) == _recomputable(prep)
    full = plans["full"].estimate
    assert full.recompute_s > 0 and full.peak_memory_bytes < full.peak_without_recompute_bytes
    assert full.peak_without_recompute_bytes == pytest.approx(plans["none"].estimate.peak_memory_bytes)
    assert full.step_s == pytest.approx(plans["none"].estimate.step_s + full.recompute_s, rel=1e-9)


def test_selective_saves_every_other_matmul_and_attention(prep, plans) -> None:
    recomputed = set(plans["selective"].recompute)
    for region in prep.graph.regions:
        mms = [m for m in region.members if prep.traced.nodes[m].op.__name__.startswith("mm")]
        assert len(mms) == 7  # wq, wk, wv, wo, w1, w3, w2
        # the 1st, 3rd, ... are saved; of the others those the backward needs are recomputed
        assert not any(mm in recomputed for mm in mms[0::2])
        assert all(mm in recomputed for mm in mms[1::2] if mm in _recomputable(prep))
        assert not any("scaled_dot_product" in str(prep.traced.nodes[m].op) for m in recomputed & set(region.members))
    assert plans["full"].estimate.peak_memory_bytes <= plans["selective"].estimate.peak_memory_bytes
    assert plans["selective"].estimate.peak_memory_bytes < plans["none"].estimate.peak_memory_bytes


def test_every_second_block_recomputes_blocks_two_and_four_fully(prep, plans) -> None:
    recomputed = set(plans["every:2"].recompute)
    assert {_region(prep, n) for n in recomputed} == {"layers.1", "layers.3"}
    full = set(plans["full"].recompute)
    assert recomputed == {n for n in full if _region(prep, n) in ("layers.1", "layers.3")}


def test_the_solver_recomputes_only_under_memory_pressure_and_beats_the_policies(prep, plans) -> None:
    free = solve_prepared(prep, memory_limit=1e30, time_limit=20)
    assert free.recompute == () and free.estimate.step_s == pytest.approx(plans["none"].estimate.step_s)
    low, high = plans["full"].estimate.peak_memory_bytes, plans["none"].estimate.peak_memory_bytes
    limit = low + 0.5 * (high - low)
    tight = solve_prepared(prep, memory_limit=limit, time_limit=30)
    assert tight.estimate.fits and tight.recompute
    # what it recomputes costs less than recomputing everything, and it fits where keeping everything does not
    assert tight.estimate.step_s < plans["full"].estimate.step_s
    for policy in ("selective", "every:2"):
        if plans[policy].estimate.peak_memory_bytes <= limit:
            assert tight.estimate.step_s <= plans[policy].estimate.step_s * (1 + 1e-6)


def test_a_plan_that_recomputes_round_trips_and_explains_itself(tmp_path, plans) -> None:
    plan = plans["selective"]
    path = tmp_path / "plan.json"
    plan.save(path)
    loaded = Plan.load(path)
    assert loaded.recompute == plan.recompute and loaded.estimate == plan.estimate
    assert {n.region for n in loaded.nodes if n.name in plan.recompute} == {f"layers.{i}" for i in range(LAYERS)}
    text = explain_text(loaded)
    assert f"recomputation (policy selective): {len(plan.recompute)} ops in {LAYERS} blocks" in text
    assert f"layers.0 ... layers.{LAYERS - 1} ({LAYERS})" in text  # one row for the identical blocks
    assert len(text.splitlines()) < 120


def test_baselines_are_priced_with_every_policy(prep) -> None:
    rows = compare_baselines(prep, time_limit=20)
    policies = {(r.name, r.recompute) for r in rows if r.plan is not None}
    for name in ("ddp", "fsdp"):
        assert {(name, p) for p in ("none", "selective", "every:2", "full")} <= policies
    by = {(r.name, r.recompute): r.plan for r in rows if r.plan is not None}
    assert by["ddp", "full"].estimate.peak_memory_bytes < by["ddp", "none"].estimate.peak_memory_bytes
    assert by["ddp", "full"].options["recompute"] == "full"


def test_warm_start_falls_back_to_a_policy_when_keeping_everything_does_not_fit(prep, plans) -> None:
    from autoshard.graph.problem import to_problem
    from autoshard.search.solve import _solve_local

    low, high = plans["full"].estimate.peak_memory_bytes, plans["none"].estimate.peak_memory_bytes
    limit = low + 0.5 * (high - low)

    def under(policy: str, memory_limit):
        return to_problem(prep.graph, memory_limit=memory_limit, recompute=policy)

    answer = _solve_local(prep.graph, under("auto", limit), "auto", 20.0, "cbc", lambda event: None, under, limit)
    solution = answer.solution
    tried = solution.stats["warm_start"]
    assert tried["none"]["cost"] is None  # keeping everything does not fit
    fitted = [tried[p]["cost"] for p in ("selective", "full") if tried[p]["cost"] is not None]
    assert fitted  # a fixed policy fits and starts the search, which ends no worse than the best of them
    assert solution.choice and solution.cost <= min(fitted) * (1 + 1e-9)
