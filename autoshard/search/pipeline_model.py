"""The pipeline of a model instance on a mesh with a ``pp`` dim: search it, write the section.

:func:`choose_pipeline` runs :func:`autoshard.search.pipeline.search_pipeline` for one
model instance (not a factory): the block pricing of a microbatch
(:func:`autoshard.search.pipeline_blocks.price_blocks`) solves the model cut down to
``L_1 = 2`` and ``L_2 = 3`` of its repeated blocks (1 and 2 for a model of two; a shallow
copy whose block container keeps its first ``L`` blocks, the same modules, nothing copied)
at the microbatch's rows of the example inputs, on the stage sub-mesh (the mesh without the
``pp`` dim), once per recomputation policy the search prices (``none``, ``full`` and
``selective``: what the stage runtime runs; ``autoshard.search.pipeline``, Recomputation). The answer is the chosen :class:`~autoshard.search.pipeline.PipelinePlan` and the plan
file's :class:`~autoshard.plan.pipeline_section.PipelineSection`, with each stage's
priced time and its rank's peak memory recorded.

Where the pieces come from (the caller gives them: the runtime's
``autoshard.runtime.pipeline_stages.model_parts`` finds them): ``block_paths`` the
repeated blocks, ``leading`` / ``trailing`` the modules before and after them.

**A ``tp`` dim** (of more than one rank): the stage runtime runs tensor parallelism as torch's
column / row styles of Megatron's split of the blocks' linears and nothing else
(``autoshard.runtime.pipeline_tp``), so the stage solves price that split, pinned: the layout
``tp`` (``fsdp+tp`` where the stages run FSDP over a ``dp`` dim; ``autoshard.search.baselines``)
with the table of :func:`autoshard.trace.blocks.megatron_split` (found from the linears' shapes,
Hugging Face's grouped-query ``q/k/v`` included; every other parameter replicated on ``tp``, as
the runtime leaves it), each matmul reading its weight's shard where it lies on ``tp``
(``baselines.tensor_parallel_reads``: no weight gathered on ``tp``, as torch's styles run). A free
solve may choose a split the runtime cannot run (a tiny model's solve on a slow link replicates
every linear), and its price would be of a plan nothing runs. The section's layout
(:func:`stage_tensor_parallel`) is read back from the pinned solve, so the priced split is the one
that runs. Partial: the other activations stay the solver's choice under that layout (the layout
at its best, as every expert layout is priced): the replicated modules (embedding, norms, head, an
attention whose K/V heads do not split over ``tp``) may be priced with work split over ``tp`` that
the runtime runs replicated.

Bad input raises :class:`~autoshard.plan.pipeline_section.PipelineError`, one line: a
mesh without the pipeline dim, fewer blocks than stages, a microbatch count that does
not divide the batch, no candidate that fits the memory limit, a ``tp`` dim over blocks
whose linears have no Megatron split.

>>> # section, chosen = choose_pipeline(model, (tokens, labels), (2, 2), ("pp", "dp"),
>>> #                                   block_paths=parts.blocks, leading=parts.leading, trailing=parts.trailing)
>>> # section.schedule, section.n_microbatches, chosen.bubble_fraction
"""

from __future__ import annotations

import copy
import math
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

from autoshard.plan.pipeline_section import (RECOMPUTE_POLICIES, PipelineError, PipelineSection,
                                             tensor_parallel_from_params)
from autoshard.search.pipeline import PipelineLayout, PipelinePlan, pipeline_section, search_pipeline
from autoshard.search.pipeline_blocks import BlockPricing, price_blocks
from autoshard.trace.blocks import block_linears, column_then_row, megatron_table

__all__ = ["PIPELINE_DIM", "RUNTIME_SCHEDULES", "choose_pipeline", "stage_recompute", "stage_tensor_parallel",
           "truncated_model", "microbatch_inputs", "stage_sub_mesh"]

