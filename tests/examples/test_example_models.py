"""The example models: factories, configs, shapes, losses, and MoE routing."""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from examples.models import llama3, moe

# (module, factory) for every factory the examples ship
FACTORIES = [
    ("mlp", "tiny"), ("mlp", "small"),
    ("gpt2", "tiny"), ("gpt2", "gpt2_small"),
    ("llama3", "tiny"), ("llama3", "llama3_1b"), ("llama3", "llama3_8b"), ("llama3", "llama3_70b"),
    ("moe", "tiny"), ("moe", "small"),
    ("convnet", "tiny"), ("convnet", "small"),
    ("vit", "tiny"), ("vit", "vit_base"),
]
TINY = sorted({name for name, _ in FACTORIES})


def _factory(module: str, name: str):
    return getattr(importlib.import_module(f"examples.models.{module}"), name)


@pytest.mark.parametrize("module,name", FACTORIES)
def test_every_factory_builds_on_meta_with_inputs_on_meta(module, name):
    model, inputs = _factory(module, name)(device="meta")
    assert all(p.device.type == "meta" for p in model.parameters())
    assert all(b.device.type == "meta" for b in model.buffers())
    assert inputs and all(x.device.type == "meta" for x in inputs)


@pytest.mark.parametrize("module", TINY)
def test_tiny_forward_gives_a_finite_scalar_loss_and_a_grad_for_every_param(module):
    model, inputs = _factory(module, "tiny")()
    loss = model(*inputs)
    assert loss.shape == () and torch.isfinite(loss)
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing


@pytest.mark.parametrize("module", TINY)
def test_tiny_is_deterministic_and_keeps_the_global_rng_state(module):
    state = torch.random.get_rng_state()
    (m1, x1), (m2, x2) = _factory(module, "tiny")(), _factory(module, "tiny")()
    assert torch.equal(torch.random.get_rng_state(), state)
    for (name, p1), p2 in zip(m1.named_parameters(), m2.parameters()):
        assert torch.equal(p1, p2), name
    assert all(torch.equal(a, b) for a, b in zip(x1, x2))


def test_unknown_override_is_a_value_error_listing_valid_names():
    with pytest.raises(ValueError, match=r"unknown override\(s\) n_layer;.*n_layers"):
        llama3.tiny(n_layer=3)


@pytest.mark.parametrize(
    "overrides,message",
    [({"n_heads": 3}, "must divide dim"), ({"n_kv_heads": 3}, "n_kv_heads"), ({"seq_len": 1000}, "max_seq_len"),
     ({"batch_size": 0}, "batch_size"), ({"dtype": "int8"}, "dtype")],
)
def test_invalid_llama_config_is_a_value_error_naming_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        llama3.tiny(**overrides)


def test_llama3_presets_have_the_published_shapes():
    model, (tokens, _) = llama3.llama3_8b()
    layer = model.layers[0]
    assert tuple(layer.feed_forward.w1.weight.shape) == (14336, 4096)
    assert tuple(layer.attention.wk.weight.shape) == (8 * 128, 4096)
    assert sum(p.numel() for p in model.parameters()) == 8_030_261_248
    model70, _ = llama3.llama3_70b()
    assert tuple(model70.layers[0].feed_forward.w1.weight.shape) == (28672, 8192)
    assert len(model70.layers) == 80


def test_tie_embeddings_shares_the_embedding_with_the_head():
    tied, _ = llama3.tiny(tie_embeddings=True)
    untied, _ = llama3.tiny()
    assert tied.output is None and untied.output is not None
    names = {n for n, _ in tied.named_parameters()}
    assert "tok_embeddings.weight" in names and not any(n.startswith("output") for n in names)


def test_dtype_override_applies_to_parameters_and_float_inputs():
    model, (images, labels) = _factory("vit", "tiny")(dtype="bfloat16", device="meta")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert images.dtype == torch.bfloat16 and labels.dtype == torch.long


def test_moe_routing_respects_top_k_and_capacity():
    torch.manual_seed(0)
    tokens, experts, top_k, capacity = 32, 4, 2, 10
    dispatch, combine, probs = moe.route_top_k(torch.randn(tokens, experts), top_k, capacity)
    assert dispatch.shape == (tokens, experts, capacity)
    assert dispatch.sum(dim=(1, 2)).max() <= top_k            # each token sits in at most k slots
    assert dispatch.sum(dim=0).max() <= 1                     # each slot holds at most one token
    assert (dispatch.sum(dim=(0, 2)) <= capacity).all()        # no expert over capacity
    kept = dispatch.sum(dim=(1, 2)) == top_k
    torch.testing.assert_close(combine.sum(dim=(1, 2))[kept], torch.ones(int(kept.sum())))
    torch.testing.assert_close(probs.sum(dim=-1), torch.ones(tokens))


@pytest.mark.parametrize("groups", [1, 4])
def test_moe_with_ample_capacity_equals_dense_top_k_mixture(groups):
    # capacity_factor = n_experts: every expert could take every token, nothing overflows (in any group)
    model, _ = moe.tiny(n_layers=1, n_experts=4, capacity_factor=4.0, n_groups=groups)
    block = model.layers[0].moe
    x = torch.randn(2, 16, 32)
    out, _ = block(x)
    # reference: every token through its top-k experts, mixed by softmax over the chosen logits
    flat = x.flatten(0, 1)
    top_logits, top_index = block.router(flat).topk(block.top_k, dim=-1)
    weights = top_logits.softmax(dim=-1)
    expected = torch.zeros_like(flat)
    for t in range(flat.shape[0]):
        for j in range(block.top_k):
            e = int(top_index[t, j])
            hidden = torch.nn.functional.silu(flat[t] @ block.w1[e]) * (flat[t] @ block.w3[e])
            expected[t] += weights[t, j] * (hidden @ block.w2[e])
    torch.testing.assert_close(out.flatten(0, 1), expected, rtol=1e-4, atol=1e-5)


def test_moe_groups_route_on_their_own_and_must_divide_the_tokens():
    torch.manual_seed(0)
    model, _ = moe.tiny(n_layers=1, n_experts=4, n_groups=2, capacity_factor=0.5)
    block, x = model.layers[0].moe, torch.randn(2, 16, 32)
    out, _ = block(x)  # two groups of 16 tokens: each sequence, with its own capacity (tokens overflow)
    block.n_groups = 1
    torch.testing.assert_close(out, torch.cat([block(x[i:i + 1])[0] for i in range(2)]))
    with pytest.raises(ValueError, match="n_groups=3 does not divide the batch's 32 tokens"):
        block.n_groups = 3
        block(x)


def test_convnet_channels_override_accepts_a_json_list():
    model, _ = _factory("convnet", "tiny")(channels=[4, 8, 16], device="meta")
    assert len(model.stages) == 3 and math.prod(model.stages[2].conv.weight.shape[:2]) == 16 * 8
