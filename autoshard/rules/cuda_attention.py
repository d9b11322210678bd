"""Scaled dot-product attention as CUDA runs it: the flash and memory-efficient kernels.

A plan for GPUs holds these ops (``autoshard.trace.device`` maps the CPU flash
kernel to the kernel CUDA's SDPA picks). They split like the CPU kernel
(``autoshard.rules.attention``): batch and heads freely; the backward is
linear in the output gradient. The random state outputs (seed and offset;
flash's unused and debug tensors) are tiny and replicated. Query rows are
not split here: the flash backward takes the sequence lengths as numbers
(``max_q``), which a row split would leave at the global length, and the
efficient kernel pads its logsumexp's rows to a multiple of 32, so a row
split of it is not the local kernel's. Sequence splits with the keys and
values gathered run as exchanges (``autoshard.rules.context_parallel``).

No CPU kernel runs them, so each rule has a CPU reference for the validator
(numerical shard simulation): the CPU flash kernel, with the CUDA kernels'
output structure (the efficient kernel's logsumexp padded with zeros, the
random state zeros).

>>> import torch
>>> q = torch.randn(2, 2, 5, 4)
>>> out, lse, seed, offset = efficient_reference(q, q, q, None, True)
>>> tuple(lse.shape), torch.allclose(out, torch.nn.functional.scaled_dot_product_attention(q, q, q))
((2, 2, 32), True)
"""

from __future__ import annotations

from typing import Any

import torch

from autoshard.rules.compute import attention_compute
from autoshard.rules.context_parallel import register_context_parallel
from autoshard.rules.core import P, P_AVG, R, OpCall, S, SingleDimStrategy, TensorMeta
from autoshard.rules.registry import RuleRegistry, SampleInput
from autoshard.rules.samples import Sampler

__all__ = ["cuda_sdpa_rule", "cuda_sdpa_backward_rule", "flash_reference", "efficient_reference", "register"]

aten = torch.ops.aten
_CPU_FLASH = aten._scaled_dot_product_flash_attention_for_cpu.default
_CPU_FLASH_BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def _bias_placement(call: OpCall, dim_from_end: int) -> Any:
    """``attn_bias`` (the mask, broadcast to ``[B, H, L, S]``) for a split of that dim
    (counted from the end): R where it broadcasts along it; None without a bias."""
    bias = call.bound.get("attn_bias")
    if not isinstance(bias, TensorMeta):
        return None
    d = bias.ndim - dim_from_end
    return R if d < 0 or bias.shape[d] == 1 else S(d)


def cuda_sdpa_rule(call: OpCall) -> list[SingleDimStrategy]:
    """Forward: (output, logsumexp, random state...) split by batch or heads."""
    flash = call.op is aten._scaled_dot_product_flash_attention.default
    extra = (None, None, None, None, R, R, R) if flash else (R, R)  # flash: cum_seq_q/k, max_q/k are not tensors
    return [SingleDimStrategy((S(d), S(d), *extra),
                              call.place(R, query=S(d), key=S(d), value=S(d), attn_bias=_bias_placement(call, 4 - d)))
            for d in (0, 1)]


def cuda_sdpa_backward_rule(call: OpCall) -> list[SingleDimStrategy]:
    """Backward: (grad_q, grad_k, grad_v[, grad_bias]) split by batch or heads, or partial
    with a partial output gradient (the rest replicated)."""
    flash = call.op is aten._scaled_dot_product_flash_attention_backward.default
    grad_out = "grad_out" if flash else "grad_out_"
    extra = () if flash else (None,)  # the bias gradient is not made (grad_input_mask)
    every = (grad_out, "query", "key", "value", "out", "logsumexp")
    strategies = [SingleDimStrategy((S(d), S(d), S(d), *extra),
                                    call.place(R, **{n: S(d) for n in every}, attn_bias=_bias_placement(call, 4 - d)))
                  for d in (0, 1)]
    strategies += [SingleDimStrategy((k, k, k, *extra), call.place(R, **{grad_out: k})) for k in (P, P_AVG)]
    return strategies


# ------------------------------------------------------------------ CPU references


def flash_reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float = 0.0,
                    is_causal: bool = False, return_debug_mask: bool = False, *, scale: float | None = None) -> tuple:
    """``_scaled_dot_product_flash_attention`` on the CPU (module docstring). The kernel's
    ``max_q``/``max_k`` are numbers, no outputs of a strategy (the traced graph lists them
    as None, as it lists every non-tensor output): None here too."""
    out, lse = _CPU_FLASH(query, key, value, dropout_p, is_causal, scale=scale)
    rng_state, unused = torch.zeros(2, dtype=torch.uint64), torch.zeros((), dtype=torch.uint64)
    return out, lse, None, None, None, None, rng_state, unused, query.new_empty(0)


