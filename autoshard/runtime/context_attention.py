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
float64 inputs; the tests check it on CPU like the fused one). ``flash`` and
``efficient``: the CUDA fused kernels, which return the logsumexp too and take
it back in their backward (``autoshard.runtime.context_cuda``: bf16/fp16 parts
without a mask on flash, GQA keys expanded; the others on the efficient kernel
with ``attn_bias``); checked on CUDA fake tensors (shapes, devices, no host
sync), not yet on a GPU.

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

**Plan nodes** (``autoshard.runtime.context_ops``: ``context_attention_forward``,
``context_attention_backward``, which run a plan's ``context_gather`` exchanges): the
forward and the backward attention node each as one call, with no state between them (the
backward gathers K/V again), on the plan's contiguous sequence split (DTensor ``Shard(2)``).
An explicit attention mask comes with its query rows local and its key columns whole (each
part takes its columns; Hugging Face's padding and sliding-window masks). With
``load_balanced=True`` the query rows (in the backward also ``grad_out``, ``out``, ``lse``)
move to the head-and-tail layout and back by an all-to-all (``autoshard.runtime.context_comm``),
while K/V stay contiguous (:attr:`CPConfig.keys_contiguous`). With whole K/V (:attr:`CPConfig.whole_kv`,
the plan's ``context_whole_kv`` kinds) nothing is gathered: each query chunk runs against slices of
the whole K/V in at most two calls (``costmodel.context_parallel.whole_kv_parts``), and the backward
returns dK/dV of every key row, this rank's share of a sum the plan reduce-scatters.

Still missing: dropout inside attention; the CUDA kernels' numbers on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives  # noqa: F401 - registers the _c10d_functional ops

from costmodel.context_parallel import AttentionPart, ChunkLayout, attention_parts, offset_range, whole_kv_parts

from autoshard.runtime import context_comm
from autoshard.runtime.context_cuda import CUDA_KERNELS

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


def _accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """What dQ/dK/dV accumulate in across parts: fp32 for 16-bit inputs (``costmodel.context_parallel.
    accumulator_itemsize`` prices the same), the inputs' own dtype otherwise."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _scores(q, k, causal, mask, scale):
    """``QK^T * scale`` with the mask added, GQA keys shared by their query heads: ``[B, H_kv, G, L, S]``."""
    b, h, length, d = q.shape
    groups = h // k.shape[1]
    s = torch.matmul(q.view(b, k.shape[1], groups, length, d), k.unsqueeze(2).transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(length, k.shape[2], dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    if mask is not None:  # [L, S], [B, 1, L, S] (broadcast over the head groups) or [B, H, L, S]
        if mask.dim() == 4 and mask.shape[1] > 1:
            s = s + mask.view(mask.shape[0], k.shape[1], groups, *mask.shape[2:])
        else:
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


KERNELS = {"cpu": _Kernel(_cpu_forward, _cpu_backward), "math": _Kernel(_math_forward, _math_backward),
           **{name: _Kernel(*pair) for name, pair in CUDA_KERNELS.items()}}
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
    keys_contiguous: bool = False
    """K/V are held in the contiguous order (rank ``r``: chunks ``2r, 2r + 1`` of a load-balanced
    layout's ``2 cp``) while the queries are in ``layout``'s: a plan node's balanced exchange."""
    whole_kv: bool = False
    """K/V are the whole sequence on every rank (a plan's ``context_whole_kv`` kinds): no exchange of
    keys, the parts :func:`costmodel.context_parallel.whole_kv_parts`."""

    def key_owner(self, chunk: int) -> tuple[int, int]:
        """(rank, slot) holding the keys of global chunk ``chunk``."""
        if self.keys_contiguous and self.layout.load_balanced:
            return divmod(chunk, 2)
        return self.layout.owner_of(chunk)

    def parts(self) -> tuple[AttentionPart, ...]:
        if self.whole_kv:
            return whole_kv_parts(self.layout, self.rank, self.seq_len, causal=self.causal)
        parts = attention_parts(self.layout, self.rank, self.seq_len, causal=self.causal, window=self.window,
                                group_by="owner" if self.ring else "locality")
        if not (self.keys_contiguous and self.layout.load_balanced):
            return parts
        # locality by where the keys are, not by the queries' layout
        parts = [replace(p, local=all(self.key_owner(g)[0] == self.rank for g in p.key_chunks)) for p in parts]
        return tuple(sorted(parts, key=lambda p: not p.local))


def _split(flat: torch.Tensor, shapes: tuple[torch.Size, ...], cp: int) -> tuple[torch.Tensor, ...]:
    """``[cp, *shape]`` views of a ``[cp * sum(numel)]`` buffer holding each rank's tensors back to back."""
    rows = flat.view(cp, -1)
    views, start = [], 0
    for shape in shapes:
        n = shape.numel()
        views.append(rows.narrow(1, start, n).view(cp, *shape))
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
        self.mask: torch.Tensor | None = None
        """An explicit additive mask ``[B|1, H|1, rows|1, L]``: this rank's query rows, every key."""

    def issue(self) -> None:
        """Issue the all-gather (every rank must, even one that needs no remote key)."""
        if self.config.layout.cp > 1:
            flat = torch.cat([t.reshape(-1) for t in self.local])
            self._pending = context_comm.issue("all_gather", flat, self.config.layout.cp, self.config.group_name)

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
            owner, slot = self.config.key_owner(g)
            t = self.local[which] if owner == self.config.rank else _of_owner(self.everyone[which], owner)
            pieces.append(t.narrow(2, slot * self.c, self.c))
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=2)


class _WholeBlocks(_Blocks):
    """K and V of the whole sequence on this rank (``CPConfig.whole_kv``): nothing to gather; a
    part's key chunks, consecutive, are one slice."""

    def issue(self) -> None:
        pass

    def arrive(self) -> None:
        pass

    def chunks(self, which: int, part: AttentionPart) -> torch.Tensor:
        return self.local[which].narrow(2, part.key_chunks[0] * self.c, len(part.key_chunks) * self.c)


def _whole_backward(dout: torch.Tensor, q: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, blocks: _WholeBlocks
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ of this rank's rows and this rank's share of dK/dV of every key row (a partial sum over
    the CP group), no collective; accumulated in fp32 for 16-bit inputs, returned in the inputs'
    dtype (``autoshard.runtime.context_ops`` says what that rounding costs)."""
    config, c = blocks.config, blocks.c
    kernel = KERNELS[config.kernel]
    k, v = blocks.local[0], blocks.local[1]
    acc_dtype = _accumulator_dtype(k.dtype)
    dq = torch.zeros(q.shape, dtype=acc_dtype, device=q.device)
    dk = torch.zeros(k.shape, dtype=acc_dtype, device=k.device)
    dv = torch.zeros(v.shape, dtype=acc_dtype, device=v.device)
    lse = lse.masked_fill(lse == float("-inf"), float("inf"))  # rows that see no key: P = 0, not nan
    for part in config.parts():
        dk_p, dv_p = _kernel_backward(kernel, part, dout, q, out, lse, blocks, dq)
        keys = (part.key_chunks[0] * c, len(part.key_chunks) * c)
        dk.narrow(2, *keys).add_(dk_p)
        dv.narrow(2, *keys).add_(dv_p)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def dense(t: torch.Tensor) -> torch.Tensor:
    """``t`` in contiguous memory (``Tensor.contiguous`` itself fails on a CUDA fake tensor on a
    CPU-only torch, which the CUDA checks run on).

    >>> dense(torch.zeros(2, 3).t()).is_contiguous()
    True
    """
    return t if t.is_contiguous() else t.clone(memory_format=torch.contiguous_format)


def _of_owner(everyone: Any, owner: int) -> torch.Tensor:
    """Owner ``owner``'s block of a gathered ``[cp, ...]`` tensor or of the ring's ``{owner: block}``."""
    return everyone[owner] if isinstance(everyone, dict) else everyone.select(0, owner)


def _mask(part: AttentionPart, blocks: _Blocks, dtype: torch.dtype, device: Any
          ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(additive float mask, rows that see some key) of a part: ``[c, n c]`` from the positions
    (a ``masked`` part), ``[B, 1, c, n c]`` with key padding (every part), the explicit mask's
    rows and columns of the part added (every part); (None, None) for a ``full`` or ``causal``
    part without either (the kernel's own flag does it)."""
    config, c = blocks.config, blocks.c
    explicit = blocks.mask
    if part.mode != "masked" and not config.padded and explicit is None:
        return None, None
    lo, hi = offset_range(config.causal, config.window)
    queries = torch.arange(part.query_chunk * c, (part.query_chunk + 1) * c, device=device)
    keys = torch.cat([torch.arange(g * c, (g + 1) * c, device=device) for g in part.key_chunks])
    offset = queries.unsqueeze(1) - keys.unsqueeze(0)
    visible = (offset >= lo) & (offset <= hi)
    if config.padded:
        visible = visible & (blocks.chunks(2, part) != 0).unsqueeze(2)  # [B, 1, 1, n c]
    additive = torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill(visible.logical_not(), float("-inf"))
    if explicit is None:
        return additive, visible.any(dim=-1)
    if explicit.shape[2] > 1:  # rows of this query chunk; else one row for all
        slot = _slot(part, config)
        explicit = explicit.narrow(2, slot * c, c)
    columns = [explicit.narrow(3, g * c, c) for g in part.key_chunks]
    additive = additive + (columns[0] if len(columns) == 1 else torch.cat(columns, dim=-1))
    return additive, (additive != float("-inf")).any(dim=-1)


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
        out, lse = kernel.forward(q.narrow(2, slot * c, c), blocks.chunks(0, part), blocks.chunks(1, part),
                                  part.mode == "causal" and mask is None, mask, config.scale)
        if reached is not None:  # the fused kernel gives a row with no key lse 0 (and out 0)
            lse = lse.masked_fill(reached.logical_not(), float("-inf"))
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
    acc_dtype = _accumulator_dtype(k.dtype)
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
            pending_scatter = context_comm.issue("reduce_scatter", buffer.view(-1), "sum", cp, config.group_name)
    blocks.arrive()
    dk, dv = local_grads
    if pending_scatter is not None:
        arrived = _OPS.wait_tensor(pending_scatter)
        dk += arrived.narrow(0, 0, k.numel()).view(k.shape)
        dv += arrived.narrow(0, k.numel(), v.numel()).view(v.shape)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _kernel_backward(kernel: _Kernel, part: AttentionPart, dout: torch.Tensor, q: torch.Tensor, out: torch.Tensor,
                     lse: torch.Tensor, blocks: Any, dq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One part's kernel backward on its query rows and key chunks: dQ added into ``dq``, the
    part's dK/dV returned (where they go is the caller's: the gathered layout's owners, or the
    whole K/V's rows)."""
    config, c = blocks.config, blocks.c
    start = _slot(part, config) * c
    mask, _ = _mask(part, blocks, q.dtype, q.device)
    # narrow, not indexing: a CUDA fake tensor on a CPU-only torch cannot be indexed
    dq_p, dk_p, dv_p = kernel.backward(dense(dout.narrow(2, start, c)), q.narrow(2, start, c),
                                       blocks.chunks(0, part), blocks.chunks(1, part),
                                       dense(out.narrow(2, start, c)), dense(lse.narrow(2, start, c)),
                                       part.mode == "causal" and mask is None, mask, config.scale)
    dq.narrow(2, start, c).add_(dq_p)
    return dk_p, dv_p


def _part_backward(kernel: _Kernel, part: AttentionPart, dout: torch.Tensor, q: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor, blocks: _Blocks, dq: torch.Tensor, into: tuple[Any, ...]) -> None:
    """One part's kernel backward with the merged out/lse; dQ into ``dq``, dK/dV into ``into``
    (this rank's ``[B, H_kv, S, D]`` for local parts; for remote ones indexed by owner first:
    the ``[cp, ...]`` buffer, or the ring's ``{owner: block}``)."""
    config, c = blocks.config, blocks.c
    dk_p, dv_p = _kernel_backward(kernel, part, dout, q, out, lse, blocks, dq)
    for j, g in enumerate(part.key_chunks):
        owner, slot = config.key_owner(g)
        for grad, whole in zip((dk_p, dv_p), into):
            target = whole if part.local else _of_owner(whole, owner)
            target.narrow(2, slot * c, c).add_(grad.narrow(2, j * c, c))


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
        dq, dk, dv = _backward(dense(dout), q, out, lse, blocks)
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

