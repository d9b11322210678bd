"""Losses: what a batch split gives for each reduction."""

import torch

from costmodel.placements import Partial, Shard
from autoshard.rules import TensorMeta, load_rules

aten = torch.ops.aten
F32 = torch.float32
X, T = TensorMeta((8, 10), F32), TensorMeta((8,), torch.long)


def _batch_outputs(op, args) -> set:
    return {s.output_placements[0] for s in load_rules().strategies(op, args, {}, (2,)) if s.input_placements[0] == (Shard(0),)}


def test_nll_forward_batch_split_is_partial_for_sum_and_absent_for_mean() -> None:
    assert _batch_outputs(aten.nll_loss_forward.default, (X, T, None, 2, -100)) == {(Partial("sum"),)}
    assert _batch_outputs(aten.nll_loss_forward.default, (X, T, None, 1, -100)) == set()


def test_nll_backward_splits_the_batch_for_every_reduction() -> None:
    g, tw = TensorMeta((), F32), TensorMeta((), F32)
    for red in (1, 2):
        strategies = load_rules().strategies(aten.nll_loss_backward.default, (g, X, T, None, red, -100, tw), {}, (2,))
        assert any(s.input_placements[1] == (Shard(0),) and s.output_placements[0] == (Shard(0),) for s in strategies)


def test_mse_mean_backward_is_not_split() -> None:
    g, x = TensorMeta((), F32), TensorMeta((8, 4), F32)
    outs = {s.output_placements[0] for s in load_rules().strategies(aten.mse_loss_backward.default, (g, x, x, 1), {}, (2,))}
    assert not any(isinstance(p[0], Shard) for p in outs)


def test_a_batch_split_of_the_mse_mean_backward_is_caught_by_the_validator() -> None:
    """Why traces rewrite the mean as sum kernels (autoshard.trace.DEFAULT_DECOMPOSITIONS):
    the mean kernel on a 1/k slice divides by the slice's count, k times the gradient;
    the same split of the sum kernel is exact."""
    from autoshard.rules.compute import elementwise
    from autoshard.rules.core import R, S, SingleDimStrategy
    from autoshard.rules.registry import Rule
    from autoshard.validation.validator import validate_rule

    registry = load_rules()
    base = registry.rule_for(aten.mse_loss_backward.default)

    def split(reduction: int) -> Rule:
        def fn(call):
            return [SingleDimStrategy(S(0), (R, S(0), S(0)))] if int(call.arg("reduction", 1)) == reduction else []

        def samples(sampler):
            return (s for s in base.samples(sampler) if s.args[-1] == reduction)

        return Rule(aten.mse_loss_backward.default, "split", fn, elementwise(4), samples=samples, uneven=False)

    assert not validate_rule(split(1), registry, cases=4).ok
    report = validate_rule(split(2), registry, cases=4)
    assert report.ok and report.strategies_checked > 0
