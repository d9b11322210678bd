"""Context-parallel attention: one CP group's sequence-split attention, all-gather of K/V.

Each rank of the CP group holds a part of the sequence of ``q [B, H, S, D]``,
``k, v [B, H_kv, S, D]`` (GQA: ``H_kv`` divides ``H``), ``S = L / cp``. With
the load-balanced layout (``costmodel.context_parallel.ChunkLayout``) the
sequence is cut into ``2 cp`` equal chunks and rank ``r`` holds chunks ``r``
(head) and ``2 cp - 1 - r`` (tail), so under a causal mask every rank does the
same work; without it rank ``r`` holds chunk ``r`` of ``cp``.

**Forward** (:func:`context_attention`): one all-gather of this rank's K and V
(and key padding; one flat buffer, ``torch.ops._c10d_functional.all_gather_into_tensor``, the op
``autoshard.runtime.collectives`` issues) is issued first; the parts that need
only this rank's keys run beside it (the diagonal blocks, and the tail chunk
against the head chunk); then the wait, then the parts against remote keys. The
parts are ``costmodel.context_parallel.attention_parts``, the same list the cost
model prices: each local query chunk against the key chunks it may see, by
their global positions (causal: ``k <= p``; a sliding window of ``w``:
``p - k < w``, Hugging Face's ``sliding_window``; non-causal windows also
``k - p < w``); a diagonal block with the kernel's causal flag, wholly visible
chunks without a mask, partly visible ones with an explicit mask. A query
chunk computed in several parts is merged exactly by logsumexp:
``lse = logaddexp(lse_1, lse_2)``, ``out = e^(lse_1 - lse) out_1 + e^(lse_2 - lse) out_2``
(rows a part does not reach carry ``lse = -inf`` and weigh nothing).

**Backward**: per part the kernel's own backward with the *merged* output and
logsumexp (``P = exp(QK^T s - lse)`` and ``D = rowsum(dO * O)`` are then the
whole row's, so each part's ``dQ, dK, dV`` are exact and add up). ``dQ`` stays
local; ``dK, dV`` of remote keys go into a ``[cp, ...]`` buffer that one
reduce-scatter (sum) returns to the owners, issued after the remote parts and
run beside the local parts, whose ``dK, dV`` are added after the wait. With
``keep_gathered=False`` the forward frees the gathered K/V and the backward
gathers again (beside its local parts): ``cp - 1`` blocks less memory between
forward and backward, one all-gather more (``costmodel.context_parallel``
prices both).

**Kernels.** ``kernel="cpu"`` (CPU tensors): ``aten._scaled_dot_product_flash_attention_for_cpu``
and its ``_backward`` (they return and take the logsumexp, take GQA keys as
they are, a float mask in the query's dtype, and a given out/lse in the
backward). ``kernel="math"`` (any device, the default off the CPU): the same
computation written with matmuls and ``logsumexp`` in float32 (float64 for
float64 inputs; the tests check it on CPU like the fused one). The CUDA
fused kernels return the logsumexp too and take it back in their backward:
``aten._scaled_dot_product_flash_attention`` / ``_backward`` (bf16/fp16, no
mask: the ``causal`` and ``full`` parts; GQA keys expanded to ``H`` heads, dK
summed back) and ``aten._scaled_dot_product_efficient_attention`` /
``_backward`` (``compute_log_sumexp=True``; ``attn_bias`` for the ``masked``
parts; its lse is padded to a multiple of 32 rows); wiring them is one more
entry in :data:`KERNELS`, to be checked on a GPU (none was at hand).

**Padding.** ``key_padding`` (a ``[B, S]`` mask of real tokens) travels in the same
gather buffer as K and V and joins every part's mask; a query row that sees no
key gets ``lse = -inf`` and output 0, as ``F.scaled_dot_product_attention`` gives it.

**Sequence order.** A sequence split in the load-balanced order is the whole
sequence permuted (:func:`to_load_balanced`, :func:`from_load_balanced`), so
token inputs, labels and RoPE positions are permuted alike and every
token-wise op between attentions needs nothing; :func:`sequence_shard` takes
one rank's tokens and :func:`shard_positions` their global positions (RoPE's
cos/sin are read at those, not at ``0 .. S-1``). The loss: shift the labels on
the whole sequence first, then shard them like the inputs; a token-mean loss
is the sum over the group of local sums over the global token count.

>>> import torch
>>> to_load_balanced(torch.arange(8), cp=2, dim=0).tolist()
[0, 1, 6, 7, 2, 3, 4, 5]
>>> shard_positions(8, cp=2, rank=1).tolist()
[2, 3, 4, 5]

Design note: how this becomes a strategy the solver chooses (issue 56).

* Rule (``autoshard/rules/attention.py``): a strategy on a ``cp`` mesh dim with
  ``q, k, v`` all ``S(2)`` (sequence) and the output and logsumexp ``S(2)``,
  allowed for causal attention too, because the op is no longer the local
  kernel but this exchange; its compute is the busiest rank's parts
  (``price_context_attention(...).forward_compute_s``) and the backward's
  ``dK, dV`` come back ``S(2)`` (the reduce-scatter is inside the op, not a
  ``P`` placement). The sequence split must be the load-balanced order where
  chosen: inputs are permuted once at the data loader (``sequence_shard``).
* Step program (``autoshard/program/``): a K/V exchange action (issue the
  gather, the local parts, wait, the remote parts; in the backward the
  reduce-scatter beside the local parts) so the schedule and ``costmodel.overlap``
  see it as a transfer with its issue and wait positions, and the collective
  trace records it (here it goes straight to ``_c10d_functional``, unrecorded).
* Solver and mesh search: a ``cp`` mesh dim name in the solve (``--dims dp,cp,tp``)
  and the factorizations of ``autoshard/search/mesh_search.py``; the edge
  costs of ``S(seq)`` on ``cp`` are the usual redistributions.
* Trace: RoPE positions must be traced as inputs (or buffers read at
  positions) so the runtime can give each rank its ``shard_positions``; models
  that build ``arange(S)`` inside the forward need a rule for ``arange`` on a
  sequence split. HF models' 4-D masks (``create_causal_mask``) must be
  recognised as causal/sliding-window/padding and replaced by the flags here.
* Ring: ``autoshard.runtime.context_ring.ring_attention`` passes the K/V blocks
  around instead (two blocks of memory, not ``cp``); the strategy would carry
  the variant ``costmodel.context_parallel.best_context_attention`` picks.
* Missing here: the CUDA fused kernels (see Kernels; the ``math`` kernel runs on
  CUDA meanwhile, unmeasured), dropout inside attention, the collective trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives  # noqa: F401 - registers the _c10d_functional ops

from costmodel.context_parallel import AttentionPart, ChunkLayout, attention_parts, offset_range

__all__ = ["KERNELS", "CPConfig", "context_attention", "to_load_balanced", "from_load_balanced",
           "load_balanced_index", "sequence_shard", "shard_positions"]

_OPS = torch.ops._c10d_functional
aten = torch.ops.aten


# ------------------------------------------------------------------ sequence order


def load_balanced_index(seq_len: int, cp: int, *, device: Any = None) -> torch.Tensor:
    """Global positions in load-balanced storage order (rank 0's chunks, rank 1's, ...).

    >>> load_balanced_index(8, 2).tolist()
    [0, 1, 6, 7, 2, 3, 4, 5]
    """
    layout = ChunkLayout(cp)
    c = layout.chunk_len(seq_len)
    return torch.cat([torch.arange(g * c, (g + 1) * c, device=device) for g in layout.chunk_order()])


def to_load_balanced(x: torch.Tensor, cp: int, dim: int = 1) -> torch.Tensor:
    """``x`` with its sequence ``dim`` reordered so that an even split gives each rank its head and tail chunks."""
    return x.index_select(dim, load_balanced_index(x.shape[dim], cp, device=x.device))


def from_load_balanced(x: torch.Tensor, cp: int, dim: int = 1) -> torch.Tensor:
    """Undo :func:`to_load_balanced` (``from_load_balanced(to_load_balanced(x, cp), cp)`` is ``x``).

    >>> x = torch.arange(12).view(1, 12)
    >>> bool((from_load_balanced(to_load_balanced(x, 3), 3) == x).all())
    True
    """
    index = load_balanced_index(x.shape[dim], cp, device=x.device)
    return x.index_select(dim, torch.argsort(index))


def shard_positions(seq_len: int, cp: int, rank: int, *, load_balanced: bool = True, device: Any = None
                    ) -> torch.Tensor:
    """Global positions of the tokens rank ``rank`` holds, in its order (for RoPE and masks).

    >>> shard_positions(8, cp=2, rank=0).tolist(), shard_positions(8, cp=2, rank=0, load_balanced=False).tolist()
    ([0, 1, 6, 7], [0, 1, 2, 3])
    """
    layout = ChunkLayout(cp, load_balanced)
    c = layout.chunk_len(seq_len)
    return torch.cat([torch.arange(g * c, (g + 1) * c, device=device) for g in layout.chunks_of(rank)])


def sequence_shard(x: torch.Tensor, cp: int, rank: int, dim: int = 1, *, load_balanced: bool = True) -> torch.Tensor:
    """Rank ``rank``'s tokens of the whole sequence ``x`` (its chunks along ``dim``, concatenated).

    >>> sequence_shard(torch.arange(8), cp=2, rank=1, dim=0).tolist()
    [2, 3, 4, 5]
    """
    layout = ChunkLayout(cp, load_balanced)
    c = layout.chunk_len(x.shape[dim])
    return torch.cat([x.narrow(dim, g * c, c) for g in layout.chunks_of(rank)], dim=dim)


# ------------------------------------------------------------------ kernels
# A kernel: forward(q, k, v, causal, mask, scale) -> (out, lse [B, H, L]) and
# backward(dout, q, k, v, out, lse, causal, mask, scale) -> (dq, dk, dv), k/v with H_kv heads.


def _cpu_forward(q, k, v, causal, mask, scale):
    return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=mask, scale=scale)


def _cpu_backward(dout, q, k, v, out, lse, causal, mask, scale):
    return aten._scaled_dot_product_flash_attention_for_cpu_backward(dout, q, k, v, out, lse, 0.0, causal,
                                                                     attn_mask=mask, scale=scale)


def _math_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _scores(q, k, causal, mask, scale):
    """``QK^T * scale`` with the mask added, GQA keys shared by their query heads: ``[B, H_kv, G, L, S]``."""
    b, h, length, d = q.shape
    groups = h // k.shape[1]
    s = torch.matmul(q.view(b, k.shape[1], groups, length, d), k.unsqueeze(2).transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(length, k.shape[2], dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    if mask is not None:  # [L, S] or [B, 1, L, S]: broadcast over the head groups
        s = s + (mask.unsqueeze(2) if mask.dim() == 4 else mask)
    return s


def _math_forward(q, k, v, causal, mask, scale):
    dtype, work = q.dtype, _math_dtype(q.dtype)
    q, k, v = q.to(work), k.to(work), v.to(work)
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    s = _scores(q, k, causal, mask if mask is None else mask.to(work), scale)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)  # a row with no key: -inf - -inf
    out = torch.matmul(p, v.unsqueeze(2)).flatten(1, 2)
    return out.to(dtype), lse.flatten(1, 2)


def _math_backward(dout, q, k, v, out, lse, causal, mask, scale):
    dtype, work = q.dtype, _math_dtype(q.dtype)
    b, h, length, d = q.shape
    kv_heads, groups = k.shape[1], h // k.shape[1]
    q, k, v, dout, out = (t.to(work) for t in (q, k, v, dout, out))
    scale = scale if scale is not None else d ** -0.5
    s = _scores(q, k, causal, mask if mask is None else mask.to(work), scale)
    p = torch.exp(s - lse.to(work).view(b, kv_heads, groups, length, 1)).nan_to_num(0.0)
    grouped = dout.view(b, kv_heads, groups, length, -1)
    dv = torch.matmul(p.transpose(-1, -2), grouped).sum(2)
    dp = torch.matmul(grouped, v.unsqueeze(2).transpose(-1, -2))
    rows = (grouped * out.view(b, kv_heads, groups, length, -1)).sum(-1, keepdim=True)
    ds = p * (dp - rows) * scale
    dq = torch.matmul(ds, k.unsqueeze(2)).flatten(1, 2)
    dk = torch.matmul(ds.transpose(-1, -2), q.view(b, kv_heads, groups, length, d)).sum(2)
    return dq.to(dtype), dk.to(dtype), dv.to(dtype)


@dataclass(frozen=True, slots=True)
class _Kernel:
    forward: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    backward: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


KERNELS = {"cpu": _Kernel(_cpu_forward, _cpu_backward), "math": _Kernel(_math_forward, _math_backward)}
"""Attention kernels by name (module docstring: which aten op each calls)."""


# ------------------------------------------------------------------ the exchange


@dataclass(frozen=True, slots=True)
class CPConfig:
    """What one CP attention call needs besides its tensors (checked by :func:`context_attention`)."""

    group_name: str
    """The CP process group's name (``ProcessGroup.group_name``)."""
    rank: int
    """This rank's index in the CP group."""
    layout: ChunkLayout
    causal: bool
    window: int | None
    scale: float | None
    kernel: str
    keep_gathered: bool
    seq_len: int
    """Global sequence length."""
    padded: bool = False
    """A key padding mask comes with the keys (gathered with them)."""
    ring: bool = False
    """Parts grouped by the owner of their keys (``autoshard.runtime.context_ring``), not by locality."""

    def parts(self) -> tuple[AttentionPart, ...]:
        return attention_parts(self.layout, self.rank, self.seq_len, causal=self.causal, window=self.window,
                               group_by="owner" if self.ring else "locality")


