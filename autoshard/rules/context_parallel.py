r"""Context parallelism: attention split along the sequence, as exchange strategies.

A local kernel cannot run causal attention on query rows split across ranks
(``autoshard.rules.attention``: the causal diagonal would align at the local
row 0, and the rows need every key). With the keys and values all-gathered
over the split's mesh dim it can: each rank computes its query rows against
the whole sequence, merging the visible chunks by their logsumexp
(``autoshard.runtime.context_attention``). That is no local op, so, as expert
parallelism (``autoshard.rules.experts``), it is offered as an *exchange*
strategy (``OpStrategy.exchange = (kind, mesh_dim)``) by
``autoshard.rules.expand.expand_exchanges``, priced by the kind's price
function (:func:`context_exchange_price`, registered with
``autoshard.rules.expand.register_exchange_price``) and run by the runtime's op
caller (``autoshard.runtime.context_ops``). The rule validator skips exchange
strategies (``strategy.exchange is not None``); the runtime's equivalence tests
check them.

**Contract with the runtime** (``autoshard.runtime.context_ops``):

* ``"context_gather"`` on the forward attention node (CPU:
  ``aten._scaled_dot_product_flash_attention_for_cpu``; CUDA:
  ``aten._scaled_dot_product_flash_attention``,
  ``aten._scaled_dot_product_efficient_attention``): ``query``, ``key``,
  ``value`` ``S(2)`` (sequence) on the CP mesh dim; outputs ``out`` and
  ``logsumexp`` ``S(2)`` (the CUDA kernels' random-state and debug outputs
  ``R``); an explicit mask (``attn_mask`` / ``attn_bias``, broadcast to
  ``[B|1, H|1, L, S]``) split on its query-row dim (dim ``ndim - 2``: 2 for a
  4-D mask), its key dim whole, or ``R`` where that dim has size 1. Layout as
  DTensor's ``Shard(2)``: rank ``r`` of the CP group holds the contiguous rows
  ``[r L/cp, (r+1) L/cp)``; K/V are all-gathered inside the exchange. On the
  backward node (``..._backward``): ``grad_out``, ``query``, ``key``,
  ``value``, ``out``, ``logsumexp`` ``S(2)`` -> ``grad_q``, ``grad_k``,
  ``grad_v`` ``S(2)`` (the efficient kernel's ``grad_bias`` is not made); the
  backward gathers K/V again and reduce-scatters dK/dV (``keep_gathered=False``
  in ``costmodel.context_parallel``). On the other mesh dims the rule's batch
  split ``S(0)`` and head split ``S(1)`` (and all-replicate).
* ``"context_gather_balanced"``: the same placements and graph layout; inside
  the exchange the query rows are moved so each rank computes the causal
  load-balanced head-and-tail chunk pair (chunks ``r`` and ``2 cp - 1 - r`` of
  ``2 cp``), the outputs moved back. Causal attention without a mask only, and
  only where ``2 cp`` divides the sequence.
* ``"context_ring"``: the same placements, contiguous rows; inside the exchange
  the K/V blocks pass around the CP ring one hop a step beside that step's
  attention (``autoshard.runtime.context_ring``), two blocks held instead of
  ``cp``; in the backward the blocks travel again with their dK/dV
  accumulators. Without an explicit mask only (not yet with the balanced
  layout: the ring's steps follow the keys' owners, the balanced queries'
  parts another grouping).
* ``"context_whole_kv"`` (Llama 3's CP: K/V gathered before the GQA expansion): ``query``
  ``S(2)``, ``key``, ``value`` ``R`` (whole) on the CP mesh dim, the mask as above -> ``out``,
  ``logsumexp`` ``S(2)``; backward: ``grad_out``, ``query``, ``out``, ``logsumexp`` ``S(2)``,
  ``key``, ``value`` ``R`` -> ``grad_q`` ``S(2)``, ``grad_k``, ``grad_v`` ``P(sum)``. The exchange
  itself moves nothing: the K/V all-gather and the dK/dV reduce-scatter are the graph's
  redistributions, priced and placed by the solver like any other, so they can sit before the
  model's K/V head expansion (``unsqueeze``/``expand``/``clone``/``view`` carry ``R``) and after
  its backward's ``sum`` (``P(sum)`` in, ``P(sum)`` out): ``H / H_kv`` times fewer bytes than
  gathering the expanded K/V inside the exchange. An edge into a view takes its input as it
  comes, except into a growing view (``expand``, ``autoshard.graph.copies``): so K (after
  RoPE's products) and V (only views between its projection and the expand) can both be
  gathered at the K/V heads' bytes, on the ``expand``'s input. Each rank computes its
  query rows against the whole K/V and leaves its dK/dV share of every key row; in 16-bit dtypes
  that share is rounded to the graph's dtype before the graph sums it over the CP ranks
  (``autoshard.runtime.context_ops``).
* ``"context_whole_kv_balanced"``: the same placements, the query rows moved to the causal
  head-and-tail chunk pairs inside the exchange as ``"context_gather_balanced"`` moves them.
  Causal attention without a mask only, where ``2 cp`` divides the sequence.

**Where it is exact** (else not offered): self-attention (``L == S``), no
dropout, the sequence divisible by the CP degree (``2 cp`` for the balanced
kind; the efficient kernel's logsumexp rows padded to 32, so ``L / cp`` a
multiple of 32 there), causal, full, or an explicit mask split as above; GQA
(fewer K/V heads) as the rule's head split allows.

**Price** (:func:`context_exchange_price`): ``costmodel.context_parallel.
price_context_attention`` of the local attention shape (batch and heads after
the other mesh dims' splits, the whole sequence) on the CP mesh dim, all-gather
variant, ``keep_gathered=False``: its ``forward_s`` on the forward node, its
``backward_s`` on the backward node. The contiguous layout's unbalanced causal
work is what it prices with ``load_balanced=False``; the balanced kind is the
load-balanced price plus the row moves (all-to-alls on the CP mesh dim: ``q``
in and ``out``, ``logsumexp`` back in the forward; ``grad_out``, ``q``,
``out``, ``logsumexp`` in and ``grad_q`` back in the backward). With an
explicit mask every pair is priced (a full mask). The ring kind is the ring
variant's price (each step's parts beside its pass). :func:`gathered_kv_bytes` is
what the exchange holds beside the op (the gathered K/V and, in the backward, the
fp32 dK/dV buffer; the ring's two blocks, and two fp32 dK/dV blocks in the backward).
Inside :func:`priced_as_torch` the balanced kind is priced as torch's own
``context_parallel`` runs it instead (``costmodel.context_parallel_torch``): for
pricing a published torchtitan layout as it ran, never for a plan this runtime runs.
The whole-K/V kinds are ``costmodel.context_parallel.price_whole_kv_attention``: the attention
parts alone (no collective; balanced or not as above), plus the balanced kind's row moves;
beside the op the backward's dK/dV accumulators of the whole sequence (fp32 for 16-bit K/V).

>>> from autoshard.rules.calls import make_call
>>> x = TensorMeta((1, 4, 64, 8), torch.float32)
>>> call = make_call(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default, (x, x, x, 0.0, True), {}, None)
>>> [kind for _, kind in context_exchanges(call)]
['context_gather', 'context_gather_balanced', 'context_ring', 'context_whole_kv', 'context_whole_kv_balanced']
>>> str(context_exchanges(call)[0][0])
'S*(2), S*(2) <- S*(2), S*(2), S*(2)'
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch

from costmodel.collectives import collective_time_s
from costmodel.context_parallel import (AttentionShape, ContextAttentionCost, accumulator_itemsize,
                                        price_context_attention, price_whole_kv_attention)
from costmodel.context_parallel_torch import ROTATE_METHODS, price_torch_context_attention
from costmodel.mesh import MeshSpec
from hw_profiles import HardwareProfile
from autoshard.rules.core import P, OpCall, OpStrategy, R, S, SingleDimStrategy, TensorMeta
from autoshard.rules.expand import ExchangeProvider, local_call, register_exchange, register_exchange_price

__all__ = ["GATHER", "GATHER_BALANCED", "KINDS", "context_exchanges", "context_exchange_price",
           "gathered_kv_bytes", "admits", "register_context_parallel", "RING", "torch_exchange_price",
           "priced_as_torch", "WHOLE_KV", "WHOLE_KV_BALANCED", "WHOLE_KV_KINDS"]

GATHER = "context_gather"
"""K/V all-gathered over the CP mesh dim, query rows where they are (contiguous chunks)."""
GATHER_BALANCED = "context_gather_balanced"
"""As :data:`GATHER`, query rows moved to the causal head-and-tail chunk pairs inside the exchange."""
RING = "context_ring"
"""Query rows where they are (contiguous chunks); the K/V blocks passed around the CP ring, one hop a
step beside that step's attention (``autoshard.runtime.context_ring``): two blocks held, not ``cp``.
Without an explicit mask only."""
WHOLE_KV = "context_whole_kv"
"""K/V whole (``R``) on the CP mesh dim, dK/dV partial: the gather and reduce-scatter are the graph's."""
WHOLE_KV_BALANCED = "context_whole_kv_balanced"
"""As :data:`WHOLE_KV`, query rows moved to the causal head-and-tail chunk pairs inside the exchange."""
WHOLE_KV_KINDS = (WHOLE_KV, WHOLE_KV_BALANCED)
KINDS = (GATHER, GATHER_BALANCED, RING) + WHOLE_KV_KINDS
_BALANCED = (GATHER_BALANCED, WHOLE_KV_BALANCED)

