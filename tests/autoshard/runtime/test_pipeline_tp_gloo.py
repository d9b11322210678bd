"""Tensor parallelism inside pipeline stages: 8 gloo ranks, pp 2 x dp 2 x tp 2, against one device.

Two models in one spawn: the Hugging Face ``LlamaForCausalLM`` as given
(``examples.models.hf.hf_llama``) and the example LLaMA (``examples.models.llama3.tiny``),
both tiny, fp32, 2 blocks, batch 8 x 16, cut between their blocks into two stages
(1F1B, 2 microbatches). The section's ``tensor_parallel`` layout is read from
plan-style parameter placements on the mesh ("pp", "dp", "tp") by
``tensor_parallel_from_params``: Megatron's column split of q/k/v and gate/up
(weight ``S(0)`` on tp), row split of o and down (``S(1)``); the example LLaMA's
attention, which reshapes with its head counts, gets them divided by tp; inside each stage torch's
``parallelize_module`` runs it, then FSDP2 shards the stage over dp (2-D parameters).
This is torch's tensor parallelism with the plan's column/row choice, not the plan's
per-op placements (``autoshard.runtime.pipeline_tp`` says what differs). After each
of two AdamW steps the loss (last stage, averaged over dp) and every gradient
(gathered over dp and tp) equal the one-device model's; so do the example LLaMA's with the
section's ``sequence_parallel`` (the residual stream split along the sequence over tp), whose
sends are the local sequence shard. The 8 ranks are the ones the 8-rank
context- and expert-parallel tests start too (``ranks_2x2x2.py``: one spawn for the three).
"""

from __future__ import annotations

import pytest
from equivalence import assert_pipeline_matches_one_device

from examples.models import hf, llama3

pytestmark = pytest.mark.slow

STEPS = 2
KW = {"batch_size": 8}
MESH = ((2, 2, 2), ("pp", "dp", "tp"))
COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "wq", "wk", "wv", "w1", "w3")
ROW = ("o_proj", "down_proj", "wo", "w2")
VOCAB = ("tok_embeddings", "embed_tokens", "output", "lm_head")
"""The embedding and the head: split over the vocabulary on tp beside the layout (``trace.blocks.vocab_split``)."""
MODELS = ("hf", "llama3")


def build(label: str):
    """(model, keyword inputs) of ``label``."""
    if label == "hf":
        return hf.hf_llama(**KW)
    model, (tokens, labels) = llama3.tiny(**KW)
    return model, {"tokens": tokens, "labels": labels}


def plan_params(model) -> dict[str, str]:
    """Placements a plan on (pp, dp, tp) could give: FSDP's S(0) on dp, Megatron's split on tp."""
    out = {}
    for name, _ in model.named_parameters():
        module = name.rsplit(".", 2)[-2]
        tp = "S(0)" if module in COLUMN else "S(1)" if module in ROW else "R"
        out[name] = f"RS(0){tp}"
    return out


def run_tp(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", *MESH[:1], mesh_dim_names=MESH[1])
    return {**{label: run_model(label, mesh) for label in MODELS},
            "llama3_sp": run_model("llama3", mesh, sequence_parallel=True)}


def run_model(label: str, mesh, *, sequence_parallel: bool = False) -> dict:
    from equivalence import pipeline_steps
    from torch.distributed.tensor import DTensor

    from autoshard.plan.pipeline_section import build_pipeline_section
    from autoshard.runtime.pipeline_stages import build_pipeline, model_parts
    from autoshard.runtime.pipeline_tp import block_linears, tensor_parallel_from_params

    reference, inputs = build(label)
    model, _ = build(label)
    parts = model_parts(model)
    layout = tensor_parallel_from_params(plan_params(model), MESH[1], block_linears(model, parts.blocks))
    section = build_pipeline_section(schedule="1F1B", n_ranks=2, n_microbatches=2, batch_size=8,
                                     block_paths=parts.blocks, cuts=(1,), leading=parts.leading,
                                     trailing=parts.trailing, tensor_parallel=layout,
                                     sequence_parallel=sequence_parallel)
    run = build_pipeline(model, mesh, section, record_sends=sequence_parallel)
    split = {n: [str(p) for p in param.placements] for n, param in run.named_parameters() if isinstance(param, DTensor)}
    steps = pipeline_steps(run, reference, inputs, mesh["dp"], steps=STEPS)
    return {"layout": dict(layout), "placements": split, "steps": steps, "sends": [s.nbytes for s in run.sends]}


@pytest.fixture(scope="module")
def results(ranks_2x2x2):
    """Every rank's results (``run_tp``'s under ``hf`` and ``llama3``) of the spawn this test shares
    with the 8-rank context- and expert-parallel tests (``ranks_2x2x2.py``)."""
    return ranks_2x2x2[1]


def test_layout_is_megatrons_column_then_row_split_from_the_placements(results):
    layout = results[0]["hf"]["layout"]
    assert len(layout) == 14 and len(results[0]["llama3"]["layout"]) == 14
    assert layout["model.layers.0.self_attn.q_proj"] == "colwise"
    assert layout["model.layers.1.mlp.down_proj"] == "rowwise"
    assert results[0]["llama3"]["layout"]["layers.0.attention.wo"] == "rowwise"


@pytest.mark.parametrize("label", MODELS)
def test_split_linears_embedding_and_head_are_sharded_over_dp_and_tp_and_the_rest_over_dp_only(results, label):
    for res in results:
        placements = res[label]["placements"]
        assert placements, "FSDP makes every parameter a DTensor"
        for name, p in placements.items():
            module = name.rsplit(".", 2)[-2]
            if module in COLUMN or module in VOCAB:  # dim 0 split over tp, its tp shard over dp (torch: strided)
                assert len(p) == 2 and "S(0" in p[0] and p[1] == "S(0)", (name, p)
            elif module in ROW:
                assert p == ["S(0)", "S(1)"], (name, p)
            else:
                assert p == ["S(0)"], (name, p)


@pytest.mark.parametrize("label", MODELS)
def test_loss_and_every_gradient_equal_one_device_after_each_step(results, label):
    # the loss is on the four (dp x tp) ranks of the last stage
    assert_pipeline_matches_one_device([res[label]["steps"] for res in results], holders=4, label=label)


def test_sequence_parallel_under_fsdp_matches_one_device_and_sends_one_tp_th_of_the_activation(results):
    # the example LLaMA with the section's sequence_parallel (autoshard.runtime.pipeline_sp), FSDP over dp:
    # the blocks' norms are tp DTensors (replicated) sharded over dp, and each send is the local
    # sequence shard (micro_batch 2, seq 16 / tp, dim 64, fp32), half the replicated activation
    assert_pipeline_matches_one_device([res["llama3_sp"]["steps"] for res in results], holders=4, label="llama3_sp")
    for res in results:
        norms = {n: p for n, p in res["llama3_sp"]["placements"].items() if "layers." in n and n.endswith("norm.weight")}
        assert len(norms) == 2 and all(p == ["S(0)", "R"] for p in norms.values()), norms
        assert res["llama3_sp"]["sends"] and set(res["llama3_sp"]["sends"]) == {2 * 8 * 64 * 4}
