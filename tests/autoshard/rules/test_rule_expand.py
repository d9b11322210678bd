"""Expansion of single-dim rules to N-D strategies and its pruning, checked
against strategy counts worked out by hand."""

from __future__ import annotations

import pytest
import torch

from costmodel.placements import Partial, Replicate, Shard, StridedShard
from autoshard.rules import RuleRegistry, TensorMeta, load_rules
from autoshard.rules.compute import elementwise
from autoshard.rules.core import P, P_MAX, R, OpCall, S, SingleDimStrategy
from autoshard.rules.expand import cast_keeps_partial, expand_rule, partial_fits
from autoshard.rules.registry import Rule

aten = torch.ops.aten
F32 = torch.float32


@pytest.fixture(scope="module")
def rules() -> RuleRegistry:
    return load_rules()


def _mm_count(rules: RuleRegistry, mesh: tuple[int, ...]) -> int:
    a, b = TensorMeta((64, 32), F32), TensorMeta((32, 16), F32)
    return len(rules.strategies(aten.mm.default, (a, b), {}, mesh))


# mm [64,32] x [32,16], per mesh dim: R, rows, cols, k-split -> P, P(A), P(B) = 6.
# 8x8: 36, minus cols on both (16 < 64) and k on both (32 < 64) = 34.
# 2x4x8: 216, minus cols on {4,8} (5 choices for mesh dim 0) and on {2,4,8} (1),
# minus k on {2,4,8} (1) = 209.
@pytest.mark.parametrize("mesh, count", [((8,), 6), ((8, 8), 34), ((2, 4, 8), 209)])
def test_mm_strategy_counts_match_hand_counts(rules: RuleRegistry, mesh: tuple[int, ...], count: int) -> None:
    assert _mm_count(rules, mesh) == count


# relu on [16, 16], per mesh dim: R, S(0), S(1), P(max), P(min) = 5.
# 2x4x8: 125, minus for each tensor dim the splits by {4,8} (4 choices for
# mesh dim 0) and by {2,4,8} (1): 125 - 2 * 5 = 115.
@pytest.mark.parametrize("mesh, count", [((8,), 5), ((8, 8), 25 - 2), ((2, 4, 8), 115)])
def test_relu_strategy_counts_match_hand_counts(rules: RuleRegistry, mesh: tuple[int, ...], count: int) -> None:
    x = TensorMeta((16, 16), F32)
    assert len(rules.strategies(aten.relu.default, (x,), {}, mesh)) == count


# add on [8, 8, 8] + [8, 8, 8] on one mesh dim of 8: R, three shards, and the
# six partial rows of the additive table.
def test_add_strategy_count_on_one_mesh_dim(rules: RuleRegistry) -> None:
    x = TensorMeta((8, 8, 8), F32)
    assert len(rules.strategies(aten.add.Tensor, (x, x), {}, (8,))) == 10


def test_add_with_a_python_scalar_never_gives_partial_sum(rules: RuleRegistry) -> None:
    x = TensorMeta((8, 8), F32)
    labels = [str(s) for s in rules.strategies(aten.add.Tensor, (x, 1.0), {}, (2,))]
    assert "P(avg) <- P(avg)" in labels and not any("P(sum)" in s for s in labels)


def test_size_one_mesh_dim_only_replicates(rules: RuleRegistry) -> None:
    x = TensorMeta((16, 16), F32)
    flat = rules.strategies(aten.relu.default, (x,), {}, (8,))
    padded = rules.strategies(aten.relu.default, (x,), {}, (1, 8))
    assert len(padded) == len(flat)
    assert all(s.output_placements[0][0] == Replicate() for s in padded)


def test_uneven_splits_only_when_allowed_and_never_empty(rules: RuleRegistry) -> None:
    ten, five = TensorMeta((10,), F32), TensorMeta((5,), F32)
    even = rules.strategies(aten.relu.default, (ten,), {}, (4,))
    uneven = rules.strategies(aten.relu.default, (ten,), {}, (4,), allow_uneven=True)
    empty = rules.strategies(aten.relu.default, (five,), {}, (4,), allow_uneven=True)  # 2, 2, 1, 0
    assert len(even) == 3 and len(uneven) == 4 and len(empty) == 3


def test_rules_that_need_even_splits_ignore_allow_uneven(rules: RuleRegistry) -> None:
    x = TensorMeta((10, 4), F32)
    strategies = rules.strategies(aten.mean.dim, (x, [0]), {}, (4,), allow_uneven=True)
    assert not any(p == (Shard(0),) for s in strategies for p in s.input_placements)


def test_strided_factors_fill_placeholders_with_strided_shards(rules: RuleRegistry) -> None:
    x = TensorMeta((8,), F32)
    labels = [str(s) for s in rules.strategies(aten.relu.default, (x,), {}, (2,), strided_factors=(2,))]
    assert "_S(0,sf=2) <- _S(0,sf=2)" in labels and "S(0) <- S(0)" in labels


