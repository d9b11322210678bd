"""Stage pricing on a ``dp x tp`` sub-mesh, as the pipeline runs it: weights held, inputs re-gathered.

The tiny LLaMA (dim 64) at 4 x 16 tokens, fp32, on a ``(dp 2, tp 2)`` mesh with FSDP and Megatron's
split pinned (``fsdp+tp``, ``trace.blocks.megatron_table``), 2 and 3 blocks:

- under full recomputation a stage keeps its weights gathered through the step, so the recomputed
  forward does not gather them again over ``dp`` (``pipeline_blocks`` (b) ``R_w``);
- without recomputation, a block's gathering modules keep their input as its sequence shard and
  all-gather it again on ``tp`` in the backward (``pipeline_blocks`` (h''')): per rank, the hidden
  state at this rank's share of the batch (``1/dp``), not the whole microbatch.
"""

from __future__ import annotations

import math

import pytest

from examples.models import llama3

from autoshard.search.pipeline_blocks import _held_regathers_s, plan_figures
from autoshard.search.solve import prepare, solve_prepared
from autoshard.trace.blocks import megatron_table, repeated_blocks

BATCH, SEQ, DP, TP = 4, 16, 2, 2


def _solve(depth: int, recompute: str):
    model, inputs = llama3.tiny(device="meta", n_layers=depth, batch_size=BATCH, seq_len=SEQ)
    prep = prepare(model, inputs, (DP, TP), ("dp", "tp"), profile="h100-sxm-80gb",
                   recompute="auto" if recompute != "none" else "none")
    plan = solve_prepared(prep, baseline="fsdp+tp", recompute=recompute, memory_limit=math.inf, time_limit=10,
                          tp_table=megatron_table(model, repeated_blocks(model), TP))
    return prep, plan, model.config.dim


@pytest.fixture(scope="module")
def full():
    return _solve(2, "full")


def test_full_recomputation_is_priced_without_gathering_the_held_weights_again(full) -> None:
    prep, plan, _ = full
    again = _held_regathers_s(prep.graph, plan)
    assert plan.recompute and again > 0  # the solve prices an FSDP gather per recomputed weight read
    fig = plan_figures(prep, plan, 2)
    assert fig.recompute_s == pytest.approx(plan.estimate.recompute_s - again)
    assert 0 < fig.recompute_s < plan.estimate.recompute_s


def test_a_plan_without_recomputation_has_no_weight_gathers_to_take_back() -> None:
    prep, plan, _ = _solve(2, "none")
    assert not plan.recompute and _held_regathers_s(prep.graph, plan) == 0.0


def test_the_regathered_input_is_this_ranks_share_of_the_batch_whole_along_the_sequence() -> None:
    prep, plan, dim = _solve(2, "none")
    fig = plan_figures(prep, plan, 2)
    assert fig.regather_max_bytes == BATCH // DP * SEQ * dim * 4
    assert fig.regather_s > 0 and fig.gathered_saved_split_bytes * TP == pytest.approx(fig.gathered_saved_bytes)
