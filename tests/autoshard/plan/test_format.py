"""The plan file: JSON round trip, atomic save, fingerprint checks naming the part."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from hw_profiles import load

from autoshard.plan.fingerprint import make_fingerprint
from autoshard.plan.format import FORMAT, Plan, PlanError
from autoshard.search.solve import solve_prepared


@pytest.fixture(scope="module")
def plan(dp_mlp) -> Plan:
    return solve_prepared(dp_mlp, time_limit=30)


def test_plan_round_trips_through_json_unchanged(plan, tmp_path) -> None:
    path = tmp_path / "plan.json"
    plan.save(path)
    data = json.loads(path.read_text())
    assert data["format"] == FORMAT
    assert set(data) >= {"fingerprint", "params", "inputs", "nodes", "redistributions", "estimate", "solver"}
    again = Plan.load(path)
    assert again == plan
    assert again.to_dict() == plan.to_dict()
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]  # no temporary left


def test_plan_names_every_parameter_and_every_redistribution_has_steps(plan, dp_mlp) -> None:
    model_names = set(dp_mlp.graph.params)
    assert set(plan.params) == model_names
    assert all(r.steps for r in plan.redistributions)
    for r in plan.redistributions:
        assert r.cost_s == pytest.approx(sum(s.cost_s for s in r.steps))


def test_load_refuses_a_plan_for_another_mesh_or_model_naming_the_part(plan, dp_mlp, megatron_mlp, tmp_path) -> None:
    path = tmp_path / "plan.json"
    plan.save(path)
    assert Plan.load(path, expect=dp_mlp.fingerprint) == plan
    other_mesh = replace(dp_mlp.fingerprint, mesh_shape=(4,), dim_names=("dp",))
    with pytest.raises(PlanError, match=r"mesh \(plan: 2x2 dp,tp; here: 4 dp\)"):
        Plan.load(path, expect=other_mesh)
    with pytest.raises(PlanError, match="graph"):
        Plan.load(path, expect=replace(megatron_mlp.fingerprint, mesh_shape=(2, 2), dim_names=("dp", "tp")))
    other_profile = make_fingerprint(dp_mlp.traced, (2, 2), ("dp", "tp"), load("a100-sxm-80gb"))
    with pytest.raises(PlanError, match="profile"):
        Plan.load(path, expect=other_profile)
    assert Plan.load(path, expect=other_profile, allow_profile_change=True) == plan


@pytest.mark.parametrize("text, message", [
    ("{", "malformed JSON"),
    ('{"format": "autoshard.plan/0"}', "format"),
    ('{"format": "autoshard.plan/1"}', "fingerprint: missing"),
])
def test_bad_plan_files_get_one_clear_error(tmp_path, text, message) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(PlanError, match=message):
        Plan.load(path)


def test_fingerprint_is_stable_for_the_same_model(dp_mlp) -> None:
    again = make_fingerprint(dp_mlp.traced, (2, 2), ("dp", "tp"), load("h100-sxm-80gb"))
    assert again == dp_mlp.fingerprint and again.graph.startswith("sha256:")


def test_a_placement_that_does_not_parse_is_refused_naming_its_field(tmp_path):
    from autoshard.plan.format import Plan, PlanError
    from autoshard.search.solve import prepare, solve_prepared
    from examples.models import mlp

    plan = solve_prepared(prepare(*mlp.tiny(device="meta"), (2,), ("dp",), profile="cpu-gloo"), time_limit=5)
    for path, value, field in ((("params", "layers.0.w1.weight"), "S(0", "params.layers.0.w1.weight"),
                               (("params", "layers.0.w1.bias"), None, "params.layers.0.w1.bias"),
                               (("nodes", 0, "in", 0), "X", r"nodes\[0\].in\[0\]")):
        data = plan.to_dict()
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        with pytest.raises(PlanError, match=field):
            Plan.from_dict(data)


def test_constants_round_trip_and_are_absent_when_the_graph_has_none(plan, tmp_path) -> None:
    assert "constants" not in plan.to_dict()  # plans of graphs without constants are unchanged
    with_constants = replace(plan, constants={"_tensor_constant0": "S(0)R", "_tensor_constant1": "RR"})
    path = tmp_path / "plan.json"
    with_constants.save(path)
    assert json.loads(path.read_text())["constants"] == {"_tensor_constant0": "S(0)R", "_tensor_constant1": "RR"}
    assert Plan.load(path) == with_constants
    data = with_constants.to_dict()
    data["constants"]["_tensor_constant0"] = "S(x)"
    with pytest.raises(PlanError, match=r"constants\._tensor_constant0"):
        Plan.from_dict(data)
