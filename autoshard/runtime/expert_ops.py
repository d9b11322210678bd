r"""The experts stand-in's ops run expert-parallel: this rank's tokens, this rank's experts, the exchange.

A MoE layer traced with :mod:`autoshard.trace.experts` is one
``autoshard::experts`` node and one ``autoshard::experts_backward`` node. Under
the expert-parallel strategy (``autoshard.rules.experts``: experts split on E,
tokens on T, on the same mesh dim of ``G`` ranks) rank ``r`` holds its ``T``
tokens with their routing (``top_k_index`` of *global* expert ids, the
``top_k_weights``) and the experts ``[r E/G, (r+1) E/G)``. The op cannot run
locally: a token's expert may live on another rank. :func:`run_expert_op` runs
either node with the exchange instead (the step program's hook: for a node
whose chosen strategy has ``exchange == "expert_dispatch"``, call it with the
process group of the strategy's mesh dim, ``MeshComm.group(mesh_dims)``, in
place of the local op).

**Forward** (:func:`expert_parallel_forward`): the ``T k`` routed copies
(copy ``t k + j`` of token ``t`` for expert ``top_k_index[t, j]``) go to their
experts' ranks (``expert_dispatch.dispatch``: a counts all-to-all, then the
rows with run-time split sizes), each rank's experts process what arrived
grouped by local expert (``grouped_expert_forward`` with
``tokens_per_expert``), the results come back (``combine``), and the source
rank takes the routing weights' sum over the ``k`` copies of each token.

**Backward** (:func:`expert_parallel_backward`): the graph's backward node
receives the forward's inputs and ``grad_out``, not its dispatched rows, so it
dispatches again, with ``grad_out`` beside the token in one row (``2 d`` wide)
and the copy's routing weight in a second, small exchange; the expert rank
computes the expert gradients of its experts (whole: every copy routed to them
arrived), each copy's input gradient and its output ``y`` (the routing
weight's gradient is ``<grad_out, y>``), and sends back the copies' input
gradients and those scalars. Per step: three all-to-alls forward (counts,
rows ``d`` wide, back) and five backward (counts, rows ``2 d`` wide, routing
weights, input gradients, weights' gradients), each priced on its own by
``costmodel.expert_parallel.exchange_bytes`` (a gloo test counts the bytes
each one carries against it).

Experts that receive no copy on a rank compute on no row and get zero
gradients, as on one device. Each call reads one value set on the host, its
dispatch's split sizes (``HOST_SYNCS``, ``planned_host_syncs``: a step's count,
which a ``DeviceAudit`` sees as ``declared_syncs``); the grouped experts take
their row counts from that read, not from a second one. Checked on gloo
against one device (tests/autoshard/runtime/test_expert_ops.py) and on CUDA
fake tensors, every tensor on the device and no other host read
(test_expert_cuda_fake.py per node, test_expert_cuda_plan.py a whole plan).

:func:`measure_imbalance` is the runtime's measured imbalance factor (the
busiest rank's received copies over the mean) to price a plan again with.

>>> import torch
>>> run_expert_op(torch.ops.aten.mm.default, (), group=None)
Traceback (most recent call last):
...
autoshard.runtime.expert_ops.ExpertOpError: aten.mm.default: not an experts op (autoshard::experts or its backward)
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist

from autoshard.runtime.expert_dispatch import _layout, _return, _send, _unsort, combine, dispatch
from autoshard.trace.experts import (
    ACTIVATIONS,
    EXPERTS_BACKWARD_OP,
    EXPERTS_OP,
    grouped_expert_backward,
    grouped_expert_forward,
)
from costmodel.expert_parallel import measured_imbalance

__all__ = ["ExpertOpError", "expert_parallel_forward", "expert_parallel_backward", "run_expert_op",
           "measure_imbalance", "gathered_imbalance", "ALL_TO_ALLS", "planned_all_to_alls", "HOST_SYNCS", "planned_host_syncs"]

ALL_TO_ALLS = {"autoshard.experts.default": 3, "autoshard.experts_backward.default": 5}
"""All-to-alls one call issues on its group: forward: the counts, the dispatch, the combine;
backward: the counts, the paired rows, the routing weights, the input gradients, the
routing weights' gradients."""