def _split(flat: torch.Tensor, shapes: tuple[torch.Size, ...], cp: int) -> tuple[torch.Tensor, ...]:
    """``[cp, *shape]`` views of a ``[cp * sum(numel)]`` buffer holding each rank's tensors back to back."""
    rows = flat.view(cp, -1)
    views, start = [], 0
    for shape in shapes:
        n = shape.numel()
        views.append(rows[:, start:start + n].view(cp, *shape))
        start += n
    return tuple(views)


class _Blocks:
    """K, V and the key padding (``[B, 1, S]``, in K's dtype) of one call: this rank's own,
    and everyone's once the gather (one flat buffer, one collective) has arrived."""

    def __init__(self, local: tuple[torch.Tensor, ...], config: CPConfig) -> None:
        self.local, self.config = local, config
        self.c = config.layout.chunk_len(config.seq_len)
        self.everyone: tuple[Any, ...] | None = None
        """Per tensor, everyone's blocks indexed by owner: the gathered ``[cp, ...]``, or the
        ring's ``{owner: block}`` of the block in hand."""
        self._pending: torch.Tensor | None = None

    def issue(self) -> None:
        """Issue the all-gather (every rank must, even one that needs no remote key)."""
        if self.config.layout.cp > 1:
            flat = torch.cat([t.reshape(-1) for t in self.local])
            self._pending = _OPS.all_gather_into_tensor(flat, self.config.layout.cp, self.config.group_name)

    def arrive(self) -> None:
        """Wait for the gather issued last, if any."""
        if self._pending is not None:
            self.everyone = _split(_OPS.wait_tensor(self._pending), tuple(t.shape for t in self.local),
                                   self.config.layout.cp)
            self._pending = None

    def chunks(self, which: int, part: AttentionPart) -> torch.Tensor:
        """Tensor ``which`` (0: K, 1: V, 2: padding) of the part's key chunks, concatenated along the sequence."""
        pieces = []
        for g in part.key_chunks:
            owner, slot = self.config.layout.owner_of(g)
            t = self.local[which] if owner == self.config.rank else self.everyone[which][owner]
            pieces.append(t[:, :, slot * self.c:(slot + 1) * self.c])
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=2)


