"""Every strategy of every distinct real call of the example and Hugging Face
tiny models reproduces the unsharded op on meshes 2, 4 and 2x2.

The calls are the real ones (the traced shapes, dtypes and arguments, never
shrunk), run on the values the joint graph really feeds them (captured from a
run on the model's parameters and inputs), plus random finite tensors where
the captured ones hold masks of ``-inf``/``finfo.min`` (there sum partials are
not exact, so they are checked on the random ones). A call already checked
for an earlier model is not checked again. Every strategy is checked: none is
sampled away.
"""

from __future__ import annotations

import importlib
import logging

import pytest
import torch

from autoshard.rules import RuleRegistry, load_rules
from autoshard.rules.compute import elementwise
from autoshard.rules.core import S, SingleDimStrategy
from autoshard.validation.call_inputs import distinct_calls, synthesize
from autoshard.validation.real_calls import MESHES, RealCallReport, validate_model, validate_traced
from autoshard.rules.registry import Rule
from autoshard.trace import trace_joint

aten = torch.ops.aten

EXAMPLES = [("examples.models.mlp", "tiny", {}), ("examples.models.gpt2", "tiny", {}),
            ("examples.models.llama3", "tiny", {}), ("examples.models.moe", "tiny", {})]
HF = [("hf_llama", {}), ("hf_llama", {"attn_implementation": "eager"}), ("hf_mistral", {}), ("hf_gpt2", {}),
      ("hf_bert", {}), ("hf_t5", {}), ("hf_mixtral", {}), ("hf_mixtral", {"dtype": "bfloat16"})]


@pytest.fixture(scope="module")
def suite():
    """One registry and one set of checked calls for the whole module (shared calls are checked once)."""
    logging.getLogger("autoshard.rules").setLevel(logging.ERROR)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    return load_rules(), set()


def _check(label: str, model, inputs, suite, capsys) -> RealCallReport:
    registry, seen = suite
    report = validate_model(model, inputs, MESHES, registry=registry, seen=seen, label=label)
    with capsys.disabled():
        print("\n" + report.summary().splitlines()[0])
        for call, why in report.skipped:
            print(f"  skipped {call}: {why}")
    assert not report.failures, "\n".join(str(f) for f in report.failures[:10])
    assert not report.skipped and not report.unchecked, report.summary()
    assert report.strategies_checked == report.strategies
    return report


@pytest.mark.parametrize("module,factory,overrides", EXAMPLES, ids=[m.rsplit(".", 1)[1] for m, _, _ in EXAMPLES])
def test_example_model_real_calls_pass_every_strategy(module, factory, overrides, suite, capsys):
    model, inputs = getattr(importlib.import_module(module), factory)(**overrides)
    report = _check(module.rsplit(".", 1)[1], model, inputs, suite, capsys)
    assert report.calls > 0 and report.strategies_checked > 0


@pytest.mark.parametrize("name,overrides", HF, ids=[f"{n}-{'-'.join(map(str, kw.values())) or 'default'}" for n, kw in HF])
def test_hf_model_real_calls_pass_every_strategy(name, overrides, suite, capsys):
    pytest.importorskip("transformers")
    from examples.models import hf

    model, inputs = getattr(hf, name)(**overrides)
    report = _check(name, model, inputs, suite, capsys)
    # transformers' own fp32 expert kernel is no ATen op: replicate-only, reported, not checked
    assert set(report.no_rule) <= {"transformers.grouped_mm_fallback.default",
                                   "transformers.grouped_mm_fallback_backward.default"}


def test_a_wrong_rule_is_caught_on_a_real_call():
    from examples.models import mlp

    model, inputs = mlp.tiny()
    good = load_rules()
    registry = RuleRegistry()
    for op in good.ops():
        rule = good.rule_for(op)
        if op is aten.relu.default:  # claims relu of a row shard is a column shard
            rule = Rule(op, "bad", lambda call: [SingleDimStrategy(S(1), S(0))], elementwise(), samples=rule.samples)
        registry.add(rule)
    report = validate_model(model, inputs, [(2,)], registry=registry)
    assert report.failures and {f.op for f in report.failures} == {"aten.relu.default"}
    assert report.wrong_strategies >= 1


def test_synthesized_samples_are_valid_real_shaped_calls():
    from examples.models import llama3

    traced = trace_joint(*llama3.tiny(device="meta"))
    calls, nodes = distinct_calls(traced)
    assert nodes >= len(calls) > 0
    embedding = next(c for c in calls if c.op is aten.embedding.default)
    weight, indices = synthesize(embedding).args[:2]
    assert tuple(weight.shape) == embedding.args[0].shape and indices.dtype == torch.int64
    assert 0 <= int(indices.min()) and int(indices.max()) < weight.shape[0]
    # a model on meta has no values to capture: every call is synthesized
    report = validate_traced(traced, [(2,)], synthesized=True)
    assert report.ok and not report.skipped and report.samples == {"synthesized": report.calls}
