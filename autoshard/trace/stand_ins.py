"""Kernels a GPU run calls that a trace on CPU tensors cannot make: custom-op stand-ins.

``torch.nn.functional.rms_norm`` (``nn.RMSNorm``) runs one fused kernel on a
GPU, ``aten._fused_rms_norm`` and its backward, but on CPU tensors the same
call decomposes into six or so elementwise and reduction ops (and autograd
keeps their intermediates for the backward). A trace on CPU fake tensors
(``autoshard.trace.device``: the only trace a CPU-only torch can make) thus
held the CPU's ops: a plan for H100s priced and ran the decomposition, which
on the one H100 measured cost ~0.8 GB and ~10 ms per step more than the
fused kernel of eager torch (benchmarks/results/h100_one_gpu.md).

While tracing for CUDA, :func:`cuda_stand_ins` makes ``F.rms_norm`` call
``autoshard::fused_rms_norm``, a custom op with a fake kernel and an autograd
formula whose backward is ``autoshard::fused_rms_norm_backward``: the joint
graph keeps one node each, and :func:`autoshard.trace.device.for_device`
maps them to ``aten._fused_rms_norm`` and ``aten._fused_rms_norm_backward``
(same arguments), whose sharding rules are ``autoshard.rules.normalization``'s.
Calls without a weight keep torch's own path.

**Attention with a narrower value head** (DeepSeek's multi-head latent attention: query and key
heads of 192, value heads of 128). A CPU's SDPA has no fused kernel for it and decomposes into
the math path (the ``[heads, seq, seq]`` scores and softmax kept for the backward: 8 GiB a
sequence of 4,096 at 128 heads), which a GPU never runs: CUDA takes the memory-efficient kernel.
While tracing for CUDA, such a call pads the value heads with zeros to the query's width, runs
the fused attention and keeps the first ``Ev`` columns of its output, as Hugging Face's own
flash-attention path for these models does: the padded columns of the output are zeros and get
no gradient into ``value``, so the result and every gradient equal the unpadded call's. The
graph then holds the flash kernel (``autoshard.trace.device``) at the query's head width.

>>> with cuda_stand_ins():
...     torch.nn.functional.rms_norm is not _ORIGINAL_RMS_NORM
True
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Optional

import torch
import torch.nn.functional as F

__all__ = ["cuda_stand_ins", "STAND_INS"]

aten = torch.ops.aten
_ORIGINAL_RMS_NORM = F.rms_norm
_ORIGINAL_SDPA = F.scaled_dot_product_attention


@torch.library.custom_op("autoshard::fused_rms_norm", mutates_args=())
def fused_rms_norm(input: torch.Tensor, normalized_shape: list[int], weight: torch.Tensor,
                   eps: Optional[float]) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: UP007 - the schema reads it
    """``aten._fused_rms_norm`` (output, rstd) as one traced node."""
    out, rstd = aten._fused_rms_norm.default(input, normalized_shape, weight, eps)
    return out.clone(), rstd.clone()  # a custom op's outputs may not alias its inputs


@fused_rms_norm.register_fake
def _(input: torch.Tensor, normalized_shape: list[int], weight: torch.Tensor,
      eps: Optional[float]) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: UP007
    return aten._fused_rms_norm.default(input, normalized_shape, weight, eps)


@torch.library.custom_op("autoshard::fused_rms_norm_backward", mutates_args=())
def fused_rms_norm_backward(grad_out: torch.Tensor, input: torch.Tensor, normalized_shape: list[int],
                            rstd: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten._fused_rms_norm_backward`` (grad_input, grad_weight) as one traced node."""
    grad_input, grad_weight = aten._fused_rms_norm_backward.default(grad_out, input, normalized_shape, rstd, weight,
                                                                    [True, True])
    return grad_input.clone(), grad_weight.clone()


@fused_rms_norm_backward.register_fake
def _(grad_out: torch.Tensor, input: torch.Tensor, normalized_shape: list[int], rstd: torch.Tensor,
      weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(input), torch.empty_like(weight)


def _setup(ctx: Any, inputs: tuple, output: tuple) -> None:
    input, normalized_shape, weight, _ = inputs
    ctx.save_for_backward(input, weight, output[1])
    ctx.normalized_shape = normalized_shape


def _backward(ctx: Any, grad_out: torch.Tensor, _grad_rstd: Any) -> tuple:
    input, weight, rstd = ctx.saved_tensors
    grad_input, grad_weight = fused_rms_norm_backward(grad_out, input, ctx.normalized_shape, rstd, weight)
    return grad_input, None, grad_weight, None


fused_rms_norm.register_autograd(_backward, setup_context=_setup)

STAND_INS = {
    torch.ops.autoshard.fused_rms_norm.default: aten._fused_rms_norm.default,
    torch.ops.autoshard.fused_rms_norm_backward.default: aten._fused_rms_norm_backward.default,
}
"""Stand-in op -> the ATen op a GPU runs (the backward's mask argument added by ``for_device``)."""


def _rms_norm(input: torch.Tensor, normalized_shape: Any, weight: torch.Tensor | None = None,
              eps: float | None = None) -> torch.Tensor:
    if weight is None:
        return _ORIGINAL_RMS_NORM(input, normalized_shape, weight, eps)
    return fused_rms_norm(input, list(normalized_shape), weight, eps)[0]


def _sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    width, narrow = query.shape[-1], value.shape[-1]
    if narrow >= width or key.shape[-1] != width:
        return _ORIGINAL_SDPA(query, key, value, *args, **kwargs)
    out = _ORIGINAL_SDPA(query, key, F.pad(value, (0, width - narrow)), *args, **kwargs)
    return out[..., :narrow]


@contextlib.contextmanager
def cuda_stand_ins() -> Iterator[None]:
    """While the block runs, ``F.rms_norm`` with a weight calls the stand-in, and attention with
    value heads narrower than the query's pads them (module docstring); restored on exit, also
    on error."""
    F.rms_norm, F.scaled_dot_product_attention = _rms_norm, _sdpa
    try:
        yield
    finally:
        F.rms_norm, F.scaled_dot_product_attention = _ORIGINAL_RMS_NORM, _ORIGINAL_SDPA
