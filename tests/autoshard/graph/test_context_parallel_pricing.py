"""The strategy graph prices context-parallel attention as ``costmodel.context_parallel`` does,
and holds the gathered K/V as the op's temporary (``autoshard.graph.builder._price_exchanges``)."""

from __future__ import annotations

import pytest

from autoshard.graph.builder import build_graph
from autoshard.rules.context_parallel import GATHER, GATHER_BALANCED, RING
from autoshard.trace import trace_joint
from costmodel.collectives import collective_time_s
from costmodel.context_parallel import AttentionShape, price_context_attention
from costmodel.mesh import MeshSpec
from examples.models import llama3
from hw_profiles import load

H100 = load("h100-sxm-80gb")
MESH = MeshSpec((2, 2), ("dp", "cp"))
SEQ = 64  # tiny LLaMA: batch 2, 4 heads (K/V expanded to 4) of 16


@pytest.fixture(scope="module")
def graph():
    traced = trace_joint(*llama3.tiny(device="meta", seq_len=SEQ))
    return build_graph(traced, MESH, H100, recompute=False)


def _attention(graph, backward: bool):
    suffix = "cpu_backward.default" if backward else "cpu.default"
    return next(n for n in graph.nodes if n.kind == "op" and n.target.endswith("flash_attention_for_" + suffix))


def _strategy(node, kind: str, text: str) -> int:
    return next(j for j, s in enumerate(node.strategies) if s.exchange == (kind, 1) and str(s).startswith(text))


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_contiguous_split_is_priced_as_the_unbalanced_all_gather(graph, backward) -> None:
    node = _attention(graph, backward)
    j = _strategy(node, GATHER, "RS(2)")  # the sequence on the cp dim, the rest replicated
    shape = AttentionShape(batch=2, heads=4, kv_heads=4, seq_len=SEQ, head_dim=16, dtype="torch.float32", itemsize=4)
    cost = price_context_attention(shape, mesh=MESH, cp_mesh_dim=1, profile=H100, causal=True,
                                   load_balanced=False, keep_gathered=False)
    expected = cost.backward_s if backward else cost.forward_s
    assert node.compute_s[j] == pytest.approx(H100.device.step_op_s + expected, rel=1e-12)


def test_the_other_mesh_dims_split_shrinks_the_priced_attention(graph) -> None:
    node = _attention(graph, False)
    whole, heads = _strategy(node, GATHER, "RS(2)"), _strategy(node, GATHER, "S(1)S(2)")
    shape = AttentionShape(batch=2, heads=2, kv_heads=2, seq_len=SEQ, head_dim=16, dtype="torch.float32", itemsize=4)
    cost = price_context_attention(shape, mesh=MESH, cp_mesh_dim=1, profile=H100, load_balanced=False,
                                   keep_gathered=False)
    assert node.compute_s[heads] == pytest.approx(H100.device.step_op_s + cost.forward_s, rel=1e-12)
    assert node.compute_s[heads] < node.compute_s[whole]


def test_balanced_split_adds_the_row_moves_to_the_balanced_price(graph) -> None:
    node = _attention(graph, False)
    j = _strategy(node, GATHER_BALANCED, "RS(2)")
    shape = AttentionShape(batch=2, heads=4, kv_heads=4, seq_len=SEQ, head_dim=16, dtype="torch.float32", itemsize=4)
    cost = price_context_attention(shape, mesh=MESH, cp_mesh_dim=1, profile=H100, load_balanced=True,
                                   keep_gathered=False)
    rows = 2 * 4 * (SEQ // 2)
    moves = sum(collective_time_s("all_to_all", float(b), (1,), MESH, H100) for b in (rows * 16 * 4,) * 2 + (rows * 4,))
    assert node.compute_s[j] == pytest.approx(H100.device.step_op_s + cost.forward_s + moves, rel=1e-12)


def test_gathered_kv_is_a_memory_bound_at_the_ops_time_only_for_context_strategies(graph) -> None:
    node = _attention(graph, False)
    bound = graph.nodes[graph.index[f"memory:in:{node.name}:99"]]
    kv_local = 2 * (2 * 4 * (SEQ // 2) * 16 * 4)  # K and V, this rank's rows
    j = _strategy(node, GATHER, "RS(2)")
    assert bound.memory_bytes[j] == 2 * kv_local  # every rank's rows gathered
    assert all(bound.memory_bytes[k] == 0 for k, s in enumerate(node.strategies) if s.exchange is None)
    assert bound.live[1] - bound.live[0] == 1
    backward = _attention(graph, True)
    k = _strategy(backward, GATHER, "RS(2)")  # gathered K/V and the dK/dV buffer of the reduce-scatter
    assert graph.nodes[graph.index[f"memory:in:{backward.name}:99"]].memory_bytes[k] == 4 * kv_local


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_ring_is_priced_as_its_passes_and_holds_two_blocks(graph, backward) -> None:
    node = _attention(graph, backward)
    j = _strategy(node, RING, "RS(2)")
    shape = AttentionShape(batch=2, heads=4, kv_heads=4, seq_len=SEQ, head_dim=16, dtype="torch.float32", itemsize=4)
    cost = price_context_attention(shape, mesh=MESH, cp_mesh_dim=1, profile=H100, causal=True,
                                   load_balanced=False, keep_gathered=False, variant="ring")
    assert node.compute_s[j] == pytest.approx(H100.device.step_op_s + (cost.backward_s if backward else cost.forward_s),
                                              rel=1e-12)
    kv_local = 2 * (2 * 4 * (SEQ // 2) * 16 * 4)  # K and V, this rank's rows
    bound = graph.nodes[graph.index[f"memory:in:{node.name}:99"]]
    # the block in hand and the one arriving (and the backward's two dK/dV accumulators), not cp blocks
    assert bound.memory_bytes[j] == (4 if backward else 2) * kv_local
