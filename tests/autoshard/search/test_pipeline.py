"""Pipeline search (autoshard.search.pipeline, pipeline_blocks) on a small LLaMA and on hand-built costs."""

from __future__ import annotations

import math

import pytest

from costmodel.pipeline_schedules import build_schedule
from costmodel.pipeline_simulate import simulate_pipeline
from costmodel.stage_cuts import BlockCost
from examples.models import llama3
from hw_profiles import load as load_profile

from autoshard.search.pipeline import (
    PipelineLayout, best_plan, microbatch_counts, pipeline_layouts, price_pipeline, search_pipeline,
)
from autoshard.search.pipeline_blocks import BlockPricing, plan_figures, price_blocks

PROFILE = "h100-sxm-80gb"
LLAMA = {"n_layers": 2, "batch_size": 8, "seq_len": 16}
N_BLOCKS = 6
NOTHING = BlockCost(0.0, 0.0, 0, 0)


def _pricing(block: BlockCost, micro_batch: int = 1, **changes: float) -> BlockPricing:
    fields = dict(block_reduction_s=0.0, block_optimizer_s=0.0, first_extra=NOTHING, last_extra=NOTHING,
                  extra_reduction_s=0.0, extra_optimizer_s=0.0, transient_bytes=0.0)
    fields.update(changes)
    return BlockPricing(micro_batch=micro_batch, block=block, figures=(), solve_s=0.0, **fields)


@pytest.fixture(scope="module")
def priced():
    """Block pricing of the tiny LLaMA on 4 GPUs (one stage, batch 8) and on 2 (a stage of pp 2,
    microbatches of 4 and 2 sequences): each two solves."""
    cache = {}

    def at(mesh: tuple[int, ...], micro_batch: int) -> BlockPricing:
        key = (mesh, micro_batch)
        if key not in cache:
            cache[key] = price_blocks(llama3.tiny, LLAMA, mesh, ("dp",), micro_batch=micro_batch, profile=PROFILE,
                                      recompute="none", time_limit=20)
        return cache[key]

    return at


def test_blocks_reproduce_the_whole_model_on_one_stage(priced):
    """(a) p = 1, m = 1: the blocks' sum is the whole 6-layer model's plan, within 2 %
    (the solve of each depth is its own; pinned layers make them exactly affine)."""
    from autoshard.search.solve import prepare, solve_prepared

    pricing = priced((4,), 8)
    model, inputs = llama3.tiny(**{**LLAMA, "n_layers": N_BLOCKS})
    prep = prepare(model, inputs, (4,), ("dp",), profile=PROFILE, recompute="none")
    whole = solve_prepared(prep, recompute="none", memory_limit=math.inf, time_limit=20)
    assert pricing.step_of_model(N_BLOCKS) == pytest.approx(whole.estimate.step_s, rel=0.02)
    figures = plan_figures(prep, whole, N_BLOCKS)
    assert figures.state_bytes == pytest.approx(N_BLOCKS * pricing.block.state_bytes, rel=0.01)
    plan = search_pipeline(lambda mb: pricing, n_blocks=N_BLOCKS, batch=8, seq_len=16, dim=64,
                           layout=PipelineLayout(1, 4, 1), profile=load_profile(PROFILE), flops_per_token=1.0,
                           schedules=("1F1B",))
    # one stage, one microbatch: forward, backward, then the reduction and the optimizer
    tail = N_BLOCKS * (pricing.block_reduction_s + pricing.block_optimizer_s) + pricing.extra_reduction_s \
        + pricing.extra_optimizer_s
    assert plan.step_s == pytest.approx(pricing.step_of_model(N_BLOCKS) - N_BLOCKS * pricing.block_optimizer_s
                                        - pricing.extra_optimizer_s + tail, rel=1e-9)
    assert plan.step_s == pytest.approx(whole.estimate.step_s, rel=0.05)


