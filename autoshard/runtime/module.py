"""The user-facing runtime: a model whose parameters are DTensors with the plan's
placements, trained by running the plan's per-rank joint graph.

>>> # mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
>>> # sharded = shard(model, mesh, plan, example_inputs)
>>> # loss = sharded(*global_batch); loss.backward(); optimizer.step()

What :class:`ShardedModule` does:

* Parameters: every parameter of ``model`` is replaced, **in place** (as
  FSDP2's ``fully_shard`` does), by ``nn.Parameter(DTensor)`` holding this
  rank's shard in the plan's placement, under the same names: the module
  adopts the model's children, so ``named_parameters()`` and
  ``state_dict()`` keys are unchanged; tied parameters stay one object.
  When the plan replicates every parameter on every mesh dim (a data-parallel
  layout, or a mesh of one), parameters and gradients stay plain tensors, as
  ``DistributedDataParallel`` keeps them (``plain_replicated=False`` keeps
  DTensors): an optimizer then steps plain tensors without DTensor's dispatch
  on every step, and DCP saves them as replicated.
* ``forward(*global_batch)``: each rank passes the whole batch (the example
  inputs' shapes) and takes its own slice per the plan's input placements
  (``local_inputs=True``: each rank passes its shard; see
  :attr:`ShardedModule.input_placements`). The joint forward+backward graph
  runs at once on local shards (:class:`~autoshard.runtime.execute.JointRunner`);
  the loss comes back as a plain scalar tensor, equal on every rank.
* ``loss.backward()``: the loss is the output of one ``autograd.Function``
  whose backward hands autograd the gradients the joint graph already
  computed, as DTensors in each parameter's placement (already reduced: no
  hidden all-reduce), scaled by the incoming gradient; so ``.grad`` is set as
  usual and ``torch.optim`` optimizers step the DTensor parameters.
  :meth:`ShardedModule.step_loss_and_grads` gives the same without autograd.
* Buffers stay plain tensors (whole) on the model; each step takes their
  shard per the plan, and buffer updates (BatchNorm statistics) are written
  back when the buffer is replicated.
* The collective trace: ``trace_collectives=True`` or
  ``AUTOSHARD_TRACE_COLLECTIVES=1`` records every collective of a step in
  :attr:`ShardedModule.collective_trace` (kind, mesh dims, bytes, group ranks,
  plan edge, schedule positions where it was issued and waited).
* The per-rank step runs interpreted the first time (every shape checked),
  then as one traced fx graph (``autoshard.runtime.traced_step``);
  ``compile=True`` compiles that graph with inductor (with a warning and the
  uncompiled graph where inductor cannot), ``graph=False`` interprets every
  step.

Limitations (first version):

* the forward computes the gradients too (the joint graph is one graph),
  and ``backward`` hands them over; under ``torch.no_grad()`` (evaluation)
  only the forward part runs. The loss's gradient is applied by scaling
  (exact for the loss tangent);
* the model's forward must be exactly the traced one: same input shapes and
  dtypes every step (the plan is for one graph);
* random ops: dropout and rand/randn run sharded, each rank computing its
  slice of the single-device draw (every rank draws the whole random tensor;
  rank 0's generator state is copied to all ranks at start-up); other random
  ops must be replicated; a mutated buffer must be replicated; a plan fusing
  mesh dims needs a DeviceMesh with ``mesh_dim_names`` (for the flattened
  process group);
* the loss must not be used by other differentiable computations than
  ``backward`` (its graph has no other inputs than the parameters).
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor import Partial as DPartial
from torch.distributed.tensor import Replicate as DReplicate
from torch.distributed.tensor import Shard as DShard
from torch.distributed.tensor.placement_types import _StridedShard

from costmodel.placements import Partial, Placement, Replicate, Shard, StridedShard

from autoshard.graph.node_ids import tensor_node
from autoshard.plan.format import Plan
from autoshard.plan.options import refuse_engine_options
from autoshard.runtime.collectives import CollectiveRecord, MeshComm
from autoshard.runtime.devices import mesh_device
from autoshard.runtime.execute import JointRunner, RuntimeLoadError, placements_of
from autoshard.runtime.random_ops import sync_rng_state
from autoshard.runtime.shards import local_slice
from autoshard.trace import TracedGraph, trace_joint

__all__ = ["ShardedModule", "shard", "to_dtensor_placements", "scale_grads"]


def to_dtensor_placements(placements: Sequence[Placement]) -> tuple[Any, ...]:
    """DTensor placements for ours: ``S(d)`` -> ``Shard(d)``, ``R`` -> ``Replicate()``,
    ``_S(d,sf=k)`` -> ``_StridedShard(d, split_factor=k)``, ``P(op)`` -> ``Partial(op)``."""
    out = []
    for p in placements:
        if isinstance(p, Shard):
            out.append(DShard(p.dim))
        elif isinstance(p, StridedShard):
            out.append(_StridedShard(p.dim, split_factor=p.split_factor))
        elif isinstance(p, Replicate):
            out.append(DReplicate())
        elif isinstance(p, Partial):
            out.append(DPartial(p.reduce_op))
        else:
            raise ValueError(f"unknown placement {p!r}")
    return tuple(out)


class _JointStep(torch.autograd.Function):
    """Loss in forward; the saved (already computed) gradients in backward."""

    @staticmethod
    def forward(ctx: Any, loss: torch.Tensor, make_grads: Any, *params: torch.Tensor) -> torch.Tensor:
        ctx.make_grads = make_grads
        return loss.clone()

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[Any, ...]:
        grads = ctx.make_grads(grad_loss)
        ctx.make_grads = None
        return (None, None, *grads)


def _local_shard(p: torch.Tensor) -> torch.Tensor:
    """``p.to_local()`` without its autograd function (the step runs under no_grad;
    ``to_local`` costs a Python autograd call per parameter and step); a plain
    (replicated) parameter is its own shard."""
    if not isinstance(p, DTensor):
        return p.detach()
    local = getattr(p, "_local_tensor", None)
    return local.detach() if local is not None else p.to_local().detach()


def _like(p: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """A DTensor of ``local`` with ``p``'s spec (mesh, placements, global shape and
    stride): a gradient in its parameter's layout. The spec is shared, not rebuilt
    (``DTensor.from_local`` rebuilds it per call); ``from_local`` if that fails.
    A plain parameter's gradient is ``local`` itself."""
    if not isinstance(p, DTensor):
        return local
    spec = getattr(p, "_spec", None)
    if spec is not None and local.dtype == p.dtype:
        try:
            return DTensor(local, spec, requires_grad=False)
        except TypeError:  # another torch's private constructor: the public way
            pass
    return DTensor.from_local(local, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride())


