"""Tensor parallelism inside a pipeline stage: the plan's column / row layout, run by torch's ``parallelize_module``.

A plan for a mesh ``(pp, dp, tp)`` places each parameter per mesh dim; on ``tp`` a
linear layer's weight ``S(0)`` splits its output features (torch's ``ColwiseParallel``)
and ``S(1)`` its input features (``RowwiseParallel``). :func:`tensor_parallel_from_params`
reads that layout for the linear layers of the model's repeated blocks into the
pipeline section's ``tensor_parallel`` field; :func:`apply_tensor_parallel` runs it on
one stage module before FSDP2 shards the stage over its dp sub-mesh (2-D parameters:
``Shard`` over dp of a ``tp`` DTensor, as torchtitan composes them).

**What this runs and what it does not.** It is torch's tensor parallelism with the
plan's column / row choice per linear layer, not the plan's per-op placements: every
activation between the linear layers is what ``ColwiseParallel`` / ``RowwiseParallel``
leave (a column-split output stays local, the row-split output is all-reduced to
replicated), and every other parameter but the embedding and the head (below), the norms
for one, is replicated over ``tp``, whatever the plan chose for it. Without ``section.sequence_parallel`` the
boundary activation each stage sends is the whole (replicated over ``tp``) hidden state,
``tp`` times what the search prices for a sequence-split one. With it
(``autoshard.runtime.pipeline_sp``), the residual stream between the blocks is split
along the sequence over ``tp`` as torchtitan runs its TP (row-split outputs
reduce-scattered, the blocks' norms ``SequenceParallel``), and each ``tp`` rank sends
``1/tp`` of the activation, the section's ``send_bytes``.
A column split of an attention's projections gives each ``tp`` rank ``1/tp`` of its
heads: an attention that reshapes with ``-1`` heads (Hugging Face's ``view(*shape, -1,
head_dim)``) needs nothing more; one that reshapes with its head-count attributes
(:data:`HEAD_COUNT_ATTRS`, as the example LLaMA and older torchtitan models do) gets
them divided by ``tp`` in place, as torchtitan did for its TP (the model is sharded in
place anyway: its parameters become DTensors).

**The embedding and the head** (``autoshard.trace.blocks.vocab_split``: an ``nn.Embedding``
before the blocks, an ``nn.Linear`` after them, ``tp`` dividing the vocabulary) are split over
the vocabulary with any layout, as torchtitan splits them and as the stage solve prices them
(``autoshard.trace.blocks.megatron_table`` pins both weights ``S(0)`` on ``tp``): the embedding
``RowwiseParallel`` (each rank looks up its rows, the partial outputs all-reduced), the head
``ColwiseParallel`` with its logits gathered whole (not torch's loss parallelism: the model's
own loss reads them, as on one device). So a rank holds ``1/tp`` of the head's weight and
gradient and runs ``1/tp`` of its matmul; the logits it keeps for the loss are whole, as the
solve's gather before the loss keeps them. A forward that reads the head's weight without
calling the head (``F.linear(x, self.output.weight)``: the example LLaMA) gets the same
gather from a torch-function mode around the stage's forward (:func:`_gather_head_reads`).

>>> tensor_parallel_from_params({"layers.0.wq.weight": "RS(0)", "layers.0.wo.weight": "RS(1)",
...                              "layers.0.norm.weight": "RR"}, ("dp", "tp"), ("layers.0.wq", "layers.0.wo"))
(('layers.0.wq', 'colwise'), ('layers.0.wo', 'rowwise'))
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from torch import nn

from autoshard.plan.pipeline_section import (PipelineError, PipelineSection, priced_sequence_parallel,
                                             tensor_parallel_from_params)
from autoshard.trace.blocks import block_linears, column_then_row, vocab_split

__all__ = ["TP_DIM", "HEAD_COUNT_ATTRS", "tensor_parallel_from_params", "block_linears", "with_plan_layout",
           "apply_tensor_parallel"]

TP_DIM = "tp"
"""The mesh dim a stage's tensor parallelism runs on."""
HEAD_COUNT_ATTRS = ("n_heads", "n_kv_heads", "num_heads", "num_key_value_heads")
"""Integer attributes of a module with column-split children that count its heads (divided by ``tp``)."""


