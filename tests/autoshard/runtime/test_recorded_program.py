"""The runtime runs the step program the plan records, and refuses one it would not run.

A plan records its step program (``autoshard.plan.program_section``). The runtime
derives the program from the plan and its own fx graph and checks that it is the
recorded one, action for action, before running it: a hand-edited program (two
ops swapped, a value freed early) is refused in one line; a plan written before
the section (none recorded) still runs, its program derived.
"""

from __future__ import annotations

import dataclasses

import pytest
from threadcomm import run_threads

from autoshard.plan.format import Plan
from autoshard.plan.program_section import ProgramSection, recorded_actions
from autoshard.runtime.execute import JointRunner, RuntimeLoadError
from autoshard.search.solve import prepare, solve_prepared
from examples.models import mlp


@pytest.fixture(scope="module")
def solved():
    """An FSDP plan with gradient and gather buckets and full recomputation, on 2 ranks."""
    model, inputs = mlp.tiny(n_layers=3)
    prep = prepare(model, inputs, (2,), ("dp",), profile="cpu-gloo")
    return prep.traced, solve_prepared(prep, time_limit=10, baseline="fsdp", recompute="full")


def _programs(traced, plan):
    return run_threads((2,), lambda coord, comm: JointRunner(traced, plan, (2,), coord, comm=comm,
                                                             graph=False).program)


def test_each_rank_runs_the_recorded_program(solved):
    traced, plan = solved
    assert plan.program is not None
    kinds = {entry[0] for entry in plan.program.actions}
    assert {"compute", "recompute", "issue", "wait", "pack", "unpack", "free"} <= kinds
    recorded = recorded_actions(plan.program, plan.schedule)
    for program in _programs(traced, plan).values():
        assert program.actions == recorded


def test_the_recorded_program_survives_the_file(solved, tmp_path):
    _, plan = solved
    plan.save(tmp_path / "plan.json")
    again = Plan.load(tmp_path / "plan.json")
    assert again.program == plan.program


def _edited(plan: Plan, edit) -> Plan:
    actions = list(plan.program.actions)
    edit(actions)
    return dataclasses.replace(plan, program=ProgramSection(tuple(actions)))


def test_two_ops_swapped_by_hand_are_refused_in_one_line(solved):
    traced, plan = solved
    computes = [t for t, a in enumerate(plan.program.actions) if a[0] == "compute"]

    def swap(actions):
        a, b = computes[3], computes[4]
        actions[a], actions[b] = actions[b], actions[a]

    with pytest.raises(RuntimeLoadError, match=r"^plan: program: the recorded step program is not this plan's .*"
                                               r"action \d+: recorded 'compute .*', here 'compute .*'") as info:
        _programs(traced, _edited(plan, swap))
    assert "\n" not in str(info.value)


def test_a_value_freed_early_is_refused(solved):
    traced, plan = solved
    at = next(t for t, a in enumerate(plan.program.actions) if a[0] == "free" and t > 2)

    def early(actions):
        actions.insert(at - 1, actions.pop(at))

    with pytest.raises(RuntimeLoadError, match="recorded step program is not this plan's"):
        _programs(traced, _edited(plan, early))


def test_a_plan_without_the_section_still_runs_its_derived_program(solved):
    traced, plan = solved
    older = dataclasses.replace(plan, program=None)
    assert "program" not in older.to_dict()
    recorded = recorded_actions(plan.program, plan.schedule)
    for program in _programs(traced, older).values():
        assert program.actions == recorded
