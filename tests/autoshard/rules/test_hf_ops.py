"""Rules of the ops Hugging Face models emit beyond the core families: transformers'
grouped-matmul custom ops (registered by name) and ``aten.new_empty_strided``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autoshard.rules import NamedRule, RuleError, RuleRegistry, TensorMeta, load_rules
from autoshard.rules.core import P, R, S, SingleDimStrategy
from autoshard.rules.hf_ops import GROUPED_MM_FALLBACK, GROUPED_MM_FALLBACK_BACKWARD
from autoshard.rules.registry import Rule, op_name
from autoshard.validation.validator import select_ops, validate_rule

ROOT = Path(__file__).resolve().parents[3]
F32 = torch.float32
aten = torch.ops.aten


@pytest.fixture(scope="module")
def transformers_ops():
    """(registry, forward op, backward op) with transformers' ops defined."""
    pytest.importorskip("transformers")
    registry = load_rules()
    assert registry.define_named() == []
    ns = torch.ops.transformers
    return registry, ns.grouped_mm_fallback.default, ns.grouped_mm_fallback_backward.default


def _labels(registry, op, args, mesh=(2,)) -> list[str]:
    return [str(s) for s in registry.strategies(op, args, {}, mesh)]


X, W, OFFS = TensorMeta((16, 32), F32), TensorMeta((4, 32, 64), F32), TensorMeta((4,), torch.int64)
GRAD_OUT = TensorMeta((16, 64), F32)


def test_fallback_forward_splits_hidden_dims_never_experts_or_tokens(transformers_ops) -> None:
    registry, forward, _ = transformers_ops
    assert _labels(registry, forward, (X, W, OFFS)) == [
        "R <- R, R, R", "S(1) <- R, S(2), R", "P(sum) <- S(1), S(1), R", "P(sum) <- P(sum), R, R", "P(sum) <- R, P(sum), R",
    ]
    assert len(registry.strategies(forward, (X, W, OFFS), {}, (2, 2))) == 25  # 5 per mesh dim, product, none pruned


def test_fallback_backward_has_the_two_einsums_strategies(transformers_ops) -> None:
    registry, _, backward = transformers_ops
    assert _labels(registry, backward, (X, W, OFFS, GRAD_OUT)) == [
        "R, R <- R, R, R, R",
        "S(1), S(1) <- S(1), S(1), R, R",
        "P(sum), S(2) <- R, S(2), R, S(1)",
        "P(sum), P(sum) <- R, R, R, P(sum)",
        "P(sum), R <- R, P(sum), R, R",
        "R, P(sum) <- P(sum), R, R, R",
    ]


def test_fallback_compute_counts_both_grouped_matmuls(transformers_ops) -> None:
    registry, forward, backward = transformers_ops
    fwd = registry.compute_kind(forward, (X, W, OFFS))
    bwd = registry.compute_kind(backward, (X, W, OFFS, GRAD_OUT))
    assert fwd.kind == bwd.kind == "matmul"
    assert fwd.flops == 2 * 16 * 32 * 64 and bwd.flops == 2 * fwd.flops


@pytest.mark.parametrize("which", [GROUPED_MM_FALLBACK, GROUPED_MM_FALLBACK_BACKWARD])
def test_fallback_rules_validate_on_simulated_meshes(transformers_ops, which) -> None:
    registry, forward, backward = transformers_ops
    op = forward if which == GROUPED_MM_FALLBACK else backward
    report = validate_rule(registry.rule_for(op), registry, cases=5, seed=1)
    assert report.ok, "\n".join(str(f) for f in report.failures[:3])
    assert report.strategies_checked > 100


def test_validator_catches_tokens_split_in_the_backward(transformers_ops) -> None:
    registry, _, backward = transformers_ops
    good = registry.rule_for(backward)

    def tokens_split(call):  # offs are absolute row positions: a slice of the rows needs other offsets
        return [SingleDimStrategy((S(0), P), (S(0), R, R, S(0)))]

    bad = Rule(backward, "bad", tokens_split, good.compute, samples=good.samples)
    assert not validate_rule(bad, registry, cases=3).ok