def with_plan_layout(section: PipelineSection, model: nn.Module, params: Mapping[str, str],
                     dim_names: Sequence[str]) -> PipelineSection:
    """``section`` with its ``tensor_parallel`` read from a plan's parameter placements (``Plan.params``
    on the plan's mesh dims ``dim_names``) for the linears of ``model``'s blocks, when it has none
    and the plan's mesh has a ``tp`` dim and splits them as torch's column / row styles can run
    (``autoshard.trace.blocks.column_then_row``); else ``section`` itself. A section given a layout
    here then runs sequence parallel (``sequence_parallel``) under either recomputation policy, as
    the search priced its blocks (``autoshard.plan.pipeline_section.priced_sequence_parallel``).

    >>> # run = build_pipeline(model, mesh, with_plan_layout(plan.pipeline, model, plan.params, dims))
    """
    import dataclasses

    from autoshard.plan.pipeline_section import check_section
    from autoshard.trace.blocks import repeated_blocks

    if section.tensor_parallel or TP_DIM not in tuple(dim_names):
        return section
    linears = block_linears(model, repeated_blocks(model))
    layout = tensor_parallel_from_params(params, dim_names, linears)
    if not column_then_row(model, linears, dict(layout)):  # torch's styles cannot run it: refused when built
        return section
    section = dataclasses.replace(section, tensor_parallel=layout, sequence_parallel=section.sequence_parallel
                                  or priced_sequence_parallel(section.recompute, layout))
    check_section(section)
    return section


def apply_tensor_parallel(stage_module: nn.Module, section: PipelineSection, stage: int, tp_mesh: Any, *,
                          blocks: Sequence[nn.Module] = ()) -> int:
    """Split the linear layers of stage ``stage``'s modules over ``tp_mesh`` as ``section.tensor_parallel``
    says (torch's ``ColwiseParallel`` / ``RowwiseParallel``, parameters becoming ``tp`` DTensors in
    place). With ``section.sequence_parallel``, the residual stream between the stage's ``blocks``
    is split along the sequence (``autoshard.runtime.pipeline_sp``). Returns how many layers it split.

    >>> # apply_tensor_parallel(stage_module, section, 0, mesh["tp"], blocks=[stage_module.layers[0]])
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from autoshard.runtime.pipeline_sp import add_sequence_hooks, replicated_parents, sequence_parallel_plan

    mine = section.stages[stage].modules
    layout = {path: style for path, style in section.tensor_parallel if any(path.startswith(m + ".") for m in mine)}
    for path in layout:
        if not isinstance(stage_module.get_submodule(path), nn.Linear):
            raise PipelineError(f"pipeline.tensor_parallel: {path!r} is not an nn.Linear")
    if not layout:
        return 0
    if section.sequence_parallel and not blocks:
        raise PipelineError(f"pipeline.sequence_parallel: stage {stage} was given no blocks to split")
    columns = [p for p, style in layout.items() if style == "colwise"]
    _localize_head_counts(stage_module, columns, tp_mesh.size())
    if section.sequence_parallel:
        plan = sequence_parallel_plan(stage_module, layout, blocks)
        add_sequence_hooks(stage_module, columns, blocks, received=_received_modules(stage_module, section, stage),
                           last=stage == section.n_stages - 1, tp_mesh=tp_mesh,
                           replicated=replicated_parents(stage_module, layout, blocks),
                           regather=section.recompute != "full")
    else:
        plan = {p: ColwiseParallel() if style == "colwise" else RowwiseParallel() for p, style in layout.items()}
    vocab = _vocab_plan(stage_module, blocks, tp_mesh)
    parallelize_module(stage_module, tp_mesh, {**plan, **vocab})
    return len(layout) + len(vocab)


def _vocab_plan(stage_module: nn.Module, blocks: Sequence[nn.Module], tp_mesh: Any) -> dict[str, Any]:
    """The ``parallelize_module`` plan of this stage's embedding and head split over the vocabulary
    (module docstring, The embedding and the head), with the head's gather for a forward that reads
    its weight without calling it."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    where = {id(m): path for path, m in stage_module.named_modules()}
    paths = tuple(where[id(b)] for b in blocks if id(b) in where)
    plan: dict[str, Any] = {}
    for path, kind in vocab_split(stage_module, paths, tp_mesh.size()):
        if kind == "embedding":  # each rank looks its vocabulary up, the partial rows summed over tp
            plan[path] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
        else:  # the logits gathered whole: the model's own loss reads them as it would on one device
            plan[path] = ColwiseParallel(output_layouts=Replicate())
            _gather_head_reads(stage_module, tp_mesh)
    return plan


