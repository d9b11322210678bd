"""Which modules of a sequence-parallel stage run replicated on the gathered sequence: those inside
a block whose linears Megatron's split leaves whole (``autoshard.runtime.pipeline_sp``), found from
the module tree without a process group."""

from __future__ import annotations

import pytest
from torch import nn

from autoshard.plan.pipeline_section import PipelineError
from autoshard.runtime.pipeline_sp import replicated_parents
from autoshard.trace.blocks import block_linears, megatron_split, repeated_blocks
from examples.models import hf


def _layout(model: nn.Module, tp: int) -> dict[str, str]:
    return dict(megatron_split(model, block_linears(model, repeated_blocks(model)), tp))


def test_an_attention_whose_kv_heads_do_not_split_is_the_one_replicated_module_of_each_block() -> None:
    model, _ = hf.hf_llama(device="meta", num_key_value_heads=1)
    blocks = list(model.model.layers)
    assert replicated_parents(model, _layout(model, 2), blocks) == ("model.layers.0.self_attn",
                                                                    "model.layers.1.self_attn")
    assert replicated_parents(model, _layout(model, 2), blocks[1:]) == ("model.layers.1.self_attn",)


def test_a_fully_split_block_has_no_replicated_module() -> None:
    model, _ = hf.hf_llama(device="meta")
    assert replicated_parents(model, _layout(model, 2), list(model.model.layers)) == ()


class _Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)


class _Block(nn.Module):
    """A module of whole linears holding another (its inner one sees the gathered sequence already)."""

    def __init__(self) -> None:
        super().__init__()
        self.mix = nn.Module()
        self.mix.inner = _Inner()
        self.mix.out = nn.Linear(4, 4)


def test_a_replicated_module_inside_another_is_not_gathered_twice() -> None:
    model = nn.Module()
    model.layers = nn.ModuleList([_Block(), _Block()])
    assert replicated_parents(model, {}, list(model.layers)) == ("layers.0.mix", "layers.1.mix")


def test_a_block_with_whole_linears_as_direct_children_is_refused_in_one_line() -> None:
    model = nn.Module()
    model.layers = nn.ModuleList([nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)) for _ in range(2)])
    with pytest.raises(PipelineError, match="cannot run on the gathered sequence") as info:
        replicated_parents(model, {}, list(model.layers))
    assert "\n" not in str(info.value)
