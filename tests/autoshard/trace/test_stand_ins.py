"""Stand-ins a trace for CUDA makes: attention with value heads narrower than the query's.

DeepSeek's latent attention (query and key heads of 192, value heads of 128) has no fused CPU
kernel, so a trace on CPU fake tensors held SDPA's math path (the scores and softmax kept for the
backward), which a GPU never runs. ``autoshard.trace.stand_ins`` pads the value heads to the
query's width while tracing for CUDA: checked equal to the unpadded call in value and every
gradient (float64, with a causal flag, an explicit mask and a scale), and a traced DeepSeek-V3
holds the flash kernel and no softmax of scores.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from autoshard.trace.stand_ins import _sdpa, cuda_stand_ins


@pytest.mark.parametrize("kwargs", [{"is_causal": True}, {"attn_mask": "random"}, {"scale": 0.3, "is_causal": True},
                                    {}])
def test_padded_value_heads_give_the_same_output_and_gradients(kwargs) -> None:
    torch.manual_seed(0)
    q, k = (torch.randn(2, 4, 16, 24, dtype=torch.float64, requires_grad=True) for _ in range(2))
    v = torch.randn(2, 4, 16, 8, dtype=torch.float64, requires_grad=True)
    if kwargs.get("attn_mask") == "random":
        kwargs = {"attn_mask": torch.randn(16, 16, dtype=torch.float64)}
    want = F.scaled_dot_product_attention(q, k, v, **kwargs)
    got = _sdpa(q, k, v, **kwargs)
    assert got.shape == want.shape == (2, 4, 16, 8)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    for a, b in zip(torch.autograd.grad(want.square().sum(), (q, k, v)), torch.autograd.grad(got.square().sum(), (q, k, v))):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-12)


def test_equal_head_widths_call_torch_unchanged_and_the_patch_is_undone() -> None:
    original = F.scaled_dot_product_attention
    q = torch.randn(1, 2, 8, 16)
    with cuda_stand_ins():
        assert F.scaled_dot_product_attention is not original
        assert torch.equal(F.scaled_dot_product_attention(q, q, q), original(q, q, q))
    assert F.scaled_dot_product_attention is original


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
def test_deepseek_v3_traced_for_cuda_holds_the_flash_kernel_not_the_math_path() -> None:
    from autoshard.trace import trace_joint
    from benchmarks.common.models import load

    model, inputs = load("hf.hf_deepseek_v3", {"dtype": "bfloat16", "device": "meta"})
    ops = {str(i.op) for i in trace_joint(model, inputs, target_device="cuda").nodes.values()}
    assert "aten._scaled_dot_product_flash_attention.default" in ops
    assert "aten._scaled_dot_product_flash_attention_backward.default" in ops
    assert not any("_safe_softmax" in op or op == "aten._softmax.default" for op in ops)
