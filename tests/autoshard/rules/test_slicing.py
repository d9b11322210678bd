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


def test_select_scatter_splits_other_dims_with_src_dims_shifted() -> None:
    x, src = TensorMeta((4, 6, 8), F32), TensorMeta((4, 8), F32)
    labels = [str(s) for s in load_rules().strategies(aten.select_scatter.default, (x, src, 1, 2), {}, (2,))]
    assert "S(2) <- S(2), S(1)" in labels and "S(0) <- S(0), S(0)" in labels
    assert not any(label.startswith("S(1)") for label in labels)
    assert "P(sum) <- P(sum), P(sum)" in labels and "P(sum) <- P(sum), R" not in labels


def test_slice_scatter_keeps_the_scattered_dim_whole() -> None:
    x, src = TensorMeta((4, 8), F32), TensorMeta((4, 4), F32)
    labels = [str(s) for s in load_rules().strategies(aten.slice_scatter.default, (x, src, 1, 0, 8, 2), {}, (2,))]
    assert labels[:2] == ["R <- R, R", "S(0) <- S(0), S(0)"] and "S(1) <- S(1), S(1)" not in labels


def test_slice_of_complex_passes_no_max_or_min_partial() -> None:
    x = TensorMeta((4, 8), torch.complex64)
    outs = {s.output_placements[0] for s in load_rules().strategies(aten.slice.Tensor, (x, 1, 0, 4), {}, (2,))}
    assert (Partial("sum"),) in outs and not outs & {(Partial("max"),), (Partial("min"),)}
