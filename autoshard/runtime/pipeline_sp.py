"""Sequence parallelism inside a pipeline stage: the residual stream split along the sequence over ``tp``.

With ``section.sequence_parallel`` (and a ``tensor_parallel`` layout), a stage runs torch's
tensor parallelism as torchtitan runs its TP, not as Megatron's first paper did: between
the blocks' attention and feed-forward, each ``tp`` rank holds its ``1/tp`` of the sequence,
``(batch, seq/tp, dim)``, which is what the pipeline search prices
(``autoshard.search.pipeline_blocks``, "Full recomputation"): a block keeps its input
sequence-split and each ``tp`` rank sends ``1/tp`` of the boundary activation.

What :func:`sequence_parallel_plan` and :func:`add_sequence_hooks` set up, per stage:

- the parent of each column-split linear (the attention, the feed-forward) all-gathers its
  hidden-state input from ``Shard(1)`` (a forward pre-hook, torchtitan's
  ``PrepareModuleInput``): one gather per attention and per feed-forward, not one per linear,
  because an attention reads the sequence length from its input (``batch, seq, _ = x.shape``)
  and a per-linear gather would leave that ``seq/tp``. The hidden state is the parent's first
  positional argument, else its ``hidden_states`` keyword (Hugging Face's attention);
- column-split linears run ``ColwiseParallel()`` on that replicated input; row-split ones
  ``RowwiseParallel(output_layouts=Shard(1))``: a reduce-scatter to the sequence shard
  where the plain TP all-reduces;
- a module inside a block whose linears the layout leaves replicated (an attention whose K/V
  heads do not split over ``tp``: ``autoshard.trace.blocks.megatron_split``) runs on the
  gathered sequence too, and its output is cut back to this rank's rows (a redistribution
  from ``Replicate``: its backward all-gathers, so the module's replicated weights get the
  whole gradient on every rank); without it the module would see this rank's rows of the
  sequence alone (an attention over part of the sequence: wrong, and silently so). Such a
  module holding a norm of the block, or a block all of whose linears are replicated, is
  refused in one line (its norm would run on the whole sequence under ``SequenceParallel``);
- every norm inside a block (``nn.LayerNorm``, ``nn.RMSNorm``, any module whose class name
  ends in ``Norm``: Hugging Face's ``LlamaRMSNorm``) runs ``SequenceParallel()`` on its
  sequence shard: its weight a replicated ``tp`` DTensor, so its gradient is summed over
  ``tp``;
- the stage boundaries: on the first stage, the first block's input (the embedding's
  output, replicated) is cut to this rank's rows of the sequence (its gradient all-gathered
  back, so the replicated embedding gets the whole one); on a later stage, what stands for
  the embedding returns the received shard placed at this rank's rows of zeros of the whole
  sequence (the model's own bookkeeping between the embedding and the blocks, a Hugging
  Face model's position ids and causal mask, reads the sequence length from it), which the
  first block narrows back, with no communication; on the last stage, the last block's
  output is all-gathered for the final norm and head (replicated, as before). Every send
  between stages then carries ``(micro_batch, seq/tp, dim)``.

**Re-gathering in the backward** (``regather``: blocks without recomputation, as the pipeline
search prices them: ``autoshard.search.pipeline_blocks`` (h''')): the column-split linears keep
their input for the weight gradient, which is the gathered hidden state, ``tp`` times the shard
it was gathered from. As Megatron-LM's sequence parallelism does, the gathered copy is not kept:
saved-tensor hooks around the gathering module's forward (pushed by its pre-hook, popped by a
forward hook) pack every saved view of the gathered storage as a reference to the shard, and
the backward all-gathers the shard again at the first unpack, once for all the linears reading
it (the attention's ``wq``, ``wk``, ``wv``), and drops the copy after the last. What the block
keeps is the shard (``1/tp`` of the bytes); the backward runs one more all-gather per gathering
module in each backward pass through it (a zero-bubble schedule's input and weight passes each
unpack the linears' saved inputs: two; its first stage, whose input needs no gradient, runs no
input pass through its blocks: one).

The gathers and cuts are DTensor redistributions (``Shard(1)`` <-> ``Replicate()``), so
autograd runs their adjoints (reduce-scatter, all-gather, slice) and every gradient equals
the one-device one. The sequence length must divide by ``tp`` for the sends to be the
priced ``1/tp`` (torch splits an uneven one unevenly).

>>> is_norm(nn.RMSNorm(8)), is_norm(nn.Linear(8, 8))
(True, False)
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from autoshard.plan.pipeline_section import PipelineError

__all__ = ["SEQUENCE_DIM", "is_norm", "block_norms", "replicated_parents", "sequence_parallel_plan",
           "add_sequence_hooks"]

SEQUENCE_DIM = 1
"""The tensor dim of the residual stream ``(batch, seq, dim)`` split over ``tp``."""


def is_norm(module: nn.Module) -> bool:
    """A normalization layer: ``nn.LayerNorm``, ``nn.RMSNorm`` or a class named ``...Norm``."""
    return isinstance(module, (nn.LayerNorm, nn.RMSNorm)) or type(module).__name__.endswith("Norm")


def block_norms(stage_module: nn.Module, blocks: Sequence[nn.Module]) -> tuple[str, ...]:
    """Paths (in ``stage_module``) of the norms inside ``blocks``, outermost only.

    >>> # block_norms(stage, [stage.layers[0]]) == ("layers.0.attention_norm", "layers.0.ffn_norm")
    """
    ids = {id(b) for b in blocks}
    out: list[str] = []
    for path, module in stage_module.named_modules():
        if id(module) not in ids:
            continue
        for name, child in module.named_modules():
            if name and is_norm(child) and not any(f"{path}.{name}".startswith(p + ".") for p in out):
                out.append(f"{path}.{name}")
    return tuple(out)


def replicated_parents(stage_module: nn.Module, layout: dict[str, str], blocks: Sequence[nn.Module]
                       ) -> tuple[str, ...]:
    """Paths (in ``stage_module``) of the modules inside ``blocks`` that hold ``nn.Linear`` children
    none of which ``layout`` splits (module docstring: run on the gathered sequence). A block itself
    among them, or one holding a norm, raises :class:`PipelineError`, one line.

    >>> # replicated_parents(stage, {"layers.0.mlp.up": "colwise", ...}, [stage.layers[0]]) == ("layers.0.attn",)
    """
    ids = {id(b) for b in blocks}
    norms = block_norms(stage_module, blocks)
    columns = {p.rpartition(".")[0] for p, style in layout.items() if style == "colwise"}
    out: list[str] = []
    for path, module in stage_module.named_modules():
        if id(module) not in ids:
            continue
        parents: dict[str, bool] = {}
        for name, child in module.named_modules():
            if name and isinstance(child, nn.Linear):
                parent = f"{path}.{name}".rpartition(".")[0]
                parents[parent] = parents.get(parent, False) or f"{path}.{name}" in layout
        for parent, split in sorted(parents.items(), key=lambda item: item[0].count(".")):  # outer first
            # inside a module that gathers the sequence already, a second gather would double it
            if split or any(parent.startswith(g + ".") for g in (*columns, *out)):
                continue
            if parent == path or any(n.startswith(parent + ".") for n in norms) \
                    or any(c.startswith(parent + ".") for c in columns):
                raise PipelineError(f"pipeline.sequence_parallel: {parent!r} holds linears the layout leaves "
                                    "replicated beside the block's residual stream, a norm or split linears; it "
                                    "cannot run on the gathered sequence")
            out.append(parent)
    return tuple(out)


def sequence_parallel_plan(stage_module: nn.Module, layout: dict[str, str], blocks: Sequence[nn.Module]
                           ) -> dict[str, Any]:
    """The ``parallelize_module`` plan of a sequence-parallel stage: ``layout`` (path -> colwise /
    rowwise, this stage's linears) with row-split outputs reduce-scattered to ``Shard(1)``, and the
    blocks' norms under ``SequenceParallel``."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    plan: dict[str, Any] = {path: ColwiseParallel() if style == "colwise"
                            else RowwiseParallel(output_layouts=Shard(SEQUENCE_DIM))
                            for path, style in layout.items()}
    for path in block_norms(stage_module, blocks):
        plan[path] = SequenceParallel(sequence_dim=SEQUENCE_DIM, use_local_output=True)
    return plan


