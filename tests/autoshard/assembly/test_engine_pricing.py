"""autoshard.assembly.engine_pricing: a solved fsdp+tp plan of two 405B blocks repriced with
float8 linears and async TP (one solve, ~5 s)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from autoshard.assembly.engine_pricing import reprice, repriced_plan
from autoshard.plan.options import EngineOptions, refuse_engine_options

LINEARS_PER_BLOCK = 7  # wq, wk, wv, wo, w1, w2, w3
LAYERS = 2


@pytest.fixture(scope="module")
def solved():
    from examples.models import llama3

    from autoshard.search.solve import prepare, solve_prepared

    model, inputs = llama3.llama3_405b(n_layers=LAYERS, batch_size=8, seq_len=8192, dtype="bfloat16", device="meta")
    prep = prepare(model, inputs, (8, 8), ("dp", "tp"), profile="h100-sxm-96gb-500w", mixed_precision=True,
                   gather="fsdp2", reduce_dtype="float32")
    plan = solve_prepared(prep, baseline="fsdp+tp", recompute="full", memory_limit=math.inf, time_limit=30)
    return prep.graph, plan


def test_no_option_keeps_the_plans_own_step(solved):
    graph, plan = solved
    step = reprice(graph, plan, EngineOptions())
    assert step.step_s == plan.estimate.step_s
    assert step.recompute_s == plan.estimate.recompute_s
    assert step.float8_matmuls == 0 and step.fused_collectives == 0


def test_float8_prices_the_three_matmuls_of_every_block_linear_and_not_the_output_layer(solved):
    graph, plan = solved
    step = reprice(graph, plan, EngineOptions(float8_linears=True))
    assert step.float8_matmuls == 3 * LINEARS_PER_BLOCK * LAYERS
    mms = sum(graph.nodes[graph.index[n.name]].target == "aten.mm.default" for n in plan.nodes)
    assert mms == step.float8_matmuls + 3  # the output layer's forward, input- and weight-gradient stay bf16
    assert step.step_s < plan.estimate.step_s
    assert step.recompute_s < plan.estimate.recompute_s  # the recomputed forward's matmuls are float8 too


def test_float8_all_gather_shortens_the_weight_gathers(solved):
    graph, plan = solved
    fp8 = reprice(graph, plan, EngineOptions(float8_linears=True))
    gathered = reprice(graph, plan, EngineOptions(float8_linears=True, float8_all_gather=True))
    assert gathered.step_s < fp8.step_s


def test_async_tp_fuses_tp_collectives_into_their_matmuls(solved):
    graph, plan = solved
    base = reprice(graph, plan, EngineOptions())
    fused = reprice(graph, plan, EngineOptions(async_tp=True))
    assert fused.fused_collectives >= LAYERS  # at least one per block
    assert fused.step_s <= base.step_s
    changed = [p for p, (a, b) in enumerate(zip(base.op_compute_s, fused.op_compute_s)) if a != b]
    assert 0 < len(changed) <= fused.fused_collectives
    # the collective is inside the op now: hidden under the chunks (the matmul's time) or past them
    assert all(fused.op_compute_s[p] >= base.op_compute_s[p] * (1 - 1e-12) for p in changed)
    assert any(fused.op_compute_s[p] > base.op_compute_s[p] * 1.01 for p in changed)


def test_a_repriced_plan_records_its_options_and_the_runtime_check_refuses_it(solved):
    graph, plan = solved
    out = repriced_plan(graph, plan, EngineOptions(float8_linears=True, async_tp=True))
    assert out.options["engine"] == {"float8_linears": True, "float8_all_gather": False, "async_tp": True}
    assert out.estimate.step_s < plan.estimate.step_s
    with pytest.raises(ValueError, match="priced with float8_linears, async_tp"):
        refuse_engine_options(out.options)
    refuse_engine_options(plan.options)  # the plan as solved runs


def test_a_plan_without_a_schedule_is_refused_by_name(solved):
    graph, plan = solved
    with pytest.raises(ValueError, match="plan: has no schedule"):
        reprice(graph, replace(plan, schedule=None), EngineOptions(async_tp=True))
