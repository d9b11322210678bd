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
result the host must read to size step (4). On a GPU that is one
device-to-host synchronisation per dispatch, as in every all-to-all MoE
implementation that does not pad to a fixed capacity (torchtitan's too); the
step program prices it as the counts exchange (``costmodel.expert_parallel``).
It is the only one: the counts this rank sends, the copies whose expert index
is out of range and the counts received are read together, in one call of
``_host_counts``, declared to ``DeviceAudit`` (``declared_host_sync``); the
rest of a layout is made on the rows' device (no ``bincount``, which sizes its
output on the host, and no index built on the host).

Experts that receive no token on a rank are fine: their ``tokens_per_expert``
entry is 0, the grouped computation gives them an empty slice, and their
weights' gradients are zeros (as on one device, where an expert no token
picked gets none).

Status: checked against one device on gloo
(tests/autoshard/runtime/test_expert_dispatch.py) and run by the step program
for the experts nodes whose strategy has the ``expert_dispatch`` exchange
(``autoshard.runtime.expert_ops``, through ``runtime/op_calls.py``); on CUDA
fake tensors every tensor a dispatch and a combine make is on the rows'
device and the one host read is the declared one
(tests/autoshard/runtime/test_expert_cuda_fake.py per op,
test_expert_cuda_plan.py for a whole plan's steps). A CPU-only torch's CUDA
fake tensors refuse Python indexing and ``copy_``, so this module and the
experts kernels use ``narrow``, ``select``, ``cat`` and ``index_select``. A
caller whose experts may receive no row must keep their output on the
autograd graph of the dispatched rows (an empty matmul does): otherwise that
rank skips the combine's backward, and the other ranks wait in its all-to-all.

>>> # recv, layout = dispatch(routed, expert_of_copy, num_experts=8, group=ep_group)
>>> # out = combine(experts(recv, layout.expert_rows), layout)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from autoshard.runtime.device_audit import declared_host_sync

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
    expert_rows: tuple[int, ...]
    """``tokens_per_expert`` on the host, read with the split sizes (reading it again would sync)."""
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


def _host_counts(counts: torch.Tensor) -> list[int]:
    """The one value a dispatch reads on the host: ``counts`` (int64, on the rows' device) as ints.

    Every exchange's layout goes through here once (the module docstring's one sync); a test on
    fake tensors, whose values do not exist, replaces it with counts its fake group could deliver.

    >>> _host_counts(torch.tensor([2, 0, 1]))
    [2, 0, 1]
    """
    return counts.tolist()


def _layout(expert_of_copy: torch.Tensor, num_experts: int, group: Any) -> DispatchLayout:
    world = dist.get_world_size(group)
    if num_experts % world:
        raise ExpertDispatchError(f"num_experts: {num_experts} experts do not divide over {world} "
                                  "expert-parallel ranks")
    local, device = num_experts // world, expert_of_copy.device
    order = torch.sort(expert_of_copy, stable=True).indices
    # copies per expert, with a last bin for indices out of range: checked with the counts' one
    # host read rather than by a read of their own (bincount would also size its output on the host)
    valid = (expert_of_copy >= 0) & (expert_of_copy < num_experts)
    binned = torch.where(valid, expert_of_copy, num_experts).to(torch.int64)  # scatter's index type
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=device).scatter_add_(
        0, binned, torch.ones_like(binned))
    # counts[q * local + j]: copies this rank sends to expert j of rank q; after the exchange,
    # received[s * local + j]: copies rank s sends to this rank's expert j
    received = _all_to_all(counts.narrow(0, 0, num_experts), (local,) * world, (local,) * world, group)
    with declared_host_sync("expert dispatch: the all-to-all's run-time split sizes"):
        values = _host_counts(torch.cat((counts, received)))
    if values[num_experts]:
        raise ExpertDispatchError(f"expert_of_copy: {values[num_experts]} expert indices outside [0, {num_experts})")
    send_splits = tuple(sum(values[q * local:(q + 1) * local]) for q in range(world))
    per_source = [values[num_experts + 1 + s * local:num_experts + 1 + (s + 1) * local] for s in range(world)]
    recv_splits = tuple(sum(row) for row in per_source)
    # regroup: arrival order is (source, local expert); the experts want (local expert, source).
    # Runs of one arange made on the device: an index built on the host would be a copy each step
    starts, at = [], 0
    for row in per_source:
        starts.append([])
        for n in row:
            starts[-1].append(at)
            at += n
    arrival = torch.arange(at, device=device)
    regroup = torch.cat([arrival.narrow(0, starts[s][j], per_source[s][j]) for j in range(local) for s in range(world)])
    expert_rows = tuple(sum(per_source[s][j] for s in range(world)) for j in range(local))
    return DispatchLayout(order, send_splits, recv_splits, regroup, received.view(world, local).sum(0),
                          expert_rows, group)


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