def _gather_head_reads(stage_module: nn.Module, tp_mesh: Any) -> None:
    """Around each forward of ``stage_module``: a ``F.linear`` of a plain input by a weight split
    ``Shard(0)`` on ``tp_mesh`` (a model whose forward reads its head's weight, ``F.linear(x,
    self.output.weight)``, as the example LLaMA does, never calls the head, so ``ColwiseParallel``'s
    hooks do not run) runs as they would: the input taken as replicated over ``tp``, the logits
    gathered whole. The input's gradient is then summed over ``tp`` by the redistribution's adjoint."""
    import torch.nn.functional as F
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.overrides import TorchFunctionMode

    class _HeadReads(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is F.linear and len(args) >= 2 and not isinstance(args[0], DTensor) \
                    and isinstance(args[1], DTensor) and args[1].device_mesh == tp_mesh \
                    and tuple(args[1].placements) == (Shard(0),):
                x = DTensor.from_local(args[0], tp_mesh, [Replicate()], run_check=False)
                return func(x, *args[1:], **kwargs).redistribute(tp_mesh, [Replicate()]).to_local()
            return func(*args, **kwargs)

    modes: list[TorchFunctionMode] = []

    def enter(module: nn.Module, args: Any, kwargs: Any) -> None:
        modes.append(_HeadReads())
        modes[-1].__enter__()

    def leave(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if modes:
            modes.pop().__exit__(None, None, None)

    stage_module.register_forward_pre_hook(enter, with_kwargs=True)
    stage_module.register_forward_hook(leave, with_kwargs=True, always_call=True)


def _received_modules(stage_module: nn.Module, section: PipelineSection, stage: int) -> list[nn.Module]:
    """On a stage after the first, the modules standing for the ones before the blocks (the
    embedding: they return the received activation); none on stage 0. Those are stage 0's
    modules ahead of its blocks (its last ``end_block - first_block`` modules)."""
    if stage == 0:
        return []
    first = section.stages[0]
    n_blocks = first.end_block - first.first_block
    return [stage_module.get_submodule(p) for p in first.modules[:len(first.modules) - n_blocks]]


def _localize_head_counts(stage_module: nn.Module, column_paths: list[str], tp: int) -> None:
    """Divide the :data:`HEAD_COUNT_ATTRS` of each parent of a column-split linear by ``tp`` (module
    docstring); a count ``tp`` does not divide raises :class:`PipelineError`, one line."""
    parents = {path.rpartition(".")[0] for path in column_paths}
    for parent in sorted(parents):
        module = stage_module.get_submodule(parent)
        for attr in HEAD_COUNT_ATTRS:
            count = getattr(module, attr, None)
            if type(count) is not int:
                continue
            if count % tp:
                raise PipelineError(f"pipeline.tensor_parallel: {parent}.{attr} = {count} heads do not split over "
                                    f"{tp} tp ranks")
            setattr(module, attr, count // tp)
