"""A plan's sequence-split attention nodes run context-parallel: this rank's rows, the exchange.

Under a context-parallel strategy (``autoshard.rules.context_parallel``: ``q, k, v`` split
``Shard(2)``, the sequence, on the CP mesh dim; other mesh dims may split batch or heads, which
arrive as local shards) an attention node cannot run as a local op: a query row needs every
key. :func:`run_context_op` runs the node with its exchange instead (the op caller's hook for a
node whose plan strategy has ``exchange = (kind, mesh_dim)``, ``autoshard.runtime.op_calls``,
given the process group of that mesh dim):

* ``context_gather``: the forward node (CPU: ``aten._scaled_dot_product_flash_attention_for_cpu``;
  CUDA: ``aten._scaled_dot_product_flash_attention`` or ``_efficient_attention``, whose parts
  run on the same kernels, ``autoshard.runtime.context_cuda``) gathers K/V over the group and gives this
  rank's rows of ``out`` and ``logsumexp`` (:func:`context_attention_forward`); the backward
  node gathers K/V again and reduce-scatters dK/dV (:func:`context_attention_backward`). No
  state passes between the two nodes.
* ``context_gather_balanced``: the same, with the query rows (and in the backward ``grad_out``,
  ``out``, ``logsumexp``) moved to the causal head-and-tail layout and back by an all-to-all
  (``autoshard.runtime.context_comm``); causal attention only.
* ``context_ring``: the same rows, the K/V blocks passed around the group's ring one hop a
  step beside that step's parts (``autoshard.runtime.context_ring``); in the backward the
  blocks travel again with their dK/dV accumulators. Without an explicit mask.
* ``context_whole_kv``: K/V arrive whole (the plan gathered them, before the model's GQA
  expansion where the solver put it); the forward computes this rank's rows, the backward
  returns dQ of its rows and its share of dK/dV of every key row, a partial sum the plan
  reduce-scatters (after the expansion's backward sum). No collective here.
  ``context_whole_kv_balanced``: the same with the query rows moved as in
  ``context_gather_balanced``. **Precision**: each rank accumulates its dK/dV share in fp32 (over
  its parts) but hands it over in the graph's dtype, and the plan's reduce-scatter sums the
  ``cp`` shares in that dtype (NCCL reduces bf16 in bf16, each hop's partial sum rounded). The
  gather kinds reduce-scatter fp32 accumulators and round once. With ``u = 2^-8`` (bf16's unit
  roundoff) dK/dV then carry up to ``2 cp - 1`` roundings instead of one: at most ``(2 cp - 1) u``
  of the largest share's magnitude, about ``sqrt(2 cp - 1) u / sqrt(3)`` RMS for independent
  roundings: 0.4 % for cp 2, 1.3 % for cp 16, against 0.2 % (one rounding). fp16 the same with
  ``u = 2^-11``; fp32 graphs differ only in summation order. Simulated on the CPU with this
  runtime's part loop (``python -m benchmarks.context_parallel --rounding``, causal 1 x 4 x 2048 x
  64, ``docs/context_parallel.md``): the partial sums being smaller than the result, the relative
  RMS error at cp 16 is 0.66-0.70 % against 0.31-0.32 % for one rounding (the kernel alone: 0.39 %),
  the largest 2.2 % of the largest magnitude. Not measured on a GPU yet.

An explicit ``attn_mask`` arrives split on its query rows (dim 2) with every key column, or with
one row for all; the causal flag and scale are the node's; dropout must be 0.
:func:`planned_context_collectives` counts the collectives a step of a plan issues on each rank
for these nodes (as ``expert_ops.planned_all_to_alls`` does for the expert exchange).

>>> import torch
>>> run_context_op(torch.ops.aten.mm.default, (), {}, kind="context_gather", group=None)
Traceback (most recent call last):
...
autoshard.runtime.context_ops.ContextOpError: aten.mm.default: not an attention op a context exchange runs \
(_scaled_dot_product_flash_attention_for_cpu, _scaled_dot_product_flash_attention, \
_scaled_dot_product_efficient_attention and their backward)
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping, Sequence

import torch
import torch.distributed as dist

from autoshard.runtime import context_comm
from autoshard.runtime.context_attention import (CPConfig, _backward, _Blocks, _forward, _setup, _whole_backward,
                                                 _WholeBlocks, dense)
from autoshard.runtime.context_cuda import padded_lse_rows
from autoshard.runtime.context_ring import _ring_backward, _ring_forward

__all__ = ["CONTEXT_KINDS", "ContextOpError", "context_attention_forward", "context_attention_backward",
           "run_context_op", "collectives_of", "planned_context_collectives"]

aten = torch.ops.aten

CONTEXT_KINDS = ("context_gather", "context_gather_balanced", "context_ring", "context_whole_kv",
                 "context_whole_kv_balanced")
"""The exchange kinds this module runs."""

_FLASH = "aten._scaled_dot_product_flash_attention.default"
_EFFICIENT = "aten._scaled_dot_product_efficient_attention.default"
_FORWARD = {"aten._scaled_dot_product_flash_attention_for_cpu.default": "cpu", _FLASH: "flash", _EFFICIENT: "efficient"}
_BACKWARD = {"aten._scaled_dot_product_flash_attention_for_cpu_backward.default": "cpu",
             "aten._scaled_dot_product_flash_attention_backward.default": "flash",
             "aten._scaled_dot_product_efficient_attention_backward.default": "efficient"}
"""Op name -> the kernel its parts run with (``context_attention.KERNELS``)."""


class ContextOpError(ValueError):
    """An attention node that cannot run context-parallel as asked (names the argument and why)."""


# ------------------------------------------------------------------ plan nodes


def _node_setup(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any, causal: bool,
                scale: float | None, mask: torch.Tensor | None, load_balanced: bool, kernel: str | None,
                ring: bool = False, whole_kv: bool = False) -> tuple[CPConfig, torch.Tensor | None]:
    """The config of one plan node's call (contiguous K/V, or whole with ``whole_kv``) and its
    mask made additive in q's dtype."""
    if load_balanced and not causal:
        raise ContextOpError(f"{name}: the load-balanced layout is for causal attention only")
    if ring and (load_balanced or mask is not None):
        raise ContextOpError(f"{name}: the ring exchange runs contiguous rows without an explicit mask")
    if whole_kv:
        cp = dist.get_world_size(group if group is not None else dist.group.WORLD)
        if k.dim() != 4 or v.dim() != 4 or q.dim() != 4 or k.shape[2] != cp * q.shape[2] or v.shape[2] != k.shape[2]:
            raise ContextOpError(f"{name}: whole K/V must be [batch, heads, {cp} x q's rows, head_dim], "
                                 f"got k {list(k.shape)}, v {list(v.shape)}, q {list(q.shape)}")
        # the checks _setup runs see one rank's rows of K/V, as the gathering exchanges get them
        k, v = k.narrow(2, 0, q.shape[2]), v.narrow(2, 0, q.shape[2])
    group, cp, layout, kernel, _ = _setup(name, q, k, v, group, load_balanced, kernel, None, causal, None)
    seq_len = cp * q.shape[2]
    if mask is not None:
        if mask.dim() != 4 or mask.shape[2] not in (1, q.shape[2]) or mask.shape[3] != seq_len:
            raise ContextOpError(f"{name}: mask must be [batch, heads, seq_local or 1, seq] = "
                                 f"[.., .., {q.shape[2]}, {seq_len}] (rows local, keys whole), got {list(mask.shape)}")
        if mask.dtype == torch.bool:  # True: attend
            blocked = mask.logical_not()
            mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(blocked, float("-inf"))
        mask = mask.to(q.dtype)
    config = CPConfig(group.group_name, dist.get_rank(group), layout, bool(causal), None, scale, kernel, False,
                      seq_len, ring=ring, keys_contiguous=True, whole_kv=whole_kv)
    return config, mask


