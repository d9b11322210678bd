"""cat/split/slice: only untouched dims split; partials pass through."""

import torch

from costmodel.placements import Partial, Shard
from autoshard.rules import TensorMeta, load_rules

aten = torch.ops.aten
F32 = torch.float32


def test_cat_never_splits_the_cat_dim_and_keeps_partials() -> None:
    a, b = TensorMeta((4, 6), F32), TensorMeta((4, 2), F32)
    strategies = load_rules().strategies(aten.cat.default, ([a, b], 1), {}, (2,))
    ins = {s.input_placements[0] for s in strategies}
    assert (Shard(1),) not in ins and (Shard(0),) in ins and (Partial("max"),) in ins


def test_constant_pad_with_nonzero_value_drops_partial_sum() -> None:
    x = TensorMeta((4, 6), F32)
    outs = {s.output_placements[0] for s in load_rules().strategies(aten.constant_pad_nd.default, (x, [1, 1], 2.0), {}, (2,))}
    assert (Partial("sum"),) not in outs and (Partial("avg"),) in outs and (Shard(0),) in outs
