"""Sequence parallelism inside a pipeline stage, without ranks: which norms it finds, the styles it
gives the split linears and norms, and the sections it refuses."""

from __future__ import annotations

import pytest
from torch import nn
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

from autoshard.plan.pipeline_section import PipelineError, build_pipeline_section
from autoshard.runtime.pipeline_sp import add_sequence_hooks, block_norms, is_norm, sequence_parallel_plan
from autoshard.runtime.pipeline_tp import apply_tensor_parallel
from examples.models import hf, llama3


class ScaleNorm(nn.Module):
    """A norm of a model's own, recognised by its class name."""


class Normalizer(nn.Module):
    """Not a norm layer by its name."""


def test_layer_rms_and_own_norms_are_norms_and_linears_are_not():
    assert is_norm(nn.LayerNorm(4)) and is_norm(nn.RMSNorm(4)) and is_norm(ScaleNorm())
    assert not is_norm(nn.Linear(4, 4)) and not is_norm(Normalizer())


def test_the_norms_inside_the_blocks_are_found_in_ours_and_hugging_faces_and_the_final_norm_is_not():
    model, _ = llama3.tiny(device="meta")
    assert block_norms(model, [model.layers[1]]) == ("layers.1.attention_norm", "layers.1.ffn_norm")
    hf_model, _ = hf.hf_llama()
    layers = hf_model.model.layers
    assert block_norms(hf_model, list(layers)) == tuple(
        f"model.layers.{i}.{n}" for i in range(2) for n in ("input_layernorm", "post_attention_layernorm"))


def test_row_split_outputs_are_reduce_scattered_to_the_sequence_and_norms_run_sequence_parallel():
    model, _ = llama3.tiny(device="meta")
    layout = {"layers.0.attention.wq": "colwise", "layers.0.attention.wo": "rowwise"}
    plan = sequence_parallel_plan(model, layout, [model.layers[0]])
    assert type(plan["layers.0.attention.wq"]) is ColwiseParallel
    assert type(plan["layers.0.attention.wo"]) is RowwiseParallel
    assert plan["layers.0.attention.wo"].output_layouts == (Shard(1),)
    assert isinstance(plan["layers.0.ffn_norm"], SequenceParallel) and len(plan) == 4


def test_a_block_with_column_split_linears_as_direct_children_is_refused_in_one_line():
    block = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 4))
    root = nn.Sequential(block)
    with pytest.raises(PipelineError, match=r"^pipeline.sequence_parallel: '0' is a block") as info:
        add_sequence_hooks(root, ["0.0"], [block], received=[], last=True, tp_mesh=None)
    assert "\n" not in str(info.value)


def test_a_sequence_parallel_stage_given_no_blocks_is_refused_naming_the_field():
    model, _ = llama3.tiny(device="meta")
    section = build_pipeline_section(schedule="1F1B", n_ranks=2, n_microbatches=2, batch_size=2,
                                     block_paths=("layers.0", "layers.1"), cuts=(1,), leading=("tok_embeddings",),
                                     trailing=("norm", "output"), tensor_parallel=(("layers.0.attention.wq", "colwise"),),
                                     sequence_parallel=True)
    tp_mesh = type("Mesh", (), {"size": lambda self: 2})()
    with pytest.raises(PipelineError, match=r"^pipeline.sequence_parallel: stage 0 was given no blocks"):
        apply_tensor_parallel(model, section, 0, tp_mesh)
