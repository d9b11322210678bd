"""A plan's tensors replayed through the caching allocator (autoshard.program.reservation): the
optimizer's lazy state, FSDP2's delayed gradients, and ``estimate.reserved_bytes`` on plans."""

from __future__ import annotations

import pytest

from autoshard.program.reservation import replay_spans

MiB = 2**20


def test_state_made_at_the_first_update_strands_the_activations_block():
    # a 10 MiB parameter, a 100 MiB activation over [0, 2), the update at 2 making 60 MiB of state
    spans = [(None, None, 70 * MiB, ("node", 0), "param"), (0, 2, 100 * MiB, ("node", 1), "op")]
    lazy = {("node", 0): (10 * MiB, (30 * MiB, 30 * MiB))}
    one = replay_spans(spans, lazy, optimizer_time=2, steps=1)
    assert one.reserved_bytes == 110 * MiB  # step 1: the state fits the activation's freed block
    two = replay_spans(spans, lazy, optimizer_time=2)
    # step 2: the state splits that block, so the activation needs a segment of its own
    assert two.reserved_bytes == 210 * MiB and two.allocated_bytes == 170 * MiB
    # the same tensors with the state made up front (no split): nothing stranded
    assert replay_spans(spans, {}, optimizer_time=2).reserved_bytes == 170 * MiB
    # expandable segments: the free tail is extended instead (granules of 20 MiB), so only the
    # activation's missing 50 MiB (three granules) are mapped again
    assert replay_spans(spans, lazy, optimizer_time=2, expandable_segments=True).reserved_bytes == 180 * MiB


def test_a_negative_prefix_makes_the_tensor_later_and_streams_keep_their_blocks():
    # a 40 MiB gradient sink over [1, 6) whose first part [1, 4) waits for its reduction
    spans = [(1, 6, 40 * MiB, ("node", 3), "grad"), (1, 4, -40 * MiB, ("node", 3), "grad"),
             (2, 4, 40 * MiB, ("node", 4), "op")]
    same = replay_spans(spans, {}, optimizer_time=5)
    assert same.allocated_bytes == 40 * MiB and same.reserved_bytes == 40 * MiB  # made at 4, after the op's free
    apart = replay_spans(spans, {}, optimizer_time=5, streams={"grad": "reduce_scatter"})
    assert apart.reserved_bytes == 80 * MiB  # the sink's stream cannot take the op's block


def test_the_update_allocates_after_the_last_gradients_take_their_blocks_back():
    # the last op's output [3, 4) becomes the gradient's sink at 4 (AccumulateGrad keeps it); the
    # update at 4 makes a smaller state, which must not split the sink's block (the sink would then
    # need a segment of its own: 110 MiB)
    spans = [(None, None, 50 * MiB, ("node", 0), "param"), (3, 4, 30 * MiB, ("node", 1), "op"),
             (4, 5, 30 * MiB, ("node", 2), "grad"), (4, 5, 20 * MiB, ("node", 5), "opt_temp")]
    lazy = {("node", 0): (30 * MiB, (20 * MiB,))}
    peaks = replay_spans(spans, lazy, optimizer_time=4, steps=1)
    assert peaks.allocated_bytes == 100 * MiB and peaks.reserved_bytes == 100 * MiB


@pytest.fixture(scope="module")
def mlp_plans():
    from autoshard.search.solve import prepare, solve_prepared
    from examples.models import mlp

    model, inputs = mlp.tiny(device="meta")
    out = {}
    for profile in ("h100-sxm-80gb", "cpu-gloo"):
        prep = prepare(model, inputs, (2,), ("dp",), profile=profile, recompute="none", device_type="cpu")
        out[profile] = solve_prepared(prep, time_limit=10)
    prep = prepare(model, inputs, (2,), ("dp",), profile="h100-sxm-80gb", recompute="none", device_type="cpu")
    out["expandable"] = solve_prepared(prep, time_limit=10, expandable_segments=True)
    return out


