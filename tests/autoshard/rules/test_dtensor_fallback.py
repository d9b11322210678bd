"""The optional DTensor fallback: off by default, checked by the check its caller gives, logged."""

import logging

import pytest
import torch

from autoshard.rules import TensorMeta, load_rules
from autoshard.rules.registry import Rule, RuleRegistry
from autoshard.validation.validator import Failure, RuleReport, check_derived_rule

aten = torch.ops.aten
X = TensorMeta((4, 8), torch.float32)


def test_fallback_is_off_by_default() -> None:
    assert len(load_rules().strategies(aten.logaddexp2.default, (X, X), {}, (2,))) == 1


def test_fallback_rule_is_validated_used_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    rules = load_rules(dtensor_fallback=check_derived_rule)
    with caplog.at_level(logging.INFO, logger="autoshard.rules"):
        strategies = rules.strategies(aten.logaddexp2.default, (X, X), {}, (2,))
    assert "S(0) <- S(0), S(0)" in [str(s) for s in strategies]
    assert rules.fallback_uses[aten.logaddexp2.default] == 1
    assert any("aten.logaddexp2.default" in r.getMessage() and "DTensor" in r.getMessage() for r in caplog.records)


def test_fallback_rule_that_fails_validation_is_rejected() -> None:
    # DTensor's group norm rule needs its N argument localised, which a raw
    # rule does not say: the validator sees the local kernel fail.
    rules = load_rules(dtensor_fallback=check_derived_rule)
    x = TensorMeta((4, 8, 6), torch.float32)
    strategies = rules.strategies(aten.native_group_norm.default, (x, None, None, 4, 8, 6, 2, 1e-5), {}, (2,))
    assert len(strategies) == 1
    assert aten.native_group_norm.default in rules._fallback.rejected


def test_the_fallback_adopts_a_rule_only_when_the_given_check_passes_it() -> None:
    seen: list[str] = []

    def refuse(rule: Rule, registry: RuleRegistry) -> RuleReport:
        seen.append(rule.family)
        report = RuleReport("refused", rule.family)
        report.failures.append(Failure((2,), "S(0) <- S(0), S(0)", "the first call", "refused by the test"))
        return report

    rules = load_rules(dtensor_fallback=refuse)
    assert len(rules.strategies(aten.logaddexp2.default, (X, X), {}, (2,))) == 1  # replicate only
    assert seen == ["dtensor"]
    assert rules._fallback.rejected[aten.logaddexp2.default].endswith("refused by the test")


def test_a_fallback_that_is_not_a_check_is_one_clear_error() -> None:
    with pytest.raises(TypeError, match="dtensor_fallback is the check a derived rule must pass"):
        load_rules(dtensor_fallback=True)
