"""Run time, one op: its inputs made local (redistributed, waited or reused), its call, its checks.

:class:`OpCaller` runs one :class:`~autoshard.runtime.binding.OpBinding` on
this rank's local tensors. Each tensor input is its edge's redistributed
value: the one a ``Wait`` of the step program left ready, an earlier reader's
copy it reuses (``Redistribution.reuses``: held until its last reader), or
one made now (local steps; evaluation's collectives). The non-tensor
arguments are made local by the rule's ``localize`` (view sizes, factory
shapes: the same call the rule validator makes) at the first run and kept as
a template (``autoshard.runtime.templates``); every local output's shape is
checked against the plan's placement, and an op that fails raises naming the
node, the op and the rank's coordinate. A node whose plan strategy has an
exchange is not a local op: ``expert_dispatch`` runs
:func:`autoshard.runtime.expert_ops.run_expert_op`, ``context_gather`` and
``context_gather_balanced`` :func:`autoshard.runtime.context_ops.run_context_op`,
on the local tensors over the process group of the strategy's mesh dim
(``Comm.group``); neither runs on fake tensors, so a plan with exchanges is
interpreted, not traced (``autoshard.runtime.traced_step``). ``LiveBytes.touch`` counts the op's
inputs and outputs together (``autoshard.runtime.live_bytes``).

>>> # caller = OpCaller(binding)
>>> # out = caller.run(binding.ops[0], env, ready={}, live=None)
"""

from __future__ import annotations

import operator
from typing import Any, Iterator, Mapping, Sequence

import torch
import torch.fx as fx

from costmodel.shard_shapes import local_shape
from costmodel.redistribute_steps import RedistributeStep

from autoshard.rules import op_name
from autoshard.rules.calls import bind_args, replace_tensors
from autoshard.rules.core import OpCall, TensorMeta, to_meta
from autoshard.runtime.binding import Edge, OpBinding, PlanBinding, fmt_placements
from autoshard.runtime.context_ops import CONTEXT_KINDS, run_context_op
from autoshard.runtime.devices import on_device
from autoshard.runtime.expert_ops import run_expert_op
from autoshard.runtime.live_bytes import LiveBytes
from autoshard.runtime.random_ops import run_random
from autoshard.runtime.steps import run_step
from autoshard.runtime.templates import CallTemplate
from autoshard.trace.experts import EXPERTS_OP

__all__ = ["OpCaller", "Reuse"]

aten = torch.ops.aten

Reuse = tuple[dict[Any, Any], dict[Any, int]]
"""(edge key -> a redistributed copy later readers reuse, edge key -> readers left)."""


