"""The plan's ``program`` section: written by the assembler, checked on load, refused in one line."""

from __future__ import annotations

import json

import jsonschema
import pytest

from autoshard.plan.format import Plan, PlanError
from autoshard.plan.program_section import PROGRAM_VERSION, recorded_actions
from autoshard.plan.schema import PLAN_SCHEMA
from autoshard.search.solve import prepare, solve_prepared
from examples.models import llama3


@pytest.fixture(scope="module")
def plan():
    """A llama (tuple accesses) with gradient buckets and selective recomputation on 2 ranks."""
    model, inputs = llama3.tiny(batch_size=2, seq_len=16)
    prep = prepare(model, inputs, (2,), ("dp",), profile="cpu-gloo")
    return solve_prepared(prep, time_limit=10, baseline="ddp", recompute="selective")


def test_the_section_follows_the_schema_and_survives_a_round_trip(plan):
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["program"]["version"] == PROGRAM_VERSION
    jsonschema.Draft202012Validator(PLAN_SCHEMA).validate(data)
    assert Plan.from_dict(data).program == plan.program


def test_every_node_is_computed_once_and_every_collective_issued_and_waited(plan):
    entries = plan.program.actions
    computed = [e[1] for e in entries if e[0] == "compute"]
    assert all(isinstance(e, str) and " " in e for e in plan.to_dict()["program"]["actions"])  # one line each
    assert {n.name for n in plan.nodes} <= set(computed) and len(computed) == len(set(computed))
    assert any("[" in name for name in computed)  # tuple accesses of multi-output ops are actions too
    n_items = len(plan.schedule.items)
    assert sorted(e[1] for e in entries if e[0] == "issue") == list(range(n_items))
    assert sorted(e[1] for e in entries if e[0] == "wait") == list(range(n_items))
    assert len(recorded_actions(plan.program, plan.schedule)) == len(entries)


def _refused(plan: Plan, edit) -> str:
    data = json.loads(json.dumps(plan.to_dict()))
    edit(data["program"]["actions"])
    with pytest.raises(PlanError) as info:
        Plan.from_dict(data)
    assert "\n" not in str(info.value)
    return str(info.value)


def _first(entries, kind):
    return next(t for t, e in enumerate(entries) if e.split(" ")[0] == kind)


def test_an_op_computed_twice_is_refused(plan):
    assert "computed twice" in _refused(plan, lambda a: a.insert(1, a[_first(a, "compute")]))


def test_a_node_never_computed_is_refused(plan):
    assert "is never computed" in _refused(plan, lambda a: a.pop(_first(a, "compute")))


def test_a_wait_before_its_issue_is_refused(plan):
    def early(actions):
        wait = actions.pop(_first(actions, "wait"))
        actions.insert(0, wait)
    assert "waited before its issue" in _refused(plan, early)


def test_a_collective_outside_the_schedule_is_refused(plan):
    n_items = len(plan.schedule.items)
    assert f"collective {n_items} is not in the schedule" in _refused(
        plan, lambda a: a.__setitem__(_first(a, "issue"), f"issue {n_items}"))


def test_a_bucket_issued_without_its_pack_is_refused(plan):
    def drop(actions):
        actions.pop(_first(actions, "pack"))
    assert "without its pack right before" in _refused(plan, drop)


def test_an_unknown_action_and_another_version_are_refused(plan):
    assert "not an action" in _refused(plan, lambda a: a.append("jump 3"))
    assert "one space between words" in _refused(plan, lambda a: a.append("compute  mm"))
    assert "not an action" in _refused(plan, lambda a: a.append("issue \u00b2"))
    data = plan.to_dict()
    data["program"] = {**data["program"], "version": PROGRAM_VERSION + 1}
    with pytest.raises(PlanError, match=f"program.version: expected {PROGRAM_VERSION}"):
        Plan.from_dict(data)


def test_a_recompute_of_an_op_the_plan_does_not_recompute_is_refused(plan):
    kept = next(n.name for n in plan.nodes if n.name not in set(plan.recompute))
    assert "the plan's recompute does not list it" in _refused(
        plan, lambda a: a.insert(1, f"recompute {kept} layers.0 0"))