HOST_SYNCS = {"autoshard.experts.default": 1, "autoshard.experts_backward.default": 1}
"""Device-to-host reads one call makes: the split sizes of its one dispatch layout
(``expert_dispatch._host_counts``); nothing else of the call reads a value on the host."""


def _per_step(plan: Any, per_call: dict[str, int]) -> int:
    again = set(getattr(plan, "recompute", ()) or ())
    # a plan may hold other exchanges too (context parallelism's): only the experts' count here
    return sum(per_call[n.op] * (2 if n.name in again else 1) for n in plan.nodes
               if getattr(n, "exchange", None) is not None and n.op in per_call)


def planned_all_to_alls(plan: Any) -> int:
    """The all-to-alls one step of ``plan`` issues on each rank for its exchanges (a recomputed
    forward exchanges again).

    >>> from types import SimpleNamespace as N
    >>> planned_all_to_alls(N(nodes=[N(name="e", op="autoshard.experts.default", exchange=("expert_dispatch", 0))],
    ...                       recompute=()))
    3
    """
    return _per_step(plan, ALL_TO_ALLS)


def planned_host_syncs(plan: Any) -> int:
    """The device-to-host reads one step of ``plan`` makes on each rank for its exchanges: one per
    exchange call, as a ``DeviceAudit`` counts them in ``declared_syncs``.

    >>> from types import SimpleNamespace as N
    >>> planned_host_syncs(N(nodes=[N(name="e", op="autoshard.experts.default", exchange=("expert_dispatch", 0)),
    ...                             N(name="b", op="autoshard.experts_backward.default",
    ...                               exchange=("expert_dispatch", 0))], recompute=()))
    2
    """
    return _per_step(plan, HOST_SYNCS)


class ExpertOpError(ValueError):
    """An experts op that cannot run expert-parallel as asked (names the argument and why)."""


def _check(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
           gate_up_proj: torch.Tensor, down_proj: torch.Tensor, activation: str) -> None:
    if activation not in ACTIVATIONS:
        raise ExpertOpError(f"activation: {activation!r} is not one of {', '.join(ACTIVATIONS)}")
    if top_k_index.ndim != 2 or top_k_index.shape != top_k_weights.shape or top_k_index.shape[0] != hidden.shape[0]:
        raise ExpertOpError(f"top_k_index: shape {tuple(top_k_index.shape)} does not route the {hidden.shape[0]} "
                            f"tokens with weights of shape {tuple(top_k_weights.shape)}")
    if gate_up_proj.shape[0] != down_proj.shape[0]:
        raise ExpertOpError(f"down_proj: {down_proj.shape[0]} local experts, gate_up_proj has {gate_up_proj.shape[0]}")


def expert_parallel_forward(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                            gate_up_proj: torch.Tensor, down_proj: torch.Tensor, *, activation: str,
                            group: Any, received: list[int] | None = None) -> torch.Tensor:
    """``autoshard::experts`` on this rank's tokens with this rank's experts (``gate_up_proj``,
    ``down_proj``: the local ``E / G`` of them) over ``group``; differentiable (module docstring).

    >>> # out = expert_parallel_forward(x, idx, w, gate_up[lo:hi], down[lo:hi], activation="silu", group=ep)
    """
    _check(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, activation)
    tokens, k = top_k_index.shape
    experts = gate_up_proj.shape[0] * dist.get_world_size(group)
    rows, layout = dispatch(hidden.repeat_interleave(k, dim=0), top_k_index.reshape(-1), num_experts=experts,
                            group=group)
    if received is not None:  # this rank's experts' load, known from the split sizes (no extra read)
        received.append(layout.received_rows)
    done = grouped_expert_forward(rows, list(layout.expert_rows), gate_up_proj, down_proj, activation)
    back = combine(done, layout).view(tokens, k, -1)
    return (back * top_k_weights.unsqueeze(-1).to(back.dtype)).sum(1).to(hidden.dtype)


