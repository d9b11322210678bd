"""A deep stack traced as three blocks and stamped out is the whole trace, node for node;
where it would not be, the model is traced whole."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from autoshard.plan.fingerprint import graph_hash
from autoshard.trace import trace_joint
from autoshard.trace.blocks import find_stack
from autoshard.trace.stamp import STAMP_MIN_BLOCKS, graph_difference, truncated
from examples.models import llama3, mlp

STAMPED = "blocks stamped from 3"


def _same_trace(model, inputs, caplog, device: str = "cpu") -> str:
    """Trace whole and stamped; assert they are equal; return what the stamping logged."""
    whole = trace_joint(model, inputs, target_device=device)
    with caplog.at_level(logging.DEBUG, logger="autoshard.trace.stamp"):
        caplog.clear()
        stamped = trace_joint(model, inputs, target_device=device, stamp=True)
    assert graph_difference(stamped.graph_module.graph, whole.graph_module.graph) is None
    assert graph_hash(stamped) == graph_hash(whole)  # a plan solved on the stamped graph runs on the whole one
    assert stamped.graph_module.code == whole.graph_module.code
    assert list(stamped.params) == list(whole.params)
    assert {k: v and v.name for k, v in stamped.grads.items()} == {k: v and v.name for k, v in whole.grads.items()}
    assert stamped.module_paths == whole.module_paths and stamped.blocks == whole.blocks
    assert [i.outputs for i in stamped.nodes.values()] == [i.outputs for i in whole.nodes.values()]
    return caplog.text


def test_a_stamped_mlp_is_its_whole_trace(caplog):
    assert STAMPED in _same_trace(*mlp.tiny(device="meta", n_layers=9), caplog)


def test_a_stamped_llama_for_cuda_is_its_whole_trace(caplog):
    # the attention kernels are swapped for the device's after stamping, named as after a whole trace
    assert STAMPED in _same_trace(*llama3.tiny(device="meta", n_layers=8), caplog, "cuda")


def test_a_stamped_hugging_face_llama_keeps_the_names_of_nodes_the_trace_erased(caplog):
    hf = pytest.importorskip("examples.models.hf")
    pytest.importorskip("transformers")
    # transformers' mask code leaves erased nodes (arange_2) whose names a whole trace skips
    model, inputs = hf.hf_llama(device="meta", num_hidden_layers=8)
    assert STAMPED in _same_trace(model, inputs, caplog, "cuda")


class _Block(nn.Module):
    def __init__(self, index: int, branch_at: int | None) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.index, self.branch_at = index, branch_at  # the index alone does not make blocks differ

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + torch.tanh(self.lin(x))
        return y * 2 if self.index == self.branch_at else y


class _Stacked(nn.Module):
    def __init__(self, n: int, branch_at: int | None = None, width: dict[int, int] | None = None) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block(i, branch_at) for i in range(n))
        for i, w in (width or {}).items():
            self.blocks[i].lin = nn.Linear(8, 8, bias=w > 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x.square().mean()


def test_a_block_that_branches_on_its_index_fails_the_check_and_is_traced_whole(caplog):
    # block 3 differs only in what its forward does with its index: the 4-block check sees it
    model = _Stacked(8, branch_at=3).to("meta")
    text = _same_trace(model, (torch.ones(4, 8, device="meta"),), caplog)
    assert STAMPED not in text and "traced whole" in text


def test_only_interchangeable_blocks_of_a_deep_enough_stack_are_a_stack():
    stack = find_stack(_Stacked(8), STAMP_MIN_BLOCKS)
    assert stack is not None and stack.keys == tuple(map(str, range(8)))
    assert find_stack(_Stacked(7), STAMP_MIN_BLOCKS) is None  # tracing 3 + 4 blocks would cost as much as 7
    assert find_stack(_Stacked(8, width={5: 0}), STAMP_MIN_BLOCKS) is None  # one block without a bias
    different = _Stacked(8)
    different.blocks[6].branch_at = 2  # an attribute other than the block's index
    assert find_stack(different, STAMP_MIN_BLOCKS) is None


def test_the_model_is_restored_after_a_truncated_trace_even_on_error():
    model = _Stacked(8)
    stack = find_stack(model, STAMP_MIN_BLOCKS)
    container = model.blocks
    with pytest.raises(RuntimeError), truncated(model, stack, 3):
        assert len(model.blocks) == 3 and model.blocks[2] is container[2]
        raise RuntimeError("boom")
    assert model.blocks is container and len(model.blocks) == 8


class _Keyed(nn.Module):
    """torchtitan's layout: the layers in an ``nn.ModuleDict`` keyed "0".."n-1", called in order."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({str(i): _Block(i, None) for i in range(n)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers.values():
            x = layer(x)
        return x.square().mean()


def test_a_module_dict_stack_is_stamped_as_its_whole_trace(caplog):
    model = _Keyed(9).to("meta")
    assert STAMPED in _same_trace(model, (torch.ones(4, 8, device="meta"),), caplog)
    assert list(model.layers) == [str(i) for i in range(9)]  # restored