class OpCaller:
    """Runs the ops of ``binding`` on this rank's local tensors (module docstring)."""

    def __init__(self, binding: PlanBinding) -> None:
        self.binding = binding
        self.mesh_shape, self.coord, self.device = binding.mesh_shape, binding.coord, binding.device
        self.comm = binding.comm
        # node name -> (exchange kind, mesh dim): the nodes that are not local ops
        self.exchanges = {n.name: n.exchange for n in binding.plan.nodes if getattr(n, "exchange", None)}
        # experts node -> routed copies this rank's experts processed, per forward run (the runtime's
        # measured load: ``autoshard.runtime.module.ShardedModule.measured_expert_imbalance``)
        self.expert_rows: dict[str, list[int]] = {}

    def set_comm(self, edge: tuple[str, str, int] | None, positions: tuple[int, int] | None) -> None:
        """Label the collectives run from now on (a tracing comm records them with their edge and positions)."""
        comm = self.comm
        if comm is not None and hasattr(comm, "edge"):
            comm.edge = edge
            if hasattr(comm, "positions"):
                comm.positions = positions

    @staticmethod
    def value(env: Mapping[fx.Node, Any], node: fx.Node) -> Any:
        """``env[node]``; a tuple element not yet taken (its getitem comes later in the graph) is taken here."""
        if node in env:
            return env[node]
        if node.op == "call_function" and node.target is operator.getitem and node.args[0] in env:
            return env[node.args[0]][int(node.args[1])]
        raise RuntimeError(f"runtime: {node.name} is read before it is made (schedule out of order)")

    def run_steps(self, value: torch.Tensor, edge: Edge, steps: Sequence[RedistributeStep]) -> torch.Tensor:
        for step in steps:
            value = run_step(value, step, edge.global_shape, self.mesh_shape, self.coord, self.comm)
        return value

    def redistribute(self, value: torch.Tensor, edge: Edge) -> torch.Tensor:
        """All of an edge's steps at once (local steps, and evaluation's collectives)."""
        if not edge.steps:
            return value
        self.set_comm(edge.key, None)
        return self.run_steps(value, edge, edge.steps)

    def device_of(self, b: OpBinding, env: Mapping[fx.Node, Any]) -> torch.device:
        """Where the op's tensors are (whose generator a random op draws from)."""
        for e in b.edges:
            value = self.value(env, e.source)
            if isinstance(value, torch.Tensor):
                return value.device
        return self.device

    def _input(self, e: Edge, env: Mapping[fx.Node, Any], ready: dict[Any, Any], reuse: Reuse | None) -> Any:
        """An op's local input: its redistributed value (waited, made now, or an earlier
        reader's copy it reuses), or the producer's value as it is."""
        if reuse is not None and e.reuses is not None and e.reuses in reuse[0]:
            shared, uses = reuse
            value = shared[e.reuses]
            uses[e.reuses] -= 1
            if not uses[e.reuses]:  # its last reader: the copy can go
                del shared[e.reuses]
                del uses[e.reuses]
            return value
        if e.key in ready:
            value = ready.pop(e.key)
        elif e.steps:
            value = self.redistribute(env[e.source], e)
        else:
            value = env[e.source]
        count = self.binding.reuse_count.get(e.key)
        if reuse is not None and count:
            reuse[0][e.key], reuse[1][e.key] = value, count
        return value

    def run(self, b: OpBinding, env: Mapping[fx.Node, Any], ready: dict[Any, Any], live: LiveBytes | None = None,
            reuse: Reuse | None = None) -> Any:
        """The op of ``b`` on local tensors (module docstring)."""
        node, op = b.node, b.op
        locals_ = [self._input(e, env, ready, reuse) for e in b.edges]
        if b.random is not None:
            result = run_random(b.random, node, locals_, b.out_global, b.out_placements, self.mesh_shape,
                                self.coord, self.device)
            if live is not None:
                live.touch([*locals_, result])
            return result
        exchange = self.exchanges.get(node.name)
        result = self._exchange(b, exchange, locals_) if exchange is not None else self._local(b, env, locals_)
        flat = list(result) if isinstance(result, (tuple, list)) else [result]
        for k, (got, want) in enumerate(zip(flat, b.out_local)):
            if want is not None and isinstance(got, torch.Tensor) and tuple(got.shape) != want.shape:
                raise RuntimeError(f"{node.name} ({op_name(op)}) output {k}: local shape {tuple(got.shape)}, "
                                   f"the plan's {fmt_placements(b.out_placements[k])} gives {want.shape}")
        if live is not None:  # inputs (copies included) and outputs exist together here
            live.touch([*locals_, result])
        return result

    def _exchange(self, b: OpBinding, exchange: tuple[str, int], locals_: list[torch.Tensor]) -> Any:
        """The op run with its exchange over the mesh dim's group (module docstring)."""
        kind, mesh_dim = exchange
        if kind != "expert_dispatch" and kind not in CONTEXT_KINDS:
            raise RuntimeError(f"{b.node.name} ({op_name(b.op)}): the plan's exchange {kind!r} is not one this "
                               f"runtime runs (expert_dispatch, {', '.join(CONTEXT_KINDS)})")
        if self.comm is None or not hasattr(self.comm, "group"):
            raise RuntimeError(f"{b.node.name} ({op_name(b.op)}): a {kind} exchange needs the mesh's "
                               f"process groups (this runtime has none)")
        if _tracing():
            # expert split sizes are known only at run time, and a context exchange's collectives
            # are its own (not the plan's): tracing the step (autoshard.runtime.traced_step) stops
            # here, before any exchange is issued, and the runner interprets the step (a step run on
            # fake tensors, as the CUDA checks run it, is not a trace: its exchange runs)
            raise RuntimeError(f"{b.node.name} ({op_name(b.op)}): a {kind} exchange is interpreted, not held "
                               f"in a traced step graph")
        self._out_local(b)
        tensors = iter(locals_)
        group = self.comm.group((mesh_dim,))
        if kind == "expert_dispatch":
            args = tuple(next(tensors) if isinstance(a, fx.Node) else a for a in b.node.args)
            # a forward records its experts' load (the backward dispatches the same copies again)
            received = self.expert_rows.setdefault(b.node.name, []) if b.op == EXPERTS_OP else None
            return run_expert_op(b.op, args, group=group, received=received)
        args, kwargs = _with_locals(b.node, tensors)
        return run_context_op(b.op, args, kwargs, kind=kind, group=group)

    def _local(self, b: OpBinding, env: Mapping[fx.Node, Any], locals_: list[torch.Tensor]) -> Any:
        """The op itself on this rank's local tensors."""
        node, op = b.node, b.op
        if b.call is not None:
            args, kwargs = b.call.fill(locals_)
        else:
            args, kwargs = self._first_args(b, env, locals_)
        try:
            return op(*args, **kwargs)
        except (RuntimeError, ValueError) as exc:  # fake tensors (tracing the step) raise ValueError
            if op in (aten.view.default, aten._unsafe_view.default) and "view" in str(exc):
                # a collective or a slice left the local tensor non-contiguous
                return aten.reshape.default(*args, **kwargs)
            raise RuntimeError(f"{node.name} ({op_name(op)}) failed on local shards at coordinate "
                               f"{self.coord}: {exc}") from exc

    def _out_local(self, b: OpBinding) -> None:
        """This rank's output shapes, once (they never change)."""
        if b.out_local is None:
            b.out_local = tuple(
                None if (meta is None or pl is None) else TensorMeta(local_shape(meta.shape, pl, self.mesh_shape,
                                                                                 self.coord), meta.dtype)
                for meta, pl in zip(b.out_global, b.out_placements)
            )

    def _first_args(self, b: OpBinding, env: Mapping[fx.Node, Any], locals_: list[torch.Tensor]) -> tuple[tuple, dict]:
        """The op's local arguments built from the graph node (the rule's ``localize``
        makes shape arguments local); kept as a template for the next runs."""
        node, op = b.node, b.op
        args, kwargs = fx.node.map_arg((tuple(node.args), dict(node.kwargs)), lambda n: env[n])
        args, kwargs = on_device((args, kwargs), self.device)  # the graph says "cuda", this rank has cuda:k
        args, kwargs = replace_tensors(op, args, kwargs, locals_)
        self._out_local(b)
        if b.localize is not None:
            call = OpCall(op, to_meta(args), to_meta(kwargs), tuple(TensorMeta.of(t) for t in locals_), b.out_local,
                          bind_args(op, args, kwargs))
            args, kwargs = b.localize(args, kwargs, call)
        if not b.slow:
            b.call = CallTemplate.make(args, kwargs, locals_)
            b.slow = b.call is None
        return args, kwargs


def _tracing() -> bool:
    """Whether ``make_fx`` is recording this op (``autoshard.runtime.traced_step``)."""
    from torch.fx.experimental.proxy_tensor import get_proxy_mode

    return get_proxy_mode() is not None


def _with_locals(node: fx.Node, tensors: Iterator[torch.Tensor]) -> tuple[tuple, dict]:
    """The node's arguments with its tensor arguments replaced by ``tensors``, taken in the
    rules' input order (positional, then keyword in schema order: ``trace.run.tensor_arg_nodes``)."""
    def local(value: Any) -> Any:
        if not isinstance(value, fx.Node):
            return value
        traced = value.meta.get("val")
        # a non-tensor node (flash attention's max_q, an int) keeps its traced value
        return next(tensors) if isinstance(traced, torch.Tensor) else traced

    names = [a.name for a in node.target._schema.arguments]
    args = tuple(local(a) for a in node.args)
    kwargs = {name: local(node.kwargs[name])
              for name in sorted(node.kwargs, key=lambda n: names.index(n) if n in names else len(names))}
    return args, kwargs