def expert_parallel_backward(grad_out: torch.Tensor, hidden: torch.Tensor, top_k_index: torch.Tensor,
                             top_k_weights: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor, *,
                             activation: str, group: Any
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``autoshard::experts_backward`` expert-parallel: ``(grad_hidden, grad_weights, grad_gate_up,
    grad_down)``, the last two of this rank's experts (module docstring)."""
    _check(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, activation)
    if grad_out.shape != hidden.shape[:1] + down_proj.shape[1:2]:
        raise ExpertOpError(f"grad_out: shape {tuple(grad_out.shape)}, the output is "
                            f"{(hidden.shape[0], down_proj.shape[1])}")
    tokens, k = top_k_index.shape
    dim = hidden.shape[1]
    experts = gate_up_proj.shape[0] * dist.get_world_size(group)
    with torch.no_grad():
        layout = _layout(top_k_index.reshape(-1), experts, group)
        # token and its output gradient travel as one row: one exchange, not two
        paired = torch.cat((hidden, grad_out.to(hidden.dtype)), dim=1).repeat_interleave(k, dim=0)
        rows = _send(paired.index_select(0, layout.order), layout)
        weights = _send(top_k_weights.reshape(-1, 1).index_select(0, layout.order), layout)
        x_rows, g_rows = rows.narrow(1, 0, dim), rows.narrow(1, dim, dim)  # not rows[:, :dim]: module docstring
        grad_rows, grad_gate_up, grad_down, y_rows = grouped_expert_backward(
            x_rows, g_rows * weights.to(g_rows.dtype), list(layout.expert_rows), gate_up_proj, down_proj,
            activation)
        grad_copies = _unsort(_return(grad_rows, layout), layout)
        grad_weight_rows = (g_rows * y_rows).sum(1, keepdim=True).to(top_k_weights.dtype)
        grad_weights = _unsort(_return(grad_weight_rows, layout), layout)
    return (grad_copies.view(tokens, k, dim).sum(1), grad_weights.view(tokens, k), grad_gate_up, grad_down)


def run_expert_op(op: Any, args: Sequence[Any], *, group: Any, received: list[int] | None = None) -> Any:
    """The step program's hook: run the experts node ``op`` (forward or backward) with ``args``
    (this rank's local tensors, in the op's argument order) expert-parallel over ``group``;
    returns what the op returns. A forward appends to ``received`` the routed copies this rank's
    experts processed (:func:`gathered_imbalance` turns them into the measured imbalance)."""
    if op is EXPERTS_OP or op == EXPERTS_OP:
        *tensors, activation = args
        return expert_parallel_forward(*tensors, activation=activation, group=group, received=received)
    if op is EXPERTS_BACKWARD_OP or op == EXPERTS_BACKWARD_OP:
        *tensors, activation = args
        return expert_parallel_backward(*tensors, activation=activation, group=group)
    name = f"{op.namespace}.{op._opname}.{op._overloadname}" if hasattr(op, "_opname") else str(op)
    raise ExpertOpError(f"{name}: not an experts op (autoshard::experts or its backward)")


def gathered_imbalance(received_rows: int, group: Any) -> float:
    """The measured imbalance of one dispatch from each rank's ``received_rows`` (what
    :func:`run_expert_op` recorded): ``costmodel.expert_parallel.measured_imbalance`` of every
    rank's count over ``group`` (one all-reduce; a collective: every rank of the group calls it).

    >>> # gathered_imbalance(rows, ep_group) -> e.g. 1.31
    """
    rows = torch.zeros(dist.get_world_size(group), dtype=torch.int64)
    rows[dist.get_rank(group)] = received_rows
    dist.all_reduce(rows, group=group)
    return measured_imbalance([int(n) for n in rows.tolist()])


def measure_imbalance(top_k_index: torch.Tensor, num_experts: int, group: Any) -> float:
    """The measured imbalance factor of this routing over ``group`` (one all-reduce of the
    per-expert counts): the busiest rank's routed copies over the mean, 1.0 for even routing.

    >>> # measure_imbalance(idx, 8, ep_group) -> e.g. 1.31; price again with imbalance=1.31
    """
    world = dist.get_world_size(group)
    if num_experts % world:
        raise ExpertOpError(f"num_experts: {num_experts} experts do not divide over {world} expert-parallel ranks")
    counts = torch.bincount(top_k_index.reshape(-1), minlength=num_experts)[:num_experts].to(torch.int64)
    dist.all_reduce(counts, group=group)
    return measured_imbalance([int(n) for n in counts.view(world, -1).sum(1).tolist()])
