"""Reductions: kept dims stay split, reduced dims become partial."""

import torch

from costmodel.placements import Partial, Shard
from autoshard.rules import TensorMeta, load_rules

aten = torch.ops.aten
F32 = torch.float32


def _outs(op, args, mesh=(2,)):
    return {(str(s.input_placements[0][0]), str(s.output_placements[0][0])) for s in load_rules().strategies(op, args, {}, mesh)}


def test_sum_of_a_split_dim_is_a_partial_sum_and_kept_dims_move() -> None:
    pairs = _outs(aten.sum.dim_IntList, (TensorMeta((4, 8, 6), F32), [1]))
    assert ("S(1)", "P(sum)") in pairs and ("S(2)", "S(1)") in pairs


def test_mean_gives_partial_avg_and_amax_partial_max() -> None:
    assert ("S(0)", "P(avg)") in _outs(aten.mean.dim, (TensorMeta((4, 8), F32), [0]))
    assert ("S(0)", "P(max)") in _outs(aten.amax.default, (TensorMeta((4, 8), F32), [0]))


def test_index_returning_reductions_never_reduce_a_split_dim() -> None:
    pairs = _outs(aten.argmax.default, (TensorMeta((4, 8), F32), 1))
    assert ("S(1)", "S(1)") not in pairs and not any(o.startswith("P") for _, o in pairs)


def test_sum_keeps_partial_sums() -> None:
    strategies = load_rules().strategies(aten.sum.default, (TensorMeta((4, 8), F32),), {}, (2,))
    assert any(s.input_placements[0] == (Partial("sum"),) and s.output_placements[0] == (Partial("sum"),) for s in strategies)
    assert not any(s.output_placements[0] == (Shard(0),) for s in strategies)
