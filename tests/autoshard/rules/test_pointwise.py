"""Pointwise table: broadcasting, partial groups and their reasons."""

import pytest
import torch

from autoshard.rules import load_rules
from autoshard.rules.core import OpCall, TensorMeta
from autoshard.rules.pointwise import ADDITIVE, GROUPS, broadcast_dim, pointwise_rule

aten = torch.ops.aten
F32 = torch.float32


def test_broadcast_dim_replicates_broadcast_inputs() -> None:
    assert broadcast_dim((4, 8), (8,), 1) == 0
    assert broadcast_dim((4, 8), (8,), 0) is None
    assert broadcast_dim((4, 8), (1, 8), 0) is None


def test_add_with_broadcast_bias_splits_the_bias_only_along_its_own_dim() -> None:
    x, b = TensorMeta((4, 8), F32), TensorMeta((8,), F32)
    labels = [str(s) for s in pointwise_rule(ADDITIVE)(OpCall(aten.add.Tensor, (x, b), {}, (x, b), (x,)))]
    assert labels[:2] == ["S*(0) <- S*(0), R", "S*(1) <- S*(1), S*(0)"]
    assert "P(sum) <- P(sum), R" not in labels  # the bias would be added once per rank


def test_every_group_states_its_reason_and_no_op_is_in_two_groups() -> None:
    seen = set()
    for group in GROUPS:
        assert len(group.why) > 20
        for entry in group.ops:
            assert entry.op not in seen
            seen.add(entry.op)


def test_clone_of_complex_carries_no_max_or_min_and_of_int_no_average() -> None:
    rules = load_rules()

    def outs(dtype: torch.dtype) -> set[str]:
        x = TensorMeta((4, 8), dtype)
        return {str(s.output_placements[0][0]) for s in rules.strategies(aten.clone.default, (x,), {}, (2,))}

    assert {"P(sum)", "P(avg)"} <= outs(torch.complex64) and not {"P(max)", "P(min)"} & outs(torch.complex64)
    assert outs(torch.int64) >= {"P(sum)", "P(max)"} and "P(avg)" not in outs(torch.int64)


def _to_copy_outputs(src: torch.dtype, dst: torch.dtype) -> set[str]:
    x = TensorMeta((4, 8), src)
    strategies = load_rules().strategies(aten._to_copy.default, (x,), {"dtype": dst}, (2,))
    return {str(s.output_placements[0][0]) for s in strategies}


@pytest.mark.parametrize("src,dst", [(F32, torch.int32), (torch.int64, torch.int8), (torch.int64, torch.uint8),
                                     (torch.int8, torch.uint8), (F32, torch.bool), (torch.int32, torch.bool)])
def test_to_copy_that_can_wrap_keeps_no_order_partials(src: torch.dtype, dst: torch.dtype) -> None:
    # shares [3, -1, 0, 200] and [-2, 7, -5, 100] to uint8: max then cast [3, 7, 0, 200],
    # cast then max [254, 255, 251, 200]; +inf -> int64 is INT64_MIN
    assert _to_copy_outputs(src, dst) == {"R", "S(0)", "S(1)"}


@pytest.mark.parametrize("src,dst", [(torch.int32, torch.int64), (torch.uint8, torch.int16), (torch.bool, torch.int64),
                                     (torch.int64, F32), (F32, torch.float64), (torch.float64, torch.bfloat16)])
def test_to_copy_monotone_on_the_whole_source_range_keeps_max_and_min(src: torch.dtype, dst: torch.dtype) -> None:
    assert {"P(max)", "P(min)"} <= _to_copy_outputs(src, dst)


def test_validator_catches_max_kept_through_a_wrapping_cast() -> None:
    # what the old rule (every cast to an integer type monotone) enumerated
    from costmodel.placements import Partial
    from autoshard.rules.core import OpStrategy
    from autoshard.rules.registry import SampleInput
    from autoshard.validation.validator import check_strategy

    rule = load_rules().rule_for(aten._to_copy.default)
    x = torch.tensor([3, 7, 0, 200, -5, 300])
    sample = SampleInput((x,), {"dtype": torch.uint8})
    pmax = OpStrategy(((Partial("max"),),), ((Partial("max"),),))
    msg = check_strategy(rule, sample, pmax, (2,), [x.to(torch.uint8)], torch.Generator().manual_seed(0))
    assert msg and "differ" in msg


def test_special_functions_split_only_and_deg2rad_keeps_sums() -> None:
    x = TensorMeta((4, 6), F32)
    rules = load_rules()
    for op, args in ((aten.digamma.default, (x,)), (aten.polygamma.default, (1, x)), (aten.cosh.default, (x,)),
                     (aten.special_i0e.default, (x,)), (aten.fmax.default, (x, x))):
        assert [str(s) for s in rules.strategies(op, args, {}, (2,))][-1].startswith("S(1)"), op
        assert len(rules.strategies(op, args, {}, (2,))) == 3
    assert len(rules.strategies(aten.deg2rad.default, (x,), {}, (2,))) == 5  # R, S(0), S(1), P(sum), P(avg)


def test_view_copies_and_unsafe_splits_share_their_views_strategies() -> None:
    rules = load_rules()
    x = TensorMeta((4, 6, 8), F32)
    pairs = [(aten.permute.default, aten.permute_copy.default, (x, [2, 0, 1])),
             (aten.transpose.int, aten.transpose_copy.int, (x, 0, 2)),
             (aten.split.Tensor, aten.unsafe_split.Tensor, (x, 2, 1))]
    for op, copied, args in pairs:
        assert [str(s) for s in rules.strategies(op, args, {}, (2, 2))] == [str(s) for s in rules.strategies(copied, args, {}, (2, 2))]
    assert rules.compute_kind(aten.permute_copy.default, (x, [2, 0, 1])).kind == "copy"


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int64])
def test_neg_and_add_of_integers_keep_no_order_partials(dtype: torch.dtype) -> None:
    # integers wrap: uint8 -1 is 255, int8 127 + 1 is -128; neither is monotone
    rules = load_rules()
    x = TensorMeta((4, 6), dtype)
    for op, args in ((aten.neg.default, (x,)), (aten.add.Tensor, (x, x)), (aten.sub.Tensor, (x, x))):
        outs = {str(p) for s in rules.strategies(op, args, {}, (2,)) for p in s.output_placements[0]}
        assert not outs & {"P(max)", "P(min)"}, op
        assert "P(sum)" in outs  # sums wrap alike on every rank: still exact modulo 2**bits
    assert "P(min)" in {str(s.output_placements[0][0]) for s in rules.strategies(aten.neg.default, (TensorMeta((4,), F32),), {}, (2,))}
