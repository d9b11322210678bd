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


def _partials(strategies) -> set[str]:
    return {
        p.reduce_op
        for s in strategies
        for ps in list(s.output_placements) + list(s.input_placements) if ps is not None
        for p in ps if isinstance(p, Partial)
    }


def test_new_ones_of_bool_is_only_a_max_or_min_partial() -> None:
    x = TensorMeta((4, 8), torch.bool)
    strategies = load_rules().strategies(aten.new_ones.default, (x, [8, 4]), {}, (2,))
    assert _partials(strategies) == {"max", "min"}


def test_zeros_of_int64_can_be_a_partial_sum_but_not_an_average() -> None:
    strategies = load_rules().strategies(aten.zeros.default, ([8, 4],), {"dtype": torch.int64}, (2,))
    assert _partials(strategies) == {"sum", "max", "min"}


def test_fill_tensor_follows_a_partial_value_and_never_sums_a_replicated_one() -> None:
    x, value = TensorMeta((4, 8), torch.float32), TensorMeta((), torch.float32)
    labels = [str(s) for s in load_rules().strategies(aten.fill.Tensor, (x, value), {}, (2,))]
    assert "S(1) <- S(1), R" in labels and "P(sum) <- R, P(sum)" in labels and "P(max) <- R, R" in labels
    assert "P(sum) <- R, R" not in labels  # the value is not known to be zero


def test_fill_tensor_of_an_int_tensor_takes_no_float_partial_sum() -> None:
    # each rank would truncate its piece of the value: int(0.6) + int(0.6) != int(1.2);
    # and a float -> int cast is not monotone where a piece leaves int32's range
    x, value = TensorMeta((4, 8), torch.int32), TensorMeta((), torch.float32)
    labels = [str(s) for s in load_rules().strategies(aten.fill.Tensor, (x, value), {}, (2,))]
    assert "P(sum) <- R, P(sum)" not in labels and "P(max) <- R, P(max)" not in labels
    wide = TensorMeta((4, 8), torch.int64), TensorMeta((), torch.int32)
    assert "P(max) <- R, P(max)" in [str(s) for s in load_rules().strategies(aten.fill.Tensor, wide, {}, (2,))]


def test_a_constant_near_the_dtype_range_is_never_an_average_partial() -> None:
    # an average all-reduce sums first: two copies of finfo.min overflow to -inf
    rules = load_rules()
    fmin = torch.finfo(torch.float32).min
    kinds = {str(s.output_placements[0][0]) for s in rules.strategies(aten.scalar_tensor.default, (fmin,), {"dtype": torch.float32}, (2,))}
    assert "P(avg)" not in kinds and "P(max)" in kinds
    x, mask = TensorMeta((4, 8), torch.float32), TensorMeta((4, 8), torch.bool)
    masked = {str(s.output_placements[0][0]) for s in rules.strategies(aten.masked_fill.Scalar, (x, mask, fmin), {}, (2,))}
    assert "P(avg)" not in masked and "P(avg)" in {str(s.output_placements[0][0]) for s in rules.strategies(aten.masked_fill.Scalar, (x, mask, -1.5), {}, (2,))}
