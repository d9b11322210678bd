"""``choose_pipeline`` on a model instance: the section the search picks, and its one-line refusals."""

from __future__ import annotations

import pytest

from autoshard.plan.pipeline_section import PipelineError
from autoshard.search.pipeline_model import choose_pipeline, microbatch_inputs, stage_sub_mesh, truncated_model
from examples.models import llama3


def _tiny(**kw):
    from autoshard.runtime.pipeline_stages import model_parts

    model, inputs = llama3.tiny(device="meta", batch_size=8, **kw)
    return model, inputs, model_parts(model)


def test_truncated_model_keeps_the_first_blocks_and_leaves_the_model_alone():
    model, _, parts = _tiny(n_layers=4)
    cut = truncated_model(model, parts.blocks, 2)
    assert len(cut.layers) == 2 and cut.layers[1] is model.layers[1] and len(model.layers) == 4
    assert cut.tok_embeddings is model.tok_embeddings


def test_microbatch_inputs_take_the_first_rows():
    _, (tokens, labels), _ = _tiny()
    cut = microbatch_inputs((tokens, labels), 2)
    assert cut[0].shape[0] == 2 and cut[1].shape[0] == 2


def test_stage_sub_mesh_drops_pp_and_refuses_a_mesh_without_it():
    assert stage_sub_mesh((2, 2), ("pp", "dp")) == ((2,), ("dp",))
    with pytest.raises(PipelineError, match="no 'pp' dim"):
        stage_sub_mesh((2, 2), ("dp", "tp"))


def test_the_searched_section_cuts_the_blocks_over_pp_ranks():
    model, inputs, parts = _tiny(n_layers=4)
    section, chosen = choose_pipeline(model, inputs, (2, 2), ("pp", "dp"), block_paths=parts.blocks,
                                      leading=parts.leading, trailing=parts.trailing, schedules=("GPipe", "1F1B"),
                                      microbatches=(2, 4), time_limit=10)
    assert section.n_ranks == 2 and section.schedule == chosen.schedule in ("GPipe", "1F1B")
    assert section.stages[0].first_block == 0 and section.stages[-1].end_block == 4
    assert "tok_embeddings" in section.stages[0].modules and "output" in section.stages[-1].modules
    assert chosen.lower_bound_s <= chosen.step_s


def test_more_stages_than_blocks_is_one_line():
    model, inputs, parts = _tiny()
    with pytest.raises(PipelineError, match="pp=4 stages exceed the model's 2 blocks"):
        choose_pipeline(model, inputs, (4,), ("pp",), block_paths=parts.blocks)


def test_a_microbatch_count_that_does_not_divide_the_batch_is_one_line():
    model, inputs, parts = _tiny()
    with pytest.raises(PipelineError, match="n_microbatches=3 does not divide the batch of 8"):
        choose_pipeline(model, inputs, (2, 2), ("pp", "dp"), block_paths=parts.blocks, microbatches=(3,))
