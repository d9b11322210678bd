"""Checkpoints of a :class:`~autoshard.runtime.pipeline_stages.PipelineRun` with ``torch.distributed.checkpoint``.

A pipeline rank holds only its stages' parameters (DTensors over its dp sub-mesh, and
``tp`` where the section splits linears), under the model's own names. The state dict
:func:`pipeline_state_dict` gives ``dcp.save`` / ``dcp.load`` is keyed by those names:
``model`` holds this rank's parameters, ``optim`` the optimizer's state flattened per
parameter name (torch's ``flatten_optimizer_state_dict``: ``state.<name>.exp_avg``,
``param_groups.<name>.lr``), so that every key belongs to one parameter and ranks of
different stages never write one key with different values (a nested ``param_groups``
list would be one key, each pp rank's list naming only its own parameters).

So a checkpoint saved by one plan loads into another with other stage counts, or into
the model with no pipeline: DCP finds each name's shards, whoever wrote them. A loader
without a pipeline uses torch's ``get_state_dict`` / ``set_state_dict`` with
``StateDictOptions(flatten_optimizer_state_dict=True)``, the same layout.

>>> # state = pipeline_state_dict(run, optimizer); dcp.save(state, checkpoint_id=path)
>>> # state = pipeline_state_dict(run4, optimizer4); dcp.load(state, checkpoint_id=path)
>>> # load_pipeline_state_dict(run4, optimizer4, state)
"""

from __future__ import annotations

from typing import Any

import torch

from autoshard.plan.pipeline_section import PipelineError
from autoshard.runtime.pipeline_stages import PipelineRun

__all__ = ["pipeline_state_dict", "load_pipeline_state_dict"]


def _model_of(run: PipelineRun) -> torch.nn.Module:
    if run.model is None:
        raise PipelineError("pipeline checkpoint: this PipelineRun was built without its model "
                            "(build it with autoshard.runtime.pipeline_stages.build_pipeline)")
    return run.model


def _options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def pipeline_state_dict(run: PipelineRun, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
    """``{"model": {name: parameter}, "optim": {flat key: value}}`` of this rank's stages (module
    docstring), for ``dcp.save``, or for ``dcp.load`` to fill (then :func:`load_pipeline_state_dict`).
    The parameters are the run's own tensors: ``dcp.load`` writes into them in place."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state: dict[str, Any] = {"model": {name: p for name, p in run.named_parameters()}}
    if optimizer is not None:
        # The whole model maps the optimizer's parameter objects to their names; only those the
        # optimizer holds (this rank's stages) appear.
        state["optim"] = get_optimizer_state_dict(_model_of(run), optimizer, options=_options())
    return state


def load_pipeline_state_dict(run: PipelineRun, optimizer: torch.optim.Optimizer | None,
                             state: dict[str, Any]) -> None:
    """Put what ``dcp.load`` read into ``state`` (made by :func:`pipeline_state_dict` of this run)
    into the run's parameters and ``optimizer``."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    mine = dict(run.named_parameters())
    with torch.no_grad():
        for name, value in state["model"].items():
            if name not in mine:
                raise PipelineError(f"pipeline checkpoint: {name!r} is not a parameter of this rank's stages")
            if value is not mine[name]:  # dcp.load fills the run's own tensors; a copy is put back
                mine[name].copy_(value)
    if optimizer is not None:
        set_optimizer_state_dict(_model_of(run), optimizer, state["optim"], options=_options())