def add_sequence_hooks(stage_module: nn.Module, column_paths: Sequence[str], blocks: Sequence[nn.Module], *,
                       received: Sequence[nn.Module], last: bool, tp_mesh: Any, replicated: Sequence[str] = (),
                       regather: bool = False) -> None:
    """Register the gathers and cuts of the module docstring: a sequence all-gather before each
    parent of ``column_paths``; before each of ``replicated`` (:func:`replicated_parents`) that
    gather and after it the cut back to this rank's rows; before the first of ``blocks``, the cut (stage 0: ``received``
    empty) or the narrowing of the padded received shard (a later stage: ``received`` are the
    modules standing for the embedding, whose output is padded to the whole sequence); the
    all-gather after the last block when ``last``. A parent that is a block itself (its residual
    stream would be gathered) raises :class:`PipelineError`, one line. ``regather`` (blocks without
    recomputation): each gathered input is kept as its sequence shard for the backward and
    all-gathered again there (module docstring, Re-gathering in the backward), except inside a block
    run under activation checkpointing (``pipeline_stages.recompute_blocks``; a ``partial`` section's
    first blocks), which keeps only its input and gathers again in its recomputation anyway."""
    block_ids = {id(b) for b in blocks}
    # a selective block (pipeline_stages.selective_blocks) recomputes its gathers as a checkpointed one does
    checkpointed = {id(m) for b in blocks if getattr(type(b), "_pipeline_full_recompute", False)
                    or getattr(type(b), "_pipeline_selective_recompute", False) for m in b.modules()}
    for parent in sorted({p.rpartition(".")[0] for p in column_paths}):
        module = stage_module.get_submodule(parent)
        if id(module) in block_ids:
            raise PipelineError(f"pipeline.sequence_parallel: {parent!r} is a block with column-split linears as "
                                "direct children; the sequence is gathered at their parent (the attention, the "
                                "feed-forward), which must be inside the block")
        _add_gather(module, tp_mesh, parent, regather and id(module) not in checkpointed)
    for parent in replicated:
        module = stage_module.get_submodule(parent)
        _add_gather(module, tp_mesh, parent, regather and id(module) not in checkpointed)
        module.register_forward_hook(_cut_output_hook(tp_mesh))
    for module in received:
        module.register_forward_hook(_pad_received_hook(tp_mesh))
    if blocks:
        blocks[0].register_forward_pre_hook(_cut_input_hook(tp_mesh, received=bool(received)), with_kwargs=True)
    if last and blocks:
        blocks[-1].register_forward_hook(_gather_output_hook(tp_mesh))


