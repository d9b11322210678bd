"""costmodel.redistribute_steps: step and plan dicts round-trip and bad dicts name the field."""

from __future__ import annotations

import pytest

from costmodel.placements import parse_placements
from costmodel.redistribute_steps import RedistributePlan, RedistributeStep, StepError


def test_step_dict_round_trip_keeps_runtime_fields():
    step = RedistributeStep(
        "all_to_all", (0, 2), 4096, 1e-5, parse_placements("S(0)RS(0)"), parse_placements("S(1)RS(1)"),
        tensor_dim=0, split_tensor_dim=1, relayout_s=2e-6,
    )
    data = step.to_dict()
    assert data["mesh_dims"] == [0, 2] and data["src"] == "S(0)RS(0)" and data["split_tensor_dim"] == 1
    assert RedistributeStep.from_dict(data) == step


def test_plan_dict_round_trip():
    step = RedistributeStep("all_reduce", (1,), 8388608, 1.2e-4, reduce_op="sum")
    plan = RedistributePlan((step,), 1.2e-4, parse_placements("P(sum)R"), parse_placements("RR"))
    data = plan.to_dict()
    assert data["steps"][0] == {"collective": "all_reduce", "mesh_dims": [1], "bytes": 8388608, "cost_s": 1.2e-4, "reduce_op": "sum"}
    back = RedistributePlan.from_dict(data)
    assert back.steps == plan.steps and back.src == plan.src and back.dst == plan.dst


def test_bad_step_dicts_name_the_field():
    with pytest.raises(StepError, match="collective"):
        RedistributeStep.from_dict({"collective": "broadcast", "mesh_dims": [0], "bytes": 1})
    with pytest.raises(StepError, match="bytes"):
        RedistributeStep.from_dict({"collective": "all_reduce", "mesh_dims": [0]})
