"""Reshape dim groups and view-op shard mapping."""

import torch

from costmodel.placements import Shard, StridedShard
from autoshard.rules import TensorMeta, load_rules
from autoshard.rules.views import reshape_groups

aten = torch.ops.aten
F32 = torch.float32


def test_reshape_groups_pair_dims_of_equal_products_ignoring_ones() -> None:
    assert reshape_groups((2, 3, 4), (6, 4)) == [((0, 1), (0,)), ((2,), (1,))]
    assert reshape_groups((6, 4), (4, 6)) == [((0, 1), (0, 1))]
    assert reshape_groups((1, 8, 1), (2, 4)) == [((1,), (0, 1))]


def test_head_split_keeps_the_hidden_shard_on_the_heads() -> None:
    # [B, S, H] -> [B, S, heads, head_dim]: a split hidden dim is a split of heads
    x = TensorMeta((2, 4, 32), F32)
    strategies = load_rules().strategies(aten.view.default, (x, [2, 4, 4, 8]), {}, (2,))
    assert {s.output_placements[0] for s in strategies if s.input_placements[0] == (Shard(2),)} == {(Shard(2),)}


def test_sequence_parallel_flatten_round_trip() -> None:
    rules = load_rules()
    flat = rules.strategies(aten.view.default, (TensorMeta((4, 8, 16), F32), [32, 16]), {}, (2,))
    assert any(s.input_placements[0] == (Shard(1),) and s.output_placements[0] == (StridedShard(0, 4),) for s in flat)
    back = rules.strategies(aten.view.default, (TensorMeta((32, 16), F32), [4, 8, 16]), {}, (2,))
    assert any(s.input_placements[0] == (StridedShard(0, 4),) and s.output_placements[0] == (Shard(1),) for s in back)


def test_squeeze_dim_never_splits_a_named_dim_that_stays() -> None:
    x = TensorMeta((4, 8), F32)
    strategies = load_rules().strategies(aten.squeeze.dim, (x, 1), {}, (2,))
    assert all(s.input_placements[0] != (Shard(1),) for s in strategies)


def test_expand_splits_a_broadcast_dim_with_a_replicated_input() -> None:
    x = TensorMeta((1, 8), F32)
    labels = [str(s) for s in load_rules().strategies(aten.expand.default, (x, [4, 8]), {}, (2,))]
    assert "S(0) <- R" in labels and "S(1) <- S(1)" in labels


def _partials(strategies) -> set[str]:
    return {
        p.reduce_op
        for s in strategies
        for ps in list(s.output_placements) + list(s.input_placements) if ps is not None
        for p in ps if type(p).__name__ == "Partial"
    }


def test_bool_views_and_expands_carry_no_sum_or_average() -> None:
    rules = load_rules()
    mask = TensorMeta((1, 8, 8), torch.bool)
    assert _partials(rules.strategies(aten.expand.default, (mask, [4, 8, 8]), {}, (2,))) == {"max", "min"}
    assert _partials(rules.strategies(aten.view.default, (mask, [64]), {}, (2,))) == {"max", "min"}


def test_complex_views_carry_no_max_or_min() -> None:
    rules = load_rules()
    freqs = TensorMeta((8, 4), torch.complex64)  # rotary embeddings
    assert _partials(rules.strategies(aten.view.default, (freqs, [1, 8, 1, 4]), {}, (2,))) == {"sum", "avg"}
    assert _partials(rules.strategies(aten._conj.default, (freqs,), {}, (2,))) == {"sum", "avg"}


def test_flatten_of_fewer_sequences_than_ranks_gives_strided_token_rows() -> None:
    # 2 sequences on 4 ranks: each rank holds a chunk of every sequence, rows strided by the batch
    rules = load_rules()
    tokens = TensorMeta((2, 16, 8), F32)
    flat = rules.strategies(aten.view.default, (tokens, [32, 8]), {}, (4,))
    assert {s.output_placements[0] for s in flat if s.input_placements[0] == (Shard(1),)} == {(StridedShard(0, 2),)}
    # one sequence (or one per rank of an earlier mesh dim): the rows are contiguous again
    one = rules.strategies(aten.view.default, (TensorMeta((1, 16, 8), F32), [16, 8]), {}, (4,))
    assert any(s.input_placements[0] == (Shard(1),) and s.output_placements[0] == (Shard(0),) for s in one)
    both = rules.strategies(aten.view.default, (tokens, [32, 8]), {}, (2, 4))
    assert any(s.input_placements[0] == (Shard(0), Shard(1)) and s.output_placements[0] == (Shard(0), Shard(0))
               for s in both)
