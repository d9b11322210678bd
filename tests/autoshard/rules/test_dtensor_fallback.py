"""The optional DTensor fallback: off by default, validated, logged."""

import logging

import pytest
import torch

from autoshard.rules import TensorMeta, load_rules

aten = torch.ops.aten
X = TensorMeta((4, 8), torch.float32)


def test_fallback_is_off_by_default() -> None:
    assert len(load_rules().strategies(aten.logaddexp2.default, (X, X), {}, (2,))) == 1


def test_fallback_rule_is_validated_used_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    rules = load_rules(dtensor_fallback=True)
    with caplog.at_level(logging.INFO, logger="autoshard.rules"):
        strategies = rules.strategies(aten.logaddexp2.default, (X, X), {}, (2,))
    assert "S(0) <- S(0), S(0)" in [str(s) for s in strategies]
    assert rules.fallback_uses[aten.logaddexp2.default] == 1
    assert any("aten.logaddexp2.default" in r.getMessage() and "DTensor" in r.getMessage() for r in caplog.records)


def test_fallback_rule_that_fails_validation_is_rejected() -> None:
    # DTensor's group norm rule needs its N argument localised, which a raw
    # rule does not say: the validator sees the local kernel fail.
    rules = load_rules(dtensor_fallback=True)
    x = TensorMeta((4, 8, 6), torch.float32)
    strategies = rules.strategies(aten.native_group_norm.default, (x, None, None, 4, 8, 6, 2, 1e-5), {}, (2,))
    assert len(strategies) == 1
    assert aten.native_group_norm.default in rules._fallback.rejected