def _resplit(x: Any, tp_mesh: Any, src: Any, dst: Any) -> Any:
    """``x`` (this rank's local tensor, laid out ``src`` over ``tp``) laid out ``dst``, as a local
    tensor; a DTensor redistribution so that autograd runs its adjoint backward."""
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(x, tp_mesh, [src], run_check=False).redistribute(tp_mesh, [dst]).to_local()


def _gather(x: Any, tp_mesh: Any) -> Any:
    from torch.distributed.tensor import Replicate, Shard

    return _resplit(x, tp_mesh, Shard(SEQUENCE_DIM), Replicate())


def _on_hidden_state(args: tuple, kwargs: dict, change: Any, refusal: str) -> tuple[tuple, dict]:
    """A pre-hook's ``(args, kwargs)`` with the hidden state (the first positional tensor, else the
    ``hidden_states`` keyword: Hugging Face's) replaced by ``change(it)``; ``refusal`` (one line)
    raised as :class:`PipelineError` when there is none."""
    if args and isinstance(args[0], torch.Tensor):
        return (change(args[0]), *args[1:]), kwargs
    if isinstance(kwargs.get("hidden_states"), torch.Tensor):
        return args, {**kwargs, "hidden_states": change(kwargs["hidden_states"])}
    raise PipelineError(refusal)


