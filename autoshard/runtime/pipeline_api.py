"""``autoshard(model, mesh, example_inputs)`` on a mesh with a ``pp`` dim: a :class:`PipelineRun`.

Called by :func:`autoshard.runtime.api.autoshard` when the mesh has a dim named ``pp``.
Rank 0 gets the pipeline section (``plan=``'s ``pipeline`` section when a plan is
given, else :func:`autoshard.search.pipeline_model.choose_pipeline`: the stage cuts,
microbatch count and torch schedule the search prices fastest), broadcasts it as JSON
(never pickled), and every rank builds its stages
(:func:`autoshard.runtime.pipeline_stages.build_pipeline`). If any rank fails, every
rank raises (as :func:`autoshard.runtime.rank_agreement.agree`).

Each stage runs data-parallel over the mesh's ``dp`` dim (FSDP2 ``fully_shard`` or
``replicate``, as the section's ``data_parallel`` says) and, on a ``tp`` dim, torch's
tensor parallelism with the column/row split of the linears that the given plan's
placements say (``autoshard.runtime.pipeline_tp``; without a plan, the split the search
pinned and priced: ``autoshard.search.pipeline_model``, A ``tp`` dim), not with the per-op placements
of the stage sub-mesh's solve: autoshard's interpreter runs whole-graph step programs,
not the per-microbatch stage calls a ``PipelineStage`` makes. Where the section says
``recompute`` "full" (the search priced the stages with activation checkpointing), each
block's forward runs again before its backward
(:func:`autoshard.runtime.pipeline_stages.recompute_blocks`); "partial", only each stage's first
``recompute_blocks`` blocks do, and its next ``recompute_selective_blocks`` run the op-level policy
(:func:`autoshard.runtime.pipeline_recompute.selective_blocks`).

**Stepping it**: ``run.step(**batch)`` takes this rank's data-parallel shard of the batch
as the model's keyword inputs (the same on every ``pp`` rank), runs the schedule's
microbatches, accumulates the gradients, and returns the mean loss on the last stage's
ranks, None on the others; the optimizer steps ``run.parameters()``::

    run = autoshard(model, mesh, (tokens, labels))       # mesh dims ("pp", "dp")
    optimizer = torch.optim.AdamW(run.parameters())
    optimizer.zero_grad()
    loss = run.step(tokens=tokens[rows], labels=labels[rows])
    optimizer.step()

>>> # run = autoshard(model, init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp")), (tokens, labels))
>>> # run.section.schedule, run.section.n_microbatches
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn

from autoshard.plan.format import Plan
from autoshard.plan.options import SolveOptions
from autoshard.plan.pipeline_section import PipelineError, PipelineSection
from autoshard.runtime.pipeline_stages import PipelineRun, build_pipeline, model_parts
from autoshard.runtime.pipeline_tp import with_plan_layout
from autoshard.runtime.rank_agreement import ERROR_CODE, RankSetupError, agree, broadcast_bytes, comm_device
from autoshard.search.pipeline_model import PIPELINE_DIM, choose_pipeline, stage_recompute

__all__ = ["autoshard_pipeline", "rank0_section", "pipeline_for"]


def pipeline_for(model: nn.Module, inputs: Sequence[Any] | Mapping[str, Any], mesh_shape: Sequence[int],
                 dim_names: Sequence[str], options: SolveOptions) -> PipelineSection | None:
    """The searched section for a mesh with a ``pp`` dim, None for any other mesh (``autoshard solve``
    writes it into the plan). Raises :class:`PipelineError` (one line) on bad input: a model without
    repeated blocks, more stages than blocks, no microbatch count or candidate that fits.

    The plan ``autoshard solve`` writes with it keeps the per-op placements of today's solve of the
    whole mesh (``pp`` as a plain dim), not the stage sub-mesh's: partial; the runtime does not run
    them for a pipeline.

    >>> # pipeline_for(model, (tokens, labels), (2, 2), ("pp", "dp"), options).schedule
    """
    if PIPELINE_DIM not in tuple(dim_names):
        return None
    parts = model_parts(model)
    section, _ = choose_pipeline(model, inputs, tuple(mesh_shape), tuple(dim_names), block_paths=parts.blocks,
                                 leading=parts.leading, trailing=parts.trailing, profile=options.profile,
                                 time_limit=options.time_limit, memory_limit=options.memory_limit,
                                 recompute=stage_recompute(options.recompute))
    return section


def rank0_section(model: nn.Module, example_inputs: Sequence[torch.Tensor] | Mapping[str, torch.Tensor],
                  mesh_shape: Sequence[int], dim_names: Sequence[str], options: SolveOptions,
                  plan: Plan | str | os.PathLike[str] | None = None) -> PipelineSection:
    """The section rank 0 runs: the given plan's, else the searched one (module docstring)."""
    if plan is not None:
        given = plan if isinstance(plan, Plan) else Plan.load(plan)
        if given.pipeline is None:
            raise PipelineError("plan: no pipeline section for a mesh with a 'pp' dim")
        # tp inside the stages: the column/row split of the plan's own placements
        return with_plan_layout(given.pipeline, model, given.params, given.fingerprint.dim_names)
    section = pipeline_for(model, example_inputs, mesh_shape, dim_names, options)
    if section is None:
        raise PipelineError(f"mesh dims {','.join(dim_names)}: no {PIPELINE_DIM!r} dim to cut stages along")
    return section


def autoshard_pipeline(model: nn.Module, mesh: Any,
                       example_inputs: Sequence[torch.Tensor] | Mapping[str, torch.Tensor],
                       options: SolveOptions, *, plan: Plan | str | os.PathLike[str] | None = None) -> PipelineRun:
    """This rank's :class:`PipelineRun` of ``model`` on ``mesh`` (module docstring)."""
    device = comm_device()
    payload, code, error = None, ERROR_CODE, None
    if dist.get_rank() == 0:
        try:
            shape = tuple(int(s) for s in mesh.shape)
            section = rank0_section(model, example_inputs, shape, tuple(mesh.mesh_dim_names), options, plan)
            payload, code = json.dumps(section.to_dict()).encode("utf-8"), 0
        except Exception as exc:  # noqa: BLE001 - broadcast, then raised on rank 0 too
            error, payload = exc, f"{type(exc).__name__}: {exc}".splitlines()[0].encode()
    code, payload = broadcast_bytes(code, payload, 0, device)
    if code == ERROR_CODE:
        if error is not None:
            raise error
        raise RankSetupError(f"rank 0 failed: {payload.decode(errors='replace')}")
    run, error = None, None
    try:
        run = build_pipeline(model, mesh, PipelineSection.from_dict(json.loads(payload.decode("utf-8"))))
    except Exception as exc:  # noqa: BLE001 - reported to every rank by agree
        error = exc
    agree(error, device)
    assert run is not None
    return run