PIPELINE_DIM = "pp"
"""The mesh dim name that asks for pipeline stages."""

RUNTIME_SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
"""Schedules searched by default: those the runtime is shown to train as one device with
(tests/autoshard/runtime/test_pipeline_gloo.py), the zero-bubble ones (split input / weight
backward) and the V-shaped ones included."""


def stage_recompute(policy: str) -> str:
    """The pipeline stages' policy for the solve's ``recompute`` (``autoshard.graph.recompute_policy``):
    ``none`` and ``full`` as they are; ``auto``, ``selective`` and ``every:K`` search both and the
    stages mixing checkpointed, selective (torchtitan's op-level policy) and kept blocks (``auto``;
    the per-stage counts are the search's: ``autoshard.search.pipeline_selective``): a stage runs
    its blocks in that order, so ``every:K``'s blocks are not a stage's, and ``selective`` on every
    block is one of the mixes searched, not pinned.

    >>> stage_recompute("full"), stage_recompute("selective"), stage_recompute("every:2")
    ('full', 'auto', 'auto')
    """
    return policy if policy in RECOMPUTE_POLICIES else "auto"


def stage_sub_mesh(mesh_shape: Sequence[int], dim_names: Sequence[str]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The mesh one stage runs on: every dim but ``pp``.

    >>> stage_sub_mesh((2, 4, 2), ("pp", "dp", "tp"))
    ((4, 2), ('dp', 'tp'))
    """
    if PIPELINE_DIM not in dim_names:
        raise PipelineError(f"mesh dims {','.join(dim_names)}: no {PIPELINE_DIM!r} dim to cut stages along")
    at = list(dim_names).index(PIPELINE_DIM)
    shape = tuple(int(s) for i, s in enumerate(mesh_shape) if i != at)
    names = tuple(n for i, n in enumerate(dim_names) if i != at)
    return (shape or (1,)), (names or ("dp",))


def truncated_model(model: nn.Module, block_paths: Sequence[str], n_blocks: int) -> nn.Module:
    """A shallow copy of ``model`` whose block container holds its first ``n_blocks`` blocks
    (the same module objects: nothing is copied or allocated)."""
    container_path = block_paths[0].rpartition(".")[0]
    root = copy.copy(model)
    root._modules = dict(model._modules)
    parent, original = root, model
    names = container_path.split(".") if container_path else []
    for name in names[:-1]:  # copy the path down to the container so the original is untouched
        child = copy.copy(original._modules[name])
        child._modules = dict(original._modules[name]._modules)
        parent._modules[name] = child
        parent, original = child, original._modules[name]
    container = original._modules[names[-1]] if names else original
    keys = [p.rpartition(".")[2] for p in block_paths]
    kept = type(container)([container._modules[k] for k in keys[:n_blocks]]) if isinstance(container, nn.ModuleList) \
        else None
    if kept is None:
        raise PipelineError(f"pipeline: blocks under {container_path!r} are not an nn.ModuleList")
    if names:
        parent._modules[names[-1]] = kept
        return root
    return kept


def microbatch_inputs(inputs: Sequence[Any] | Mapping[str, Any], rows: int) -> Any:
    """The first ``rows`` sequences of every batched tensor input (dim 0)."""
    def cut(x: Any) -> Any:
        return x[:rows] if isinstance(x, torch.Tensor) and x.dim() > 0 else x
    if isinstance(inputs, Mapping):
        return {k: cut(v) for k, v in inputs.items()}
    return tuple(cut(x) for x in inputs)


def _first_tensor(inputs: Sequence[Any] | Mapping[str, Any]) -> torch.Tensor:
    values = inputs.values() if isinstance(inputs, Mapping) else inputs
    for x in values:
        if isinstance(x, torch.Tensor) and x.dim() >= 1:
            return x
    raise PipelineError("pipeline: the example inputs have no batched tensor (batch on dim 0)")


def _hidden(model: nn.Module, block_paths: Sequence[str]) -> tuple[int, int]:
    """(hidden size, bytes per element) of the stream between blocks: the last dim and dtype
    of the first block's first parameter of rank >= 1 whose last dim is shared by the most."""
    block = model.get_submodule(block_paths[0])
    dims: dict[int, int] = {}
    itemsize = 4
    for p in block.parameters():
        if p.dim() >= 1:
            dims[p.shape[-1]] = dims.get(p.shape[-1], 0) + 1
            itemsize = p.element_size()
    if not dims:
        raise PipelineError(f"pipeline: block {block_paths[0]} has no parameters to size its activations")
    return max(dims, key=lambda d: (dims[d], d)), itemsize


def choose_pipeline(
    model: nn.Module,
    inputs: Sequence[Any] | Mapping[str, Any],
    mesh_shape: Sequence[int],
    dim_names: Sequence[str],
    *,
    block_paths: Sequence[str],
    leading: Sequence[str] = (),
    trailing: Sequence[str] = (),
    profile: Any = "cpu-gloo",
    time_limit: float = 30.0,
    schedules: Sequence[str] = RUNTIME_SCHEDULES,
    microbatches: Sequence[int] | None = None,
    memory_limit: float | None = None,
    recompute: str = "auto",
    data_parallel: str = "fsdp",
) -> tuple[PipelineSection, PipelinePlan]:
    """The searched pipeline of ``model`` on the mesh (module docstring): the section and the
    priced choice. ``time_limit`` bounds each block-pricing solve; ``memory_limit`` (bytes per
    device) defaults to the profile's usable memory. ``recompute``: the stages' policy,
    ``none`` or ``full`` (:data:`~autoshard.plan.pipeline_section.RECOMPUTE_POLICIES`), or
    ``auto``: both searched, and stages checkpointing some of their blocks where full is priced
    (``autoshard.search.pipeline``, Recomputation (R4); the section's ``recompute`` then says
    ``partial``, each stage its count); anything else is a one-line :class:`PipelineError`.

    >>> # choose_pipeline(model, (tokens, labels), (2, 2), ("pp", "dp"), block_paths=("layers.0", "layers.1"))
    """
    from hw_profiles import HardwareProfile, load

    if recompute not in ("auto", *RECOMPUTE_POLICIES):
        raise PipelineError(f"pipeline: recompute {recompute!r} is not a stage policy; valid: auto, "
                            f"{', '.join(RECOMPUTE_POLICIES)}")
    prof = profile if isinstance(profile, HardwareProfile) else load(str(profile))
    sub_shape, sub_names = stage_sub_mesh(mesh_shape, dim_names)
    pp = int(mesh_shape[list(dim_names).index(PIPELINE_DIM)])
    n_blocks = len(block_paths)
    if n_blocks < 2:
        raise PipelineError(f"pipeline: the model has {n_blocks} repeated block(s); pricing a stage needs at least 2")
    if pp > n_blocks:
        raise PipelineError(f"pipeline: pp={pp} stages exceed the model's {n_blocks} blocks")
    first = _first_tensor(inputs)
    batch, seq_len = int(first.shape[0]), int(first.shape[1]) if first.dim() > 1 else 1
    dim, itemsize = _hidden(model, block_paths)
    tp = math.prod(s for s, n in zip(sub_shape, sub_names) if n == "tp")
    layout = PipelineLayout(pp, math.prod(sub_shape) // tp, tp)
    baseline, table = None, None
    if tp > 1:  # the split the stage runtime runs, pinned (module docstring, A ``tp`` dim)
        table = megatron_table(model, block_paths, tp)
        if not table:
            raise PipelineError(f"pipeline: a 'tp' dim of {tp} ranks, but the blocks' nn.Linear layers have no "
                                f"Megatron column/row split over it (autoshard.trace.blocks.megatron_split)")
        baseline = "fsdp+tp" if data_parallel == "fsdp" and len(sub_shape) > 1 else "tp"
    pricings: dict[tuple[int, str], BlockPricing] = {}
    traces: dict[tuple[int, int], Any] = {}  # one trace a depth and microbatch for both policies

    def factory(n_layers: int, batch_size: int, **_: Any) -> tuple[nn.Module, Any]:
        return truncated_model(model, block_paths, n_layers), microbatch_inputs(inputs, batch_size)

    # the marginal block an inner one where there are three: the last block's backward follows its
    # forward at once, which no inner block of a stage sees
    depths = (2, 3) if n_blocks >= 3 else (1, 2)

    def pricer(policy: str) -> Callable[[int], BlockPricing]:
        def price_at(micro_batch: int) -> BlockPricing:
            if (micro_batch, policy) not in pricings:
                pricings[micro_batch, policy] = price_blocks(
                    factory, {}, sub_shape, sub_names, micro_batch=micro_batch, depths=depths, recompute=policy,
                    profile=prof, time_limit=time_limit, traces=traces, baseline=baseline, tp_table=table)
            return pricings[micro_batch, policy]
        return price_at

    base = "none" if recompute == "auto" else recompute
    try:
        chosen = search_pipeline(pricer(base), n_blocks=n_blocks, batch=batch, seq_len=seq_len, dim=dim,
                                 layout=layout, profile=prof, flops_per_token=0.0, schedules=schedules,
                                 microbatches=microbatches, memory_limit_bytes=memory_limit, itemsize=itemsize,
                                 recompute=base, price_full=pricer("full") if recompute == "auto" else None,
                                 price_selective=pricer("selective") if recompute == "auto" else None,
                                 price_all_mm=pricer("selective_all_mm") if recompute == "auto" else None)
    except PipelineError:
        raise
    except ValueError as exc:  # the search's one-line refusals, as the section's error
        raise PipelineError(f"pipeline: {exc}") from None
    # a partial choice mixes both policies' pricings, solved with the same pinned layout: the split is read from none's
    pricing = pricings[batch // chosen.n_microbatches, "none" if chosen.recompute == "partial" else chosen.recompute]
    section = pipeline_section(chosen, batch=batch, seq_len=seq_len, dim=dim, block_paths=block_paths,
                               leading=leading, trailing=trailing, itemsize=itemsize, data_parallel=data_parallel,
                               tensor_parallel=stage_tensor_parallel(pricing, model, block_paths, sub_names))
    return section, chosen


def stage_tensor_parallel(pricing: BlockPricing, model: nn.Module, block_paths: Sequence[str],
                          sub_names: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """The column / row split on ``tp`` of every block's linears, as the stage sub-mesh's solve
    (``pricing.params``, its deeper depth) placed the first block's: the blocks are alike (tied in
    the solve), so each runs the first one's layout. On a ``tp`` dim of more than one rank the
    search solves the stages with Megatron's split pinned (:func:`choose_pipeline`), so what this
    reads back is the split that was priced, the one torch's ``ColwiseParallel`` /
    ``RowwiseParallel`` run. Empty without a ``tp`` dim or placements, and where the solve's split
    is not one those styles can run (:func:`autoshard.trace.blocks.column_then_row`; a solve not
    pinned so): the stage runtime then refuses a ``tp`` dim of more than one rank in one line.

    >>> # stage_tensor_parallel(pricing, model, [f"layers.{i}" for i in range(4)], ("dp", "tp"))
    """
    if "tp" not in tuple(sub_names) or not pricing.params:
        return ()
    first = block_paths[0]
    linears = block_linears(model, [first])
    layout = tensor_parallel_from_params(dict(pricing.params), sub_names, linears)
    if not column_then_row(model, linears, dict(layout)):
        return ()
    inside = [(path[len(first) + 1:], style) for path, style in layout]
    return tuple((f"{block}.{rel}", style) for block in block_paths for rel, style in inside)
