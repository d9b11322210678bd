"""The per-rank schedule: its rules on a hand-made plan, its checks (each names the
item), its JSON round trip, its simulation, and a solved plan's schedule.

The hand-made plan: ops ``t, mm, relu, t_1, mm_1, loss_op, mm_2, mm_3`` (positions
0..7, end = 8). Leaf gathers: ``param:w1 -> t`` and ``param:w2 -> t_1`` (all_gather),
an activation all_reduce ``mm_1 -> loss_op``, two gradient reductions in one bucket
(``grad:w1`` made by ``mm_3``, ``grad:w2`` by ``mm_2``) and a local-only slice.
"""

from __future__ import annotations

import doctest
from dataclasses import dataclass, replace

import pytest

from costmodel.buckets.grouping import Bucket
from costmodel.placements import parse_placements as pp
from costmodel.redistribute_steps import RedistributeStep

import autoshard.program.schedule as schedule_module
from autoshard.program.schedule import (Schedule, ScheduleError, ScheduleItem, build_schedule, check_schedule,
                                     prefetch_intervals, simulate_schedule)

NODES = ["t", "mm", "relu", "t_1", "mm_1", "loss_op", "mm_2", "mm_3"]
GATHER = RedistributeStep("all_gather", (0,), 4096, 2.0, pp("S(0)"), pp("R"), tensor_dim=0)
REDUCE = RedistributeStep("all_reduce", (0,), 1024, 1.0, pp("P(sum)"), pp("R"), reduce_op="sum")
SLICE = RedistributeStep("local_slice", (0,), 512, 0.5, pp("R"), pp("S(0)"), tensor_dim=0)


@dataclass(frozen=True)
class Redist:
    tensor: str
    to: str
    input_index: int
    steps: tuple


REDISTRIBUTIONS = (
    Redist("param:w1", "t", 0, (GATHER,)),
    Redist("param:w2", "t_1", 0, (GATHER,)),
    Redist("mm_1", "loss_op", 1, (REDUCE,)),
    Redist("relu", "t_1", 1, (SLICE,)),
    Redist("mm_3", "grad:w1", 0, (REDUCE,)),
    Redist("mm_2", "grad:w2", 0, (REDUCE,)),
)
BUCKETS = (Bucket("all_reduce", (0,), "sum", "torch.float32", ("grad:w2", "grad:w1"), 2048, 1.5),)


def _items(schedule: Schedule) -> list[tuple]:
    return [(i.key[1] if i.bucket is not None else i.edge[1], i.issue, i.wait) for i in schedule.items]


def test_rules_issue_when_the_input_exists_and_wait_at_the_reader():
    s = build_schedule(NODES, REDISTRIBUTIONS, BUCKETS, prefetch=1)
    # w1's gather at 0 (first leaf item), w2's where w1's is waited (0), the activation
    # all_reduce after mm_1 (5) waited at loss_op (5), the bucket after its last member (mm_3: 8)
    assert _items(s) == [("t", 0, 0), ("t_1", 0, 3), ("loss_op", 5, 5), (0, 8, 8)]
    assert s.positions == 8 and s.prefetch == 1
    check_schedule(s, NODES, REDISTRIBUTIONS, BUCKETS)


def test_prefetch_zero_issues_every_gather_at_its_reader_and_two_runs_further_ahead():
    assert _items(build_schedule(NODES, REDISTRIBUTIONS, BUCKETS, prefetch=0))[:2] == [("t", 0, 0), ("t_1", 3, 3)]
    assert _items(build_schedule(NODES, REDISTRIBUTIONS, BUCKETS, prefetch=2))[:2] == [("t", 0, 0), ("t_1", 0, 3)]


def test_prefetched_gathers_hold_their_output_from_issue_to_reader():
    s = build_schedule(NODES, REDISTRIBUTIONS, BUCKETS, prefetch=1)
    assert prefetch_intervals(s, REDISTRIBUTIONS) == [(0, 3, 4096)]
    assert prefetch_intervals(build_schedule(NODES, REDISTRIBUTIONS, BUCKETS, prefetch=0), REDISTRIBUTIONS) == []


