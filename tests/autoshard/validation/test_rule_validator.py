"""The numerical validator: it passes every registered rule, catches wrong
rules, splits partial inputs correctly, and its report lists the failures
(the command, ``autoshard validate-rules``: tests/autoshard/cli/test_validate_rules.py)."""

from __future__ import annotations

import pytest
import torch

from costmodel import simulate
from costmodel.placements import Partial, Replicate, Shard
from autoshard.rules import load_rules
from autoshard.rules.compute import elementwise, reduction
from autoshard.rules.core import P, P_MAX, P_MIN, R, S, SingleDimStrategy
from autoshard.rules.registry import Rule
from autoshard.rules.samples import VARIANTS
from autoshard.validation.validator import distribute, format_reports, validate_rule

aten = torch.ops.aten
REGISTRY = load_rules()


@pytest.mark.parametrize("op", REGISTRY.ops(), ids=str)
def test_validator_passes_registered_rule(op: torch._ops.OpOverload) -> None:
    report = validate_rule(REGISTRY.rule_for(op), REGISTRY, cases=5, seed=7)
    assert report.ok, "\n".join(str(f) for f in report.failures[:3])
    assert report.strategies_checked > 0 or op is aten._assert_async.msg


@pytest.mark.parametrize("reduce_op", ["sum", "avg", "max", "min"])
def test_partial_inputs_are_random_pieces_that_reduce_to_the_value(reduce_op: str) -> None:
    x = torch.randn(6, 4, dtype=torch.float64)
    placements = (Partial(reduce_op), Shard(1))
    locals_ = distribute(x, placements, (3, 2), torch.Generator().manual_seed(0))
    assert torch.allclose(simulate.unshard(locals_, placements, (3, 2)), x)
    assert not torch.equal(locals_[(0, 0)], locals_[(1, 0)])


def test_replicas_hold_identical_pieces_of_a_later_partial_mesh_dim() -> None:
    x = torch.randn(4, dtype=torch.float64)
    locals_ = distribute(x, (Replicate(), Partial("sum")), (2, 2), torch.Generator().manual_seed(1))
    assert torch.equal(locals_[(0, 1)], locals_[(1, 1)])


def _bad(op, fn, compute=None) -> Rule:
    return Rule(op, "bad", fn, compute or elementwise(), samples=REGISTRY.rule_for(op).samples)


@pytest.mark.parametrize(
    "rule",
    [
        # relu is not linear: relu(a) + relu(b) != relu(a + b)
        _bad(aten.relu.default, lambda call: [SingleDimStrategy(P, P)]),
        # the rows of A give the rows of C, not its columns
        _bad(aten.mm.default, lambda call: [SingleDimStrategy(S(1), (S(0), R))]),
        # softmax needs the whole row it normalizes
        _bad(aten._softmax.default, lambda call: [SingleDimStrategy(S(call.arg("dim")), S(call.arg("dim")))]),
        # a reduced dim cannot stay split
        _bad(aten.sum.default, lambda call: [SingleDimStrategy(S(0), S(0))], reduction()),
        # merging [B, S] with S split is a strided shard, not a plain one
        Rule(aten.view.default, "bad", lambda call: [SingleDimStrategy(S(0), S(1))] if call.inputs[0].ndim > call.outputs[0].ndim else [],
             elementwise(), samples=lambda s: iter([__import__("autoshard.rules.registry", fromlist=["SampleInput"]).SampleInput((torch.randn(4, 6, 2, dtype=torch.float64), [24, 2]), {})]),
             localize=REGISTRY.rule_for(aten.view.default).localize, uneven=False),
        # adding a replicated bias to a partial sum counts the bias once per rank
        _bad(aten.add.Tensor, lambda call: [SingleDimStrategy(P, (P, R))] if len(call.inputs) == 2 else []),
    ],
    ids=["relu-partial", "mm-rows-as-cols", "softmax-split-dim", "sum-keeps-split", "view-merge-plain", "add-replicated-bias"],
)
def test_validator_catches_a_deliberately_wrong_rule(rule: Rule) -> None:
    report = validate_rule(rule, REGISTRY, cases=4)
    assert not report.ok


def test_validator_reports_a_rule_without_samples_as_skipped() -> None:
    rule = Rule(aten.neg.default, "demo", lambda call: [], elementwise(), note="no CPU kernel")
    report = validate_rule(rule, REGISTRY)
    assert report.skipped == "no CPU kernel" and report.ok


def test_format_reports_lists_failures_after_the_table() -> None:
    report = validate_rule(_bad(aten.relu.default, lambda call: [SingleDimStrategy(P, P)]), REGISTRY, cases=2)
    text = format_reports([report])
    assert text.splitlines()[1].endswith("FAIL") and "FAIL aten.relu.default: mesh" in text


# ------------------------------------------------------------------ dtypes and extreme values


def test_validator_checks_bool_int_complex_half_and_extreme_variants() -> None:
    report = validate_rule(REGISTRY.rule_for(aten.clone.default), REGISTRY, cases=5, seed=7)
    # one sample per case, each case another variant kind (VARIANTS), all taken by clone
    assert report.ok and report.variants_checked == 5 == len(VARIANTS)


def test_variants_the_op_rejects_are_skipped_not_failed() -> None:
    # _softmax takes no integer, bool or complex input
    report = validate_rule(REGISTRY.rule_for(aten._softmax.default), REGISTRY, cases=5, seed=7)
    assert report.ok and report.variants_rejected > 0 and report.variants_checked > 0


@pytest.mark.parametrize(
    "rule",
    [
        # |x| is monotone on bools and unsigned ints only: a rule that assumes
        # integers are counts is wrong for negative ints, never seen by float samples
        _bad(aten.abs.default, lambda call: [SingleDimStrategy(P_MAX, P_MAX)] if not call.inputs[0].dtype.is_floating_point else []),
        # sgn(z) = z/|z| is not linear on complex numbers
        _bad(aten.sgn.default, lambda call: [SingleDimStrategy(P, P)] if call.inputs[0].dtype.is_complex else []),
    ],
    ids=["abs-monotone-on-ints", "sgn-linear-on-complex"],
)
def test_validator_catches_a_rule_wrong_only_for_some_dtype(rule: Rule) -> None:
    report = validate_rule(rule, REGISTRY, cases=5)
    assert not report.ok and all("variant]" in f.sample for f in report.failures)


def test_max_partial_of_minus_inf_and_finfo_min_reduces_to_the_value() -> None:
    x = torch.tensor([float("-inf"), torch.finfo(torch.float32).min, 1.0])
    for reduce_op in ("max", "min"):
        locals_ = distribute(x, (Partial(reduce_op),), (3,), torch.Generator().manual_seed(0))
        assert torch.equal(simulate.unshard(locals_, (Partial(reduce_op),), (3,)), x)


def test_extreme_values_pass_a_correct_masking_rule_and_still_catch_a_wrong_one() -> None:
    # masked_fill(x, mask, -inf) / softmax over -inf and finfo.min: no false alarm
    for op in (aten.masked_fill.Scalar, aten._softmax.default, aten.amax.default):
        report = validate_rule(REGISTRY.rule_for(op), REGISTRY, cases=5, seed=11)
        assert report.ok, "\n".join(str(f) for f in report.failures[:3])
    wrong = _bad(aten.amax.default, lambda call: [SingleDimStrategy(P_MIN, S(0))], reduction())
    assert not validate_rule(wrong, REGISTRY, cases=5, seed=11).ok
