"""The step program's builder on a hand-made 5-op step (``autoshard.program.actions``).

The step: ``mm = x @ w`` and ``relu`` in checkpoint region ``L``, ``sum`` the loss;
the backward ``relu_bw(tangent, relu)`` and ``mm_bw(relu_bw, x)`` (w's gradient).
The schedule gathers ``w`` before ``mm`` (issued and waited at position 0) and
reduces the gradient after the last op (position 5). Every expected action,
free and byte count below is worked out by hand from the module docstring.
"""

from __future__ import annotations

import pytest

from autoshard.program.actions import (Compute, Free, Issue, Lifetime, Pack, ProgramNode, Recompute, RecomputeError,
                                       Unpack, Wait, build_step_program)
from autoshard.program.live_bytes import HeldCopy, live_bytes_timeline
from autoshard.program.schedule import Schedule, ScheduleItem

NODES = (ProgramNode("mm", ("x", "w")), ProgramNode("relu", ("mm",)), ProgramNode("sum", ("relu",)),
         ProgramNode("relu_bw", ("tangent", "relu")), ProgramNode("mm_bw", ("relu_bw", "x")))
GATHER = ScheduleItem(0, 0, edge=("param:w", "mm", 1))
REDUCE = ScheduleItem(5, 5, edge=("mm_bw", "grad:w", 0))
SCHEDULE = Schedule(5, 1, (GATHER, REDUCE))
KEEP = {"sum", "mm_bw"}
READS = {GATHER.key: ("w",), REDUCE.key: ("mm_bw",)}
REGIONS = {"mm": "L", "relu": "L"}
BACKWARD = {"relu_bw", "mm_bw"}
LEAVES = ["x", "w", "tangent"]
BYTES = {"x": 100, "w": 10, "tangent": 1, "mm": 40, "relu": 40, "sum": 4, "relu_bw": 40, "mm_bw": 10}
STORAGES = {name: [(name, n)] for name, n in BYTES.items()}


def _program(**changes):
    options = {"keep": KEEP, "item_reads": READS, "regions": REGIONS, "backward": BACKWARD, **changes}
    return build_step_program(NODES, SCHEDULE, **options)


def test_without_recomputation_each_value_dies_after_its_last_read():
    p = _program()
    assert p.actions == (
        Issue(GATHER), Wait(GATHER), Compute("mm"), Free(("w",)),  # the gather read w at 0: mm reads it last
        Compute("relu"), Free(("mm",)), Compute("sum"), Compute("relu_bw"), Free(("tangent", "relu")),
        Compute("mm_bw"), Free(("x", "relu_bw")), Issue(REDUCE), Wait(REDUCE))
    assert [a.stream for a in p.actions[:3]] == ["comm", "comm", "compute"]
    assert p.positions == (0, 0, 0, 0, 1, 1, 2, 3, 3, 4, 4, 5, 5)  # where the pricing puts each action
    assert Lifetime("relu", 4, 8, False) in p.lifetimes
    assert Lifetime("sum", 6, len(p.actions), False) in p.lifetimes  # a result: held to the end


def test_a_recomputed_value_has_two_lives_and_its_input_lives_until_the_phase():
    p = _program(recompute=["relu"])
    (phase,) = p.phases
    assert (phase.region, phase.at, phase.position, phase.ops) == ("L", 3, 3, (1,))
    assert p.actions == (
        Issue(GATHER), Wait(GATHER), Compute("mm"), Free(("w",)), Compute("relu"), Compute("sum"),
        Free(("relu",)),  # the first pass: its last forward reader
        Recompute("relu", "L", 3), Free(("mm",)),  # mm: read again by the recomputation
        Compute("relu_bw"), Free(("tangent", "relu")), Compute("mm_bw"), Free(("x", "relu_bw")),
        Issue(REDUCE), Wait(REDUCE))
    assert p.positions[7] == 3  # the phase: at t_rc's position, before relu_bw
    lives = [life for life in p.lifetimes if life.value == "relu"]
    assert lives == [Lifetime("relu", 4, 6, False), Lifetime("relu", 7, 10, True)]


