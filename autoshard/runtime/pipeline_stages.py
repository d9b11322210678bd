"""Pipeline stages from the plan's ``pipeline`` section, run by torch's schedule classes.

Given the model, a ``DeviceMesh`` with the section's pipeline dim (``pp``) and
``plan.pipeline`` (:class:`autoshard.plan.pipeline_section.PipelineSection`),
:func:`build_pipeline` builds, on each rank, one
``torch.distributed.pipelining.PipelineStage`` per stage the section puts on this
rank's ``pp`` coordinate, and the schedule ``get_schedule_class(section.schedule)``
(``ScheduleGPipe``, ``Schedule1F1B``, ``ScheduleInterleaved1F1B``, ...): torch sends the
activations and gradients across stage boundaries and orders the microbatches.
Each stage runs data-parallel over the mesh's ``dp`` dim (its dp sub-mesh) with
FSDP2 ``fully_shard`` (each block, then the stage; gathered from the first
microbatch's forward to the last backward, which the zero-bubble schedules' split
weight gradients need) or torch's ``replicate``, as ``section.data_parallel`` says;
on a ``tp`` dim, first torch's tensor parallelism with the section's column/row
split of the blocks' linears (``autoshard.runtime.pipeline_tp``; with the section's
``sequence_parallel``, the residual stream between blocks split along the sequence over
``tp``: ``autoshard.runtime.pipeline_sp``). Every schedule of
``costmodel.pipeline_schedules.SCHEDULE_NAMES`` runs, the V-shaped ones
(``ZBVZeroBubble``, ``DualPipeV``: rank ``r`` holds stages ``r`` and ``2p - 1 - r``)
included.

**How a stage is cut out of the model** (manual splitting, as torchtitan does, without
editing the model's forward). A stage is a shallow copy of the model whose modules
outside the stage are swapped: on a stage other than the first, the modules before
the blocks (the embedding) return the activation received from the previous stage;
blocks of other stages pass their first argument through; on a stage other than the
last, the forward stops at the output of its last block (a forward hook raises it to
the stage's ``forward``, which returns it), so the final norm, head and loss run on
the last stage only. Parameter names stay the model's (``layers.1.attention.wq.weight``).
What this assumes of the model (true of the example LLaMA and of torchtitan's): the
stream between blocks is one tensor, made by the modules before the blocks from the
model's inputs and passed by each block as its first argument; the forward returns the
scalar loss; no parameter is shared between stages (a tied embedding and head on
different stages is refused). Every rank steps with the same keyword inputs (its dp
shard of the batch): the first stage reads the tokens, the last the labels, and the
forward's own bookkeeping (``seq = tokens.shape[1]``; a Hugging Face model's position ids,
rotary tables and causal mask) runs on every stage. The last stage's output is the
loss: the forward's scalar, or the ``loss`` of the output object it returns.

**Recomputation** (``section.recompute == "full"``: torchtitan's full activation
checkpointing): each block of a stage keeps only its input and runs its forward again
just before its backward (:func:`recompute_blocks`: non-reentrant ``torch.utils.checkpoint``,
the random state restored, so dropout draws the same mask), applied before tensor
parallelism and FSDP2 wrap the stage, with parameter names unchanged. Forwards per block
and microbatch: 2 with a full backward (GPipe, 1F1B, interleaved); 3 on the zero-bubble
schedules' stages that split the backward (torch computes the input and the weight
gradients in separate autograd calls, each recomputing the block once), 2 on their first
stage (its split backward runs whole in the weight pass). ``section.recompute == "partial"``
checkpoints the first ``recompute_blocks`` of each stage's blocks and keeps the rest whole: the
first, because a stage's backward runs its blocks last to first, so a checkpointed block's
recomputation (its forward's activations made again, the stage's transient peak) comes after the
kept blocks' backward has freed what they saved; checkpointing the last ones would recompute
while every kept block's activations of that microbatch are still held. The next
``recompute_selective_blocks`` of a stage (after the checkpointed ones, before the kept ones, for
the same reason: their recomputation's transient is smaller than a checkpointed block's, larger
than none) run torchtitan's op-level policy (:func:`selective_blocks`: non-reentrant checkpoint with
``create_selective_checkpoint_contexts``; every other ``aten.mm`` output of the block and the
attention's outputs saved, everything else recomputed: what ``autoshard.graph.recompute_policy``'s
``selective`` prices).

**What this does not run (yet).** Inside a stage, autoshard's own per-stage placements
(the stage sub-mesh's solve: per-op tensor parallelism, per-tensor sharding, its
collective schedule) are not run, only the column/row split of the linears above:
``autoshard.runtime.execute`` interprets the whole joint graph's step program, which
cannot be split into the per-microbatch forward and backward calls a ``PipelineStage``
makes. A stage runs the eager module with the layouts torch offers (``fully_shard`` /
``replicate`` over ``dp``, ``parallelize_module`` over ``tp``).

**Stepping it** (a training loop)::

    run = build_pipeline(model, mesh, plan.pipeline)
    optimizer = torch.optim.AdamW(run.parameters())
    for tokens, labels in batches:                  # this rank's dp shard, on every pp rank
        optimizer.zero_grad()
        loss = run.step(tokens=tokens, labels=labels)   # the mean loss on the last stage's ranks, else None
        optimizer.step()

>>> from autoshard.plan.pipeline_section import build_pipeline_section
>>> from examples.models import llama3
>>> model, _ = llama3.tiny(device="meta")
>>> model_parts(model)
ModelParts(leading=('tok_embeddings',), blocks=('layers.0', 'layers.1'), trailing=('norm', 'output'))
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import torch
from torch import nn

from autoshard.plan.pipeline_section import PipelineError, PipelineSection
from autoshard.runtime.pipeline_recompute import all_mm_blocks, recompute_blocks, selective_blocks
from autoshard.runtime.pipeline_tp import TP_DIM, apply_tensor_parallel
from autoshard.trace.blocks import modules_around, repeated_blocks

__all__ = ["ModelParts", "SendRecord", "PipelineRun", "model_parts", "check_model", "build_stage_module",
           "recompute_blocks", "selective_blocks", "build_pipeline"]


@dataclass(frozen=True, slots=True)
class ModelParts:
    """The modules (with parameters) before the repeated blocks, the blocks, and after them."""

    leading: tuple[str, ...]
    blocks: tuple[str, ...]
    trailing: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SendRecord:
    """One point-to-point send a stage issued (:attr:`PipelineRun.sends`)."""

    stage: int
    kind: str
    """``activation`` (forward, to the next stage) or ``gradient`` (backward, to the previous)."""
    peer: int
    """Global rank it went to."""
    nbytes: int


def model_parts(model: nn.Module) -> ModelParts:
    """The model's repeated blocks (``autoshard.trace.blocks.repeated_blocks``) and the modules
    holding parameters before and after their container, in registration order.
    Raises :class:`PipelineError` for a model without repeated blocks."""
    blocks = repeated_blocks(model)
    if not blocks:
        raise PipelineError("pipeline: the model has no repeated blocks (an nn.ModuleList of layers) to cut stages at")
    leading, trailing = modules_around(model, blocks)
    if any(True for _ in model.parameters(recurse=False)):
        raise PipelineError("pipeline: the model's root holds parameters of its own; they belong to no stage")
    return ModelParts(leading, blocks, trailing)


class _StageExit(Exception):
    """Carries the last block's output out of the model's forward (module docstring)."""

    def __init__(self, output: Any) -> None:
        super().__init__("stage output")
        self.output = output


class _Box:
    """The activation a stage received, for its :class:`_Received` modules to return."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: torch.Tensor | None = None


