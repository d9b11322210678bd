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
replicated), and every other parameter (embedding, norms, head) is replicated over
``tp``, whatever the plan chose for it. Without ``section.sequence_parallel`` the
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

>>> tensor_parallel_from_params({"layers.0.wq.weight": "RS(0)", "layers.0.wo.weight": "RS(1)",
...                              "layers.0.norm.weight": "RR"}, ("dp", "tp"), ("layers.0.wq", "layers.0.wo"))
(('layers.0.wq', 'colwise'), ('layers.0.wo', 'rowwise'))
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from torch import nn

from autoshard.plan.pipeline_section import (PipelineError, PipelineSection, priced_sequence_parallel,
                                             tensor_parallel_from_params)
from autoshard.trace.blocks import block_linears, column_then_row

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
    (``autoshard.trace.blocks.column_then_row``); else ``section`` itself. A section with full recomputation
    then runs sequence parallel (``sequence_parallel``), as the search priced its blocks.

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
                           replicated=replicated_parents(stage_module, layout, blocks))
    else:
        plan = {p: ColwiseParallel() if style == "colwise" else RowwiseParallel() for p, style in layout.items()}
    parallelize_module(stage_module, tp_mesh, plan)
    return len(layout)


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