def _rows_moved(mask: torch.Tensor | None) -> bool:
    return mask is not None and mask.shape[2] > 1


def context_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any = None, *,
                              causal: bool, scale: float | None = None, mask: torch.Tensor | None = None,
                              load_balanced: bool = False, kernel: str | None = None, ring: bool = False,
                              whole_kv: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """A plan's forward attention node over the CP ``group``: ``(out, lse)``, this rank's rows of
    the whole sequence's attention; ``q, k, v`` (and ``mask``'s rows) are this rank's contiguous
    rows (module docstring, Plan nodes), ``k, v`` the whole sequence with ``whole_kv``. ``mask``:
    boolean (True: attend) or additive, ``[B|1, H|1, seq_local|1, seq]``; ``load_balanced``:
    compute the causal head-and-tail chunks.

    Example, on each rank of a CP group of 2 (``q, k, v``: rank ``r``'s half of the sequence)::

        out, lse = context_attention_forward(q, k, v, group, causal=True, load_balanced=True)
    """
    config, mask = _node_setup("context_attention_forward", q, k, v, group, causal, scale, mask, load_balanced,
                               kernel, ring, whole_kv)
    layout, moved = config.layout, _rows_moved(mask)
    if load_balanced and layout.cp > 1:
        q, *rest = context_comm.to_balanced([q, mask] if moved else [q], layout, config.rank, config.group_name)
        mask = rest[0] if moved else mask
    blocks = (_WholeBlocks if whole_kv else _Blocks)((k, v), config)
    blocks.mask = mask
    out, lse = (_ring_forward if ring else _forward)(q, blocks)
    # a row that sees no key: lse 0, as the fused kernels give it (not the merge's -inf)
    lse = lse.masked_fill(lse == float("-inf"), 0.0)
    if load_balanced and layout.cp > 1:
        out, lse = context_comm.to_contiguous([out, lse], layout, config.rank, config.group_name)
    return out, lse