def test_duplicate_single_dim_strategies_are_kept_once() -> None:
    x = TensorMeta((4, 4), F32)
    rule = Rule(aten.neg.default, "demo", lambda call: [SingleDimStrategy(S(0), S(0))] * 3 + [SingleDimStrategy(S(-2), S(0))], elementwise())
    call = OpCall(aten.neg.default, (x,), {}, (x,), (x,))
    assert [str(s) for s in expand_rule(rule, call, (2,))] == ["R <- R", "S(0) <- S(0)"]


def test_merging_reshape_turns_an_inner_shard_into_a_strided_shard(rules: RuleRegistry) -> None:
    x = TensorMeta((4, 6, 8), F32)
    labels = [str(s) for s in rules.strategies(aten.view.default, (x, [24, 8]), {}, (2,))]
    assert "_S(0,sf=4) <- S(1)" in labels and "S(0) <- S(0)" in labels and "S(1) <- S(2)" in labels


def test_reshape_strided_factor_uses_the_local_shape_after_earlier_mesh_dims(rules: RuleRegistry) -> None:
    # batch split by mesh dim 0 leaves 2 of 4 rows locally: the merge of the
    # sequence split on mesh dim 1 has split factor 2, not 4.
    x = TensorMeta((4, 6, 8), F32)
    strategies = rules.strategies(aten.view.default, (x, [24, 8]), {}, (2, 3))
    outs = {s.output_placements[0] for s in strategies if s.input_placements[0] == (Shard(0), Shard(1))}
    assert outs == {(Shard(0), StridedShard(0, 2))}


def test_splitting_reshape_turns_a_strided_shard_back_into_a_shard(rules: RuleRegistry) -> None:
    x = TensorMeta((24, 8), F32)
    labels = [str(s) for s in rules.strategies(aten.view.default, (x, [4, 6, 8]), {}, (2,))]
    assert "S(1) <- _S(0,sf=4)" in labels


def test_views_keep_every_partial(rules: RuleRegistry) -> None:
    x = TensorMeta((4, 6), F32)
    outs = {s.output_placements[0] for s in rules.strategies(aten.t.default, (x,), {}, (2,))}
    assert {(Partial(k),) for k in ("sum", "avg", "max", "min")} <= outs


# ------------------------------------------------------------------ (d) dtype


@pytest.mark.parametrize(
    "dtype, fits",
    [
        (torch.bool, {"max", "min"}),
        (torch.int32, {"sum", "max", "min"}),
        (torch.complex64, {"sum", "avg"}),
        (torch.float16, {"sum", "avg", "max", "min"}),
    ],
    ids=lambda v: ",".join(sorted(v)) if isinstance(v, set) else str(v),  # no hash order: xdist workers agree
)
def test_partial_fits_its_dtype(dtype: torch.dtype, fits: set[str]) -> None:
    assert {k for k in ("sum", "avg", "max", "min") if partial_fits(k, dtype)} == fits


def test_casts_to_integers_keep_only_order_and_to_bool_nothing() -> None:
    assert not cast_keeps_partial(torch.float32, torch.int64, "sum")
    # +inf -> INT64_MIN and out-of-range floats wrap: not monotone on the whole range
    assert not cast_keeps_partial(torch.float32, torch.int64, "min")
    assert cast_keeps_partial(torch.int32, torch.int64, "min") and not cast_keeps_partial(torch.int64, torch.int32, "max")
    assert not cast_keeps_partial(torch.int64, torch.bool, "max")
    assert cast_keeps_partial(torch.int64, torch.float32, "sum") and cast_keeps_partial(torch.float64, torch.bfloat16, "avg")


def test_expansion_drops_partials_the_dtype_cannot_carry_whatever_the_rule_says() -> None:
    # a careless rule offering every partial: the expansion keeps the ones that hold
    rule = Rule(aten.clone.default, "demo", lambda call: [SingleDimStrategy(k, k) for k in (P, P_MAX)], elementwise())
    for dtype, kept in ((torch.bool, ["P(max) <- P(max)"]), (torch.complex64, ["P(sum) <- P(sum)"])):
        x = TensorMeta((4,), dtype)
        labels = [str(s) for s in expand_rule(rule, OpCall(aten.clone.default, (x,), {}, (x,), (x,)), (2,))]
        assert labels == ["R <- R"] + kept


def test_expansion_drops_a_partial_sum_through_a_cast_to_int() -> None:
    rule = Rule(aten._to_copy.default, "demo", lambda call: [SingleDimStrategy(P, P), SingleDimStrategy(R, R)], elementwise())
    x, y = TensorMeta((4,), torch.float32), TensorMeta((4,), torch.int32)
    assert [str(s) for s in expand_rule(rule, OpCall(aten._to_copy.default, (x,), {}, (x,), (y,)), (2,))] == ["R <- R"]
