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


# ------------------------------------------------------------------ histc, dtypes

def _partials(strategies) -> set[str]:
    return {
        p.reduce_op
        for s in strategies
        for ps in list(s.output_placements) + list(s.input_placements) if ps is not None
        for p in ps if isinstance(p, Partial)
    }


def test_histc_with_a_fixed_range_counts_each_slice_into_a_partial_sum() -> None:
    x = TensorMeta((16, 8), torch.float32)
    labels = [str(s) for s in load_rules().strategies(aten.histc.default, (x, 4, 0, 3), {}, (2,))]
    assert labels == ["R <- R", "P(sum) <- S(0)", "P(sum) <- S(1)"]


def test_histc_over_the_data_range_stays_replicated() -> None:
    x = TensorMeta((16, 8), torch.float32)
    assert len(load_rules().strategies(aten.histc.default, (x, 4), {}, (2,))) == 1


def test_cumsum_of_bool_offers_no_sum_or_average_partial() -> None:
    x = TensorMeta((8, 4), torch.bool)
    strategies = load_rules().strategies(aten.cumsum.default, (x, 1), {}, (2,))
    assert len(strategies) > 1 and not _partials(strategies) & {"sum", "avg"}


def test_cumsum_cast_to_int32_passes_no_partial_through() -> None:
    x = TensorMeta((8, 4), torch.float32)
    rules = load_rules()
    assert _partials(rules.strategies(aten.cumsum.default, (x, 1), {"dtype": torch.int32}, (2,))) == set()
    assert _partials(rules.strategies(aten.cumsum.default, (x, 1), {}, (2,))) == {"sum", "avg"}


def test_cumprod_splits_other_dims_and_takes_no_partial() -> None:
    labels = [str(s) for s in load_rules().strategies(aten.cumprod.default, (TensorMeta((4, 8, 6), F32), 1), {}, (2,))]
    assert labels == ["R <- R", "S(0) <- S(0)", "S(2) <- S(2)"]


def test_norm_keeps_only_unreduced_dims_split() -> None:
    # |a|_2 + |b|_2 != |a + b|_2: a norm is never partial
    labels = [str(s) for s in load_rules().strategies(aten.norm.ScalarOpt_dim, (TensorMeta((4, 8, 6), F32), 2, [1], False), {}, (2,))]
    assert labels == ["R <- R", "S(0) <- S(0)", "S(1) <- S(2)"]


def test_scans_with_indices_and_order_statistics_split_only_kept_dims() -> None:
    x = TensorMeta((4, 8, 6), F32)
    rules = load_rules()
    cummax = [str(s) for s in rules.strategies(aten.cummax.default, (x, 1), {}, (2,))]
    assert cummax == ["R, R <- R", "S(0), S(0) <- S(0)", "S(2), S(2) <- S(2)"]
    kth = [str(s) for s in rules.strategies(aten.kthvalue.default, (x, 2, 1, False), {}, (2,))]
    assert kth == ["R, R <- R", "S(0), S(0) <- S(0)", "S(1), S(1) <- S(2)"]


def test_count_nonzero_of_a_split_dim_is_a_partial_count() -> None:
    labels = [str(s) for s in load_rules().strategies(aten.count_nonzero.dim_IntList, (TensorMeta((4, 8), F32), [1]), {}, (2,))]
    assert labels == ["R <- R", "S(0) <- S(0)", "P(sum) <- S(1)"]