def test_the_simulation_of_the_hand_plan():
    # ops 1 s each, tail 1 s. At 0: gather w1 (2 s) waited at once -> t=2; gather w2 queued 2..4.
    # ops t, mm, relu run 2..5 (w2 done at 4: hidden); op t_1 5..6.5 (+0.5 s slice at its reader),
    # mm_1 6.5..7.5; the all_reduce (1 s) is issued and waited before loss_op: 7.5..8.5;
    # loss_op, mm_2, mm_3 8.5..11.5; the bucket (1.5 s) 11.5..13; the tail 13..14.
    s = build_schedule(NODES, REDISTRIBUTIONS, BUCKETS, prefetch=1)
    sim = simulate_schedule(s, [1.0] * 8, REDISTRIBUTIONS, BUCKETS, tail_s=1.0)
    assert sim.step_s == pytest.approx(14.0)
    assert sim.comm_s == pytest.approx(2.0 + 2.0 + 1.0 + 1.5)
    assert sim.exposed_comm_s == pytest.approx(14.0 - 9.5)


def test_json_round_trip():
    s = build_schedule(NODES, REDISTRIBUTIONS, BUCKETS)
    assert Schedule.from_dict(s.to_dict()) == s


def _broken(**change) -> Schedule:
    s = build_schedule(NODES, REDISTRIBUTIONS, BUCKETS, prefetch=1)
    items = list(s.items)
    k = change.pop("index", 1)
    items[k] = replace(items[k], **change)
    return replace(s, items=tuple(items))


def _swapped(a: int, b: int) -> Schedule:
    s = build_schedule(NODES, REDISTRIBUTIONS, BUCKETS, prefetch=1)
    items = list(s.items)
    items[a], items[b] = items[b], items[a]
    return replace(s, items=tuple(items))


@pytest.mark.parametrize("schedule, message", [
    (replace(build_schedule(NODES, REDISTRIBUTIONS, BUCKETS), positions=7), "schedule.positions: 7, the plan has 8"),
    (_broken(issue=4), r"collectives\[1\]: positions issue 4, wait 3"),
    (_broken(index=2, issue=6, wait=6), r"collectives\[2\].*waited at 6, after its reader \(position 5\)"),
    (_broken(index=2, issue=4), r"collectives\[2\].*issued at 4, before its input exists \(position 5\)"),
    (_broken(index=3, issue=7, wait=8), r"collectives\[3\]: bucket 0 is issued at 7, before its input exists"),
    (_broken(edge=("param:w1", "t", 0)), r"collectives\[1\]: edge param:w1 -> t \(input 0\) is scheduled twice"),
    (_broken(edge=("relu", "t_1", 1)), r"collectives\[1\]: edge relu -> t_1 \(input 1\) is not a redistribution"),
    (_broken(index=3, bucket=1), r"collectives\[3\]: no bucket 1"),
    (_swapped(1, 2), r"collectives\[2\]: issued at 0, before the item above it \(5\)"),
    (replace(build_schedule(NODES, REDISTRIBUTIONS, BUCKETS), items=build_schedule(
        NODES, REDISTRIBUTIONS, BUCKETS).items[:3]), "bucket 0 issues collectives but is not scheduled"),
])
def test_a_schedule_that_does_not_fit_the_plan_is_refused_naming_the_item(schedule, message):
    with pytest.raises(ScheduleError, match=message):
        check_schedule(schedule, NODES, REDISTRIBUTIONS, BUCKETS)


