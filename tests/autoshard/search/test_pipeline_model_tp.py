"""The searched pipeline section's tensor parallelism: the stage solve's column / row split of
the first block's linears, run by every block, and sequence parallel wherever it has one."""

from __future__ import annotations

import pytest

from costmodel.stage_cuts import BlockCost
from examples.models import llama3

from autoshard.search.pipeline_blocks import BlockPricing
from autoshard.search.pipeline_model import stage_tensor_parallel

NOTHING = BlockCost(0.0, 0.0, 0, 0)
BLOCKS = ("layers.0", "layers.1", "layers.2")
MEGATRON = {"wq": "S(0)", "wk": "S(0)", "wv": "S(0)", "wo": "S(1)", "w1": "S(0)", "w3": "S(0)", "w2": "S(1)"}


def _pricing(on_tp: dict[str, str]) -> BlockPricing:
    """A pricing whose deeper solve placed block 0's linears ``on_tp`` (``dp`` replicated)."""
    model, _ = llama3.tiny(device="meta", n_layers=3)
    params = {name: "R" + next((p for k, p in on_tp.items() if name.endswith(f".{k}.weight")), "R")
              for name, _ in model.named_parameters()}
    return BlockPricing(4, NOTHING, 0.0, 0.0, NOTHING, NOTHING, 0.0, 0.0, 0.0, (), 0.0, params=tuple(params.items()))


def test_megatrons_split_of_the_first_block_is_every_blocks_layout() -> None:
    model, _ = llama3.tiny(device="meta", n_layers=3)
    layout = dict(stage_tensor_parallel(_pricing(MEGATRON), model, BLOCKS, ("dp", "tp")))
    assert len(layout) == 3 * 7
    for block in BLOCKS:
        assert layout[f"{block}.attention.wo"] == layout[f"{block}.feed_forward.w2"] == "rowwise"
        assert layout[f"{block}.attention.wq"] == layout[f"{block}.feed_forward.w3"] == "colwise"


@pytest.mark.parametrize("on_tp", [{**MEGATRON, "wo": "S(0)"},  # a column-split output projection
                                   {**MEGATRON, "w1": "S(1)", "w2": "S(0)"}],  # rows read the stream
                         ids=["column-output", "row-input"])
def test_a_split_torchs_styles_cannot_run_leaves_the_stages_replicated(on_tp) -> None:
    model, _ = llama3.tiny(device="meta", n_layers=3)
    assert stage_tensor_parallel(_pricing(on_tp), model, BLOCKS, ("dp", "tp")) == ()


def test_no_tp_dim_or_no_placements_is_no_layout() -> None:
    model, _ = llama3.tiny(device="meta", n_layers=3)
    assert stage_tensor_parallel(_pricing(MEGATRON), model, BLOCKS, ("dp", "cp")) == ()
    assert stage_tensor_parallel(_pricing({}), model, BLOCKS, ("dp", "tp")) == ()


def test_the_section_runs_tp_sequence_parallel_under_either_recomputation_policy_and_not_without_a_layout() -> None:
    from autoshard.search.pipeline import PipelinePlan, pipeline_section

    layout = (("layers.0.attention.wq", "colwise"), ("layers.0.attention.wo", "rowwise"))
    for policy, layout, sp in (("none", layout, True), ("full", layout, True), ("none", (), False)):
        plan = PipelinePlan(pp=2, mesh_shape=(2, 1, 2), dim_names=("pp", "dp", "tp"), schedule="1F1B",
                            n_microbatches=2, stages_per_rank=1, cuts=(1,), stage_step_s=(1.0, 1.0),
                            rank_memory_bytes=(1.0, 1.0), step_s=1.0, bubble_fraction=0.0, lower_bound_s=1.0,
                            tokens_per_gpu_s=1.0, tflops_per_gpu=0.0, candidates=(), search_s=0.0, recompute=policy)
        section = pipeline_section(plan, batch=4, seq_len=16, dim=64, block_paths=("layers.0", "layers.1"),
                                   tensor_parallel=layout)
        assert section.tensor_parallel == layout and section.sequence_parallel is sp and section.recompute == policy