def _add_gather(module: nn.Module, tp_mesh: Any, where: str, regather: bool) -> None:
    """The gather before ``module`` and, with ``regather``, the saved-tensor hooks around its forward."""
    module.register_forward_pre_hook(_gather_input_hook(tp_mesh, where, regather), with_kwargs=True)
    if regather:
        module.register_forward_hook(_pop_regather_hook, always_call=True)


def _gather_input_hook(tp_mesh: Any, where: str, regather: bool = False):
    """Pre-hook: the module's hidden state gathered along the sequence; with ``regather`` (and a
    backward to come) the saved-tensor hooks that keep the gathered copy as its shard pushed for
    the module's forward (popped by :func:`_pop_regather_hook`)."""
    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        seen: list[tuple[Any, Any]] = []

        def change(x: Any) -> Any:
            whole = _gather(x, tp_mesh)
            seen.append((x, whole))
            return whole
        out = _on_hidden_state(args, kwargs, change,
                               f"pipeline.sequence_parallel: {where!r} takes no hidden state (a first positional "
                               "tensor or a hidden_states keyword) to gather along the sequence")
        if regather and torch.is_grad_enabled() and seen:
            shard, whole = seen[0]
            hooks = torch.autograd.graph.saved_tensors_hooks(*_regather_hooks(_Regather(shard, whole, tp_mesh)))
            hooks.__enter__()
            module.__dict__.setdefault("_pipeline_regather", []).append(hooks)
        return out
    return hook


def _pop_regather_hook(module: nn.Module, args: tuple, output: Any) -> None:
    """Forward hook (always called): the saved-tensor hooks :func:`_gather_input_hook` pushed, popped."""
    stack = module.__dict__.get("_pipeline_regather")
    if stack:
        stack.pop().__exit__(None, None, None)


class _Regather:
    """One gathered input kept as its sequence shard (module docstring, Re-gathering in the backward):
    the shard (detached: the saved tensors referring to it must not hold its graph), the gathered
    storage's address and size, and the copy gathered again in the backward, shared by the ``packs``
    saved views of it and dropped after the last of them is unpacked (once a backward pass that reads
    them: a pass that unpacks them again gathers again)."""

    def __init__(self, shard: Any, whole: Any, tp_mesh: Any) -> None:
        self.shard, self.mesh = shard.detach(), tp_mesh
        storage = whole.untyped_storage()
        self.address, self.nbytes = storage.data_ptr(), storage.nbytes()
        self.packs = self.left = 0
        self.whole: Any = None

    def take(self) -> Any:
        """The gathered copy, gathered again at the first unpack of a pass."""
        if self.whole is None:
            with torch.no_grad():
                self.whole = _gather(self.shard, self.mesh)
            if self.whole.untyped_storage().nbytes() != self.nbytes:  # a torch whose gather lays out otherwise
                raise PipelineError("pipeline.sequence_parallel: the backward's re-gather does not reproduce the "
                                    "forward's gathered storage")
        whole = self.whole
        self.left -= 1
        if self.left <= 0:
            self.whole, self.left = None, self.packs
        return whole


class _Packed:
    """A saved view of a gathered input: its record and its geometry (and DTensor spec) on that storage."""

    __slots__ = ("record", "spec", "size", "stride", "offset")

    def __init__(self, record: _Regather, spec: Any, local: Any) -> None:
        self.record, self.spec = record, spec
        self.size, self.stride, self.offset = local.size(), local.stride(), local.storage_offset()