@pytest.mark.parametrize("data, message", [
    ({"positions": 8, "prefetch": 1, "collectives": [{"issue": 0, "wait": 1}]}, "exactly one of edge, bucket or gather"),
    ({"positions": 8, "prefetch": 1, "collectives": [{"edge": ["a", "b"], "issue": 0, "wait": 1}]},
     r"collectives\[0\].edge: expected \[producer, reader, reader input\]"),
    ({"positions": 8, "prefetch": 1, "collectives": [{"bucket": 0, "issue": "0", "wait": 1}]},
     r"collectives\[0\].issue: expected an integer"),
    ({"positions": 8, "prefetch": -1, "collectives": []}, "schedule.prefetch: expected a non-negative integer"),
    ({"positions": 8, "prefetch": 1, "collectives": [], "order": []}, "schedule.order: unknown key"),
])
def test_a_malformed_schedule_is_refused_naming_the_field(data, message):
    with pytest.raises(ScheduleError, match=message):
        Schedule.from_dict(data)


def test_an_item_names_what_it_schedules():
    assert ScheduleItem(0, 1, edge=("a", "b", 0)).key == ("edge", "a", "b", 0)
    assert ScheduleItem(0, 1, bucket=2).key == ("bucket", 2)


def test_docstring_example():
    assert doctest.testmod(schedule_module).failed == 0


def test_a_solved_plan_carries_a_checked_schedule_and_a_broken_one_is_refused(dp_mlp):
    from autoshard.plan.format import Plan, PlanError
    from autoshard.search.solve import solve_prepared

    plan = solve_prepared(dp_mlp, baseline="fsdp", time_limit=10)
    assert plan.schedule is not None and plan.schedule.items
    data = plan.to_dict()
    assert Plan.from_dict(data).schedule == plan.schedule
    data["schedule"]["collectives"] = data["schedule"]["collectives"][1:]
    with pytest.raises(PlanError, match="is not scheduled"):
        Plan.from_dict(data)
    del data["schedule"]
    with pytest.raises(PlanError, match="program: recorded without the schedule"):  # it names schedule items
        Plan.from_dict(data)
    del data["program"]
    assert Plan.from_dict(data).schedule is None  # a plan from before schedules (and programs) still loads


GATHERS = (__import__("costmodel.buckets.grouping", fromlist=["GatherBucket"]).GatherBucket(
    (0,), "torch.float32", (("param:w1", "t", 0), ("param:w2", "t_1", 0)), 8192, 3.0),)


def test_a_gather_bucket_is_one_chain_item_waited_at_its_first_reader():
    s = build_schedule(NODES, REDISTRIBUTIONS, BUCKETS, prefetch=1, gathers=GATHERS)
    # both leaf gathers leave the list; the bucket is issued at 0 and waited before t (0)
    assert [(i.key, i.issue, i.wait) for i in s.items] == [
        (("gather", 0), 0, 0), (("edge", "mm_1", "loss_op", 1), 5, 5), (("bucket", 0), 8, 8)]
    check_schedule(s, NODES, REDISTRIBUTIONS, BUCKETS, gathers=GATHERS)
    # w2's gathered copy is held from the bucket's issue (0) to its reader t_1 (3)
    assert prefetch_intervals(s, REDISTRIBUTIONS, GATHERS, NODES) == [(0, 3, 4096)]
    sim = simulate_schedule(s, [1.0] * 8, REDISTRIBUTIONS, BUCKETS, tail_s=1.0, gathers=GATHERS)
    assert sim.comm_s == pytest.approx(3.0 + 1.0 + 1.5)
    with pytest.raises(ScheduleError, match="gather bucket 0 issues collectives but is not scheduled"):
        check_schedule(replace(s, items=s.items[1:]), NODES, REDISTRIBUTIONS, BUCKETS, gathers=GATHERS)
    with pytest.raises(ScheduleError, match=r"edge param:w1 -> t \(input 0\) is not a redistribution"):
        check_schedule(replace(s, items=(ScheduleItem(0, 0, edge=("param:w1", "t", 0)),) + s.items), NODES,
                       REDISTRIBUTIONS, BUCKETS, gathers=GATHERS)