aten = torch.ops.aten
_CPU = (aten._scaled_dot_product_flash_attention_for_cpu.default,
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
_FLASH = (aten._scaled_dot_product_flash_attention.default,
          aten._scaled_dot_product_flash_attention_backward.default)
_EFFICIENT = (aten._scaled_dot_product_efficient_attention.default,
              aten._scaled_dot_product_efficient_attention_backward.default)
_BACKWARD = frozenset((_CPU[1], _FLASH[1], _EFFICIENT[1]))
_LSE_ROWS = 32
"""The efficient kernel pads its logsumexp's rows to a multiple of this."""


def _mask(call: OpCall) -> tuple[str, TensorMeta | None]:
    """(schema name, meta) of the call's explicit mask (None without one)."""
    name = "attn_bias" if call.op in _EFFICIENT else "attn_mask"
    mask = call.bound.get(name)
    return name, mask if isinstance(mask, TensorMeta) else None


def _exact(call: OpCall) -> bool:
    """Whether a sequence split with gathered K/V computes the call exactly (module docstring)."""
    q, k, v = (call.bound.get(n) for n in ("query", "key", "value"))
    if not all(isinstance(t, TensorMeta) and t.ndim == 4 for t in (q, k, v)):
        return False
    if not q.shape[2] == k.shape[2] == v.shape[2] or call.arg("dropout_p", 0.0) != 0.0:  # type: ignore[union-attr]
        return False
    _, mask = _mask(call)
    if mask is not None and (mask.ndim < 2 or mask.shape[-2] not in (1, q.shape[2])):  # type: ignore[union-attr]
        return False
    if call.op in _EFFICIENT:  # the logsumexp's rows are padded: a row split is exact only unpadded
        lse = call.outputs[1] if call.op is _EFFICIENT[0] else call.bound.get("logsumexp")
        return isinstance(lse, TensorMeta) and lse.shape[-1] == q.shape[2]  # type: ignore[union-attr]
    return True


def _placements(call: OpCall, whole_kv: bool = False) -> SingleDimStrategy:
    """The exchange's single-dim placements (module docstring, the contract); ``whole_kv``: K/V
    ``R`` in, dK/dV ``P(sum)`` out."""
    name, mask = _mask(call)
    rows = None if mask is None else (R if mask.shape[-2] == 1 else S(mask.ndim - 2))
    backward = call.op in _BACKWARD
    grad_out = "grad_out_" if call.op is _EFFICIENT[1] else "grad_out"
    split = ("query",) + (() if whole_kv else ("key", "value")) + ((grad_out, "out", "logsumexp") if backward else ())
    ins = call.place(R, **{n: S(2) for n in split}, **({name: rows} if mask is not None else {}))
    if backward:
        grads = (S(2), P, P) if whole_kv else (S(2),) * 3
        outs = grads + ((None,) if call.op is _EFFICIENT[1] else ())
    elif call.op is _FLASH[0]:  # cum_seq_q/k, max_q/k are no tensors; rng state, unused, debug mask
        outs = (S(2), S(2), None, None, None, None, R, R, R)
    elif call.op is _EFFICIENT[0]:  # philox seed and offset
        outs = (S(2), S(2), R, R)
    else:
        outs = (S(2), S(2))
    return SingleDimStrategy(outs, ins)


def context_exchanges(call: OpCall) -> list[tuple[SingleDimStrategy, str]]:
    """The call's context-parallel single-dim strategies with their exchange kinds; none where
    not exact (module docstring). The balanced kind only for causal attention without a mask."""
    if call.op not in _CPU + _FLASH + _EFFICIENT or not _exact(call):
        return []
    single, whole = _placements(call), _placements(call, whole_kv=True)
    balanced = bool(call.arg("is_causal", False)) and _mask(call)[1] is None
    found = [(single, GATHER)] + ([(single, GATHER_BALANCED)] if balanced else [])
    if _mask(call)[1] is None:
        found.append((single, RING))
    return found + [(whole, WHOLE_KV)] + ([(whole, WHOLE_KV_BALANCED)] if balanced else [])


def admits(call: OpCall, kind: str, ranks: int) -> bool:
    """Whether ``kind`` is exact on a mesh dim of ``ranks`` ranks beyond the even split
    (``autoshard.rules.expand.ExchangeAdmits``): ``2 ranks`` chunks for the balanced kind,
    unpadded logsumexp rows of the efficient kernel on each rank.

    >>> from autoshard.rules.calls import make_call
    >>> x = TensorMeta((1, 4, 12, 8), torch.float32)
    >>> call = make_call(_CPU[0], (x, x, x, 0.0, True), {}, None)
    >>> admits(call, GATHER, 4), admits(call, GATHER_BALANCED, 4), admits(call, GATHER_BALANCED, 3)
    (True, False, True)
    """
    length = call.bound["query"].shape[2]
    if kind in _BALANCED and length % (2 * ranks):
        return False
    if call.op in _EFFICIENT and (length % ranks or (length // ranks) % _LSE_ROWS):
        return False
    return True


def provider(companions: Callable[[OpCall], list[SingleDimStrategy]]) -> ExchangeProvider:
    """The exchange provider of an attention rule whose batch and head splits are the first
    two of ``companions(call)`` (``autoshard.rules.expand.register_exchange``)."""

    def exchanges(call: OpCall) -> tuple[list[tuple[SingleDimStrategy, str]], list[SingleDimStrategy]]:
        found = context_exchanges(call)
        return found, (companions(call)[:2] if found else [])

    return exchanges


def _attention_shape(call: OpCall, strategy: OpStrategy, mesh: MeshSpec) -> AttentionShape:
    """The attention one CP group computes: batch and heads after the other mesh dims, the whole sequence."""
    local = local_call(call, strategy, tuple(mesh.shape))
    names = call.tensor_names()
    q, k = local.inputs[names.index("query")], local.inputs[names.index("key")]
    seq = call.bound["query"].shape[2]
    dtype = str(q.dtype)
    return AttentionShape(batch=q.shape[0], heads=q.shape[1], kv_heads=k.shape[1], seq_len=seq, head_dim=q.shape[3],
                          dtype=dtype, itemsize=q.itemsize)


def _priced(shape: AttentionShape, mesh: MeshSpec, mesh_dim: int, profile: HardwareProfile, causal: bool,
            balanced: bool, variant: str = "all_gather") -> ContextAttentionCost:
    def price(dtype: str) -> ContextAttentionCost:
        typed = AttentionShape(shape.batch, shape.heads, shape.kv_heads, shape.seq_len, shape.head_dim, dtype,
                               shape.itemsize)
        if variant == "whole_kv":
            return price_whole_kv_attention(typed, mesh=mesh, cp_mesh_dim=mesh_dim, profile=profile, causal=causal,
                                            load_balanced=balanced)
        return price_context_attention(typed, mesh=mesh, cp_mesh_dim=mesh_dim, profile=profile, causal=causal,
                                       load_balanced=balanced, keep_gathered=False, variant=variant)

    try:
        return price(shape.dtype)
    except ValueError:  # a dtype the profile has no peak for: priced as fp32, as other ops are
        if shape.dtype == "torch.float32":
            raise
        return price("torch.float32")


def _balancing_moves_s(shape: AttentionShape, mesh: MeshSpec, mesh_dim: int, profile: HardwareProfile,
                       backward: bool) -> float:
    """The all-to-alls that move the query rows to the head-and-tail chunks and the results back."""
    cp = mesh.shape[mesh_dim]
    rows = shape.batch * shape.heads * (shape.seq_len // cp) * shape.itemsize
    q_bytes, lse_bytes = rows * shape.head_dim, shape.batch * shape.heads * (shape.seq_len // cp) * 4
    moved = [q_bytes, q_bytes, q_bytes, lse_bytes, q_bytes] if backward else [q_bytes, q_bytes, lse_bytes]
    return sum(collective_time_s("all_to_all", float(b), (mesh_dim,), mesh, profile) for b in moved)


def context_exchange_price(call: OpCall, strategy: OpStrategy, *, mesh: MeshSpec, profile: HardwareProfile,
                           imbalance: float = 1.0) -> tuple[None, float]:
    """A context-parallel strategy of a forward or backward attention call (global shapes)
    priced as it runs (module docstring): ``(None, seconds)`` for
    ``autoshard.rules.expand.ExchangePricer``; ``imbalance`` (expert parallelism's) is unused.

    >>> # _, seconds = context_exchange_price(call, strategy, mesh=mesh, profile=profile)
    """
    if strategy.exchange is None or strategy.exchange[0] not in KINDS:
        raise ValueError(f"{strategy}: not a context-parallel strategy")
    kind, mesh_dim = strategy.exchange
    if kind == GATHER_BALANCED and _TORCH_ROTATE:  # inside priced_as_torch
        return torch_exchange_price(call, strategy, mesh=mesh, profile=profile, rotate=_TORCH_ROTATE[-1])
    shape = _attention_shape(call, strategy, mesh)
    causal = bool(call.arg("is_causal", False)) and _mask(call)[1] is None
    balanced = kind in _BALANCED
    cost = _priced(shape, mesh, mesh_dim, profile, causal, balanced,
                   "whole_kv" if kind in WHOLE_KV_KINDS else "ring" if kind == RING else "all_gather")
    backward = call.op in _BACKWARD
    seconds = cost.backward_s if backward else cost.forward_s
    if balanced:
        seconds += _balancing_moves_s(shape, mesh, mesh_dim, profile, backward)
    return None, seconds


def gathered_kv_bytes(call: OpCall, strategy: OpStrategy, *, mesh: MeshSpec, **_: object) -> int:
    """Bytes a rank holds beside the op while its exchange runs: the gathered K/V (and in the
    backward the dK/dV buffer the reduce-scatter reads, in the runtime's fp32 accumulators for
    16-bit K/V); for the whole-K/V kinds only the backward's dK/dV accumulators of the whole
    sequence (the whole K/V and the partial dK/dV are graph tensors); 0 for a strategy without
    a CP exchange.

    >>> # gathered_kv_bytes(call, strategy, mesh=MeshSpec((2, 4), ("dp", "cp")))
    """
    if strategy.exchange is None or strategy.exchange[0] not in KINDS:
        return 0
    mesh_shape = tuple(mesh.shape)
    local = local_call(call, strategy, mesh_shape)
    names = call.tensor_names()
    cp = mesh_shape[strategy.exchange[1]]
    key = local.inputs[names.index("key")]
    local_kv = sum(local.inputs[names.index(n)].nbytes for n in ("key", "value"))
    grad_kv = local_kv * accumulator_itemsize(key.itemsize) // key.itemsize  # dK/dV as the runtime accumulates them
    if strategy.exchange[0] in WHOLE_KV_KINDS:  # local K/V are whole here
        return grad_kv if call.op in _BACKWARD else 0
    if strategy.exchange[0] == RING:  # the block in hand and the one arriving; the backward's two dK/dV too
        return 2 * local_kv + 2 * grad_kv if call.op in _BACKWARD else 2 * local_kv
    return cp * (local_kv + grad_kv) if call.op in _BACKWARD else cp * local_kv


def register_context_parallel(forward_rule: Callable[[OpCall], list[SingleDimStrategy]],
                              backward_rule: Callable[[OpCall], list[SingleDimStrategy]]) -> None:
    """Offer context-parallel strategies with the expansions of an attention rule pair
    (``autoshard.rules.attention``, ``autoshard.rules.cuda_attention`` call it from their
    ``register``) and register the kinds' price and temporary-bytes functions."""
    for rule in (forward_rule, backward_rule):
        register_exchange(rule, provider(rule), admits=admits)
    for kind in KINDS:
        register_exchange_price(kind, context_exchange_price, memory=gathered_kv_bytes)


def torch_exchange_price(call: OpCall, strategy: OpStrategy, *, mesh: MeshSpec, profile: HardwareProfile,
                         imbalance: float = 1.0, rotate: str = "all_gather") -> tuple[None, float]:
    """The balanced kind priced as torch's ``context_parallel`` runs it
    (``costmodel.context_parallel_torch``): its ring loop's per-step calls, fp32 merges and dK/dV
    passes, K/V exchanged by ``rotate``; no row moves (torch reorders the inputs once). For
    pricing a published torchtitan layout (:func:`priced_as_torch`); ``imbalance`` is unused.

    >>> # _, seconds = torch_exchange_price(call, strategy, mesh=mesh, profile=profile)
    """
    if strategy.exchange is None or strategy.exchange[0] != GATHER_BALANCED:
        raise ValueError(f"{strategy}: not a balanced context-parallel strategy")
    shape = _attention_shape(call, strategy, mesh)
    try:
        cost = price_torch_context_attention(shape, mesh=mesh, cp_mesh_dim=strategy.exchange[1], profile=profile,
                                             rotate=rotate)
    except ValueError:  # a dtype the profile has no peak for: priced as fp32, as other ops are
        if shape.dtype == "torch.float32":
            raise
        shape = AttentionShape(shape.batch, shape.heads, shape.kv_heads, shape.seq_len, shape.head_dim,
                               "torch.float32", shape.itemsize)
        cost = price_torch_context_attention(shape, mesh=mesh, cp_mesh_dim=strategy.exchange[1], profile=profile,
                                             rotate=rotate)
    return None, cost.backward_s if call.op in _BACKWARD else cost.forward_s


_TORCH_ROTATE: list[str] = []
"""The K/V rotater of each :func:`priced_as_torch` block entered and not left (innermost last);
a flag :func:`context_exchange_price` reads, not a swapped registration, because loading the
rules (every graph build does) registers the kinds' prices again."""


@contextlib.contextmanager
def priced_as_torch(rotate: str = "all_gather") -> Iterator[None]:
    """Within the block, :func:`context_exchange_price` prices :data:`GATHER_BALANCED` as torch's
    own context parallelism (:func:`torch_exchange_price`, K/V by ``rotate``): a published
    torchtitan layout pinned as it ran. Left, the balanced kind is autoshard's exchange again.

    >>> with priced_as_torch():
    ...     pass  # build_graph(...) here prices the balanced kind as torch runs it
    """
    if rotate not in ROTATE_METHODS:
        raise ValueError(f"rotate: {rotate!r} is not one of {', '.join(ROTATE_METHODS)}")
    _TORCH_ROTATE.append(rotate)
    try:
        yield
    finally:
        _TORCH_ROTATE.pop()