def context_attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               out: torch.Tensor, lse: torch.Tensor, group: Any = None, *, causal: bool,
                               scale: float | None = None, mask: torch.Tensor | None = None,
                               load_balanced: bool = False, kernel: str | None = None, ring: bool = False,
                               whole_kv: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A plan's attention backward node over the CP ``group``: ``(dq, dk, dv)`` of this rank's
    rows, from this rank's rows of ``grad_out, q, k, v, out, lse`` (those
    :func:`context_attention_forward` gave); K/V are gathered again and dK/dV reduce-scattered.
    With ``whole_kv``: ``k, v`` whole, ``dk, dv`` this rank's share of every key row (module
    docstring), nothing exchanged but the balanced layout's rows.

    Example, after the forward above::

        dq, dk, dv = context_attention_backward(dout, q, k, v, out, lse, group, causal=True, load_balanced=True)
    """
    config, mask = _node_setup("context_attention_backward", q, k, v, group, causal, scale, mask, load_balanced,
                               kernel, ring, whole_kv)
    layout, moved = config.layout, _rows_moved(mask)
    if load_balanced and layout.cp > 1:
        dout, q, out, lse, *rest = context_comm.to_balanced([dout, q, out, lse, *([mask] if moved else [])], layout,
                                                            config.rank, config.group_name)
        mask = rest[0] if moved else mask
    blocks = (_WholeBlocks if whole_kv else _Blocks)((k, v), config)
    blocks.mask = mask
    run = _whole_backward if whole_kv else _ring_backward if ring else _backward
    dq, dk, dv = run(dense(dout), q, dense(out), lse, blocks)
    if load_balanced and layout.cp > 1:
        (dq,) = context_comm.to_contiguous([dq], layout, config.rank, config.group_name)
    return dq, dk, dv


# ------------------------------------------------------------------ the op caller's hook


def _op_name(op: Any) -> str:
    return f"{op.namespace}.{op._opname}.{op._overloadname}" if hasattr(op, "_opname") else str(op)


def _bound(op: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The op's arguments by schema name, defaults filled in."""
    schema = op._schema.arguments
    values = {a.name: a.default_value for a in schema if a.has_default_value()}
    values.update(zip((a.name for a in schema), args))
    values.update(kwargs)
    return values


def run_context_op(op: Any, args: Sequence[Any], kwargs: Mapping[str, Any], *, kind: str, group: Any) -> Any:
    """The op caller's hook: run the attention node ``op`` (forward or backward) with ``args``,
    ``kwargs`` (this rank's local tensors where the node has tensors) context-parallel over
    ``group`` with exchange ``kind``; returns what the op returns (module docstring).

    >>> # out, lse = run_context_op(aten._scaled_dot_product_flash_attention_for_cpu.default,
    >>> #                           (q, k, v, 0.0, True), {"scale": None}, kind="context_gather", group=cp)
    """
    name = _op_name(op)
    if name not in _FORWARD and name not in _BACKWARD:
        raise ContextOpError(f"{name}: not an attention op a context exchange runs "
                             "(_scaled_dot_product_flash_attention_for_cpu, _scaled_dot_product_flash_attention, "
                             "_scaled_dot_product_efficient_attention and their backward)")
    if kind not in CONTEXT_KINDS:
        raise ContextOpError(f"{name}: exchange {kind!r} is not one of {', '.join(CONTEXT_KINDS)}")
    a = _bound(op, args, kwargs)
    if a["dropout_p"]:
        raise ContextOpError(f"{name}: dropout_p {a['dropout_p']} inside context-parallel attention is not "
                             "supported (it must be 0)")
    options = {"causal": bool(a["is_causal"]), "scale": a.get("scale"),
               "mask": a.get("attn_mask", a.get("attn_bias")), "load_balanced": kind.endswith("_balanced"),
               "ring": kind == "context_ring", "whole_kv": kind.startswith("context_whole_kv")}
    if options["load_balanced"] and not options["causal"]:
        raise ContextOpError(f"{name}: exchange {kind} is for causal attention only "
                             "(the node's is_causal is False)")
    if name in _FORWARD:
        q = a["query"]
        out, lse = context_attention_forward(q, a["key"], a["value"], group, kernel=_FORWARD[name], **options)
        return _forward_outputs(name, q, a["key"], out, lse)
    q, lse = a["query"], a["logsumexp"]
    if name == "aten._scaled_dot_product_efficient_attention_backward.default":
        lse = lse.narrow(2, 0, q.shape[2])  # its rows padded to 32
    grads = context_attention_backward(a.get("grad_out", a.get("grad_out_")), q, a["key"], a["value"], a["out"], lse,
                                       group, kernel=_BACKWARD[name], **options)
    return (*grads, None) if name.startswith("aten._scaled_dot_product_efficient") else grads


