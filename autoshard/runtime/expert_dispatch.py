r"""Expert-parallel dispatch and combine: routed tokens to their experts' ranks and back.

With ``E`` experts split over an expert-parallel group of ``G`` ranks (rank ``r``
holds the ``E_l = E / G`` experts ``[r E_l, (r+1) E_l)``), each rank has ``N``
routed copies of its tokens (``N = tokens * top_k``, each copy tagged with its
expert). :func:`dispatch` sends every copy to its expert's rank and returns
the copies this rank's experts must process, grouped by local expert (the
layout grouped-matmul kernels and ``torch._grouped_mm`` take, with
``tokens_per_expert`` as their offsets); :func:`combine` sends the experts'
outputs back, in the order the copies were given. Both are differentiable:
the gradient of a dispatch is a combine of the gradient, and the other way
round, on the same :class:`DispatchLayout`.

**How.** (1) Sort the copies by expert (a stable sort keeps a token's order
inside an expert, so the result does not depend on the sort's tie-breaking);
(2) count copies per expert, ``c[e]``; the copies bound for rank ``q`` are
the ``sum_{e in q} c[e]`` consecutive rows of the sorted buffer; (3) one
all-to-all of the counts (``E_l`` int64 to each rank) tells each rank how many
copies of each of its experts every source sends; (4) one all-to-all of the
rows with those split sizes; what arrives is grouped by source, then by local
expert; (5) a permutation regroups it by local expert, then by source.
Combine runs (5), (4), (2), (1) backwards.

The split sizes are known only at run time: step (3) is a collective whose
result the host must read (``tolist``) to size step (4). On a GPU that is one
device-to-host synchronisation per dispatch, as in every all-to-all MoE
implementation that does not pad to a fixed capacity; the step program
prices it as the counts exchange (``costmodel.expert_parallel``).

Experts that receive no token on a rank are fine: their ``tokens_per_expert``
entry is 0, the grouped computation skips them, and their weights' gradients
are zeros (as on one device, where an expert no token picked gets none).

Status: checked against one device on gloo
(tests/autoshard/runtime/test_expert_dispatch.py). The routing of transformers'
MoE models is recognised in the trace (``autoshard.trace.experts``), its
expert-parallel strategy is described by ``autoshard.rules.experts``, and
``autoshard.runtime.expert_ops`` runs the traced ops with this exchange; the
step program's dispatch action (calling it) is not built yet. A caller whose
experts may receive no row must keep their output on the autograd graph of
the dispatched rows (an empty matmul does): otherwise that rank skips the
combine's backward, and the other ranks wait in its all-to-all.

>>> # recv, layout = dispatch(routed, expert_of_copy, num_experts=8, group=ep_group)
>>> # out = combine(experts(recv, layout.tokens_per_expert), layout)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["DispatchLayout", "dispatch", "combine", "ExpertDispatchError"]


class ExpertDispatchError(ValueError):
    """A dispatch that cannot run as asked (names the argument and why)."""


@dataclass(frozen=True, slots=True)
class DispatchLayout:
    """Where every routed copy went, to send the results (or gradients) back."""

    order: torch.Tensor
    """The copies sorted by expert: ``sorted = copies[order]``."""
    send_splits: tuple[int, ...]
    """Rows sent to each rank of the group."""
    recv_splits: tuple[int, ...]
    """Rows received from each rank of the group."""
    regroup: torch.Tensor
    """Received rows (by source, then local expert) -> rows by local expert, then source."""
    tokens_per_expert: torch.Tensor
    """Rows this rank's experts process, per local expert (int64, on the rows' device)."""
    group: Any
    """The expert-parallel process group."""

    @property
    def received_rows(self) -> int:
        """Rows this rank's experts process; gathered over the group, ``max / mean`` of them is the
        measured imbalance (``costmodel.expert_parallel.measured_imbalance``)."""
        return sum(self.recv_splits)


def _all_to_all(rows: torch.Tensor, out_splits: tuple[int, ...], in_splits: tuple[int, ...],
                group: Any) -> torch.Tensor:
    out = rows.new_empty((sum(out_splits), *rows.shape[1:]))
    dist.all_to_all_single(out, rows.contiguous(), list(out_splits), list(in_splits), group=group)
    return out


def _layout(expert_of_copy: torch.Tensor, num_experts: int, group: Any) -> DispatchLayout:
    world = dist.get_world_size(group)
    if num_experts % world:
        raise ExpertDispatchError(f"num_experts: {num_experts} experts do not divide over {world} "
                                  "expert-parallel ranks")
    local = num_experts // world
    if expert_of_copy.numel() and (int(expert_of_copy.min()) < 0 or int(expert_of_copy.max()) >= num_experts):
        raise ExpertDispatchError(f"expert_of_copy: expert indices must lie in [0, {num_experts})")
    order = torch.sort(expert_of_copy, stable=True).indices
    counts = torch.bincount(expert_of_copy, minlength=num_experts).to(torch.int64)  # [E]: copies per expert
    # counts[q * local + j]: copies this rank sends to expert j of rank q; after the exchange,
    # received[s * local + j]: copies rank s sends to this rank's expert j
    received = _all_to_all(counts, (local,) * world, (local,) * world, group).view(world, local)
    send_splits = tuple(int(x) for x in counts.view(world, local).sum(1).tolist())
    per_source = received.tolist()  # the host sync of a run-time split (module docstring)
    recv_splits = tuple(int(sum(row)) for row in per_source)
    # regroup: arrival order is (source, local expert); the experts want (local expert, source)
    starts, at = [], 0
    for row in per_source:
        starts.append([])
        for n in row:
            starts[-1].append(at)
            at += n
    device = expert_of_copy.device
    pieces = [torch.arange(starts[s][j], starts[s][j] + per_source[s][j], device=device)
              for j in range(local) for s in range(world)]
    regroup = torch.cat(pieces) if pieces else torch.empty(0, dtype=torch.int64, device=device)
    return DispatchLayout(order, send_splits, recv_splits, regroup, received.sum(0).to(device), group)


def _send(rows: torch.Tensor, layout: DispatchLayout) -> torch.Tensor:
    """Sorted-by-expert rows of this rank -> rows of this rank's experts, by local expert."""
    arrived = _all_to_all(rows, layout.recv_splits, layout.send_splits, layout.group)
    return arrived.index_select(0, layout.regroup)