def test_chosen_schedule_is_the_fastest_simulated():
    """(b) the choice is the least step among every candidate, each re-simulated here."""
    unit = BlockCost(1.0, 2.0, 10, 5)
    profile = load_profile(PROFILE)
    plan = search_pipeline(lambda mb: _pricing(unit, mb, last_extra=BlockCost(3.0, 6.0, 0, 0), block_reduction_s=0.1),
                           n_blocks=16, batch=16, seq_len=8, dim=8, layout=PipelineLayout(4, 1, 1), profile=profile,
                           flops_per_token=1.0, microbatches=(4, 8, 16))
    fitting = [c for c in plan.candidates if math.isfinite(c.step_s)]
    assert len({c.schedule for c in fitting}) >= 5
    assert plan.step_s == min(c.step_s for c in fitting)
    for c in fitting:
        pricing = _pricing(unit, 16 // c.n_microbatches, last_extra=BlockCost(3.0, 6.0, 0, 0), block_reduction_s=0.1)
        again, _, sim = price_pipeline(pricing, n_blocks=16, batch=16, pp=4, schedule=c.schedule,
                                       n_microbatches=c.n_microbatches, stages_per_rank=c.stages_per_rank,
                                       send_s=c.send_s)
        assert c.send_s > 0 and again.step_s == pytest.approx(c.step_s)
        assert plan.step_s <= sim.step_s + 1e-12
    # the bound holds and the bubble costs something on 4 stages
    assert plan.lower_bound_s < plan.step_s


def test_uniform_1f1b_matches_the_closed_form():
    """One block per stage, no sends: 1F1B's step is (m + p - 1)(f + b)."""
    pricing = _pricing(BlockCost(1.0, 2.0, 0, 0))
    cand, cut, _ = price_pipeline(pricing, n_blocks=4, batch=8, pp=4, schedule="1F1B", n_microbatches=8)
    assert cut.cuts == (1, 2, 3)
    assert cand.step_s == pytest.approx((8 + 4 - 1) * 3.0)


def test_bad_input_names_the_thing():
    """(c) one clear error each."""
    pricing = _pricing(BlockCost(1.0, 2.0, 0, 0), micro_batch=2)
    with pytest.raises(ValueError, match="n_microbatches=4 does not divide the batch of 10"):
        price_pipeline(pricing, n_blocks=4, batch=10, pp=2, schedule="1F1B", n_microbatches=4)
    with pytest.raises(ValueError, match="16 stages exceed the model's 4 blocks"):
        price_pipeline(pricing, n_blocks=4, batch=16, pp=8, schedule="Interleaved1F1B", n_microbatches=8,
                       stages_per_rank=2)
    with pytest.raises(ValueError, match="unknown pipeline schedule 'OneFOneB'"):
        price_pipeline(pricing, n_blocks=4, batch=8, pp=2, schedule="OneFOneB", n_microbatches=4)
    with pytest.raises(ValueError, match="unknown pipeline schedule 'OneFOneB'"):
        search_pipeline(lambda mb: pricing, n_blocks=4, batch=8, seq_len=8, dim=8, layout=PipelineLayout(2, 1, 1),
                        profile=load_profile(PROFILE), flops_per_token=1.0, schedules=("1F1B", "OneFOneB"))
    with pytest.raises(ValueError, match="pp=8 stages exceed the model's 4 blocks"):
        search_pipeline(lambda mb: pricing, n_blocks=4, batch=16, seq_len=8, dim=8, layout=PipelineLayout(8, 1, 1),
                        profile=load_profile(PROFILE), flops_per_token=1.0)


def test_memory_refuses_gpipe_first():
    """GPipe holds every microbatch, 1F1B at most p: under a limit between the two only 1F1B fits."""
    pricing = _pricing(BlockCost(1.0, 2.0, 0, 100))
    limit = 100 * 4 + 50  # rank 0 holds 4 microbatches of one block under 1F1B, 8 under GPipe
    gpipe, _, _ = price_pipeline(pricing, n_blocks=4, batch=8, pp=4, schedule="GPipe", n_microbatches=8,
                                 memory_limit_bytes=limit)
    one, _, _ = price_pipeline(pricing, n_blocks=4, batch=8, pp=4, schedule="1F1B", n_microbatches=8,
                               memory_limit_bytes=limit)
    assert math.isinf(gpipe.step_s) and gpipe.why
    assert math.isfinite(one.step_s) and max(one.rank_memory_bytes) == 400


def test_small_model_fast_links_keeps_one_stage(priced):
    """(d) the tiny LLaMA on 4 H100s (2 a node): a pipeline of 2 stages does not pay, p = 1 wins."""
    profile = load_profile(PROFILE)
    plans = []
    for layout in (PipelineLayout(1, 4, 1), PipelineLayout(2, 2, 1)):
        assert layout in pipeline_layouts(4, 2, min_pp=1)
        plans.append(search_pipeline(lambda mb, dp=layout.dp: priced((dp,), mb), n_blocks=N_BLOCKS, batch=8,
                                     seq_len=16, dim=64, layout=layout, profile=profile, flops_per_token=1.0,
                                     microbatches=microbatch_counts(8, layout.pp, layout.dp, most=1)))
    assert plans[1].step_s > plans[0].step_s
    assert best_plan(plans).pp == 1


def test_one_node_has_no_pipeline_layout():
    """8 GPUs in one node (the 8B case): no pp layout, so the mesh search keeps today's plan;
    512 in 64 nodes: pp outermost, dividing the nodes, tp inside a node."""
    assert pipeline_layouts(8, 8) == ()
    layouts = pipeline_layouts(512, 8)
    assert all(64 % l.pp == 0 and 8 % l.tp == 0 and l.pp * l.dp * l.tp == 512 for l in layouts)
    assert PipelineLayout(8, 8, 8) in layouts and not any(l.pp == 1 for l in layouts)
    with pytest.raises(ValueError, match="devices must be a multiple of per_node"):
        pipeline_layouts(12, 8)


def test_schedule_orders_priced_are_torch_s():
    """The candidates are simulated on the pricing core's orders (checked against torch there)."""
    sched = build_schedule("ZBVZeroBubble", n_ranks=2, n_microbatches=4)
    unit = BlockCost(1.0, 2.0, 0, 0)
    cand, _, sim = price_pipeline(_pricing(unit), n_blocks=4, batch=4, pp=2, schedule="ZBVZeroBubble",
                                  n_microbatches=4, stages_per_rank=2)
    from costmodel.pipeline_simulate import StageCost

    alone = simulate_pipeline(sched, [StageCost(1.0, 1.0, 1.0, full_backward_s=2.0)] * 4)
    assert cand.step_s == pytest.approx(alone.step_s)