def test_a_plan_whose_gather_bucket_lists_a_wrong_member_is_refused(dp_mlp):
    from autoshard.plan.format import Plan, PlanError
    from autoshard.search.solve import solve_prepared

    data = solve_prepared(dp_mlp, baseline="fsdp", time_limit=10).to_dict()
    r = next(r for r in data["redistributions"] if r["steps"] and r["steps"][0]["collective"] != "all_gather")
    data["gather_buckets"] = [{"collective": "all_gather", "mesh_dims": [0], "dtype": "torch.float32",
                               "members": [[r["tensor"], r["to"], r.get("input", 0)]], "bytes": 4, "cost_s": 0.0}]
    data.pop("schedule")
    with pytest.raises(PlanError, match=r"gather_buckets\[0\]: .* is not a redistribution of one all_gather"):
        Plan.from_dict(data)


# leaf views: mm_1 reads t_1's output, where t_1 only transposes param:w2 (a linear layer's weight)
VIEW_REDISTRIBUTIONS = (
    Redist("param:w1", "t", 0, (GATHER,)),
    Redist("t_1", "mm_1", 1, (GATHER,)),  # the gather of w2's transposed view
    Redist("mm_1", "loss_op", 1, (REDUCE,)),
    Redist("mm_3", "grad:w1", 0, (REDUCE,)),
    Redist("mm_2", "grad:w2", 0, (REDUCE,)),
)


def test_a_gather_of_a_leaf_view_is_a_leaf_gather_in_the_prefetch_chain():
    plain = build_schedule(NODES, VIEW_REDISTRIBUTIONS, BUCKETS, prefetch=1)
    # without leaf views: the gather can only start after t_1 has run (position 4), at its reader
    assert ("mm_1", 4, 4) in _items(plain) and plain.leaf_views == ()
    s = build_schedule(NODES, VIEW_REDISTRIBUTIONS, BUCKETS, prefetch=1, leaf_views=("t_1",))
    # with t_1 a leaf view: second in the chain, issued where the first is waited (0), held until mm_1 (4)
    assert _items(s)[:2] == [("t", 0, 0), ("mm_1", 0, 4)]
    assert s.leaf_views == ("t_1",)
    check_schedule(s, NODES, VIEW_REDISTRIBUTIONS, BUCKETS)
    assert prefetch_intervals(s, VIEW_REDISTRIBUTIONS) == [(0, 4, 4096)]
    # the same schedule read without its leaf views issues t_1's gather before t_1 runs
    with pytest.raises(ScheduleError, match=r"edge t_1 -> mm_1 \(input 1\) is issued at 0, before its input exists"):
        check_schedule(replace(s, leaf_views=()), NODES, VIEW_REDISTRIBUTIONS, BUCKETS)
    with pytest.raises(ScheduleError, match="leaf_views: 'nope' is not an op node"):
        check_schedule(replace(s, leaf_views=("nope",)), NODES, VIEW_REDISTRIBUTIONS, BUCKETS)
    assert Schedule.from_dict(s.to_dict()) == s
    assert "leaf_views" not in plain.to_dict()  # plans without leaf views are written as before


def test_leaf_views_are_views_of_leaves_read_without_redistribution():
    candidates = [("t", "param:w1"), ("t_1", "param:w2"), ("t_2", "t_1"), ("t_3", "mm"), ("t_4", "t_3"),
                  ("t_5", "param:w3"), ("t_6", "t_5")]
    redistributions = VIEW_REDISTRIBUTIONS + (Redist("t_6", "mm_2", 0, (GATHER,)), Redist("t_4", "mm_3", 0, (GATHER,)))
    # t reads param:w1 through a redistribution (its gather): not a view of the leaf as it is; t_2 views
    # the leaf view t_1 but no collective reads it; t_4 views an op's output; t_6 is gathered, so t_5
    # (the view it is made from) is made first too
    assert schedule_module.leaf_views(candidates, redistributions) == ("t_1", "t_5", "t_6")


