"""Embedding and indexing: no vocab-parallel split with plain kernels."""

import torch

from costmodel.placements import Partial, Shard
from autoshard.rules import TensorMeta, load_rules

aten = torch.ops.aten


def test_embedding_splits_the_hidden_dim_or_the_tokens_never_the_vocab() -> None:
    w, idx = TensorMeta((64, 16), torch.float32), TensorMeta((4, 8), torch.long)
    strategies = load_rules().strategies(aten.embedding.default, (w, idx), {}, (2,))
    assert all(s.input_placements[0] != (Shard(0),) for s in strategies)
    assert any(s.input_placements[0] == (Shard(1),) and s.output_placements[0] == (Shard(2),) for s in strategies)


def test_embedding_backward_of_split_tokens_is_a_partial_table_gradient() -> None:
    g, idx = TensorMeta((4, 8, 16), torch.float32), TensorMeta((4, 8), torch.long)
    strategies = load_rules().strategies(aten.embedding_dense_backward.default, (g, idx, 64, -1, False), {}, (2,))
    assert any(s.input_placements == ((Shard(0),), (Shard(0),)) and s.output_placements[0] == (Partial("sum"),) for s in strategies)


def test_scatter_add_of_split_updates_into_a_partial_target_is_partial() -> None:
    x, i = TensorMeta((8, 4), torch.float32), TensorMeta((6, 4), torch.long)
    strategies = load_rules().strategies(aten.scatter_add.default, (x, 0, i, TensorMeta((6, 4), torch.float32)), {}, (2,))
    assert any(s.input_placements[1] == (Shard(0),) and s.output_placements[0] == (Partial("sum"),) for s in strategies)