def _mask(part: AttentionPart, blocks: _Blocks, dtype: torch.dtype, device: Any
          ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(additive float mask, rows that see some key) of a part: ``[c, n c]`` from the positions
    (a ``masked`` part), ``[B, 1, c, n c]`` with key padding (every part); (None, None) for a
    ``full`` or ``causal`` part without padding (the kernel's own flag does it)."""
    config, c = blocks.config, blocks.c
    if part.mode != "masked" and not config.padded:
        return None, None
    lo, hi = offset_range(config.causal, config.window)
    queries = torch.arange(part.query_chunk * c, (part.query_chunk + 1) * c, device=device)
    keys = torch.cat([torch.arange(g * c, (g + 1) * c, device=device) for g in part.key_chunks])
    offset = queries.unsqueeze(1) - keys.unsqueeze(0)
    visible = (offset >= lo) & (offset <= hi)
    if config.padded:
        visible = visible & (blocks.chunks(2, part) != 0).unsqueeze(2)  # [B, 1, 1, n c]
    additive = torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill(~visible, float("-inf"))
    return additive, visible.any(dim=-1)


def _slot(part: AttentionPart, config: CPConfig) -> int:
    return config.layout.owner_of(part.query_chunk)[1]


def _merge(acc: tuple[torch.Tensor, torch.Tensor] | None, out: torch.Tensor, lse: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact merge of two partial attentions of the same query rows by their logsumexp."""
    out, lse = out.to(lse.dtype), lse
    if acc is None:
        return out, lse
    acc_out, acc_lse = acc
    total = torch.logaddexp(acc_lse, lse)
    # exp(-inf - -inf) is nan: a row neither part reaches keeps weight 0
    w_acc = torch.exp(acc_lse - total).nan_to_num(0.0).unsqueeze(-1)
    w_new = torch.exp(lse - total).nan_to_num(0.0).unsqueeze(-1)
    return acc_out * w_acc + out * w_new, total


def _forward(q: torch.Tensor, blocks: _Blocks) -> tuple[torch.Tensor, torch.Tensor]:
    """The gather beside the local parts, then the remote parts; each query chunk merged by logsumexp."""
    config, c = blocks.config, blocks.c
    kernel = KERNELS[config.kernel]
    blocks.issue()
    acc: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * config.layout.chunks_per_rank
    for part in config.parts():
        if not part.local:
            blocks.arrive()
        slot = _slot(part, config)
        mask, reached = _mask(part, blocks, q.dtype, q.device)
        out, lse = kernel.forward(q[:, :, slot * c:(slot + 1) * c], blocks.chunks(0, part), blocks.chunks(1, part),
                                  part.mode == "causal" and mask is None, mask, config.scale)
        if reached is not None:  # the fused kernel gives a row with no key lse 0 (and out 0)
            lse = lse.masked_fill(~reached, float("-inf"))
        acc[slot] = _merge(acc[slot], out, lse)
    blocks.arrive()
    return torch.cat([a[0] for a in acc], dim=2).to(q.dtype), torch.cat([a[1] for a in acc], dim=2)


def _backward(dout: torch.Tensor, q: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, blocks: _Blocks
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every rank issues the same collectives (a rank with no remote part sends zeros)."""
    config = blocks.config
    kernel = KERNELS[config.kernel]
    cp = config.layout.cp
    k, v = blocks.local[0], blocks.local[1]
    parts = config.parts()
    local = [p for p in parts if p.local]
    remote = [p for p in parts if not p.local]
    if cp > 1 and blocks.everyone is None:  # keep_gathered=False: gather again, beside the local parts
        blocks.issue()
        order = local + remote
    else:
        order = remote + local
    acc_dtype = torch.float32 if k.dtype in (torch.float16, torch.bfloat16) else k.dtype
    buffer = torch.zeros(cp, k.numel() + v.numel(), dtype=acc_dtype, device=k.device)
    remote_grads = _split(buffer, (k.shape, v.shape), cp)
    local_grads = (torch.zeros(k.shape, dtype=acc_dtype, device=k.device),
                   torch.zeros(v.shape, dtype=acc_dtype, device=v.device))
    dq = torch.zeros(q.shape, dtype=acc_dtype, device=q.device)
    # a row that sees no key (padding) has lse -inf: +inf makes its P = exp(s - lse) 0, not nan
    lse = lse.masked_fill(lse == float("-inf"), float("inf"))
    # the reduce-scatter goes out once the last remote part is done (at once on a rank without any)
    scatter_after = max((i for i, p in enumerate(order) if not p.local), default=-1)
    pending_scatter = None
    for i in range(-1, len(order)):
        if i >= 0:
            part = order[i]
            if not part.local:
                blocks.arrive()
            _part_backward(kernel, part, dout, q, out, lse, blocks, dq, local_grads if part.local else remote_grads)
        if i == scatter_after and cp > 1:
            pending_scatter = _OPS.reduce_scatter_tensor(buffer.view(-1), "sum", cp, config.group_name)
    blocks.arrive()
    dk, dv = local_grads
    if pending_scatter is not None:
        arrived = _OPS.wait_tensor(pending_scatter)
        dk += arrived[:k.numel()].view(k.shape)
        dv += arrived[k.numel():].view(v.shape)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _part_backward(kernel: _Kernel, part: AttentionPart, dout: torch.Tensor, q: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor, blocks: _Blocks, dq: torch.Tensor, into: tuple[Any, ...]) -> None:
    """One part's kernel backward with the merged out/lse; dQ into ``dq``, dK/dV into ``into``
    (this rank's ``[B, H_kv, S, D]`` for local parts; for remote ones indexed by owner first:
    the ``[cp, ...]`` buffer, or the ring's ``{owner: block}``)."""
    config, c = blocks.config, blocks.c
    rows = slice(_slot(part, config) * c, (_slot(part, config) + 1) * c)
    mask, _ = _mask(part, blocks, q.dtype, q.device)
    dq_p, dk_p, dv_p = kernel.backward(dout[:, :, rows].contiguous(), q[:, :, rows], blocks.chunks(0, part),
                                       blocks.chunks(1, part), out[:, :, rows].contiguous(),
                                       lse[:, :, rows].contiguous(), part.mode == "causal" and mask is None, mask,
                                       config.scale)
    dq[:, :, rows] += dq_p
    for j, g in enumerate(part.key_chunks):
        owner, slot = config.layout.owner_of(g)
        for grad, whole in zip((dk_p, dv_p), into):
            target = whole if part.local else whole[owner]
            target[:, :, slot * c:(slot + 1) * c] += grad[:, :, j * c:(j + 1) * c]


class _ContextAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, padding: torch.Tensor | None,
                config: CPConfig) -> torch.Tensor:
        local = (k, v) if padding is None else (k, v, padding)
        blocks = _Blocks(local, config)
        out, lse = _forward(q, blocks)
        kept = blocks.everyone if config.keep_gathered and blocks.everyone is not None else ()
        ctx.save_for_backward(q, out, lse, *local, *kept)
        ctx.config, ctx.n_local = config, len(local)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, out, lse, *rest = ctx.saved_tensors
        blocks = _Blocks(tuple(rest[:ctx.n_local]), ctx.config)
        if rest[ctx.n_local:]:
            blocks.everyone = tuple(rest[ctx.n_local:])
        dq, dk, dv = _backward(dout.contiguous(), q, out, lse, blocks)
        return dq, dk, dv, None, None


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: ChunkLayout) -> None:
    """One error line naming the tensor for inputs this exchange cannot run."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"context_attention: {name} must be [batch, heads, seq_local, head_dim], "
                             f"got {tuple(t.shape)}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"context_attention: k {tuple(k.shape)} and v {tuple(v.shape)} differ before head_dim")
    if q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"context_attention: q {tuple(q.shape)} and k {tuple(k.shape)} differ in batch, seq_local "
                         "or head_dim")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"context_attention: k's {k.shape[1]} heads do not divide q's {q.shape[1]} (GQA)")
    if q.shape[2] % layout.chunks_per_rank:
        raise ValueError(f"context_attention: q's seq_local {q.shape[2]} does not split into "
                         f"{layout.chunks_per_rank} equal chunks (load-balanced: head and tail)")


def context_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any = None, *, causal: bool = True,
                      window: int | None = None, key_padding: torch.Tensor | None = None, scale: float | None = None,
                      load_balanced: bool = True, keep_gathered: bool = True, kernel: str | None = None
                      ) -> torch.Tensor:
    """Attention of this rank's query tokens against the whole sequence's keys, over the CP
    process ``group`` (default: the world); differentiable in ``q, k, v`` (module docstring).

    Every rank calls it with its own chunks (:func:`sequence_shard` of the whole
    ``q, k, v``); the result is this rank's chunks of ``F.scaled_dot_product_attention``
    of the whole sequence (``enable_gqa`` for fewer K/V heads). ``window``: a
    key ``k`` is visible from query ``p`` only if ``p - k < window`` (and
    ``k - p < window`` when not causal). ``key_padding``: this rank's
    ``[batch, seq_local]`` booleans, True for a real token (Hugging Face's
    ``attention_mask``, sharded like the inputs); padding keys are seen by no
    query, and a query that sees no key gets 0, as ``scaled_dot_product_attention``
    gives it. ``kernel``: a name in :data:`KERNELS` (default ``cpu`` for CPU
    tensors, else ``math``).

    Example, on each of 2 gloo ranks (``q, k, v``: the whole sequence, in every rank)::

        rank = dist.get_rank()
        local = [sequence_shard(t, 2, rank, dim=2) for t in (q, k, v)]
        out = context_attention(*local, causal=True)
        # out == sequence_shard(F.scaled_dot_product_attention(q, k, v, is_causal=True), 2, rank, dim=2)
    """
    group, cp, layout, kernel, padding = _setup("context_attention", q, k, v, group, load_balanced, kernel,
                                                key_padding, causal, window)
    config = CPConfig(group.group_name, dist.get_rank(group), layout, bool(causal), window, scale, kernel,
                      bool(keep_gathered), cp * q.shape[2], padding is not None)
    return _ContextAttention.apply(q, k, v, padding, config)


def _setup(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any, load_balanced: bool,
           kernel: str | None, key_padding: torch.Tensor | None, causal: bool,
           window: int | None) -> tuple[Any, int, ChunkLayout, str, torch.Tensor | None]:
    """What both exchanges (all-gather here, the ring in ``context_ring``) check and derive from their
    arguments: the group, its size, the chunk layout, the kernel and the key padding as it travels."""
    group = group if group is not None else dist.group.WORLD
    cp = dist.get_world_size(group)
    layout = ChunkLayout(cp, load_balanced)
    _check(q, k, v, layout)
    kernel = kernel or ("cpu" if q.device.type == "cpu" else "math")
    if kernel not in KERNELS:
        raise ValueError(f"{name}: kernel {kernel!r} is not one of {', '.join(KERNELS)}")
    padding = None
    if key_padding is not None:
        if tuple(key_padding.shape) != (k.shape[0], k.shape[2]):
            raise ValueError(f"{name}: key_padding must be [batch, seq_local] = "
                             f"{[k.shape[0], k.shape[2]]}, got {list(key_padding.shape)}")
        padding = key_padding.to(device=k.device, dtype=k.dtype).unsqueeze(1)  # travels in K's gather buffer
    offset_range(bool(causal), window)  # checks the window
    return group, cp, layout, kernel, padding