def _regather_hooks(record: _Regather):
    """``(pack, unpack)``: a saved tensor on the gathered storage (the column-split linears' input, a
    DTensor view of it) packed as a :class:`_Packed` and rebuilt from the re-gathered copy; every
    other saved tensor passes as it is."""
    from torch.distributed.tensor import DTensor

    def pack(t: Any) -> Any:
        local = t._local_tensor if isinstance(t, DTensor) else t
        if not isinstance(local, torch.Tensor) or local.untyped_storage().data_ptr() != record.address:
            return t
        record.packs += 1
        record.left += 1
        return _Packed(record, t._spec if isinstance(t, DTensor) else None, local)

    def unpack(p: Any) -> Any:
        if not isinstance(p, _Packed):
            return p
        local = p.record.take().as_strided(p.size, p.stride, p.offset)
        if p.spec is None:
            return local
        with torch.no_grad():
            return DTensor.from_local(local, p.spec.mesh, p.spec.placements, run_check=False,
                                      shape=p.spec.shape, stride=p.spec.stride)
    return pack, unpack


def _cut(x: Any, tp_mesh: Any, received: bool) -> Any:
    """This rank's rows of the sequence of ``x``: on stage 0 a redistribution from ``Replicate``
    (its backward all-gathers, so the replicated embedding gets the whole gradient); on a later
    stage a narrowing of the padded received shard (:func:`_pad_received_hook`; local both ways)."""
    from torch.distributed.tensor import Replicate, Shard

    tp, seq = tp_mesh.size(), x.shape[SEQUENCE_DIM]
    if seq % tp:
        raise PipelineError(f"pipeline.sequence_parallel: a sequence of {seq} does not split over {tp} tp ranks")
    if received:
        return x.narrow(SEQUENCE_DIM, tp_mesh.get_local_rank() * (seq // tp), seq // tp)
    return _resplit(x, tp_mesh, Replicate(), Shard(SEQUENCE_DIM))


def _cut_input_hook(tp_mesh: Any, *, received: bool):
    """Pre-hook on a stage's first block: its hidden state cut to this rank's rows of the sequence."""

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return _on_hidden_state(args, kwargs, lambda x: _cut(x, tp_mesh, received),
                                "pipeline.sequence_parallel: the first block takes no hidden state (a first "
                                "positional tensor or a hidden_states keyword) to split along the sequence")
    return hook


def _pad_received_hook(tp_mesh: Any):
    """Forward hook on what stands for the embedding on a later stage: the received shard
    ``(b, seq/tp, d)`` placed at this rank's rows of zeros ``(b, seq, d)``, so that the model's
    bookkeeping between the embedding and the blocks (a Hugging Face model's position ids and
    causal mask from the embedding's sequence length) sees the whole sequence; no communication,
    and the first block narrows it back (:func:`_cut`)."""

    def hook(module: nn.Module, args: tuple, output: Any) -> Any:
        tp, rank = tp_mesh.size(), tp_mesh.get_local_rank()
        shard = _ContiguousGrad.apply(output)
        parts = [shard if k == rank else output.new_zeros(output.shape) for k in range(tp)]
        return torch.cat(parts, dim=SEQUENCE_DIM)
    return hook


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the gradient contiguous: the gradient of the padded received
    shard is a strided slice, and torch's pipeline sends it back (and the previous stage allocates
    its receive buffer with its strides; gloo receives into contiguous tensors only)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def _cut_output_hook(tp_mesh: Any):
    """Forward hook on a replicated module run on the gathered sequence: its output (or first
    output: Hugging Face's attention returns its weights beside it) cut to this rank's rows."""
    from torch.distributed.tensor import Replicate, Shard

    def hook(module: nn.Module, args: tuple, output: Any) -> Any:
        cut = lambda x: _resplit(x, tp_mesh, Replicate(), Shard(SEQUENCE_DIM))  # noqa: E731
        if isinstance(output, tuple):
            return (cut(output[0]), *output[1:])
        return cut(output)
    return hook


def _gather_output_hook(tp_mesh: Any):
    """Forward hook on the last stage's last block: its output (or first output) gathered for the head."""

    def hook(module: nn.Module, args: tuple, output: Any) -> Any:
        if isinstance(output, tuple):
            return (_gather(output[0], tp_mesh), *output[1:])
        return _gather(output, tp_mesh)
    return hook