def test_a_solved_fsdp_plan_gathers_linear_weights_as_leaf_views(dp_mlp):
    from autoshard.search.solve import solve_prepared

    plan = solve_prepared(dp_mlp, baseline="fsdp", time_limit=10)
    ops = {n.name: n.op for n in plan.nodes}
    assert plan.schedule.leaf_views and all(ops[v] == "aten.t.default" for v in plan.schedule.leaf_views)
    views = set(plan.schedule.leaf_views)
    view_gathers = [r for r in plan.redistributions if r.tensor in views
                    and any(s.collective == "all_gather" for s in r.steps)]
    assert view_gathers  # the weights' gathers read the transposed views
    # each is a chain item issued ahead of its reader or a member of a gather bucket
    members = {tuple(m) for g in plan.gather_buckets for m in g.members}
    pos = {n.name: i for i, n in enumerate(plan.nodes)}
    items = {i.edge: i for i in plan.schedule.items if i.edge is not None}
    for r in view_gathers:
        edge = (r.tensor, r.to, r.input_index)
        assert edge in members or items[edge].issue <= pos[r.tensor]


def test_block_wise_gather_buckets_break_where_the_module_block_changes():
    from costmodel.buckets.grouping import group_gathers
    from costmodel.mesh import MeshSpec
    from hw_profiles import load

    from autoshard.program.schedule import gather_blocks

    # in reader order: block 0's two weights (one through its view t), block 1's two, then the root's output
    edges = [("param:layers.0.a.weight", "mm", 0), ("t", "mm_1", 0), ("param:layers.1.a.weight", "mm_2", 0),
             ("param:layers.1.b.weight", "mm_3", 0), ("param:output.weight", "mm_4", 0)]
    blocks = gather_blocks(edges, [("t", "param:layers.0.b.weight")], ["layers.0", "layers.1"])
    assert gather_blocks(edges, [("t", "param:layers.0.b.weight")]) == blocks  # the same from the names alone
    items = [(e, "torch.float32", (GATHER,)) for e in edges]
    by_block = group_gathers(items, MeshSpec((2,)), load("cpu-gloo"), 2**62, blocks)
    assert [b.members for b in by_block] == [tuple(edges[:2]), tuple(edges[2:4])]  # the root's one alone: no bucket
    # by size alone, a cap of three gathers runs across the block boundary
    by_size = group_gathers(items, MeshSpec((2,)), load("cpu-gloo"), 3 * GATHER.bytes)
    assert [b.members for b in by_size] == [tuple(edges[:3]), tuple(edges[3:])]


def test_a_plan_priced_with_fsdp2_gathers_runs_them_a_block_at_a_time():
    from autoshard.search.solve import prepare, solve_prepared
    from examples.models import mlp

    model, inputs = mlp.small(device="meta", dim=256, hidden_dim=1024, n_layers=4, batch_size=64)
    prep = prepare(model, inputs, (4,), ("dp",), profile="cpu-gloo", gather="fsdp2", bucket_bytes=0)
    plan = solve_prepared(prep, baseline="fsdp", time_limit=10)
    assert plan.schedule.prefetch == 1  # FSDP2's: the next block's gather is issued as this one's is waited
    block_bytes = 2 * 256 * 1024 * 4 + (1024 + 256) * 4  # one block's w1, w2 and their biases, gathered
    # one bucket per block and pass (forward, backward): none holds more than one block
    assert len(plan.gather_buckets) >= 4 and max(g.bytes for g in plan.gather_buckets) <= block_bytes


def test_a_blocks_leaf_read_again_starts_the_blocks_next_pass():
    # the last block's forward and its backward are adjacent readers: one bucket would gather its weights twice
    from autoshard.program.schedule import gather_blocks

    edges = [("param:layers.1.w1", "mm", 0), ("t", "mm_1", 0), ("t_9", "mm_8", 1), ("param:layers.1.w1", "mm_9", 0)]
    views = [("t", "param:layers.1.w2"), ("t_9", "param:layers.1.w2")]
    assert list(gather_blocks(edges, views).values()) == ["layers.1", "layers.1", "layers.1#1", "layers.1#1"]
