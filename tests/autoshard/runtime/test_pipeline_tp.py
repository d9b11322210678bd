"""The column / row layout a stage's tensor parallelism runs, read from plan placements (no ranks)."""

from __future__ import annotations

import pytest
from torch import nn

from autoshard.plan.pipeline_section import PipelineError, PipelineSection, build_pipeline_section
from autoshard.runtime.pipeline_tp import _localize_head_counts, block_linears, tensor_parallel_from_params
from examples.models import llama3

DIMS = ("pp", "dp", "tp")
LINEARS = ("layers.0.attention.wq", "layers.0.attention.wo", "layers.0.feed_forward.w1")


def test_weight_split_on_tp_dim_0_is_colwise_dim_1_rowwise_and_replicated_left_out():
    params = {"layers.0.attention.wq.weight": "RS(0)S(0)", "layers.0.attention.wo.weight": "RS(0)S(1)",
              "layers.0.feed_forward.w1.weight": "RS(0)R"}
    assert tensor_parallel_from_params(params, DIMS, LINEARS) == (
        ("layers.0.attention.wq", "colwise"), ("layers.0.attention.wo", "rowwise"))


def test_layout_reads_the_tp_entry_not_another_mesh_dims():
    params = {"layers.0.attention.wq.weight": "S(1)S(1)S(0)"}
    assert tensor_parallel_from_params(params, DIMS, LINEARS[:1]) == (("layers.0.attention.wq", "colwise"),)


@pytest.mark.parametrize("params, dims, needle", [
    ({"layers.0.attention.wq.weight": "RS(0)P(sum)"}, DIMS, "S(0) or S(1)"),
    ({"layers.0.attention.wq.weight": "RS(0)"}, DIMS, "one placement per mesh dim"),
    ({}, DIMS, "places no parameter layers.0.attention.wq.weight"),
    ({"layers.0.attention.wq.weight": "RS(0)Q"}, DIMS, "layers.0.attention.wq.weight"),
    ({"layers.0.attention.wq.weight": "RS(0)"}, ("pp", "dp"), "no 'tp'"),
])
def test_bad_placements_get_one_line_naming_the_parameter_or_dim(params, dims, needle):
    with pytest.raises(PipelineError, match="pipeline.tensor_parallel") as info:
        tensor_parallel_from_params(params, dims, LINEARS[:1])
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_block_linears_are_the_seven_projections_of_each_llama_block():
    model, _ = llama3.tiny(device="meta")
    found = block_linears(model, ("layers.0", "layers.1"))
    assert len(found) == 14 and found[0] == "layers.0.attention.wq" and "output" not in found


def _section(layout):
    return build_pipeline_section(schedule="1F1B", n_ranks=2, n_microbatches=2, batch_size=4,
                                  block_paths=("layers.0", "layers.1"), cuts=(1,), leading=("tok_embeddings",),
                                  trailing=("norm", "output"), tensor_parallel=layout)


def test_section_keeps_the_layout_through_json_and_leaves_it_out_when_empty():
    section = _section((("layers.1.attention.wq", "colwise"),))
    assert section.to_dict()["tensor_parallel"] == {"layers.1.attention.wq": "colwise"}
    assert PipelineSection.from_dict(section.to_dict()) == section
    assert "tensor_parallel" not in _section(()).to_dict()


@pytest.mark.parametrize("layout, needle", [((("layers.0.attention.wq", "diagonal"),), "'diagonal'"),
                                            ((("lm.head", "colwise"),), "'lm.head' is in no stage")])
def test_section_refuses_an_unknown_style_or_a_module_of_no_stage(layout, needle):
    with pytest.raises(PipelineError, match=needle):
        _section(layout)


def test_head_counts_of_a_column_split_attention_are_divided_by_tp_and_a_remainder_refused():
    model, _ = llama3.tiny(device="meta")
    attention = model.layers[0].attention
    heads, kv = attention.n_heads, attention.n_kv_heads
    _localize_head_counts(model, ["layers.0.attention.wq"], 2)
    assert (attention.n_heads, attention.n_kv_heads) == (heads // 2, kv // 2)
    assert model.layers[1].attention.n_heads == heads
    with pytest.raises(PipelineError, match=r"layers.0.attention.n_kv_heads = 1 heads do not split over 2"):
        _localize_head_counts(model, ["layers.0.attention.wq"], 2)


def test_a_module_without_head_counts_is_left_alone():
    block = nn.Sequential(nn.Linear(4, 4))
    _localize_head_counts(block, ["0"], 2)
    assert not hasattr(block, "n_heads")


def _megatron(model, **change: str) -> dict[str, str]:
    """Plan placements on (pp, dp, tp): q/k/v and w1/w3 split by columns on tp, wo and w2 by rows."""
    split = {"wq": "S(0)", "wk": "S(0)", "wv": "S(0)", "wo": "S(1)", "w1": "S(0)", "w3": "S(0)", "w2": "S(1)", **change}
    return {name: "RR" + split.get(name.rsplit(".", 2)[-2], "R") for name, _ in model.named_parameters()}


def test_a_plans_section_without_a_layout_gets_the_plans_column_row_split_on_a_tp_mesh():
    from autoshard.runtime.pipeline_tp import with_plan_layout

    model, _ = llama3.tiny(device="meta")
    section = with_plan_layout(_section(()), model, _megatron(model), DIMS)
    assert dict(section.tensor_parallel) == {f"layers.{i}.{m}": style for i in (0, 1) for m, style in (
        ("attention.wq", "colwise"), ("attention.wk", "colwise"), ("attention.wv", "colwise"),
        ("attention.wo", "rowwise"), ("feed_forward.w1", "colwise"), ("feed_forward.w2", "rowwise"),
        ("feed_forward.w3", "colwise"))}
    assert with_plan_layout(_section(()), model, _megatron(model), ("pp", "dp")) == _section(())
    assert with_plan_layout(section, model, {}, DIMS) is section  # a section's own layout is kept
    assert section.recompute == "none" and section.sequence_parallel  # priced sequence-split without recompute too


@pytest.mark.parametrize("change", [{"wk": "R", "wv": "R"}, {"wo": "S(0)"}, {"w1": "S(1)", "w2": "S(0)"}],
                         ids=["kv-replicated", "output-by-columns", "rows-read-the-stream"])
def test_a_plans_split_torchs_column_and_row_styles_cannot_run_stays_replicated_over_tp(change):
    from autoshard.runtime.pipeline_tp import with_plan_layout

    model, _ = llama3.tiny(device="meta")
    assert with_plan_layout(_section(()), model, _megatron(model, **change), DIMS) == _section(())


def test_a_plans_section_with_full_recomputation_runs_its_tp_sequence_parallel():
    """The search prices a checkpointed block's kept input sequence-split over tp: the stages run so
    (as without recomputation: the test above)."""
    import dataclasses

    from autoshard.runtime.pipeline_tp import with_plan_layout

    model, _ = llama3.tiny(device="meta")
    full = dataclasses.replace(_section(()), recompute="full")
    assert with_plan_layout(full, model, _megatron(model), DIMS).sequence_parallel
    assert not with_plan_layout(full, model, _megatron(model), ("pp", "dp")).sequence_parallel  # no tp: nothing to split


@pytest.mark.parametrize("name", ["autoshard.runtime.pipeline_tp", "autoshard.runtime.pipeline_stages"])
def test_doctests_of_the_pipeline_runtime_modules(name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
