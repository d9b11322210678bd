"""Hugging Face's ``LlamaForCausalLM`` as given, on a pp 2 x tp 2 mesh with no plan: tensor-parallel
stages, trained as one device (issue 55).

Four gloo ranks, mesh (2, 2) named ("pp", "tp"): ``autoshard(model, mesh, inputs)`` with no plan
searches the pipeline on rank 0 (``autoshard.search.pipeline_model.choose_pipeline``), whose
stage solves price Megatron's split of the blocks' linears pinned on ``tp`` (found from their
shapes: the grouped-query ``q/k/v`` project to different widths), and every rank builds its
stages with that split run by torch's column / row styles. The model
(``examples.models.hf.hf_llama``: tiny, fp32, 2 decoder layers, 4 query / 2 K/V heads, batch
8 x 16) is not wrapped or edited. After each of two AdamW steps the loss (on the last stage's two
tp ranks) and every gradient (gathered over tp) equal the one-device model's.

In the same spawn, the model with one K/V head (16 features, which do not split into whole heads
over 2 ranks): Megatron's split leaves its attention replicated and splits its MLP, run with and
without sequence parallelism (the replicated attention then runs on the gathered sequence,
``autoshard.runtime.pipeline_sp``); both train as one device too.
"""

from __future__ import annotations

import pytest
from equivalence import assert_pipeline_matches_one_device
from gloo_ranks import spawn

from examples.models import hf

STEPS = 2
KW = {"batch_size": 8}
COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW = ("o_proj", "down_proj")


def run_searched(rank: int, world: int) -> dict:
    from equivalence import pipeline_steps
    from torch.distributed.device_mesh import init_device_mesh

    from autoshard.runtime.api import autoshard

    reference, inputs = hf.hf_llama(**KW)
    model, _ = hf.hf_llama(**KW)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "tp"))
    run = autoshard(model, mesh, inputs, cache_dir=False, profile="cpu-gloo", time_limit=5)
    # the rows of the batch: all of it on every rank (no data-parallel dim); a dp sub-mesh of one
    # rank for the helper's loss average
    single = init_device_mesh("cpu", (2, 1, 2), mesh_dim_names=("pp", "dp", "tp"))
    steps = pipeline_steps(run, reference, inputs, single["dp"], steps=STEPS)
    return {"section": run.section.to_dict(), "steps": steps,
            **{f"kv1_sp={sp}": run_one_kv_head(single, sp) for sp in (False, True)}}


def run_one_kv_head(mesh, sequence_parallel: bool) -> dict:
    """Steps of the one-K/V-head model on ``mesh`` (pp, dp 1, tp) with Megatron's split where it applies."""
    from equivalence import pipeline_steps

    from autoshard.plan.pipeline_section import build_pipeline_section
    from autoshard.runtime.pipeline_stages import build_pipeline, model_parts
    from autoshard.trace.blocks import block_linears, megatron_split

    reference, inputs = hf.hf_llama(num_key_value_heads=1, **KW)
    model, _ = hf.hf_llama(num_key_value_heads=1, **KW)
    parts = model_parts(model)
    layout = megatron_split(model, block_linears(model, parts.blocks), mesh["tp"].size())
    section = build_pipeline_section(schedule="1F1B", n_ranks=2, n_microbatches=2, batch_size=8,
                                     block_paths=parts.blocks, cuts=(1,), leading=parts.leading,
                                     trailing=parts.trailing, tensor_parallel=layout,
                                     sequence_parallel=sequence_parallel,
                                     recompute="full" if sequence_parallel else "none")
    run = build_pipeline(model, mesh, section)
    return {"layout": dict(layout), "steps": pipeline_steps(run, reference, inputs, mesh["dp"], steps=STEPS)}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return spawn(4, run_searched, (), tmp_path_factory.mktemp("pipeline-hf-tp") / "ranks", timeout=300)


def test_the_searched_section_splits_every_hf_block_linear_as_megatron_does(results):
    sections = [res["section"] for res in results]
    assert all(s == sections[0] for s in sections)
    layout = sections[0].get("tensor_parallel", {})
    want = {f"model.layers.{i}.{parent}.{name}": "colwise" if name in COLUMN else "rowwise"
            for i in range(2) for parent, names in (("self_attn", ("q_proj", "k_proj", "v_proj", "o_proj")),
                                                    ("mlp", ("gate_proj", "up_proj", "down_proj")))
            for name in names}
    assert layout == want


def test_loss_and_every_gradient_equal_one_device_after_each_step(results):
    # the loss is on the two tp ranks of the last stage
    assert_pipeline_matches_one_device([res["steps"] for res in results], holders=2, label="hf pp2 x tp2")


@pytest.mark.parametrize("sp", [False, True], ids=["replicated-stream", "sequence-parallel"])
def test_an_attention_whose_kv_heads_do_not_split_runs_replicated_beside_a_split_mlp_as_one_device(results, sp):
    layout = results[0][f"kv1_sp={sp}"]["layout"]
    assert set(layout) == {f"model.layers.{i}.mlp.{n}" for i in range(2) for n in ("gate_proj", "up_proj", "down_proj")}
    assert_pipeline_matches_one_device([res[f"kv1_sp={sp}"]["steps"] for res in results], holders=2,
                                       label=f"one kv head, sequence parallel {sp}")