def flash_backward_reference(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             out: torch.Tensor, logsumexp: torch.Tensor, cum_seq_q: Any, cum_seq_k: Any, max_q: int,
                             max_k: int, dropout_p: float, is_causal: bool, philox_seed: torch.Tensor,
                             philox_offset: torch.Tensor, *, scale: float | None = None) -> tuple:
    """``_scaled_dot_product_flash_attention_backward`` on the CPU."""
    return _CPU_FLASH_BACKWARD(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, scale=scale)


def efficient_reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_bias: Any,
                        compute_log_sumexp: bool, dropout_p: float = 0.0, is_causal: bool = False, *,
                        scale: float | None = None) -> tuple:
    """``_scaled_dot_product_efficient_attention`` on the CPU (logsumexp rows padded to 32)."""
    out, lse = _CPU_FLASH(query, key, value, dropout_p, is_causal, attn_mask=attn_bias, scale=scale)
    rows = -(-lse.shape[-1] // 32) * 32
    padded = torch.nn.functional.pad(lse, (0, rows - lse.shape[-1]))
    zero = torch.zeros((), dtype=torch.int64)
    return out, padded, zero, zero.clone()


def efficient_backward_reference(grad_out_: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                                 value: torch.Tensor, attn_bias: Any, out: torch.Tensor, logsumexp: torch.Tensor,
                                 philox_seed: torch.Tensor, philox_offset: torch.Tensor, dropout_p: float,
                                 grad_input_mask: list[bool], is_causal: bool = False, *,
                                 scale: float | None = None) -> tuple:
    """``_scaled_dot_product_efficient_attention_backward`` on the CPU."""
    lse = logsumexp[..., :query.shape[-2]]
    grads = _CPU_FLASH_BACKWARD(grad_out_, query, key, value, out, lse, dropout_p, is_causal, attn_mask=attn_bias,
                                scale=scale)
    return (*grads, None)


# ------------------------------------------------------------------ samples


def _inputs(sampler: Sampler, masked: bool) -> tuple[Any, ...]:
    dtype = sampler.float_dtype((torch.float64, torch.float32))
    b, h, lq, lk, e = sampler.size(), sampler.size(), sampler.size(), sampler.size(), sampler.choice((4, 8))
    q, k, v = (sampler.randn((b, h, length, e), dtype) for length in (lq, lk, lk))
    mask = sampler.randn((b, 1, lq, lk), dtype) if masked and sampler.choice((True, False)) else None
    return q, k, v, mask


def _flash_samples(sampler: Sampler):
    for causal in (False, True):
        q, k, v, _ = _inputs(sampler, masked=False)
        yield SampleInput((q, k, v, 0.0, causal, False), {"scale": sampler.choice((None, 0.3))})


def _flash_backward_samples(sampler: Sampler):
    for causal in (False, True):
        q, k, v, _ = _inputs(sampler, masked=False)
        out, lse, _, _, _, _, seed, offset, _ = flash_reference(q, k, v, 0.0, causal)
        g = sampler.randn(out.shape, out.dtype)
        yield SampleInput((g, q, k, v, out, lse, None, None, q.shape[-2], k.shape[-2], 0.0, causal, seed, offset), {})


def _efficient_samples(sampler: Sampler):
    for causal in (False, True):
        q, k, v, mask = _inputs(sampler, masked=not causal)
        yield SampleInput((q, k, v, mask, True, 0.0, causal), {"scale": sampler.choice((None, 0.3))})


def _efficient_backward_samples(sampler: Sampler):
    for causal in (False, True):
        q, k, v, mask = _inputs(sampler, masked=not causal)
        out, lse, seed, offset = efficient_reference(q, k, v, mask, True, 0.0, causal)
        g = sampler.randn(out.shape, out.dtype)
        yield SampleInput((g, q, k, v, mask, out, lse, seed, offset, 0.0, [True, True, True, False], causal), {})


def register(registry: RuleRegistry) -> None:
    """Add the CUDA attention kernels' rules to ``registry``."""
    rule = registry.family("cuda_attention")
    forward, backward = attention_compute(backward=False), attention_compute(backward=True)
    rule(aten._scaled_dot_product_flash_attention.default, compute=forward, samples=_flash_samples,
         reference=flash_reference)(cuda_sdpa_rule)
    rule(aten._scaled_dot_product_flash_attention_backward.default, compute=backward,
         samples=_flash_backward_samples, reference=flash_backward_reference)(cuda_sdpa_backward_rule)
    rule(aten._scaled_dot_product_efficient_attention.default, compute=forward, samples=_efficient_samples,
         reference=efficient_reference)(cuda_sdpa_rule)
    rule(aten._scaled_dot_product_efficient_attention_backward.default, compute=backward,
         samples=_efficient_backward_samples, reference=efficient_backward_reference)(cuda_sdpa_backward_rule)
    register_context_parallel(cuda_sdpa_rule, cuda_sdpa_backward_rule)  # sequence splits: exchange strategies