def _return(rows: torch.Tensor, layout: DispatchLayout) -> torch.Tensor:
    """Rows by local expert -> this rank's copies sorted by expert (the inverse of :func:`_send`)."""
    arrived_order = torch.empty_like(rows)
    arrived_order.index_copy_(0, layout.regroup, rows)
    return _all_to_all(arrived_order, layout.send_splits, layout.recv_splits, layout.group)


def _unsort(rows: torch.Tensor, layout: DispatchLayout) -> torch.Tensor:
    out = torch.empty_like(rows)
    out.index_copy_(0, layout.order, rows)
    return out


class _Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, copies: torch.Tensor, layout: DispatchLayout) -> torch.Tensor:
        ctx.layout = layout
        return _send(copies.index_select(0, layout.order), layout)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _unsort(_return(grad, ctx.layout), ctx.layout), None


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, layout: DispatchLayout) -> torch.Tensor:
        ctx.layout = layout
        return _unsort(_return(rows, layout), layout)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _send(grad.index_select(0, ctx.layout.order), ctx.layout), None


def dispatch(copies: torch.Tensor, expert_of_copy: torch.Tensor, *, num_experts: int,
             group: Any) -> tuple[torch.Tensor, DispatchLayout]:
    """This rank's routed ``copies`` ``[N, ...]`` (copy ``i`` for expert ``expert_of_copy[i]``) sent to
    their experts' ranks; returns the rows this rank's experts process, grouped by local expert
    (``layout.tokens_per_expert`` rows each), and the layout :func:`combine` sends them back with."""
    if copies.shape[0] != expert_of_copy.numel():
        raise ExpertDispatchError(f"copies: {copies.shape[0]} rows for {expert_of_copy.numel()} expert indices")
    layout = _layout(expert_of_copy.reshape(-1), num_experts, group)
    return _Dispatch.apply(copies, layout), layout


def combine(rows: torch.Tensor, layout: DispatchLayout) -> torch.Tensor:
    """The experts' outputs ``rows`` (in :func:`dispatch`'s order) sent back: one row per routed
    copy, in the order the copies were dispatched."""
    if rows.shape[0] != int(layout.regroup.numel()):
        raise ExpertDispatchError(f"rows: {rows.shape[0]} rows, the dispatch delivered {layout.regroup.numel()}")
    return _Combine.apply(rows, layout)
