"""The step the runtime interprets is the step the planner priced (``autoshard.program.actions``).

On solved plans (FSDP with prefetched gathers and gradient buckets; tensor parallel with
recomputation) the runner's step program issues and waits every collective at the
positions the overlap simulation prices (``schedule_transfers``), in the same order;
every op runs once in the first pass, after the waits it reads; a wait comes after its
issue; and the interpreter's collective trace is the program's ``Issue`` order.
"""

from __future__ import annotations

import pytest
from threadcomm import run_threads

from autoshard.program.actions import Compute, Issue, Pack, Recompute, Unpack, Wait, simulate_program
from autoshard.program.schedule import build_schedule, schedule_transfers, simulate_schedule
from autoshard.runtime.execute import JointRunner, local_slice, placements_of
from autoshard.search.solve import prepare, solve_prepared
from examples.models import mlp

MESH = (2, 2)


@pytest.fixture(scope="module", params=[("fsdp", "none"), ("fsdp+tp", "full")], ids=lambda p: "-".join(p))
def solved(request):
    model, inputs = mlp.tiny(n_layers=3)
    prep = prepare(model, inputs, MESH, ("dp", "tp"), profile="cpu-gloo")
    baseline, recompute = request.param
    return model, inputs, prep.traced, solve_prepared(prep, baseline=baseline, recompute=recompute, time_limit=10)


def _runners(model, inputs, traced, plan, run=False):
    def rank(coord, comm):
        runner = JointRunner(traced, plan, MESH, coord, comm=comm, graph=False)
        if run:
            n = len(MESH)
            params = {k: local_slice(p.detach(), placements_of(plan.params[k], n), MESH, coord)
                      for k, p in model.named_parameters()}
            ins = [local_slice(x, placements_of(plan.inputs[k], n), MESH, coord) for k, x in zip(traced.inputs, inputs)]
            runner.run(params, {}, ins)
        return runner, list(comm.trace)

    return run_threads(MESH, rank)


def test_the_program_issues_and_waits_where_the_pricing_says(solved):
    model, inputs, traced, plan = solved
    schedule = plan.schedule or build_schedule([n.name for n in plan.nodes], plan.redistributions, plan.buckets,
                                               gathers=plan.gather_buckets)
    transfers, _ = schedule_transfers(schedule, plan.redistributions, plan.buckets, plan.gather_buckets)
    assert transfers, "a plan without collectives would make this test vacuous"
    for runner, _ in _runners(model, inputs, traced, plan).values():
        program = runner.program
        issued = [(a.item, program.positions[t]) for t, a in enumerate(program.actions) if isinstance(a, Issue)]
        assert [(x.issue, x.wait) for x, _ in issued] == [(t.issue, t.wait) for t in transfers]
        assert all(at == x.issue for x, at in issued)
        when = {a.item.key: t for t, a in enumerate(program.actions) if isinstance(a, Issue)}
        for t, a in enumerate(program.actions):
            if isinstance(a, Wait):
                assert program.positions[t] == a.item.wait and when[a.item.key] < t
        computed = [a.node for a in program.actions if isinstance(a, Compute)]
        assert sorted(computed) == sorted(n.name for n in program.nodes)
        first = {name: t for t, a in enumerate(program.actions) if isinstance(a, Compute) for name in [a.node]}
        for t, a in enumerate(program.actions):
            if isinstance(a, Wait) and a.item.edge is not None and a.item.edge[1] in first:
                assert t < first[a.item.edge[1]], f"{a.item.edge} is read before it is waited"
        assert bool(plan.recompute) == any(isinstance(a, Recompute) for a in program.actions)


def test_pricing_the_runtimes_program_is_pricing_the_plans_schedule_to_the_bit(solved):
    model, inputs, traced, plan = solved
    schedule = plan.schedule or build_schedule([n.name for n in plan.nodes], plan.redistributions, plan.buckets,
                                               gathers=plan.gather_buckets)
    compute = [1e-4 * (1 + i % 7) for i in range(len(plan.nodes))]
    options = {"tail_s": 3e-4, "contention": 0.3, "gathers": plan.gather_buckets}
    want = simulate_schedule(schedule, compute, plan.redistributions, plan.buckets, **options)
    for runner, _ in _runners(model, inputs, traced, plan).values():
        got = simulate_program(runner.program, compute, plan.redistributions, plan.buckets, **options)
        assert got == want and got.exposed_comm_s > 0


def _label(plan, item):
    """The edge name the runner gives an item's collectives (``OpCaller.set_comm``)."""
    if item.edge is not None:
        return tuple(item.edge)
    if item.bucket is not None:
        return ("bucket", ",".join(plan.buckets[item.bucket].members), 0)
    return ("gather", ",".join(f"{m[0]}>{m[1]}>{m[2]}" for m in plan.gather_buckets[item.gather].members), 0)


def test_the_interpreter_issues_the_collectives_in_the_programs_order(solved):
    """Each item's last collective is recorded with its label and (issue, wait) positions; taken
    in the trace's order (repeats of one item's earlier steps collapsed), they are the program's
    ``Issue`` order."""
    model, inputs, traced, plan = solved
    for runner, trace in _runners(model, inputs, traced, plan, run=True).values():
        order = [(_label(plan, a.item), (a.item.issue, a.item.wait)) for a in runner.program.actions
                 if isinstance(a, Issue)]
        wanted = set(order)
        seen = []
        for edge, *_, issue, wait in trace:
            key = (tuple(edge) if edge is not None else None, (issue, wait))
            if key in wanted and (not seen or seen[-1] != key):
                seen.append(key)
        assert seen == order


def test_the_interpreter_packs_a_bucket_at_its_pack_and_unpacks_it_at_its_unpack(solved, monkeypatch):
    """A bucket's flat buffer is made by its ``Pack``, right before its one collective is recorded
    (nothing issued between), and split into its members by its ``Unpack``, after that collective."""
    model, inputs, traced, plan = solved
    calls: list[tuple] = []  # (coord, "pack" | "unpack", item key, collectives recorded so far)
    pack, unpack = JointRunner._pack, JointRunner._unpack

    def packing(self, what, env):
        calls.append((self.coord, "pack", what.item.key, len(self.comm.trace)))
        return pack(self, what, env)

    def unpacking(self, what, packed, done, ready):
        calls.append((self.coord, "unpack", what.item.key, len(self.comm.trace)))
        return unpack(self, what, packed, done, ready)

    monkeypatch.setattr(JointRunner, "_pack", packing)
    monkeypatch.setattr(JointRunner, "_unpack", unpacking)
    for coord, (runner, trace) in _runners(model, inputs, traced, plan, run=True).items():
        buckets = [a.item for a in runner.program.actions if isinstance(a, Pack)]
        assert buckets, "a plan without buckets would make this test vacuous"
        assert [a.item for a in runner.program.actions if isinstance(a, Unpack)] == sorted(
            buckets, key=lambda x: (x.wait, buckets.index(x)))
        mine = [c[1:] for c in calls if c[0] == coord]
        assert sorted(k for kind, k, _ in mine if kind == "pack") == sorted(x.key for x in buckets)
        for item in buckets:
            (packed_at,) = [n for kind, k, n in mine if kind == "pack" and k == item.key]
            (unpacked_at,) = [n for kind, k, n in mine if kind == "unpack" and k == item.key]
            edge, *_, issue, wait = trace[packed_at]  # the next collective recorded is the bucket's
            assert (tuple(edge), (issue, wait)) == (_label(plan, item), (item.issue, item.wait))
            assert unpacked_at > packed_at