def test_a_bucket_packs_just_before_its_issue_and_unpacks_just_after_its_wait():
    """The same step with w gathered by a gather bucket and the gradient reduced by a gradient
    bucket: each bucket's Pack comes right before its Issue and its Unpack right after its Wait,
    at their positions, on the compute stream; the values' lives and bytes are those of the
    edges' program, each action index shifted by the bucket actions before it."""
    gather, reduce = ScheduleItem(0, 0, gather=0), ScheduleItem(5, 5, bucket=0)
    p = build_step_program(NODES, Schedule(5, 1, (gather, reduce)), keep=KEEP,
                           item_reads={gather.key: ("w",), reduce.key: ("mm_bw",)})
    assert p.actions == (
        Pack(gather), Issue(gather), Wait(gather), Unpack(gather), Compute("mm"), Free(("w",)),
        Compute("relu"), Free(("mm",)), Compute("sum"), Compute("relu_bw"), Free(("tangent", "relu")),
        Compute("mm_bw"), Free(("x", "relu_bw")), Pack(reduce), Issue(reduce), Wait(reduce), Unpack(reduce))
    assert [str(a) for a in p.actions[:4]] == ["pack gather:0", "issue gather:0", "wait gather:0", "unpack gather:0"]
    assert [a.stream for a in p.actions[:4]] == ["compute", "comm", "comm", "compute"]
    assert p.positions == (0, 0, 0, 0, 0, 0, 1, 1, 2, 3, 3, 4, 4, 5, 5, 5, 5)
    assert p.issued() == [gather, reduce]
    assert Lifetime("relu", 6, 10, False) in p.lifetimes  # 4 -> 8 in the edges' program, after 2 bucket actions
    copies = [HeldCopy("w@mm", 60, ("mm",), gather.key)]
    levels, peak = live_bytes_timeline(p, STORAGES, LEAVES, copies=copies)
    assert levels == [111, 111, 111, 171, 151, 151, 191, 151, 155, 195, 155, 165, 125, 125, 125, 125, 125]
    assert peak == 211  # as with the gather edge, but the copy exists from the unpack, through mm


def test_an_issue_keeps_what_it_reads_until_its_position():
    """A collective issued at position 4 (before mm_bw) reading relu keeps relu alive until mm_bw."""
    late = ScheduleItem(4, 5, edge=("relu", "grad:w", 0))
    p = build_step_program(NODES, Schedule(5, 1, (GATHER, late)), keep=KEEP,
                           item_reads={GATHER.key: ("w",), late.key: ("relu",)})
    assert p.actions[p.actions.index(Compute("mm_bw")) + 1] == Free(("relu", "x", "relu_bw"))  # read at (4, 1) sorts first
    assert Issue(late) in p.actions and p.actions.index(Issue(late)) < p.actions.index(Compute("mm_bw"))


def test_the_replayed_bytes_follow_the_actions():
    """Leaves 111 bytes all step; each op adds its output; a free drops it (worked out by hand)."""
    levels, peak = live_bytes_timeline(_program(), STORAGES, LEAVES)
    assert levels == [111, 111, 151, 151, 191, 151, 155, 195, 155, 165, 125, 125, 125]
    assert peak == 195
    levels, peak = live_bytes_timeline(_program(recompute=["relu"]), STORAGES, LEAVES)
    assert levels == [111, 111, 151, 151, 191, 195, 155, 195, 155, 195, 155, 165, 125, 125, 125]


def test_a_redistributed_copy_is_held_from_its_wait_to_its_last_reader():
    """w's gathered copy (60 bytes) from the gather's wait through mm (the peak: 111 + 60 + mm's 40),
    freed after mm; the reduced gradient (10 bytes) from its wait to the end (its reader is a sink)."""
    copies = [HeldCopy("w@mm", 60, ("mm",), GATHER.key), HeldCopy("w@grad", 10, ("grad:w",), REDUCE.key)]
    levels, peak = live_bytes_timeline(_program(), STORAGES, LEAVES, copies=copies)
    assert levels == [111, 171, 151, 151, 191, 151, 155, 195, 155, 165, 125, 125, 135]
    assert peak == 211
    made_at_reader = [HeldCopy("w@mm", 60, ("mm",))]  # not scheduled: made at mm, counted with it alone
    levels, peak = live_bytes_timeline(_program(), STORAGES, LEAVES, copies=made_at_reader)
    assert levels[:3] == [111, 111, 151] and peak == 211


def test_a_view_holds_its_base_storage_once():
    """relu as a view of mm (same storage): it adds no bytes, and mm's storage lives while relu does."""
    storages = {**STORAGES, "relu": [("mm", 40)]}
    levels, peak = live_bytes_timeline(_program(), storages, LEAVES)
    assert levels == [111, 111, 151, 151, 151, 151, 155, 195, 155, 165, 125, 125, 125]  # mm's 40 until relu's free
    assert peak == 195


@pytest.mark.parametrize("recompute, message", [
    (["relu_bw"], "relu_bw is a backward op"),
    (["nope"], "nope is not an op of the graph"),
    (["sum"], "sum has no checkpoint region"),
])
def test_a_recomputation_that_cannot_run_is_refused_by_name(recompute, message):
    with pytest.raises(RecomputeError, match=message):
        _program(recompute=recompute, regions={**REGIONS, "relu_bw": "L"})


def test_a_schedule_of_another_length_is_refused():
    with pytest.raises(ValueError, match="schedule.positions: 4"):
        build_step_program(NODES, Schedule(4, 1, ()))
