"""Softmax and scaled dot-product attention, forward and backward.

Softmax normalizes along one dim, so every other dim can be split. Its
backward is linear in ``grad_output`` for a fixed (replicated) output, so a
partial gradient stays partial.

Attention on ``q [B, H, L, E]``, ``k, v [B, H, S, E]`` (the CPU flash kernel):

* batch ``B`` and heads ``H``: independent, split on every tensor (an
  attention mask follows where it has that dim, else is replicated);
* query length ``L``: each query row attends to all keys, so ``q``, the output
  and ``logsumexp`` can be split on ``L`` with ``k, v`` replicated, but only
  without ``is_causal`` (the local kernel would align the causal diagonal at
  the local row 0). In the backward, ``grad_k``/``grad_v`` are then sums over
  the split query rows: ``P(sum)``;
* the backward is linear in ``grad_out`` for fixed q, k, v, out, logsumexp.

Sequence (context-parallel) splits of causal attention need the keys and
values of other ranks, not a local kernel: they are exchange strategies,
offered beside these rules by ``autoshard.rules.context_parallel``.

>>> import torch
>>> from autoshard.rules.core import OpCall, TensorMeta
>>> x = TensorMeta((4, 8), torch.float32)
>>> [str(s) for s in softmax_rule(OpCall(torch.ops.aten._softmax.default, (x, 1, False), {}, (x,), (x,), {"dim": 1}))]
['S*(0) <- S*(0)']
"""

from __future__ import annotations

from typing import Any

import torch

from autoshard.rules.compute import attention_compute, elementwise
from autoshard.rules.context_parallel import register_context_parallel
from autoshard.rules.core import P, P_AVG, R, OpCall, S, SingleDimStrategy, TensorMeta
from autoshard.rules.registry import RuleRegistry, SampleInput
from autoshard.rules.samples import Sampler

__all__ = ["softmax_rule", "sdpa_rule", "sdpa_backward_rule", "register"]

aten = torch.ops.aten


def _other_dims(call: OpCall) -> list[int]:
    n = call.inputs[0].ndim
    dim = call.arg("dim") % max(n, 1)
    return [d for d in range(n) if d != dim]


def softmax_rule(call: OpCall) -> list[SingleDimStrategy]:
    """_softmax / _log_softmax / _safe_softmax: split any dim but ``dim``."""
    return [SingleDimStrategy(S(d), S(d)) for d in _other_dims(call)]


def softmax_backward_rule(call: OpCall) -> list[SingleDimStrategy]:
    """Backward of (log-)softmax: split any dim but ``dim``; linear in grad_output."""
    strategies = [SingleDimStrategy(S(d), (S(d), S(d))) for d in _other_dims(call)]
    return strategies + [SingleDimStrategy(k, (k, R)) for k in (P, P_AVG)]


def _mask_placement(call: OpCall, dim_from_end: int) -> Any:
    """Placement of attn_mask (broadcast to ``[B, H, L, S]``) for a split of
    that dim (counted from the end), R where the mask broadcasts along it."""
    mask = call.bound.get("attn_mask")
    if not isinstance(mask, TensorMeta):
        return None
    d = mask.ndim - dim_from_end
    if d < 0 or mask.shape[d] == 1:
        return R
    return S(d)


def sdpa_rule(call: OpCall) -> list[SingleDimStrategy]:
    """(output, logsumexp) of _scaled_dot_product_flash_attention_for_cpu."""
    strategies = []
    for d in (0, 1):  # batch, heads
        ins = call.place(R, query=S(d), key=S(d), value=S(d), attn_mask=_mask_placement(call, 4 - d))
        strategies.append(SingleDimStrategy((S(d), S(d)), ins))
    if not call.arg("is_causal", False):
        ins = call.place(R, query=S(2), attn_mask=_mask_placement(call, 2))
        strategies.append(SingleDimStrategy((S(2), S(2)), ins))
    return strategies


