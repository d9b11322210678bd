"""A model's repeated blocks, both views of one container walk: every repeated block
(recomputation regions, pipeline cuts) and the largest stack of interchangeable ones
(stamping)."""

from __future__ import annotations

from torch import nn

from autoshard.trace.blocks import block_signature, containers, find_stack, repeated_blocks
from examples.models import llama3


class _Nested(nn.Module):
    """Two groups of three identical blocks: lists inside the blocks of an outer list."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 4)
        self.groups = nn.ModuleList(nn.ModuleDict({"layers": nn.ModuleList(nn.Linear(4, 4) for _ in range(3))})
                                    for _ in range(2))


class _Keyed(nn.Module):
    """torchtitan's layout: layers in an ``nn.ModuleDict`` keyed "0".."n-1"."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({str(i): nn.Linear(4, 4) for i in range(n)})


def test_llama3_tiny_has_its_layers_as_blocks_and_as_the_stack() -> None:
    model = llama3.tiny(device="meta", n_layers=8)[0]
    assert repeated_blocks(model) == tuple(f"layers.{i}" for i in range(8))
    stack = find_stack(model, min_blocks=8)
    assert stack is not None and stack.path == "layers" and stack.keys == tuple(map(str, range(8)))
    assert stack.prefix(3) == "layers.3"
    assert find_stack(model, min_blocks=9) is None  # too few blocks to stamp


def test_nested_lists_give_the_outermost_blocks_but_the_largest_stack_at_any_depth() -> None:
    model = _Nested()
    assert repeated_blocks(model) == ("groups.0", "groups.1")  # a block's own list is inside the block
    assert find_stack(model, min_blocks=2).path == "groups"  # the larger of the interchangeable stacks
    assert find_stack(model, min_blocks=3).path == "groups.0.layers"  # deep enough: only the inner lists
    assert [c.path for c in containers(model)] == ["groups", "groups.0", "groups.0.layers", "groups.1",
                                                   "groups.1.layers"]


def test_a_module_dict_is_a_stack_to_stamp_but_holds_no_repeated_blocks() -> None:
    model = _Keyed(4)
    assert repeated_blocks(model) == ()
    stack = find_stack(model, min_blocks=4)
    assert stack is not None and stack.path == "layers" and stack.keys == ("0", "1", "2", "3")


def test_a_list_of_different_blocks_holds_repeated_blocks_but_no_stack() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
    assert repeated_blocks(model) == ("0", "2")  # the root counts; a child without parameters is no block
    assert find_stack(model, min_blocks=2) is None  # the root is never a stack
    wrapped = nn.Module()
    wrapped.body = model
    assert repeated_blocks(wrapped) == ("body.0", "body.2")
    assert find_stack(wrapped, min_blocks=2) is None  # ReLU holds no parameters, the linears differ
    wrapped.body = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 4))
    assert find_stack(wrapped, min_blocks=2) is None


def test_a_block_with_a_buffer_or_a_hook_has_no_signature() -> None:
    assert block_signature(nn.Linear(4, 4)) is not None
    assert block_signature(nn.BatchNorm1d(4)) is None
    hooked = nn.Linear(4, 4)
    hooked.register_forward_hook(lambda *_: None)
    assert block_signature(hooked) is None
    model = nn.Module()
    model.layers = nn.ModuleList([nn.Linear(4, 4), hooked, nn.Linear(4, 4)])
    assert find_stack(model, min_blocks=3) is None
    assert repeated_blocks(model) == ("layers.0", "layers.1", "layers.2")