def scale_grads(grads: list[torch.Tensor | None], grad_loss: torch.Tensor) -> list[torch.Tensor | None]:
    """The gradients (computed for d(loss)/d(loss) = 1) times the loss's incoming
    gradient. On the CPU a unit gradient (``loss.backward()``) is seen and skipped;
    on a GPU reading it would make the host wait for the whole step, so every
    gradient is scaled on the device (one multi-tensor multiply per dtype).

    >>> scale_grads([torch.ones(2)], torch.full((), 3.0))[0].tolist()
    [3.0, 3.0]
    """
    if grad_loss.device.type == "cpu":
        if grad_loss.numel() == 1 and float(grad_loss) == 1.0:
            return grads
        return [None if g is None else g * grad_loss.to(g.dtype) for g in grads]
    out: list[torch.Tensor | None] = list(grads)
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, g in enumerate(grads):
        if g is not None:
            by_dtype.setdefault(g.dtype, []).append(i)
    for dtype, where in by_dtype.items():
        for i, g in zip(where, torch._foreach_mul([grads[i] for i in where], grad_loss.to(dtype))):
            out[i] = g
    return out


def _set_path(root: nn.Module, path: str, value: nn.Parameter) -> None:
    *parents, leaf = path.split(".")
    module = root
    for name in parents:
        module = getattr(module, name)
    module._parameters[leaf] = value


