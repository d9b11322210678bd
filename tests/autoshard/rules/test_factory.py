"""Factory ops: constants as shards or partials; random ops by contract."""

import torch

from costmodel.placements import Partial
from autoshard.rules import TensorMeta, load_rules
from autoshard.rules.factory import constant_kinds

aten = torch.ops.aten


def test_zeros_can_be_any_partial_but_ones_never_a_partial_sum() -> None:
    assert Partial("sum") in constant_kinds(0) and Partial("sum") not in constant_kinds(1.0)


def test_new_zeros_does_not_read_its_input() -> None:
    x = TensorMeta((4, 8), torch.float32)
    for s in load_rules().strategies(aten.new_zeros.default, (x, [8, 4]), {}, (2,)):
        assert s.input_placements == (None,)


def test_arange_stays_replicated() -> None:
    assert len(load_rules().strategies(aten.arange.default, (16,), {"dtype": torch.long}, (2,))) == 1


def test_dropout_splits_but_never_takes_partials() -> None:
    x = TensorMeta((4, 8), torch.float32)
    strategies = load_rules().strategies(aten.native_dropout.default, (x, 0.1, True), {}, (2,))
    assert len(strategies) == 3 and not any(isinstance(p[0], Partial) for s in strategies for p in s.input_placements)
