"""Growing views (``expand``: more output elements than input) in the strategy graph: unlike
other views, the edge into one may redistribute its input (the small side), so GQA's K/V can be
gathered before ``repeat_kv``; the view still owns no memory, and a copy made on its input is
held while the view's aliases are read, at the input's bytes."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel.mesh import MeshSpec
from hw_profiles import load

from autoshard.graph.builder import build_graph
from autoshard.graph.copies import growing_view
from autoshard.graph.memory import local_bytes
from autoshard.graph.node_ids import MemoryPieceId
from autoshard.trace import trace_joint
from examples.models import llama3


@pytest.fixture(scope="module")
def graph():
    """A one-layer LLaMA with 2 K/V heads for 4 query heads (``repeat_kv`` expands K and V)."""
    model, inputs = llama3.tiny(device="meta", n_layers=1, n_heads=4, n_kv_heads=2, dim=64, seq_len=16,
                                max_seq_len=16, batch_size=2, vocab_size=64)
    return build_graph(trace_joint(model, inputs), MeshSpec((2,)), load("h100-sxm-80gb"), recompute=False)


def _edges_into(graph, target: str):
    for k, e in enumerate(graph.edges):
        v = graph.nodes[e.dst]
        if v.kind == "op" and v.target == target:
            yield k, e, graph.nodes[e.src], v


def _copies_on_matched_rows(graph, edge, u, v) -> int:
    """How many (producer, view) pairs whose producer placement some view strategy reads as it
    is still allow a redistribution (0 < cost < inf)."""
    matrix = graph.matrices[edge.matrix]
    wanted = [s.input_placements[edge.dst_input] for s in v.strategies]
    count = 0
    for a, s in enumerate(u.strategies):
        if s.output_placements[edge.src_output] in wanted:
            row = matrix[a]
            count += int(np.sum(np.isfinite(row) & (row > 0)))
    return count


def test_the_gqa_expand_grows_and_may_take_its_input_redistributed(graph) -> None:
    expands = [(e, u, v) for _, e, u, v in _edges_into(graph, "aten.expand.default")
               if e.tensor.shape[2:4] == (2, 1)]  # repeat_kv's (batch, seq, kv_heads, 1, head_dim)
    assert len(expands) == 2  # K and V
    for e, u, v in expands:
        assert growing_view(e.tensor.numel, v.outputs[0].numel)
        assert _copies_on_matched_rows(graph, e, u, v) > 0


def test_a_view_that_does_not_grow_still_reads_its_input_as_it_comes(graph) -> None:
    checked = 0
    for _, e, u, v in _edges_into(graph, "aten.unsqueeze.default"):
        assert not growing_view(e.tensor.numel, v.outputs[0].numel)
        assert _copies_on_matched_rows(graph, e, u, v) == 0
        checked += 1
    assert checked >= 2


def test_an_expand_owns_no_memory_and_a_copy_on_its_input_lives_while_its_aliases_are_read(graph) -> None:
    checked = 0
    for k, e, _, v in _edges_into(graph, "aten.expand.default"):
        assert not v.memory_bytes.any()  # the expanded bytes are never materialised by the view
        (start, end), = graph.copy_live[k]
        assert start == graph.times[v.name] and end > start + 1  # its reader (the reshape's clone) reads the alias
        bound = next(n for n in graph.nodes if n.name == str(MemoryPieceId("in", v.name)))
        held = [local_bytes(e.tensor, s.input_placements[e.dst_input], graph.mesh.shape) for s in v.strategies]
        assert bound.live == (start, end)
        assert all(b <= h for b, h in zip(bound.memory_bytes, held)) and bound.memory_bytes.any()
        assert max(bound.memory_bytes) < v.outputs[0].numel * v.outputs[0].itemsize  # the input's bytes, not the output's
        checked += 1
    assert checked >= 2