def _forward_outputs(name: str, q: torch.Tensor, k: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> tuple:
    """What the forward op returns besides ``out`` and ``lse``, as the local op gives it (no dropout:
    empty random state; no debug mask); the efficient kernel's lse rows padded to 32."""
    device = q.device
    if name == _FLASH:
        return (out, lse, None, None, q.shape[2], k.shape[2], torch.empty(2, dtype=torch.uint64, device=device),
                torch.empty((), dtype=torch.uint64, device=device), torch.empty(0, dtype=q.dtype, device=device))
    if name == _EFFICIENT:
        lse = torch.nn.functional.pad(lse, (0, padded_lse_rows(q.shape[2]) - q.shape[2]))
        return (out, lse, torch.empty((), dtype=torch.int64, device=device),
                torch.empty((), dtype=torch.int64, device=device))
    return out, lse


# ------------------------------------------------------------------ what a plan issues


def collectives_of(op: str, kind: str, cp: int | None = None) -> Counter:
    """The collectives one call of the node ``op`` (its name in a plan) with exchange ``kind``
    issues on its CP group of ``cp`` ranks, by kind (``context_comm.COLLECTIVES``); a ring pass is
    one all-to-all with one send and one receive: ``cp - 1`` of them forward (K/V), ``2 cp - 1``
    backward (K/V and the dK/dV accumulators, one more hop to take them home).

    >>> dict(collectives_of("aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
    ...                     "context_gather_balanced"))
    {'all_to_all': 2, 'all_gather': 1, 'reduce_scatter': 1}
    >>> dict(collectives_of("aten._scaled_dot_product_flash_attention_for_cpu_backward.default", "context_whole_kv"))
    {}
    """
    moves = 2 if kind.endswith("_balanced") else 0  # rows there and back
    if kind.startswith("context_whole_kv") and (op in _FORWARD or op in _BACKWARD):
        return Counter({"all_to_all": moves}) - Counter()  # K/V came whole, dK/dV leave partial: the plan's
    if kind == "context_ring" and (op in _FORWARD or op in _BACKWARD):
        if cp is None:
            raise ContextOpError(f"{op}: a ring exchange's passes depend on the group's size (cp)")
        return Counter({"all_to_all": 2 * cp - 1 if op in _BACKWARD else cp - 1}) - Counter()
    if op in _FORWARD:
        return Counter({"all_to_all": moves, "all_gather": 1}) - Counter()
    if op in _BACKWARD:
        return Counter({"all_to_all": moves, "all_gather": 1, "reduce_scatter": 1}) - Counter()
    raise ContextOpError(f"{op}: not an attention op a context exchange runs")


def planned_context_collectives(plan: Any) -> Counter:
    """The collectives one step of ``plan`` issues on each rank for its context exchanges, by
    (kind, mesh dim); a recomputed forward exchanges again; none on a mesh dim of size 1.

    >>> from types import SimpleNamespace as N
    >>> node = N(name="a", op="aten._scaled_dot_product_flash_attention_for_cpu.default",
    ...          exchange=("context_gather", 1))
    >>> dict(planned_context_collectives(N(nodes=[node], recompute=("a",), fingerprint=None)))
    {('all_gather', 1): 2}
    """
    again = set(getattr(plan, "recompute", ()) or ())
    fingerprint = getattr(plan, "fingerprint", None)
    mesh_shape = getattr(fingerprint, "mesh_shape", None)
    total: Counter = Counter()
    for n in plan.nodes:
        exchange = getattr(n, "exchange", None)
        if exchange is None or exchange[0] not in CONTEXT_KINDS:
            continue
        if mesh_shape is not None and mesh_shape[exchange[1]] == 1:
            continue
        times = 2 if n.name in again else 1
        cp = mesh_shape[exchange[1]] if mesh_shape is not None else None
        for kind, count in collectives_of(n.op, exchange[0], cp).items():
            total[(kind, exchange[1])] += count * times
    return total
