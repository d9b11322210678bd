"""Convolution splits like a matmul over channels."""

import torch

from costmodel.placements import Partial, Shard
from autoshard.rules import TensorMeta, load_rules

aten = torch.ops.aten
F32 = torch.float32


def test_conv_splits_batch_out_and_in_channels_with_a_partial_bias() -> None:
    x, w, b = TensorMeta((4, 8, 6, 6), F32), TensorMeta((16, 8, 3, 3), F32), TensorMeta((16,), F32)
    args = (x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    strategies = load_rules().strategies(aten.convolution.default, args, {}, (2,))
    ins_out = {(tuple(str(p[0]) for p in s.input_placements), str(s.output_placements[0][0])) for s in strategies}
    assert (("S(0)", "R", "R"), "S(0)") in ins_out
    assert (("R", "S(0)", "S(0)"), "S(1)") in ins_out
    assert (("S(1)", "S(1)", "P(sum)"), "P(sum)") in ins_out


def test_grouped_conv_keeps_the_batch_split_only() -> None:
    x, w = TensorMeta((4, 8, 6, 6), F32), TensorMeta((16, 4, 3, 3), F32)
    args = (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 2)
    outs = {s.output_placements[0] for s in load_rules().strategies(aten.convolution.default, args, {}, (2,))}
    assert (Shard(1),) not in outs and (Shard(0),) in outs and (Partial("sum"),) in outs