def sdpa_backward_rule(call: OpCall) -> list[SingleDimStrategy]:
    """(grad_q, grad_k, grad_v) of the CPU flash attention backward."""
    every = ("grad_out", "query", "key", "value", "out", "logsumexp")
    strategies = []
    for d in (0, 1):
        ins = call.place(R, **{n: S(d) for n in every}, attn_mask=_mask_placement(call, 4 - d))
        strategies.append(SingleDimStrategy((S(d), S(d), S(d)), ins))
    if not call.arg("is_causal", False):
        rows = ("grad_out", "query", "out", "logsumexp")
        ins = call.place(R, **{n: S(2) for n in rows}, attn_mask=_mask_placement(call, 2))
        strategies.append(SingleDimStrategy((S(2), P, P), ins))
    for k in (P, P_AVG):
        strategies.append(SingleDimStrategy((k, k, k), call.place(R, grad_out=k)))
    return strategies


# ------------------------------------------------------------------ samples


def _softmax_samples(kind: str):
    def samples(sampler: Sampler):
        for _ in range(2):
            shape = sampler.shape(min_ndim=2)
            dim = sampler.randint(-len(shape), len(shape) - 1)
            dtype = sampler.float_dtype()
            x = sampler.randn(shape, dtype)
            if kind == "forward":
                yield SampleInput((x, dim, False), {})
            elif kind == "safe":
                yield SampleInput((x, dim), {})
            else:
                fwd = aten._softmax.default if kind == "softmax" else aten._log_softmax.default
                yield SampleInput((sampler.randn(shape, dtype), fwd(x, dim, False), dim, dtype), {})

    return samples


def _qkv(sampler: Sampler, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b, h, lq, lk = sampler.size(), sampler.size(), sampler.size(), sampler.size()
    e = sampler.choice((4, 8))
    return (sampler.randn((b, h, lq, e), dtype), sampler.randn((b, h, lk, e), dtype), sampler.randn((b, h, lk, e), dtype))


def _mask(sampler: Sampler, q: torch.Tensor, k: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    kind = sampler.choice(("none", "2d", "4d"))
    if kind == "none":
        return None
    shape = (q.shape[2], k.shape[2]) if kind == "2d" else (q.shape[0], 1, q.shape[2], k.shape[2])
    return sampler.randn(shape, dtype)


def _sdpa_samples(sampler: Sampler):
    for causal in (False, True):
        dtype = sampler.float_dtype((torch.float64, torch.float32))
        q, k, v = _qkv(sampler, dtype)
        mask = None if causal else _mask(sampler, q, k, dtype)
        yield SampleInput((q, k, v, 0.0, causal), {"attn_mask": mask, "scale": sampler.choice((None, 0.3))})


def _sdpa_backward_samples(sampler: Sampler):
    for causal in (False, True):
        dtype = sampler.float_dtype((torch.float64, torch.float32))
        q, k, v = _qkv(sampler, dtype)
        mask = None if causal else _mask(sampler, q, k, dtype)
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, 0.0, causal, attn_mask=mask)
        g = sampler.randn(out.shape, dtype)
        yield SampleInput((g, q, k, v, out, lse, 0.0, causal), {"attn_mask": mask})


def register(registry: RuleRegistry) -> None:
    """Add the softmax and attention rules to ``registry``."""
    rule = registry.family("attention")
    rule(aten._softmax.default, compute=elementwise(5), samples=_softmax_samples("forward"))(softmax_rule)
    rule(aten._log_softmax.default, compute=elementwise(5), samples=_softmax_samples("forward"))(softmax_rule)
    rule(aten._safe_softmax.default, compute=elementwise(5), samples=_softmax_samples("safe"))(softmax_rule)
    rule(aten._softmax_backward_data.default, compute=elementwise(4), samples=_softmax_samples("softmax"))(
        softmax_backward_rule)
    rule(aten._log_softmax_backward_data.default, compute=elementwise(4), samples=_softmax_samples("log_softmax"))(
        softmax_backward_rule)
    rule(aten._scaled_dot_product_flash_attention_for_cpu.default, compute=attention_compute(backward=False),
         samples=_sdpa_samples)(sdpa_rule)
    rule(aten._scaled_dot_product_flash_attention_for_cpu_backward.default, compute=attention_compute(backward=True),
         samples=_sdpa_backward_samples)(sdpa_backward_rule)
    register_context_parallel(sdpa_rule, sdpa_backward_rule)  # sequence splits: exchange strategies