def test_gpu_plans_carry_the_allocators_reservation_and_cpu_plans_none(mlp_plans):
    from autoshard.plan.format import Estimate

    gpu = mlp_plans["h100-sxm-80gb"].estimate
    assert gpu.reserved_bytes is not None and gpu.reserved_bytes >= gpu.peak_memory_bytes
    assert mlp_plans["cpu-gloo"].estimate.reserved_bytes is None
    assert "reserved_bytes" not in mlp_plans["cpu-gloo"].estimate.to_dict()
    assert Estimate.from_dict(gpu.to_dict()) == gpu
    assert mlp_plans["expandable"].options["expandable_segments"] is True
    assert "expandable_segments" not in mlp_plans["h100-sxm-80gb"].options
    assert mlp_plans["expandable"].estimate.reserved_bytes >= mlp_plans["expandable"].estimate.peak_memory_bytes


def test_a_plan_with_its_reservation_passes_the_plan_schema(mlp_plans):
    import jsonschema

    from autoshard.plan.format import Plan
    from autoshard.plan.schema import PLAN_SCHEMA

    data = mlp_plans["h100-sxm-80gb"].to_dict()
    jsonschema.Draft202012Validator(PLAN_SCHEMA).validate(data)
    assert Plan.from_dict(data).estimate.reserved_bytes == mlp_plans["h100-sxm-80gb"].estimate.reserved_bytes


def test_a_kept_gradient_continues_its_producers_block():
    # the weight gradient's mm output [2, 3) becomes .grad at 3 (AccumulateGrad keeps it); an op
    # allocating at 3 must not take that block
    spans = [(2, 3, 30 * MiB, ("node", 1), "op"), (3, 6, 30 * MiB, ("node", 2), "grad"),
             (3, 4, 30 * MiB, ("node", 3), "op")]
    assert replay_spans(spans, {}, optimizer_time=5, steps=1).reserved_bytes == 60 * MiB
    kept = replay_spans(spans, {}, optimizer_time=5, steps=1, kept={("node", 2): ("node", 1)})
    assert kept.reserved_bytes == 60 * MiB and kept.allocated_bytes == 60 * MiB
    # a sink of another size is a copy (another placement): not kept
    other = [(2, 3, 30 * MiB, ("node", 1), "op"), (3, 6, 20 * MiB, ("node", 2), "grad")]
    assert replay_spans(other, {}, optimizer_time=5, steps=1, kept={("node", 2): ("node", 1)}).reserved_bytes \
        == 30 * MiB


def test_flash_attentions_backward_holds_an_fp32_query_sized_workspace():
    from types import SimpleNamespace as NS

    from costmodel.mesh import MeshSpec
    from costmodel.placements import parse_placements as pp

    from autoshard.program.reservation import kernel_workspaces

    flash = "aten._scaled_dot_product_flash_attention_backward.default"
    strategy = NS(input_placements=(pp("S(0)"), pp("S(0)")))
    graph = NS(mesh=MeshSpec((2,)),
               nodes=[NS(kind="op", target="aten.mm.default", strategies=[strategy]),
                      NS(kind="op", target=flash, strategies=[strategy])],
               edges=[NS(dst=1, dst_input=0, shape=(4, 8, 128, 64)), NS(dst=1, dst_input=1, shape=(4, 8, 128, 64)),
                      NS(dst=0, dst_input=0, shape=(4, 8, 128, 64))])
    problem = NS(nodes=[NS(live=(3, 5)), NS(live=(7, 9))])
    (span,) = kernel_workspaces(graph, problem, [0, 0])
    # over the kernel's own step; fp32, the local (batch-split) query's elements
    assert span == (7, 8, float(2 * 8 * 128 * 64 * 4), ("workspace", 1), "workspace")


def test_gpu_plans_of_a_cuda_trace_replay_flash_attention():
    from autoshard.search.solve import prepare, solve_prepared
    from examples.models import llama3

    model, inputs = llama3.tiny(device="meta", dtype="bfloat16", batch_size=2)
    prep = prepare(model, inputs, (1,), ("dp",), profile="h100-sxm-80gb", recompute="none", device_type="cuda")
    assert any(n.target == "aten._scaled_dot_product_flash_attention_backward.default" for n in prep.graph.nodes)
    plan = solve_prepared(prep, time_limit=10)
    assert plan.estimate.reserved_bytes >= plan.estimate.peak_memory_bytes
