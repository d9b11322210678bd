"""Hugging Face models trace as their users have them: no wrapper, no patch.

Each tiny ``examples.models.hf`` factory is traced once per module; its joint
graph must compute eager autograd's loss and gradients (tied weights: the
gradient of the one shared Parameter), and every op in it must have a
sharding rule: the ATen ops, and ``transformers``' own custom ops
(``transformers.grouped_mm_fallback*``, the expert kernel of fp32 MoE
models, whose rules are registered by name: ``autoshard.rules.hf_ops``).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from autoshard.validation.coverage import compute_coverage  # noqa: E402
from autoshard.rules import load_rules  # noqa: E402
from autoshard.trace import DataDependentError, TraceError, run_joint, trace_joint  # noqa: E402
from examples.models import hf  # noqa: E402

# (factory, overrides): decoder-only models in both attention implementations, encoder, encoder-decoders
# (text, speech), MoE models (fp32: transformers' grouped-mm fallback ops; bf16: aten._grouped_mm)
CASES = [
    ("hf_llama", {"attn_implementation": "sdpa"}), ("hf_llama", {"attn_implementation": "eager"}),
    ("hf_mistral", {"attn_implementation": "sdpa"}), ("hf_mistral", {"attn_implementation": "eager"}),
    ("hf_gpt2", {"attn_implementation": "sdpa"}), ("hf_gpt2", {"attn_implementation": "eager"}),
    ("hf_bert", {}), ("hf_t5", {}), ("hf_whisper", {}), ("hf_falcon", {}),
    ("hf_mixtral", {}), ("hf_mixtral", {"dtype": "bfloat16"}), ("hf_qwen3_moe", {}), ("hf_deepseek_v3", {}),
]
IDS = [f"{name}-{'-'.join(map(str, kw.values())) or 'default'}" for name, kw in CASES]


@pytest.fixture(scope="module")
def traced_hf():
    """``traced_hf(name, overrides)`` -> ``(model, inputs, traced)``, traced once per module."""
    cache = {}

    def get(name, overrides):
        key = (name, tuple(sorted(overrides.items())))
        if key not in cache:
            model, inputs = getattr(hf, name)(**overrides)
            cache[key] = (model, inputs, trace_joint(model, inputs))
        return cache[key]

    return get


@pytest.mark.parametrize("name,overrides", CASES, ids=IDS)
def test_joint_graph_matches_eager_loss_and_every_gradient(name, overrides, traced_hf):
    model, inputs, traced = traced_hf(name, overrides)
    values = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    result = run_joint(traced, values, inputs)
    model.zero_grad()
    loss = model(**inputs).loss
    loss.backward()
    tolerance = {"rtol": 2e-2, "atol": 2e-2} if overrides.get("dtype") == "bfloat16" else {}
    torch.testing.assert_close(result.loss, loss.detach(), **tolerance)
    assert set(result.grads) == {fqn for fqn, _ in model.named_parameters()}
    for fqn, param in model.named_parameters():
        torch.testing.assert_close(result.grads[fqn], param.grad, msg=fqn, **tolerance)


@pytest.mark.parametrize("name,overrides", CASES, ids=IDS)
def test_every_op_has_a_rule(name, overrides, traced_hf):
    _, _, traced = traced_hf(name, overrides)
    report = compute_coverage(traced, load_rules(), model=name)
    assert report.ops and all(row.covered for row in report.ops), [row.op for row in report.ops if not row.covered]


def test_moe_experts_are_the_experts_stand_in_which_has_rules(traced_hf):
    _, _, traced = traced_hf("hf_qwen3_moe", {})  # autoshard.trace.experts: one node each way per layer
    ops = {str(info.op) for info in traced.nodes.values()}
    assert {"autoshard.experts.default", "autoshard.experts_backward.default"} <= ops


def test_tensor_constants_of_whisper_are_listed(traced_hf):
    # Falcon's graph held four with the transformers CI installed in 2026-11, and none with 5.25
    _, _, traced = traced_hf("hf_whisper", {})
    assert len(traced.constants) == 1


@pytest.mark.parametrize(
    "name,tied",
    [("hf_gpt2", {"transformer.wte.weight": ("lm_head.weight",)}),
     ("hf_bert", {"bert.embeddings.word_embeddings.weight": ("cls.predictions.decoder.weight",),
                  "cls.predictions.bias": ("cls.predictions.decoder.bias",)}),
     ("hf_t5", {"shared.weight": ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight")})],
)
def test_tied_parameter_is_one_input_named_first_with_its_aliases(name, tied, traced_hf):
    model, _, traced = traced_hf(name, {})
    assert list(traced.params) == [fqn for fqn, _ in model.named_parameters()]
    assert dict(traced.param_aliases) == tied
    for fqn in tied:
        assert traced.grads[fqn] is not None, fqn


def test_t5_shared_embedding_gets_the_gradient_of_all_four_uses(traced_hf):
    model, inputs, traced = traced_hf("hf_t5", {})
    everything = {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers())}
    result = run_joint(traced, everything, inputs)
    model.zero_grad()
    model(**inputs).loss.backward()
    torch.testing.assert_close(result.grads["shared.weight"], model.shared.weight.grad)
    assert model.lm_head.weight is model.shared.weight  # the eager reference really is tied


def test_default_config_with_kv_cache_and_sdpa_traces():
    # as loaded, a causal LM has use_cache=True: the cache is built inside forward and must trace too
    model, inputs = hf.hf_llama(use_cache=True, num_hidden_layers=1)
    traced = trace_joint(model, inputs)
    assert list(traced.inputs) == ["input_ids", "labels"]


def test_output_without_loss_names_the_missing_labels():
    model, inputs = hf.hf_llama(num_hidden_layers=1, device="meta")
    with pytest.raises(TraceError, match="no loss tensor.*pass the labels"):
        trace_joint(model, {"input_ids": inputs["input_ids"]})


def test_eager_mixtral_experts_are_one_data_dependent_line():
    model, inputs = hf.hf_mixtral(num_hidden_layers=1, experts_implementation="eager", device="meta")
    with pytest.raises(DataDependentError) as info:
        trace_joint(model, inputs)
    message = str(info.value)
    assert "\n" not in message
    assert "aten.nonzero.default" in message and "modeling_mixtral.py:" in message
    assert "experts_implementation" in message


def test_unknown_override_lists_config_fields():
    with pytest.raises(ValueError, match=r"unknown override\(s\) n_layers;.*num_hidden_layers"):
        hf.hf_llama(n_layers=1)


def test_factories_build_on_meta_without_allocating():
    model, inputs = hf.hf_llama3_8b()
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert round(sum(p.numel() for p in model.parameters()) / 1e9, 2) == 8.03
    assert inputs["input_ids"].shape == (64, 2048)
