"""Diagonals: batch dims split, the two diagonal dims never; every partial passes."""

import pytest
import torch

from autoshard.rules import TensorMeta, load_rules
from autoshard.rules.compute import copy
from autoshard.rules.core import S, SingleDimStrategy
from autoshard.rules.registry import Rule
from autoshard.validation.validator import validate_rule

aten = torch.ops.aten
F32 = torch.float32
PARTIALS = {"P(sum)", "P(avg)", "P(max)", "P(min)"}


def _labels(op, args, mesh=(2,)) -> list[str]:
    return [str(s) for s in load_rules().strategies(op, args, {}, mesh)]


def test_diagonal_splits_each_batch_dim_and_passes_every_partial() -> None:
    # [2, 4, 6, 6] -> diagonal(dim1=2, dim2=3) -> [2, 4, 6]: batch dims 0 and 1
    labels = _labels(aten.diagonal.default, (TensorMeta((2, 4, 6, 6), F32), 0, 2, 3))
    assert len(labels) == 1 + 2 + 4  # all-replicate, two batch dims, four partials
    assert "S(0) <- S(0)" in labels and "S(1) <- S(1)" in labels
    assert not any("S(2)" in l or "S(3)" in l for l in labels)


def test_diagonal_with_negative_and_swapped_dims_maps_batch_dims_in_order() -> None:
    labels = _labels(aten.diagonal.default, (TensorMeta((6, 4, 2, 6), F32), 1, -1, 0))
    assert "S(0) <- S(1)" in labels and "S(1) <- S(2)" in labels and len(labels) == 7


def test_diagonal_backward_and_scatter_split_batch_dims_and_count() -> None:
    grad = TensorMeta((4, 6), F32)  # diagonal of [4, 6, 6] over dims 1, 2
    back = _labels(aten.diagonal_backward.default, (grad, [4, 6, 6], 0, 1, 2))
    assert back == ["R <- R", "S(0) <- S(0)", "P(sum) <- P(sum)", "P(avg) <- P(avg)", "P(max) <- P(max)", "P(min) <- P(min)"]
    scatter = _labels(aten.diagonal_scatter.default, (TensorMeta((4, 6, 6), F32), grad, 0, 1, 2))
    assert "S(0) <- S(0), S(0)" in scatter and len(scatter) == 6


def test_diag_embed_splits_the_input_batch_dims_only() -> None:
    # [4, 6] -> diag_embed(dim1=0, dim2=2) -> [6, 4, 6]: input dim 0 is output dim 1
    labels = _labels(aten.diag_embed.default, (TensorMeta((4, 6), F32), 0, 0, 2))
    assert "S(1) <- S(0)" in labels and len(labels) == 6


def test_diagonal_compute_is_a_view_and_the_backward_a_copy() -> None:
    rules = load_rules()
    x = TensorMeta((4, 6, 6), F32)
    assert rules.compute_kind(aten.diagonal.default, (x, 0, 1, 2)).kind == "view"
    assert rules.compute_kind(aten.diag_embed.default, (x, 0, 0, 1)).kind == "copy"


def test_validator_catches_a_split_diagonal_dim() -> None:
    real = load_rules().rule_for(aten.diagonal.default)
    wrong = Rule(aten.diagonal.default, "bad", lambda call: [SingleDimStrategy(S(call.outputs[0].ndim - 1), S(call.arg("dim1", 0) % call.inputs[0].ndim))],
                 copy(), samples=real.samples)
    assert not validate_rule(wrong, load_rules(), cases=3).ok
