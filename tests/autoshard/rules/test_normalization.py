"""Normalization: statistics dims stay whole, backward gives partial weight grads."""

import torch

from costmodel.placements import Partial, Shard
from autoshard.rules import TensorMeta, load_rules
from autoshard.rules.normalization import rms_norm_backward_reference

aten = torch.ops.aten
F32 = torch.float32


def test_layer_norm_never_splits_the_normalized_dim() -> None:
    x, w = TensorMeta((4, 6, 8), F32), TensorMeta((8,), F32)
    strategies = load_rules().strategies(aten.native_layer_norm.default, (x, [8], w, w, 1e-5), {}, (2,))
    assert {s.input_placements[0] for s in strategies} >= {(Shard(0),), (Shard(1),)}
    assert (Shard(2),) not in {s.input_placements[0] for s in strategies}


def test_layer_norm_backward_of_split_rows_gives_partial_weight_gradients() -> None:
    x, w, stat = TensorMeta((4, 8), F32), TensorMeta((8,), F32), TensorMeta((4, 1), F32)
    args = (x, x, [8], stat, stat, w, w, [True, True, True])
    s = next(s for s in load_rules().strategies(aten.native_layer_norm_backward.default, args, {}, (2,)) if s.input_placements[0] == (Shard(0),))
    assert s.output_placements == ((Shard(0),), (Partial("sum"),), (Partial("sum"),))


def test_rms_norm_backward_reference_matches_autograd() -> None:
    x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    out, rstd = aten._fused_rms_norm.default(x, [8], w, 1e-6)
    g = torch.randn(4, 8, dtype=torch.float64)
    gx, gw = torch.autograd.grad(out, (x, w), g)
    rx, rw = rms_norm_backward_reference(g, x.detach(), [8], rstd.detach(), w.detach(), [True, True])
    assert torch.allclose(gx, rx) and torch.allclose(gw, rw)
