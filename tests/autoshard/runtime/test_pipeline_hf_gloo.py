"""A Hugging Face ``LlamaForCausalLM`` as given, cut into pipeline stages on gloo, against one device.

Four gloo ranks, mesh (2, 2) named ("pp", "dp"): ``examples.models.hf.hf_llama`` (tiny,
fp32, 2 decoder layers, batch 8 x 16), not wrapped or edited, cut between its decoder
layers: stage 0 runs ``model.embed_tokens`` and ``model.layers.0``, stage 1
``model.layers.1``, ``model.norm`` and ``lm_head``, each FSDP-sharded over its dp
sub-mesh, 1F1B with 2 microbatches; two AdamW steps of each rank's dp shard. The
model's own forward runs on both stages, so what crosses the boundary is only the
hidden states: stage 1 rebuilds its position ids, rotary embeddings and causal mask
from the inputs, as the one-device forward does (a wrong mask or rotary position would
change the loss). The loss (the output object's ``loss``, on the last stage, averaged
over dp) and every gradient equal the one-device model's after each step.
"""

from __future__ import annotations

import pytest
from equivalence import assert_pipeline_matches_one_device
from gloo_ranks import spawn

from examples.models import hf

pytestmark = pytest.mark.slow

STEPS = 2
KW = {"batch_size": 8}


def run_hf(rank: int, world: int) -> dict:
    from equivalence import pipeline_steps
    from torch.distributed.device_mesh import init_device_mesh

    from autoshard.plan.pipeline_section import build_pipeline_section
    from autoshard.runtime.pipeline_stages import build_pipeline, model_parts

    reference, inputs = hf.hf_llama(**KW)
    model, _ = hf.hf_llama(**KW)
    parts = model_parts(model)
    section = build_pipeline_section(schedule="1F1B", n_ranks=2, n_microbatches=2, batch_size=8,
                                     block_paths=parts.blocks, cuts=(1,), leading=parts.leading,
                                     trailing=parts.trailing)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
    run = build_pipeline(model, mesh, section)
    steps = pipeline_steps(run, reference, inputs, mesh["dp"], steps=STEPS)
    return {"parts": (parts.leading, parts.blocks, parts.trailing), "steps": steps}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return spawn(4, run_hf, (), tmp_path_factory.mktemp("pipeline-hf") / "ranks", timeout=300)


def test_stages_cut_between_the_decoder_layers_with_the_embedding_first_and_the_head_last(results):
    leading, blocks, trailing = results[0]["parts"]
    assert leading == ("model.embed_tokens",)
    assert blocks == ("model.layers.0", "model.layers.1")
    assert trailing == ("model.norm", "lm_head")


def test_loss_and_every_gradient_equal_one_device_after_each_step(results):
    # the loss is on the two dp ranks of the last stage
    assert_pipeline_matches_one_device([res["steps"] for res in results], holders=2)
