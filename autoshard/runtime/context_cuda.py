"""The CUDA fused attention kernels as context-parallel parts' kernels (``context_attention.KERNELS``).

A kernel computes one part (query rows against some key chunks) and takes the
merged logsumexp back in its backward; both CUDA kernels SDPA runs return and
take it:

* ``flash``: ``aten._scaled_dot_product_flash_attention`` / ``_backward`` for
  fp16 and bf16 without a mask (the ``causal`` and ``full`` parts of causal or
  full attention, which is all a plan node's parts are). It takes no GQA keys:
  K/V are expanded to the query's heads and dK/dV summed back over each group.
  A part with a mask, or fp32, goes to the efficient kernel, as SDPA would
  send it.
* ``efficient``: ``aten._scaled_dot_product_efficient_attention`` / ``_backward``
  with ``compute_log_sumexp=True`` and the part's mask as ``attn_bias``
  (``[B, H, rows, keys]``, its last dim padded to a multiple of 16 in storage
  as SDPA pads it); its logsumexp has rows padded to a multiple of 32, which
  the part drops and the backward pads again.

Neither draws random numbers (dropout is 0), so their seed and offset are empty
tensors on the query's device; nothing here reads a value on the host.

>>> sorted(CUDA_KERNELS)
['efficient', 'flash']
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

__all__ = ["CUDA_KERNELS", "padded_lse_rows"]

aten = torch.ops.aten


def padded_lse_rows(rows: int) -> int:
    """Rows of the efficient kernel's logsumexp for ``rows`` query rows.

    >>> padded_lse_rows(40), padded_lse_rows(64)
    (64, 64)
    """
    return math.ceil(rows / 32) * 32


def _expand(kv: torch.Tensor, heads: int) -> torch.Tensor:
    """GQA keys repeated to the query's ``heads``."""
    return kv if kv.shape[1] == heads else kv.repeat_interleave(heads // kv.shape[1], dim=1)


def _fold(grad: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """The gradient of expanded keys summed back to ``kv_heads``."""
    b, h, s, d = grad.shape
    return grad if h == kv_heads else grad.view(b, kv_heads, h // kv_heads, s, d).sum(2)


def _bias(mask: torch.Tensor, q: torch.Tensor, keys: int) -> torch.Tensor:
    """The mask as the efficient kernel's ``attn_bias``: ``[B, H, rows, keys]``, a view of a
    buffer whose last dim is padded to a multiple of 16 (as SDPA pads it: aligned rows)."""
    shape = (q.shape[0], q.shape[1], q.shape[2], keys)
    pad = -keys % 16
    if pad == 0:
        return mask.expand(shape)
    return F.pad(mask.expand(shape), (0, pad)).narrow(3, 0, keys)


def _random_state(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty((), dtype=torch.int64, device=q.device), torch.empty((), dtype=torch.int64, device=q.device))


def _efficient_forward(q, k, v, causal, mask, scale):
    kx, vx = _expand(k, q.shape[1]), _expand(v, q.shape[1])
    bias = None if mask is None else _bias(mask, q, k.shape[2])
    out, lse, _, _ = aten._scaled_dot_product_efficient_attention(q, kx, vx, bias, True, 0.0, causal, scale=scale)
    return out, lse.narrow(2, 0, q.shape[2])


def _efficient_backward(dout, q, k, v, out, lse, causal, mask, scale):
    kx, vx = _expand(k, q.shape[1]), _expand(v, q.shape[1])
    bias = None if mask is None else _bias(mask, q, k.shape[2])
    lse = F.pad(lse, (0, padded_lse_rows(q.shape[2]) - q.shape[2]))
    seed, offset = _random_state(q)
    dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
        dout, q, kx, vx, bias, out, lse, seed, offset, 0.0, [True, True, True, False], causal, scale=scale)
    return dq, _fold(dk, k.shape[1]), _fold(dv, v.shape[1])


def _flash_fits(q: torch.Tensor, mask: torch.Tensor | None) -> bool:
    return mask is None and q.dtype in (torch.float16, torch.bfloat16)


def _flash_forward(q, k, v, causal, mask, scale):
    if not _flash_fits(q, mask):
        return _efficient_forward(q, k, v, causal, mask, scale)
    kx, vx = _expand(k, q.shape[1]), _expand(v, q.shape[1])
    out, lse, *_ = aten._scaled_dot_product_flash_attention(q, kx, vx, 0.0, causal, False, scale=scale)
    return out, lse


def _flash_backward(dout, q, k, v, out, lse, causal, mask, scale):
    if not _flash_fits(q, mask):
        return _efficient_backward(dout, q, k, v, out, lse, causal, mask, scale)
    kx, vx = _expand(k, q.shape[1]), _expand(v, q.shape[1])
    seed = torch.empty(2, dtype=torch.uint64, device=q.device)
    offset = torch.empty((), dtype=torch.uint64, device=q.device)
    dq, dk, dv = aten._scaled_dot_product_flash_attention_backward(
        dout, q, kx, vx, out, lse, None, None, q.shape[2], kx.shape[2], 0.0, causal, seed, offset, scale=scale)
    return dq, _fold(dk, k.shape[1]), _fold(dv, v.shape[1])


CUDA_KERNELS: dict[str, tuple[Callable[..., tuple[torch.Tensor, torch.Tensor]],
                              Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]] = {
    "flash": (_flash_forward, _flash_backward),
    "efficient": (_efficient_forward, _efficient_backward),
}
"""Kernel name -> (forward, backward) with ``context_attention``'s kernel signatures."""
