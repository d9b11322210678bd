"""Random ops on shards: every rank computes its slice of the one random stream
that the single-device run draws.

A sharded dropout must drop the same elements as the unsharded model, or the
sharded run is a different model (and does not match the single-device
reference). Offsetting a counter-based generator per shard (what DTensor does
with Philox on CUDA) has no CPU counterpart, so this module takes the simple
exact road: every rank holds the same generator state (:func:`sync_rng_state`
copies rank 0's at start-up) and draws the *global* random tensor in the same
order, then keeps its slice. The draw is then bit-identical to the
single-device run's, at the price of each rank drawing the whole tensor (a
dropout mask is one byte-per-element bernoulli draw; the multiply runs on the
shard).

Which ops:

* ``native_dropout(x, p, train)``: the global mask is drawn as the CPU kernel
  draws it (``empty_like(x_global).bernoulli_(1 - p)``), sliced to x's
  placement, and ``x_local * mask * 1/(1-p)`` computed as the kernel does. A
  partial ``x`` is fine: dropout is linear in ``x``.
* ``rand``/``randn`` (a size argument) and ``rand_like``/``randn_like``: drawn at
  the global shape, then sliced to the output placement.
* any other random op (``bernoulli``, attention with ``dropout_p > 0``, ...):
  only replicated (each rank then draws the same whole tensor); a sharded one is
  refused at load, naming the op.

Ops without a random draw at this call (dropout with ``p = 0`` or
``train=False``) are ordinary ops.

>>> # kind = random_kind(node, rule)            # at load: None, "dropout", "sized", "like" or "other"
>>> # out = run_random(kind, node, args, ...)   # at run time, on this rank's shard
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist
import torch.fx as fx
from torch._ops import OpOverload

from costmodel.placements import Partial, Placement, Replicate

from autoshard.rules.calls import bind_args
from autoshard.runtime.shards import local_slice

__all__ = ["SLICEABLE", "random_kind", "run_random", "sync_rng_state", "get_rng_state", "set_rng_state"]

aten = torch.ops.aten

_SIZED = {aten.rand.default, aten.randn.default}
_LIKE = {aten.rand_like.default, aten.randn_like.default}

SLICEABLE = ("dropout", "sized", "like")
"""Random kinds whose shards the runtime computes (module docstring)."""


def random_kind(node: fx.Node, rule: Any) -> str | None:
    """How the op at ``node`` draws random numbers: None (it does not at this
    call), ``dropout``, ``sized``, ``like`` or ``other``."""
    op = node.target
    if torch.Tag.nondeterministic_seeded not in getattr(op, "tags", ()):
        return None
    if isinstance(op, OpOverload):
        bound = bind_args(op, tuple(node.args), dict(node.kwargs))
        for key in ("dropout_p", "p"):
            if key in bound and isinstance(bound[key], (int, float)) and float(bound[key]) == 0.0:
                return None
        if bound.get("train") is False:
            return None
    if op is aten.native_dropout.default:
        return "dropout"
    if op in _SIZED:
        return "sized"
    if op in _LIKE:
        return "like"
    return "other"


def _slice(tensor: torch.Tensor, placements: Sequence[Placement], mesh_shape: Sequence[int],
           coord: Sequence[int]) -> torch.Tensor:
    whole = tuple(Replicate() if isinstance(p, Partial) else p for p in placements)
    return local_slice(tensor, whole, mesh_shape, coord)


def run_random(kind: str, node: fx.Node, local_inputs: Sequence[torch.Tensor],
               out_global: Sequence[Any], out_placements: Sequence[Sequence[Placement] | None],
               mesh_shape: Sequence[int], coord: Sequence[int], device: torch.device | None = None) -> Any:
    """This rank's outputs of the random op at ``node`` (module docstring); a sized
    draw is made on ``device`` (this rank's; None: where the graph says)."""
    op = node.target
    bound = bind_args(op, tuple(node.args), dict(node.kwargs))
    if kind == "dropout":
        x = local_inputs[0]
        p = float(bound["p"])
        keep = 1.0 - p
        scale = 0.0 if keep == 0 else 1.0 / keep
        mask = torch.empty(out_global[0].shape, dtype=x.dtype, device=x.device).bernoulli_(keep)
        mask_x = _slice(mask, out_placements[0], mesh_shape, coord)
        out = x.mul(mask_x).mul_(scale)
        return out, _slice(mask, out_placements[1], mesh_shape, coord).to(torch.bool)
    meta = out_global[0]
    if kind == "sized":
        kwargs = dict(node.kwargs)
        if device is not None and "device" in kwargs:
            kwargs["device"] = device
        whole = op(list(meta.shape), *node.args[1:], **kwargs)
    elif kind == "like":
        template = torch.empty(meta.shape, dtype=local_inputs[0].dtype, device=local_inputs[0].device)
        whole = op(template, **dict(node.kwargs))
    else:
        raise ValueError(f"{node.name}: random op kind {kind!r} has no sharded execution")
    return _slice(whole, out_placements[0], mesh_shape, coord)


def get_rng_state(device: torch.device) -> torch.Tensor:
    """The state of the default generator that ops on ``device`` draw from (a
    recomputed dropout replays it: ``autoshard.program.actions``, Recompute)."""
    if device.type == "cuda":
        return torch.cuda.get_rng_state(device)
    return torch.get_rng_state()


def set_rng_state(device: torch.device, state: torch.Tensor) -> None:
    """Set the default generator of ``device`` to ``state`` (from :func:`get_rng_state`)."""
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


def sync_rng_state(group: Any = None, device: torch.device | None = None) -> None:
    """Give every rank rank 0's generator state (the CPU one, and ``device``'s
    when it is a GPU), so that all draw one stream (a collective: every rank of
    ``group`` must call it). The states travel as uint8 tensors on the process
    group's device (NCCL moves CUDA tensors only), never pickled."""
    from autoshard.runtime.rank_agreement import comm_device

    src = 0 if group is None else dist.get_global_rank(group, 0)
    moved = comm_device()
    devices = [torch.device("cpu")] + ([device] if device is not None and device.type == "cuda" else [])
    for where in devices:
        state = get_rng_state(where).clone().to(moved)
        dist.broadcast(state, src=src, group=group)
        set_rng_state(where, state.cpu())