class ShardedModule(nn.Module):
    """``model`` sharded per ``plan`` on ``mesh`` (module docstring).

    ``plan``: a :class:`Plan` or the path of a plan file. ``example_inputs``:
    the inputs the plan was solved for (whole batch; only shapes and dtypes
    matter). ``traced``: a :class:`TracedGraph` of the same model and inputs,
    to skip tracing again. ``plain_replicated``: parameters stay plain tensors
    when the plan replicates all of them (module docstring); False: DTensors
    always.
    """

    def __init__(self, model: nn.Module, mesh: Any, plan: Plan | str | os.PathLike[str],
                 example_inputs: Sequence[torch.Tensor] | Mapping[str, torch.Tensor], *,
                 local_inputs: bool = False, trace_collectives: bool | None = None,
                 traced: TracedGraph | None = None, compile: bool = False, graph: bool = True,
                 plain_replicated: bool = True) -> None:
        super().__init__()
        if not isinstance(plan, Plan):
            plan = Plan.load(plan)
        if dist.is_initialized() and mesh.size() != dist.get_world_size():
            raise ValueError(f"mesh: {tuple(mesh.shape)} has {mesh.size()} ranks, the job {dist.get_world_size()}")
        if plan.options.get("reduce_dtype"):  # priced as FSDP2 reduces: not what this runtime runs
            raise ValueError(f"plan: priced with reduce_dtype={plan.options['reduce_dtype']!r} (as FSDP2 reduces); "
                             "autoshard's runtime reduces gradients in their own dtype")
        refuse_engine_options(plan.options)  # float8 linears, async TP: priced only
        if tuple(mesh.shape) != tuple(plan.fingerprint.mesh_shape):
            raise ValueError(f"mesh: the plan is for mesh {tuple(plan.fingerprint.mesh_shape)}, here {tuple(mesh.shape)}")
        coord = mesh.get_coordinate()
        if coord is None:
            raise ValueError("mesh: this rank is not on the mesh")
        self._by_keyword = isinstance(example_inputs, Mapping)
        traced = traced or trace_joint(model, example_inputs, target_device=mesh_device(mesh).type)
        comm = MeshComm(mesh, trace=trace_collectives)
        runner = JointRunner(traced, plan, tuple(mesh.shape), tuple(coord), comm=comm, graph=graph,
                             compile=compile, device=mesh_device(mesh))
        for fqn in traced.buffer_updates:
            if any(not isinstance(p, Replicate) for p in runner.leaf_placements[tensor_node("buffer", fqn)]):
                raise RuntimeLoadError(f"buffer {fqn}: the step updates it, and the plan shards it "
                                       f"({plan.buffers[fqn]}): only replicated mutated buffers are supported")
        comm.prepare(runner.mesh_dim_sets())  # flattened groups: once, same order on every rank
        if runner.has_random and dist.is_initialized():
            sync_rng_state(device=runner.device)  # one random stream: every rank draws what one device draws
        # bypass nn.Module registration for the runtime's own state
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_runner", runner)
        object.__setattr__(self, "_comm", comm)
        object.__setattr__(self, "_traced", traced)
        self.plan = plan
        self.mesh = mesh
        self.local_inputs = local_inputs
        self.collective_trace: list[CollectiveRecord] = []
        ndim = len(mesh.shape)
        self.input_placements = {name: placements_of(plan.inputs.get(name), ndim) for name in traced.inputs}
        """Input name -> placements (what a data loader yields with ``local_inputs=True``)."""

        # parameters -> DTensor (or plain, all replicated) parameters, in place, tied ones shared
        named = list(model.named_parameters(remove_duplicate=False))
        for path, _ in named:
            if path not in plan.params:
                raise RuntimeLoadError(f"plan: no placement for parameter {path}")
        placed = {path: placements_of(plan.params[path], ndim) for path, _ in named}
        self.plain_parameters = plain_replicated and all(
            isinstance(x, Replicate) for pl in placed.values() for x in pl)
        """True when parameters and gradients are plain tensors (every one replicated)."""
        made: dict[int, nn.Parameter] = {}
        for path, p in named:
            new = made.get(id(p))
            if new is None:
                pl = placed[path]
                local = local_slice(p.detach(), pl, tuple(mesh.shape), tuple(coord))
                if not self.plain_parameters:
                    local = DTensor.from_local(local, mesh, to_dtensor_placements(pl), run_check=False,
                                               shape=p.shape, stride=p.stride())
                new = nn.Parameter(local, requires_grad=p.requires_grad)
                made[id(p)] = new
            _set_path(model, path, new)
        # the model's children, parameters and buffers under their own names
        for name, child in model.named_children():
            self.add_module(name, child)
        for name, p in model._parameters.items():
            self._parameters[name] = p
        for name, b in model._buffers.items():
            self._buffers[name] = b
            if name in model._non_persistent_buffers_set:
                self._non_persistent_buffers_set.add(name)
        self._param_order = [fqn for fqn in traced.params]

    # ------------------------------------------------------------------ helpers
    def _params(self) -> dict[str, nn.Parameter]:
        named = dict(self._model.named_parameters(remove_duplicate=False))
        return {fqn: named[fqn] for fqn in self._param_order}

    def _local_inputs(self, args: tuple, kwargs: dict) -> list[torch.Tensor]:
        traced = self._traced
        if self._by_keyword:
            if args:
                raise TypeError("the plan was traced with keyword inputs: call with keywords")
            values = [kwargs[name] for name in traced.inputs]
        else:
            if kwargs or len(args) != len(traced.inputs):
                raise TypeError(f"expected {len(traced.inputs)} positional inputs ({', '.join(traced.inputs)})")
            values = list(args)
        if self.local_inputs:
            return values
        out = []
        for (name, node), value in zip(traced.inputs.items(), values):
            want = tuple(node.meta["val"].shape)
            if tuple(value.shape) != want or value.dtype != node.meta["val"].dtype:
                raise ValueError(f"input {name}: shape {tuple(value.shape)} {value.dtype}, the plan was solved for "
                                 f"{want} {node.meta['val'].dtype}")
            out.append(local_slice(value, self.input_placements[name], tuple(self.mesh.shape),
                                   tuple(self._runner.coord)))
        return out

    def _run(self, args: tuple, kwargs: dict, forward_only: bool = False
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor | None], dict[str, nn.Parameter]]:
        runner, traced = self._runner, self._traced
        params = self._params()
        with torch.no_grad():
            local_params = {fqn: _local_shard(p) for fqn, p in params.items()}
        buffers = dict(self._model.named_buffers(remove_duplicate=False))
        local_buffers = {}
        for fqn in traced.buffers:
            b = buffers[fqn]
            local_buffers[fqn] = local_slice(b, runner.leaf_placements[tensor_node("buffer", fqn)], tuple(self.mesh.shape),
                                             tuple(runner.coord))
        self._comm.records.clear()
        result = runner.run(local_params, local_buffers, self._local_inputs(args, kwargs), forward_only=forward_only)
        self.collective_trace = list(self._comm.records)
        with torch.no_grad():
            for fqn, value in result.buffer_updates.items():
                buffers[fqn].copy_(value)
        return result.loss, dict(result.grads), params

    # ------------------------------------------------------------------ API
    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The loss of one step on the (global) batch; ``backward`` sets every ``.grad``.
        Under ``torch.no_grad()`` only the forward part of the graph runs."""
        loss, grads, params = self._run(args, kwargs, forward_only=not torch.is_grad_enabled())
        order = [fqn for fqn in self._param_order if params[fqn].requires_grad]
        if not torch.is_grad_enabled() or not order:
            return loss

        def make_grads(grad_loss: torch.Tensor) -> list[Any]:
            scaled = scale_grads([grads[fqn] for fqn in order], grad_loss)
            return [None if g is None else _like(params[fqn], g) for fqn, g in zip(order, scaled)]

        return _JointStep.apply(loss, make_grads, *(params[fqn] for fqn in order))

    @property
    def last_step_peak_bytes(self) -> int | None:
        """This rank's peak of live tensor bytes during its last interpreted training
        step (``autoshard.runtime.live_bytes``: leaves, activations, recomputed values,
        redistributed copies, gradients; no optimizer state); None before one. From the
        second step on the traced graph runs the same program, so the value stands.

        >>> # loss = sharded(*batch); loss.backward(); sharded.last_step_peak_bytes
        """
        return self._runner.last_step_peak_bytes

    def measured_expert_imbalance(self) -> dict[str, float]:
        """Per expert-parallel experts node, the imbalance its routing had over the forwards run
        so far: the busiest rank's routed copies over the mean, summed over the runs (1.0: even;
        what the plan priced is ``plan.options["expert_imbalance"]``). A collective: every rank
        calls it. Price the plan again with the number (``expert_imbalance=``) where it is far
        from what was priced.

        >>> # loss = sharded(*batch); loss.backward(); sharded.measured_expert_imbalance()
        >>> # {'experts': 1.18}
        """
        from autoshard.runtime.expert_ops import gathered_imbalance

        calls = self._runner.calls
        out = {}
        for name, rows in sorted(calls.expert_rows.items()):
            mesh_dim = calls.exchanges[name][1]
            out[name] = round(gathered_imbalance(sum(rows), calls.comm.group((mesh_dim,))), 4)
        return out

    def step_loss_and_grads(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor | None]]:
        """The loss and every parameter's gradient (a DTensor in the parameter's
        placement; plain with :attr:`plain_parameters`), without autograd."""
        loss, grads, params = self._run(args, kwargs)
        return loss, {fqn: None if g is None else _like(params[fqn], g) for fqn, g in grads.items()}


def shard(model: nn.Module, mesh: Any, plan: Plan | str | os.PathLike[str],
          example_inputs: Sequence[torch.Tensor] | Mapping[str, torch.Tensor], **options: Any) -> ShardedModule:
    """``ShardedModule(model, mesh, plan, example_inputs, **options)``."""
    return ShardedModule(model, mesh, plan, example_inputs, **options)
