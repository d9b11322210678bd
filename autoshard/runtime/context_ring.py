"""Context-parallel attention on a ring (pass-KV): the K/V blocks travel, one hop per step.

The same sequence split, parts, kernels and logsumexp merge as
``autoshard.runtime.context_attention`` (its docstring says how), with the
parts grouped by the owner of their keys (``attention_parts(..., group_by="owner")``).
Rank ``r`` holds one K/V block at a time, which never exceeds two blocks of
memory (the one in hand and the one arriving) instead of ``cp``:

* forward, step ``j = 0 .. cp - 1``: the block in hand is rank ``r - j``'s
  (mod ``cp``); the pass of it to rank ``r + 1`` is issued first and runs
  beside the step's parts, then waited (the next block has arrived);
* backward, step ``j``: the K/V block travels again; the dK/dV accumulator of
  the block in hand arrives from rank ``r - 1``, which computed its share at
  step ``j - 1``, and is waited only after this step's parts, added to and
  sent on to rank ``r + 1``; after the last step the accumulator in hand is
  rank ``r + 1``'s block's, complete, and one last hop takes it home.

A pass is one ``all_to_all_single`` on the CP group with one send and one
receive (as ``MeshComm.permute`` issues it): K, V and the key padding in one
flat buffer. ``costmodel.context_parallel.price_context_attention(...,
variant="ring")`` prices these steps; the ring pays where a step's compute
hides its pass (one block per step) and the all-gather's ``cp`` blocks of
memory do not fit.

Example, on each of 4 gloo ranks (``q, k, v``: this rank's :func:`sequence_shard`)::

    out = ring_attention(q, k, v, causal=True)   # the same values as context_attention
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from autoshard.runtime import context_comm
from autoshard.runtime.context_attention import (KERNELS, CPConfig, _accumulator_dtype, _Blocks, _mask, _merge,
                                                 _part_backward, _setup, _slot, _split)

__all__ = ["ring_attention"]

_OPS = torch.ops._c10d_functional


def _pass_on(flat: torch.Tensor, config: CPConfig) -> torch.Tensor:
    """Send ``flat`` to the next rank of the ring, receive the previous rank's (pending)."""
    cp, rank, n = config.layout.cp, config.rank, flat.numel()
    send, receive = [0] * cp, [0] * cp
    send[(rank + 1) % cp] = n
    receive[(rank - 1) % cp] = n
    return context_comm.issue("all_to_all", flat, receive, send, config.group_name)  # every CP collective's one door


def _hold(blocks: _Blocks, flat: torch.Tensor, owner: int) -> None:
    """Make the block in ``flat`` (owner ``owner``'s K, V, padding) the one the parts read."""
    views = _split(flat, tuple(t.shape for t in blocks.local), 1)
    blocks.everyone = tuple({owner: view.select(0, 0)} for view in views)  # no indexing: CUDA fake tensors


def _ring_forward(q: torch.Tensor, blocks: _Blocks) -> tuple[torch.Tensor, torch.Tensor]:
    config, c = blocks.config, blocks.c
    kernel, cp = KERNELS[config.kernel], config.layout.cp
    parts = config.parts()
    flat = torch.cat([t.reshape(-1) for t in blocks.local])
    acc: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * config.layout.chunks_per_rank
    for step in range(cp):
        pending = _pass_on(flat, config) if step < cp - 1 else None
        for part in (p for p in parts if p.step == step):
            slot = _slot(part, config)
            mask, reached = _mask(part, blocks, q.dtype, q.device)
            out, lse = kernel.forward(q.narrow(2, slot * c, c), blocks.chunks(0, part),
                                      blocks.chunks(1, part), part.mode == "causal" and mask is None, mask,
                                      config.scale)
            if reached is not None:
                lse = lse.masked_fill(~reached, float("-inf"))
            acc[slot] = _merge(acc[slot], out, lse)
        if pending is not None:
            flat = _OPS.wait_tensor(pending)
            _hold(blocks, flat, (config.rank - step - 1) % cp)
    return torch.cat([a[0] for a in acc], dim=2).to(q.dtype), torch.cat([a[1] for a in acc], dim=2)


def _ring_backward(dout: torch.Tensor, q: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, blocks: _Blocks
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    config = blocks.config
    kernel, cp, rank = KERNELS[config.kernel], config.layout.cp, config.rank
    k, v = blocks.local[0], blocks.local[1]
    parts = config.parts()
    acc_dtype = _accumulator_dtype(k.dtype)
    dq = torch.zeros(q.shape, dtype=acc_dtype, device=q.device)
    lse = lse.masked_fill(lse == float("-inf"), float("inf"))  # rows that see no key: P = 0, not nan
    flat = torch.cat([t.reshape(-1) for t in blocks.local])
    blocks.everyone = None
    pending_grads = None
    for step in range(cp):
        pending_kv = _pass_on(flat, config) if step < cp - 1 else None
        grads = torch.zeros(k.numel() + v.numel(), dtype=acc_dtype, device=k.device)
        owner = (rank - step) % cp
        dk_block, dv_block = (view.select(0, 0) for view in _split(grads, (k.shape, v.shape), 1))
        # _part_backward adds a remote part's dK/dV at [owner] of what it is given
        into = (dk_block, dv_block) if owner == rank else ({owner: dk_block}, {owner: dv_block})
        for part in (p for p in parts if p.step == step):
            _part_backward(kernel, part, dout, q, out, lse, blocks, dq, into)
        if pending_grads is not None:  # the other ranks' shares of this block, waited after our own
            grads += _OPS.wait_tensor(pending_grads)
        pending_grads = _pass_on(grads, config) if cp > 1 else None
        if pending_kv is not None:
            flat = _OPS.wait_tensor(pending_kv)
            _hold(blocks, flat, (rank - step - 1) % cp)
    mine = _OPS.wait_tensor(pending_grads) if pending_grads is not None else grads
    return (dq.to(q.dtype), mine.narrow(0, 0, k.numel()).view(k.shape).to(k.dtype),
            mine.narrow(0, k.numel(), v.numel()).view(v.shape).to(v.dtype))


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, padding: torch.Tensor | None,
                config: CPConfig) -> torch.Tensor:
        local = (k, v) if padding is None else (k, v, padding)
        out, lse = _ring_forward(q, _Blocks(local, config))
        ctx.save_for_backward(q, out, lse, *local)
        ctx.config = config
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, out, lse, *local = ctx.saved_tensors
        dq, dk, dv = _ring_backward(dout.contiguous(), q, out, lse, _Blocks(tuple(local), ctx.config))
        return dq, dk, dv, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any = None, *, causal: bool = True,
                   window: int | None = None, key_padding: torch.Tensor | None = None, scale: float | None = None,
                   load_balanced: bool = True, kernel: str | None = None) -> torch.Tensor:
    """:func:`autoshard.runtime.context_attention.context_attention` with the K/V blocks passed
    around the ring instead of all-gathered (module docstring); the same arguments and result.

    Example, on every rank of the CP group::

        out = ring_attention(q_local, k_local, v_local, causal=True, window=4096)
    """
    group, cp, layout, kernel, padding = _setup("ring_attention", q, k, v, group, load_balanced, kernel,
                                                key_padding, causal, window)
    config = CPConfig(group.group_name, dist.get_rank(group), layout, bool(causal), window, scale, kernel, False,
                      cp * q.shape[2], padding is not None, ring=True)
    return _RingAttention.apply(q, k, v, padding, config)