def test_new_empty_strided_is_made_in_any_placement() -> None:
    registry = load_rules()
    x = TensorMeta((2, 4, 16, 16), F32)
    strategies = registry.strategies(aten.new_empty_strided.default, (x, [2, 4, 16, 16], [1024, 256, 16, 1]), {}, (2,))
    # R, a shard of each of the 4 dims, and the 4 partials (unset values reduce to anything); x's data is unread
    assert [str(s) for s in strategies] == [
        "R <- -", "S(0) <- -", "S(1) <- -", "S(2) <- -", "S(3) <- -",
        "P(sum) <- -", "P(avg) <- -", "P(max) <- -", "P(min) <- -",
    ]
    report = validate_rule(registry.rule_for(aten.new_empty_strided.default), registry, cases=5)
    assert report.ok and report.strategies_checked > 50


def test_loading_the_rules_imports_no_transformers() -> None:
    code = ("import sys; from autoshard.rules import load_rules; r = load_rules(); "
            "print('transformers' in sys.modules, sorted(n.name for n in r.named_rules()))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.split()[0] == "False"
    assert GROUPED_MM_FALLBACK in out and GROUPED_MM_FALLBACK_BACKWARD in out


# ------------------------------------------------------------------ rules by name

@pytest.fixture(scope="module")
def demo_op():
    """A custom op this test defines (as a library would), by the name ``autoshard_test.twice.default``."""

    @torch.library.custom_op("autoshard_test::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @twice.register_fake
    def _(x):
        return torch.empty_like(x)

    return torch.ops.autoshard_test.twice.default


def _by_name(registry: RuleRegistry, name: str, module: str = "autoshard_test_missing.ops") -> None:
    rule = registry.family("demo")

    @rule(name, compute=lambda call: None, defined_by=module)
    def twice(call):
        return [SingleDimStrategy(S(d), S(d)) for d in range(call.inputs[0].ndim)]


def test_a_rule_by_name_binds_to_the_op_when_a_graph_holds_it(demo_op) -> None:
    registry = RuleRegistry()
    _by_name(registry, "autoshard_test.twice.default")
    assert [n.name for n in registry.named_rules()] == ["autoshard_test.twice.default"]
    rule = registry.rule_for(demo_op)
    assert rule is not None and rule.op is demo_op and rule.family == "demo"
    assert registry.named_rules() == [] and registry.ops() == [demo_op]
    assert [str(s) for s in registry.strategies(demo_op, (TensorMeta((4, 6), F32),), {}, (2,))] == [
        "R <- R", "S(0) <- S(0)", "S(1) <- S(1)"]


def test_ops_lists_a_rule_by_name_once_its_op_exists(demo_op) -> None:
    registry = RuleRegistry()
    _by_name(registry, op_name(demo_op))
    _by_name(registry, "autoshard_test.never_defined.default")
    assert registry.ops() == [demo_op]
    # the library of the other one is not installed: define_named leaves it unbound, and says so
    assert registry.define_named() == ["autoshard_test.never_defined.default"]
    with pytest.raises(ValueError, match="no registered rule matches"):
        select_ops(registry, ["never_defined"], ())
    assert "demo" in registry.families()


def test_a_name_and_an_op_cannot_both_have_a_rule(demo_op) -> None:
    registry = RuleRegistry()
    _by_name(registry, op_name(demo_op))
    with pytest.raises(RuleError, match="already has a rule"):
        _by_name(registry, op_name(demo_op))
    with pytest.raises(RuleError, match="already has a rule by name"):
        registry.add(Rule(demo_op, "other", lambda call: [], lambda call: None))
    with pytest.raises(RuleError, match="needs defined_by"):
        registry.family("demo")("autoshard_test.other.default", compute=lambda call: None)(lambda call: [])
    assert isinstance(registry.named_rules()[0], NamedRule)
