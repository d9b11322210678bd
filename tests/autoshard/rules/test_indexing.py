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


def _zero_d(t: torch.dtype = torch.float32) -> TensorMeta:
    return TensorMeta((), t)


def test_0d_index_select_index_add_scatter_add_and_gather_enumerate_partials_only() -> None:
    # valid calls of the OpInfo samples: a 0-D self gives a 0-D result, nothing to split
    f, i1, i0 = _zero_d(), TensorMeta((1,), torch.long), _zero_d(torch.long)
    calls = [
        (aten.index_select.default, (f, 0, i1)),
        (aten.index_add.default, (f, 0, i1, f)),
        (aten.scatter_add.default, (f, 0, i0, f)),
        (aten.gather.default, (f, 0, i0)),
    ]
    for op, args in calls:
        for mesh in ((2,), (2, 2)):
            strategies = load_rules().strategies(op, args, {}, mesh, allow_uneven=True, strided_factors=(2,))
            assert len(strategies) > 1
            assert not any(isinstance(p, Shard) for s in strategies for ps in s.output_placements for p in ps)


def _labels(op, args, kwargs=None, mesh=(2,)) -> list[str]:
    return [str(s) for s in load_rules().strategies(op, args, kwargs or {}, mesh)]


def test_scatter_reduce_keeps_partials_per_reduction() -> None:
    x, i, src = TensorMeta((8, 4), torch.float32), TensorMeta((6, 4), torch.long), TensorMeta((6, 4), torch.float32)
    amax = _labels(aten.scatter_reduce.two, (x, 0, i, src, "amax"), {"include_self": True})
    # dim 1 split alike; P(max) on self, src or both; updates split along dim 0 into a P(max) target
    assert "S(1) <- S(1), S(1), S(1)" in amax and "P(max) <- P(max), S(0), S(0)" in amax and len(amax) == 7
    no_self = _labels(aten.scatter_reduce.two, (x, 0, i, src, "amax"), {"include_self": False})
    assert "P(max) <- P(max), S(0), S(0)" not in no_self and len(no_self) == 5
    total = _labels(aten.scatter_reduce.two, (x, 0, i, src, "sum"), {"include_self": True})
    assert "P(sum) <- P(sum), S(0), S(0)" in total and len(total) == 5
    assert _labels(aten.scatter_reduce.two, (x, 0, i, src, "prod"), {}) == ["R <- R, R, R", "S(1) <- S(1), S(1), S(1)"]


def test_index_reduce_splits_other_dims_and_keeps_order_partials_of_amax() -> None:
    x, i, src = TensorMeta((8, 4), torch.float32), TensorMeta((6,), torch.long), TensorMeta((6, 4), torch.float32)
    amin = _labels(aten.index_reduce.default, (x, 0, i, src, "amin"), {"include_self": True})
    assert "S(1) <- S(1), R, S(1)" in amin and "P(min) <- P(min), S(0), S(0)" in amin and len(amin) == 7
    assert len(_labels(aten.index_reduce.default, (x, 0, i, src, "mean"), {})) == 2