class _Received(nn.Module):
    """Stands for the modules before the blocks on a later stage: returns the received activation."""

    def __init__(self, box: _Box) -> None:
        super().__init__()
        self.box = box

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self.box.value is None:
            raise RuntimeError("pipeline stage: no activation was received for this forward")
        return self.box.value


class _PassThrough(nn.Module):
    """Stands for a block of another stage: returns its first argument."""

    def forward(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        return x


def _stage_class(cls: type) -> type:
    """A subclass of the model's class whose forward takes the received activation positionally and
    the model's inputs as keywords, and returns the stage's output (module docstring)."""
    model_forward = cls.forward

    def forward(self: nn.Module, *received: torch.Tensor, **inputs: Any) -> Any:
        box = self._pipeline_box
        box.value = received[0] if received else None
        try:
            return _loss_of(model_forward(self, **inputs))
        except _StageExit as exit_:
            out = exit_.output
            return out[0] if isinstance(out, tuple) else out  # blocks returning (hidden, ...)
        except AttributeError as exc:
            if "'_Received'" in str(exc) or "'_PassThrough'" in str(exc):  # e.g. a head tied to the embedding
                raise PipelineError(f"pipeline: a stage's forward reads a module of another stage ({exc}); "
                                    "weights shared across stages are not supported") from None
            raise
        finally:
            box.value = None

    return type(f"PipelineStage{cls.__name__}", (cls,), {"forward": forward})


def _loss_of(output: Any) -> Any:
    """The last stage's output for torch's schedule: the loss. A Hugging Face model returns an output
    object (a Mapping) whose ``loss`` is it; the schedule needs the tensor alone."""
    if isinstance(output, torch.Tensor):
        return output
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if not isinstance(loss, torch.Tensor):
        raise PipelineError(f"pipeline: the model's forward returned {type(output).__name__} without a loss tensor; "
                            "the last stage needs the training loss (pass the labels)")
    return loss


def _shallow_copy(module: nn.Module) -> nn.Module:
    """A new module object sharing ``module``'s children, parameters and buffers, with dicts of its own."""
    new = copy.copy(module)
    for key, value in vars(module).items():
        if isinstance(value, dict):
            new.__dict__[key] = value.copy()
    return new


def _set_module(root: nn.Module, path: str, module: nn.Module, copied: set[int]) -> None:
    """Put ``module`` at ``path`` of ``root``, copying the containers on the way (the model keeps its own)."""
    *parents, last = path.split(".")
    parent = root
    for name in parents:
        child = parent._modules[name]
        if id(child) not in copied:
            child = _shallow_copy(child)
            copied.add(id(child))
            parent._modules[name] = child
        parent = child
    parent._modules[last] = module


def check_model(model: nn.Module, section: PipelineSection) -> ModelParts:
    """The model's parts, after checking that ``section`` fits it: its stages run all of the model's
    blocks, and every parameter is in the modules of exactly one stage (no tied weights across
    stages). Raises :class:`PipelineError`, one line.

    >>> from autoshard.plan.pipeline_section import build_pipeline_section
    >>> from examples.models import llama3
    >>> model, _ = llama3.tiny(device="meta")
    >>> check_model(model, build_pipeline_section(schedule="GPipe", n_ranks=2, n_microbatches=2, batch_size=2,
    ...             block_paths=("layers.0", "layers.1", "layers.2"), cuts=(1,)))
    Traceback (most recent call last):
    ...
    autoshard.plan.pipeline_section.PipelineError: pipeline.stages: they run 3 blocks, the model has 2
    """
    parts = model_parts(model)
    if section.stages[-1].end_block != len(parts.blocks):
        raise PipelineError(f"pipeline.stages: they run {section.stages[-1].end_block} blocks, the model has "
                            f"{len(parts.blocks)}")
    _check_no_shared_parameters(model, section)
    return parts


def _check_no_shared_parameters(model: nn.Module, section: PipelineSection) -> None:
    owner = {path: st.index for st in section.stages for path in st.modules}
    stages_of: dict[int, set[int]] = {}
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        path = next((m for m in owner if name.startswith(m + ".")), None)
        if path is None:
            raise PipelineError(f"pipeline: parameter {name!r} is in no stage's modules")
        stages_of.setdefault(id(p), set()).add(owner[path])
        names.setdefault(id(p), []).append(name)
    for pid, stages in stages_of.items():
        if len(stages) > 1:
            raise PipelineError(f"pipeline: parameter shared by stages {sorted(stages)} ({', '.join(names[pid])}); "
                                "tied weights across stages are not supported")


def build_stage_module(model: nn.Module, section: PipelineSection, stage: int, parts: ModelParts | None = None, *,
                       data_parallel: Callable[[nn.Module, list[nn.Module]], None] | None = None) -> nn.Module:
    """Stage ``stage`` of ``model`` (module docstring): shares the model's parameters, names them as
    the model does; its forward takes the received activation (none on stage 0) and the model's
    keyword inputs. ``data_parallel(stage_module, its blocks)`` wraps it before the hook that stops
    the forward at its last block is added (FSDP's post-forward hooks must run before that one).

    >>> # s0, s1 = (build_stage_module(model, section, k) for k in (0, 1))
    >>> # s1(s0(tokens=t, labels=l), tokens=t, labels=l) == model(t, l)
    """
    parts = parts or model_parts(model)
    st = section.stages[stage]
    last = section.n_stages - 1
    box = _Box()
    root = _shallow_copy(model)
    root.__class__ = _stage_class(type(model))
    root._pipeline_box = box
    copied = {id(root)}
    if stage > 0:
        for path in parts.leading:
            _set_module(root, path, _Received(box), copied)
    kept = set(parts.blocks[st.first_block:st.end_block])
    for path in parts.blocks:
        if path not in kept:
            _set_module(root, path, _PassThrough(), copied)
    if stage < last:
        for path in parts.trailing:
            _set_module(root, path, _PassThrough(), copied)
    blocks = [root.get_submodule(p) for p in parts.blocks[st.first_block:st.end_block]]
    # before TP and FSDP wrap them, the order torchtitan applies AC and FSDP in; a partial section's
    # first blocks (module docstring, Recomputation)
    full, sel = section.checkpointed_blocks(stage), section.selective_blocks(stage)
    recompute_blocks(blocks[:full])
    selective_blocks(blocks[full:full + sel])
    all_mm_blocks(blocks[full + sel:full + sel + section.all_mm_blocks(stage)])  # then those saving every mm
    if data_parallel is not None:
        data_parallel(root, blocks)
    if stage < last:
        root.get_submodule(parts.blocks[st.end_block - 1]).register_forward_hook(_raise_output)
    return root


def _recompute_once_per_weight_pass(stage: Any) -> None:
    """Run stage ``stage``'s weight-gradient pass (the zero-bubble schedules' ``W``) under one
    ``torch.utils.checkpoint.GraphExecGroup``. torch's pass (``stage_backward_weight``) makes one
    ``autograd.grad`` call per parameter group, and a checkpointed block recomputes its forward
    in every backward call that reads it: 9 times for a LLaMA block's 9 weights. Under one group
    each block recomputes once for the whole pass (and once in the input-gradient pass before it:
    the two passes read the same saved tensors, which one group forbids)."""
    from torch.utils.checkpoint import GraphExecGroup  # torch >= 2.10; autoshard asks for 2.11

    weight_pass = stage.backward_weight_one_chunk

    def backward_weight_one_chunk(*args: Any, **kwargs: Any) -> Any:
        with GraphExecGroup():
            return weight_pass(*args, **kwargs)

    stage.backward_weight_one_chunk = backward_weight_one_chunk


def _skip_self_warmup_ops(stage: Any) -> None:
    """Keep stage ``stage``'s first-step warm-up sends and receives to other ranks only.

    torch 2.11's multi-stage schedules open their first step with a dummy send and receive to each
    neighbouring stage's rank (``PipelineScheduleMulti._initialize_stages`` batches
    ``PipelineStage._get_init_p2p_neighbors_ops``, pytorch/pytorch#160210), without asking whether
    that neighbour is on this rank. On a V-shaped schedule (``ZBVZeroBubble``, ``DualPipeV``) the
    two stages at the turn (``p - 1`` and ``p`` of ``2p``) are both on rank ``p - 1``, which so
    sends to and receives from itself. NCCL allows a send to oneself; gloo keeps no connection
    from a rank to itself and fails the send ("Pair is not connected (... <--> [none])", gloo's
    ``tcp/pair.cc``) before any stage runs: every V-shaped plan on gloo failed on torch 2.11. The
    warm-up only opens connections; the turn's activations and gradients never travel by
    send/recv (torch hands them from stage to stage in the process), so the ops to oneself carry
    nothing anyone reads and are dropped. A sender's and a receiver's ops to oneself are dropped
    together (both are on this rank), so the ops to other ranks still match theirs. torch 2.13
    warms ``PipelineStage`` objects up with a vote that hands the turn over in the process
    (``_warmup_forward_vote``, ``_is_same_rank``) and calls this only for other stage classes;
    wrapped all the same, it keeps them from the same failure."""
    warmup_ops = getattr(stage, "_get_init_p2p_neighbors_ops", None)
    if warmup_ops is None:  # a torch without the warm-up: nothing to keep from it
        return

    def to_other_ranks() -> list:
        own = stage.group_rank
        return [op for op in warmup_ops() if getattr(op, "group_peer", None) != own]

    stage._get_init_p2p_neighbors_ops = to_other_ranks


def _apply_data_parallel(stage_module: nn.Module, blocks: list[nn.Module], kind: str, dp_mesh: Any) -> None:
    if kind == "fsdp":
        from torch.distributed.fsdp import fully_shard

        # One unit per block, kept gathered from a microbatch's forward to the step's last backward
        # (torchtitan's default under a pipeline): no per-microbatch all-gathers, and the zero-bubble
        # schedules need it, since their weight-gradient pass (torch's stage_backward_weight) finds the
        # parameters in the autograd graph through module.parameters(); after a reshard those are the
        # sharded DTensors, which the graph never saw, and the weight gradients were lost.
        for block in blocks:
            fully_shard(block, mesh=dp_mesh, reshard_after_forward=False)
        fully_shard(stage_module, mesh=dp_mesh, reshard_after_forward=False)
    else:
        from torch.distributed._composable.replicate_with_fsdp import replicate

        replicate(stage_module, mesh=dp_mesh)


def _stage_wrapper(section: PipelineSection, stage: int, tp_mesh: Any, dp_mesh: Any
                   ) -> Callable[[nn.Module, list[nn.Module]], None] | None:
    """What wraps stage ``stage``'s module: tensor parallelism first (its parameters become ``tp``
    DTensors), then FSDP2 / replicate over dp, which shards those over dp (2-D, as torchtitan does)."""
    if tp_mesh is None and dp_mesh is None:
        return None

    def wrap(module: nn.Module, blocks: list[nn.Module]) -> None:
        if tp_mesh is not None:
            apply_tensor_parallel(module, section, stage, tp_mesh, blocks=blocks)
        if dp_mesh is not None:
            _apply_data_parallel(module, blocks, section.data_parallel, dp_mesh)
    return wrap


def _shape_of(mesh: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in mesh.shape)


class _MicrobatchLoss:
    """The schedule's ``loss_fn``, called on the last stage with the model's loss of a microbatch and
    that microbatch's rows of the step's ``target``. Unweighted, the model's loss as it is (torch then
    scales every gradient by ``1/m``: the mean over microbatches). Weighted
    (:meth:`PipelineRun.step`'s ``loss_weights``), ``target`` holds each row's share
    ``m * s * w_r / W`` and a microbatch's loss is scaled by its rows' sum, so that after torch's
    ``1/m`` (and FSDP's mean over ``s`` dp ranks) microbatch ``i`` counts ``W_i / W``: a mean over
    tokens, not over microbatches, when ``w`` counts each row's label tokens."""

    __slots__ = ("weighted",)

    def __init__(self) -> None:
        self.weighted = False

    def __call__(self, output: torch.Tensor, target: Any) -> torch.Tensor:
        if not self.weighted:
            return output
        return output * float(target.sum())  # target is on the host: no device sync


def _recording(stage: Any, kind: str, get_ops: Callable[[int], list], log: list[SendRecord]) -> Callable[[int], list]:
    def get(chunk: int) -> list:
        ops = get_ops(chunk)
        log.extend(SendRecord(stage.stage_index, kind, int(op.peer), op.tensor.numel() * op.tensor.element_size())
                   for op in ops)
        return ops
    return get


class PipelineRun:
    """This rank's stages and torch's schedule over them (module docstring: stepping it)."""

    def __init__(self, section: PipelineSection, stage_modules: list[nn.Module], stages: list[Any], schedule: Any,
                 sends: list[SendRecord], model: nn.Module | None = None, *,
                 loss_fn: _MicrobatchLoss | None = None, dp_size: int = 1) -> None:
        self.section = section
        self._loss_fn = loss_fn or _MicrobatchLoss()
        self._dp_size = dp_size
        self.model = model
        """The model the stages were cut from (they share its parameter objects; for checkpoints)."""
        self.stage_modules = stage_modules
        """This rank's stage modules (the model's parameters, names unchanged; DTensors under FSDP)."""
        self.stages = stages
        """This rank's ``torch.distributed.pipelining.PipelineStage`` objects."""
        self.schedule = schedule
        """torch's schedule object (``ScheduleGPipe``, ``Schedule1F1B``, ...)."""
        self.sends = sends
        """The sends of the last :meth:`step` (filled when built with ``record_sends``)."""

    @property
    def has_last_stage(self) -> bool:
        return any(s.is_last for s in self.stages)

    def parameters(self) -> Iterator[nn.Parameter]:
        """This rank's parameters (for its optimizer)."""
        for module in self.stage_modules:
            yield from module.parameters()

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """This rank's parameters under the model's names."""
        for module in self.stage_modules:
            yield from module.named_parameters()

    def step(self, *, loss_weights: torch.Tensor | None = None, loss_weight_total: float | None = None,
             **inputs: torch.Tensor) -> torch.Tensor | None:
        """One forward and backward of this rank's dp shard of the batch (the model's keyword inputs,
        the same on every pp rank), in ``n_microbatches`` microbatches; gradients accumulated on
        the parameters, scaled to the mean over microbatches. Returns the mean loss on the ranks of
        the last stage, None elsewhere.

        A model whose loss is a mean over label tokens (``-100`` labels not counted) gives a
        different mean per microbatch when microbatches count different numbers of tokens; the
        mean of those means is not the batch's. ``loss_weights`` (one weight per row of this
        rank's batch, e.g. each row's label tokens) weights microbatch ``i`` by its rows' sum
        ``W_i`` over ``W``: ``W`` is this rank's sum, or ``loss_weight_total`` (the sum over every
        dp rank's rows), with which the dp mean of the gradients and of the returned losses is the
        whole batch's token mean, as on one device. Every microbatch must weigh more than zero."""
        if not inputs:
            raise ValueError("PipelineRun.step: pass the model's inputs as keywords (tokens=..., labels=...)")
        first = next((v for v in inputs.values() if isinstance(v, torch.Tensor) and v.dim() > 0), None)
        if first is None:
            raise ValueError("PipelineRun.step: no batched tensor among the inputs (the batch is on dim 0)")
        m = self.section.n_microbatches
        if first.shape[0] % m:
            raise ValueError(f"PipelineRun.step: {m} microbatches do not divide this rank's batch of "
                             f"{first.shape[0]} sequences")
        target = first if loss_weights is None else self._row_shares(loss_weights, loss_weight_total, first.shape[0])
        self.sends.clear()
        losses: list[torch.Tensor] = []
        self._loss_fn.weighted = loss_weights is not None
        self.schedule.step(target=target, losses=losses, return_outputs=False, **inputs)
        return torch.stack([loss.detach() for loss in losses]).mean() if self.has_last_stage else None


    def _row_shares(self, weights: Any, total: float | None, rows: int) -> torch.Tensor:
        """Each row's ``m * s * w_r / W`` (:class:`_MicrobatchLoss`), on the host."""
        w = torch.as_tensor(weights, dtype=torch.float64, device="cpu").reshape(-1)
        if w.numel() != rows:
            raise ValueError(f"PipelineRun.step: loss_weights has {w.numel()} entries for a batch of {rows} rows")
        m = self.section.n_microbatches
        per_microbatch = w.reshape(m, -1).sum(dim=1)
        if bool((per_microbatch <= 0).any()):
            raise ValueError("PipelineRun.step: loss_weights: a microbatch weighs nothing (its loss would be 0/0); "
                             f"per microbatch: {per_microbatch.tolist()}")
        whole = float(w.sum()) if total is None else float(total)
        share = 1 if total is None else self._dp_size
        return w * (m * share / whole)


def build_pipeline(model: nn.Module, mesh: Any, section: PipelineSection, *, record_sends: bool = False,
                   device: torch.device | None = None) -> PipelineRun:
    """This rank's :class:`PipelineRun` of ``section`` on ``mesh`` (module docstring). ``mesh`` has
    ``section.mesh_dim`` of ``section.n_ranks``; its other dims are the stages' data parallelism.
    The model's parameters are shared (and sharded in place under FSDP), not copied.

    >>> # run = build_pipeline(model, init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp")), plan.pipeline)
    """
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

    parts = check_model(model, section)
    names = tuple(mesh.mesh_dim_names or ())
    if section.mesh_dim not in names:
        raise PipelineError(f"pipeline.mesh_dim: {section.mesh_dim!r} is not a dim of the mesh {list(names)}")
    pp_mesh = mesh[section.mesh_dim]
    if pp_mesh.size() != section.n_ranks:
        raise PipelineError(f"pipeline.n_ranks: {section.n_ranks}, but mesh dim {section.mesh_dim!r} has "
                            f"{pp_mesh.size()} ranks")
    dp_names = tuple(n for n in names if n not in (section.mesh_dim, TP_DIM))
    if len(dp_names) > 1:  # one data-parallel dim (FSDP2's 2-D HSDP is not wired yet)
        raise PipelineError(f"pipeline: mesh {list(names)}: a stage runs data parallelism over one dim; "
                            f"{list(dp_names)} inside a stage is not supported yet")
    tp_mesh = mesh[TP_DIM] if TP_DIM in names and mesh[TP_DIM].size() > 1 else None
    if (tp_mesh is not None) != bool(section.tensor_parallel):
        raise PipelineError(f"pipeline.tensor_parallel: mesh {list(names)} {_shape_of(mesh)} and a section with "
                            f"{len(section.tensor_parallel)} split linear layers: a {TP_DIM!r} dim of more than one "
                            "rank needs the plan's column/row layout, and the layout needs that dim")
    device = device or (torch.device("cpu") if mesh.device_type == "cpu"
                        else torch.device(mesh.device_type, torch.cuda.current_device()))
    rank = pp_mesh.get_local_rank()
    dp_mesh = mesh[dp_names[0]] if dp_names and mesh[dp_names[0]].size() > 1 else None
    sends: list[SendRecord] = []
    modules, stages = [], []
    for st in section.stages_of_rank(rank):
        wrap = _stage_wrapper(section, st.index, tp_mesh, dp_mesh)
        module = build_stage_module(model, section, st.index, parts, data_parallel=wrap)
        stage = PipelineStage(module, st.index, section.n_stages, device, group=pp_mesh.get_group())
        _skip_self_warmup_ops(stage)
        if section.checkpointed_blocks(st.index) or section.selective_blocks(st.index) \
                or section.all_mm_blocks(st.index):
            _recompute_once_per_weight_pass(stage)
        if record_sends:
            stage.get_fwd_send_ops = _recording(stage, "activation", stage.get_fwd_send_ops, sends)
            stage.get_bwd_send_ops = _recording(stage, "gradient", stage.get_bwd_send_ops, sends)
        modules.append(module)
        stages.append(stage)
    try:
        schedule_cls = get_schedule_class(section.schedule)
    except ValueError as exc:
        raise PipelineError(f"pipeline.schedule: {exc}") from None
    loss_fn = _MicrobatchLoss()
    if issubclass(schedule_cls, PipelineScheduleSingle):
        schedule = schedule_cls(stages[0], n_microbatches=section.n_microbatches, loss_fn=loss_fn)
    else:
        schedule = schedule_cls(stages, n_microbatches=section.n_microbatches, loss_fn=loss_fn)
    return PipelineRun(section, modules, stages, schedule, sends, model, loss_fn=loss_fn,
                       dp_size=dp_mesh.size() if dp_mesh is not None else 1)


def _raise_output(module: nn.Module, args: Any, output: Any) -> None:
    raise _StageExit(output)
