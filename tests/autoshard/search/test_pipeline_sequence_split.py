"""A stage without recomputation priced as its runtime runs a ``tp`` layout: sequence parallel
(``pipeline_blocks`` (h''), ``pipeline_section.priced_sequence_parallel``).

The tiny LLaMA (dim 64) at 4 x 16 tokens, fp32, on a ``tp`` mesh of 2 with Megatron's split pinned
(``trace.blocks.megatron_table``, as ``choose_pipeline`` pins it), no recomputation, 2 and 3 blocks.
On the H100 profile the trace's RMSNorm is one fused op (output and rstd): a block keeps on its
residual stream its input and its mid-residual, which its norms' backward reads, replicated over
``tp`` by the solve; its norms' outputs, read by the column-split linears, are the gathering modules'
inputs, which the stage runtime keeps as shards and gathers again in the backward (``pipeline_blocks``
(h'''), ``autoshard.runtime.pipeline_sp``).
"""

from __future__ import annotations

import math

import pytest

from examples.models import llama3

from autoshard.search.pipeline_blocks import plan_figures, pricing_from_figures
from autoshard.search.solve import prepare, solve_prepared
from autoshard.trace.blocks import megatron_table, repeated_blocks

BATCH, SEQ, TP = 4, 16, 2


@pytest.fixture(scope="module")
def figures():
    """The figures of the 2- and 3-block plans and the model's dim."""
    out = []
    for depth in (2, 3):
        model, inputs = llama3.tiny(device="meta", n_layers=depth, batch_size=BATCH, seq_len=SEQ)
        prep = prepare(model, inputs, (TP,), ("tp",), profile="h100-sxm-80gb", recompute="none")
        plan = solve_prepared(prep, baseline="tp", recompute="none", memory_limit=math.inf, time_limit=10,
                              tp_table=megatron_table(model, repeated_blocks(model), TP))
        out.append(plan_figures(prep, plan, depth))
    return out, model.config.dim


def test_a_block_keeps_its_input_and_mid_residual_on_the_stream_replicated_over_tp(figures) -> None:
    (lo, hi), dim = figures
    stream = BATCH * SEQ * dim * 4  # one (batch, seq, dim) fp32 tensor, whole
    assert hi.stream_saved_bytes - lo.stream_saved_bytes == 2 * stream
    assert hi.stream_saved_split_bytes - lo.stream_saved_split_bytes == 2 * stream / TP


def test_the_norms_outputs_the_column_split_linears_read_are_the_gathered_inputs_kept_whole_by_the_solve(
        figures) -> None:
    # two a block (the attention's input, the feed-forward's): the fused RMSNorm's storage, output and rstd
    (lo, hi), dim = figures
    stream, stats = BATCH * SEQ * dim * 4, BATCH * SEQ * 4
    assert hi.gathered_saved_bytes - lo.gathered_saved_bytes == 2 * (stream + stats)
    assert hi.gathered_saved_split_bytes - lo.gathered_saved_split_bytes == 2 * (stream + stats) / TP
    assert hi.regather_max_bytes == lo.regather_max_bytes == stream


def test_sequence_split_pricing_keeps_shards_and_pays_one_more_gather_per_gathering_module(figures) -> None:
    from costmodel.collectives import collective_time_s
    from costmodel.mesh import MeshSpec
    from hw_profiles import load

    (lo, hi), dim = figures
    stream, stats = BATCH * SEQ * dim * 4, BATCH * SEQ * 4
    whole = pricing_from_figures(BATCH, lo, hi, 0.0)
    split = pricing_from_figures(BATCH, lo, hi, 0.0, sequence_split=True)
    # (h'') the input and mid-residual, (h''') the two norms' outputs (with their statistics): 1/tp kept
    assert whole.block.activation_bytes - split.block.activation_bytes == (
        2 * stream * (TP - 1) / TP + 2 * (stream + stats) * (TP - 1) / TP)
    regather = 2 * collective_time_s("all_gather", stream, (0,), MeshSpec((TP,), ("tp",)), load("h100-sxm-80gb"))
    assert split.block_regather_s == pytest.approx(regather) and regather > 0
    assert split.block.backward_s == pytest.approx(whole.block.backward_s + regather)
    assert split.transient_bytes == whole.transient_bytes + stream  # the copy gathered again, while its backward runs
    assert (split.block.forward_s, split.block.state_bytes, split.last_extra, split.first_extra) == (
        whole.block.forward_s, whole.block.state_bytes, whole.last_extra, whole.first_extra)
    # full recomputation's rule (h') is the one a checkpointed pricing applies, not (h'') nor (h''')
    assert pricing_from_figures(BATCH, lo, hi, 0.0, checkpointed=True, sequence_split=True).block == \
        pricing_from_figures(BATCH, lo, hi, 0.0, checkpointed=True).block
