"""Node ids (``autoshard.graph.node_ids``): each kind spells today's name, reads
back to itself, and every name a built graph holds parses to its node's kind."""

from __future__ import annotations

from dataclasses import replace

import pytest

from costmodel.mesh import MeshSpec
from hw_profiles import load

from autoshard.graph.builder import build_graph
from autoshard.graph.node_ids import (LOSS, TANGENT, MemoryCopyId, MemoryPieceId, OpId, StepId, TensorId,
                                      is_leaf_tensor, parse, tensor_node)
from autoshard.trace import trace_joint
from examples.models import llama3

# (id, the spelling problem and plan files have used since the formats were written)
SPELLINGS = [
    (OpId("mm_1"), "mm_1"),
    (OpId("_scaled_dot_product_flash_attention"), "_scaled_dot_product_flash_attention"),
    (TensorId("param", "layers.0.attention.wq.weight"), "param:layers.0.attention.wq.weight"),
    (TensorId("buffer", "bn.running_mean"), "buffer:bn.running_mean"),
    (TensorId("input", "tokens"), "input:tokens"),
    (TensorId("constant", "_tensor_constant0"), "constant:_tensor_constant0"),
    (TensorId("grad", "fc1.weight"), "grad:fc1.weight"),
    (TensorId("opt_temp", "fc1.weight"), "opt_temp:fc1.weight"),
    (TensorId("buffer_update", "bn.num_batches_tracked"), "buffer_update:bn.num_batches_tracked"),
    (StepId("tangent"), "tangent"),
    (StepId("loss"), "loss"),
    (MemoryPieceId("gap", "tanh_1"), "memory:gap:tanh_1"),
    (MemoryPieceId("tail", "tanh_1"), "memory:tail:tanh_1"),
    (MemoryPieceId("in", "mm_2"), "memory:in:mm_2"),
    (MemoryPieceId("in", "mm_2", 3), "memory:in:mm_2:3"),
    (MemoryPieceId("payload", "mm_7"), "memory:payload:mm_7"),
    (MemoryPieceId("waiting", "mm_7"), "memory:waiting:mm_7"),
    (MemoryCopyId("cross_entropy_loss", 0), "memory:copy:cross_entropy_loss:0"),
    (MemoryCopyId("mm_12", 1), "memory:copy:mm_12:1"),
]


@pytest.mark.parametrize("node_id, spelling", SPELLINGS, ids=[s for _, s in SPELLINGS])
def test_each_kind_spells_todays_name_and_parses_back_to_itself(node_id, spelling) -> None:
    assert str(node_id) == node_id.name == spelling
    assert parse(spelling) == node_id
    assert str(parse(spelling)) == spelling


def test_tensor_node_and_the_step_constants_match_the_types() -> None:
    assert tensor_node("param", "w") == str(TensorId("param", "w")) == "param:w"
    assert (str(TANGENT), str(LOSS)) == ("tangent", "loss")
    assert (TANGENT.kind, LOSS.kind) == ("tangent", "loss")


def test_kinds_of_the_ids_are_the_graph_node_kinds() -> None:
    assert [parse(s).kind for s in ("mm", "param:w", "grad:w", "loss", "memory:gap:mm", "memory:copy:mm:0")] == \
        ["op", "param", "grad", "loss", "memory", "memory"]


def test_a_tensor_name_with_colons_or_digits_survives() -> None:
    # a ParameterList's parameters are named by their index; an input name is whatever the caller passed
    for node_id in (TensorId("param", "0"), TensorId("param", "blocks.3"), TensorId("input", "a:b")):
        assert parse(str(node_id)) == node_id


@pytest.mark.parametrize("name", ["", "param:", "memory:", "memory:gap", "memory:gap:", "memory:copy:mm",
                                  "memory:copy:mm:x", "memory:copy::0", "memory:bogus:mm", "memory:in:mm:0",
                                  "memory:in:mm:01", "memory:copy:mm:01", "memory:gap:mm:x", "grad_x:w:y"])
def test_names_no_graph_holds_are_refused_with_one_line(name) -> None:
    with pytest.raises(ValueError, match="node id: ") as info:
        parse(name)
    assert "\n" not in str(info.value)


def test_ids_refuse_kinds_and_roles_they_do_not_know() -> None:
    for make in (lambda: TensorId("op", "w"), lambda: StepId("param"), lambda: MemoryPieceId("copy", "mm"),
                 lambda: MemoryPieceId("in", "mm", -1)):
        with pytest.raises(ValueError, match="node id: "):
            make()


def test_ids_are_frozen_slotted_and_hashable() -> None:
    node_id = MemoryPieceId("in", "mm", 2)
    with pytest.raises(AttributeError):
        node_id.part = 3  # type: ignore[misc]
    assert not hasattr(node_id, "__dict__")
    assert {node_id: 1}[MemoryPieceId("in", "mm", 2)] == 1


def test_is_leaf_tensor_is_the_parameter_input_buffer_prefix() -> None:
    assert [is_leaf_tensor(s) for s in ("param:w", "input:x", "buffer:b", "grad:w", "constant:c", "mm",
                                        "memory:in:mm", "")] == [True, True, True, False, False, False, False,
                                                                 False]


def test_every_node_name_of_a_built_graph_parses_to_its_node_kind() -> None:
    # a small device memory gives exact copy nodes; recomputation gives gap/tail pieces; buckets give payloads
    base = load("h100-sxm-80gb")
    profile = replace(base, device=replace(base.device, memory_bytes=4 * 2**20))
    traced = trace_joint(*llama3.tiny(device="meta", n_layers=2, batch_size=8, seq_len=64))
    graph = build_graph(traced, MeshSpec((4,)), profile)
    kinds = set()
    for node in graph.nodes:
        node_id = parse(node.name)
        assert str(node_id) == node.name
        assert node_id.kind == node.kind, node.name
        kinds.add(type(node_id).__name__ + (":" + node_id.role if isinstance(node_id, MemoryPieceId) else ""))
    # the graph really has the kinds the test is about
    assert {"OpId", "TensorId", "StepId", "MemoryCopyId", "MemoryPieceId:in"} <= kinds, kinds
    assert {"MemoryPieceId:gap", "MemoryPieceId:tail"} & kinds or not graph.regions
