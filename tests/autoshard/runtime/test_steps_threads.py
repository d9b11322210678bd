"""The runtime's steps and joint-graph execution on simulated ranks (threads, no
process group): every rank's result must equal ``costmodel.simulate`` (steps)
and the single-device run (graph); the plan checks at load name what is wrong.
The same code runs on real gloo processes in ``test_gloo.py``."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch
from threadcomm import run_threads

from costmodel import simulate
from costmodel.placements import format_placements, parse_placements
from costmodel.redistribute import PlannerError, plan_redistribute
from costmodel.redistribute_steps import COLLECTIVE_STEPS, RedistributeStep
from hw_profiles import load as load_profile

from autoshard.plan.format import PlanError
from autoshard.search.solve import prepare, solve_prepared
from autoshard.runtime.execute import JointRunner, RuntimeLoadError, local_slice, placements_of
from autoshard.runtime.steps import run_bucket, run_step
from autoshard.trace import run_joint
from examples.models import mlp

PROFILE = load_profile("h100-sxm-80gb")


def _placement_options(ndim: int) -> list[str]:
    out = ["R", "P(sum)", "P(max)", "P(avg)"]
    out += [f"S({d})" for d in range(ndim)]
    out += [f"_S({d},sf=2)" for d in range(ndim)]
    return out


def _cases(mesh: tuple[int, ...], shapes: list[tuple[int, ...]], count: int, seed: int) -> list[tuple]:
    """Random (shape, src, dst, steps) with a plan the planner finds, at least
    one collective per case where possible."""
    rng = random.Random(seed)
    found, tries = [], 0
    while len(found) < count and tries < 4000:
        tries += 1
        shape = rng.choice(shapes)
        opts = _placement_options(len(shape))
        src = "".join(rng.choice(opts) for _ in mesh)
        dst = "".join(rng.choice(opts) for _ in mesh)
        if src == dst:
            continue
        try:
            simulate.shard(torch.zeros(shape), src, mesh)  # placement valid for the shape
            plan = plan_redistribute(src, dst, mesh, shape, 4, PROFILE)
        except (PlannerError, ValueError):
            continue
        found.append((shape, src, dst, plan.steps))
    return found


@pytest.mark.parametrize("mesh", [(4,), (3,), (2, 2), (2, 3)])
def test_every_planned_step_matches_the_simulator(mesh):
    shapes = [(8, 6), (5, 7), (4, 3, 6), (7, 2, 5)]
    cases = _cases(mesh, shapes, 60, seed=sum(mesh) * 7 + len(mesh))
    kinds = {s.collective for *_, steps in cases for s in steps}
    assert {"all_gather", "all_reduce", "local_slice", "local_copy"} <= kinds  # the sample is not trivial
    gen = torch.Generator().manual_seed(0)
    inputs = [simulate.shard(torch.randn(shape, generator=gen), src, mesh) for shape, src, _, _ in cases]
    expected = [simulate.apply_steps(x, steps, mesh) for x, (*_, steps) in zip(inputs, cases)]

    def rank(coord, comm):
        outs = []
        for x, (shape, _, _, steps) in zip(inputs, cases):
            value = x[coord]
            for step in steps:
                value = run_step(value, step, shape, mesh, coord, comm)
            outs.append(value)
        return outs

    results = run_threads(mesh, rank)
    for i, (shape, src, dst, steps) in enumerate(cases):
        for coord in results:
            got, want = results[coord][i], expected[i][coord]
            assert tuple(got.shape) == tuple(want.shape), (shape, src, dst, coord, [s.describe() for s in steps])
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5,
                                       msg=lambda m: f"{shape} {src}->{dst} at {coord}: {m}")


def test_uneven_fused_gather_and_scatter_and_all_to_all():
    """Hand-made steps the planner rarely picks: uneven sizes on a flattened group."""
    mesh = (2, 2)
    S = parse_placements
    steps = [
        ((5, 3), "S(0)S(0)", RedistributeStep("all_gather", (0, 1), 0, 0.0, S("S(0)S(0)"), S("RR"), tensor_dim=0)),
        ((3, 7), "RS(1)", RedistributeStep("all_gather", (1,), 0, 0.0, S("RS(1)"), S("RR"), tensor_dim=1)),
        ((6, 5), "P(sum)P(sum)", RedistributeStep("reduce_scatter", (0, 1), 0, 0.0, S("P(sum)P(sum)"), S("S(1)S(1)"),
                                                   tensor_dim=1, reduce_op="sum")),
        ((5, 6), "S(0)R", RedistributeStep("all_to_all", (0,), 0, 0.0, S("S(0)R"), S("S(1)R"), tensor_dim=0,
                                           split_tensor_dim=1)),
        ((5, 3), "S(0)R", RedistributeStep("local_zero_pad", (0,), 0, 0.0, S("S(0)R"), S("P(sum)R"), tensor_dim=0)),
        ((6, 2), "S(0)R", RedistributeStep("permute", (0, 1), 0, 0.0, S("S(0)R"), S("RS(0)"))),
    ]
    gen = torch.Generator().manual_seed(1)
    inputs = [simulate.shard(torch.randn(shape, generator=gen), src, mesh) for shape, src, _ in steps]
    expected = [simulate.apply_step(x, step, mesh) for x, (_, _, step) in zip(inputs, steps)]
    results = run_threads(mesh, lambda coord, comm: [run_step(x[coord], step, shape, mesh, coord, comm)
                                                     for x, (shape, _, step) in zip(inputs, steps)])
    for i, (_, _, step) in enumerate(steps):
        for coord in results:
            torch.testing.assert_close(results[coord][i], expected[i][coord], msg=lambda m: f"{step.describe()}: {m}")



@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter"])
def test_a_bucket_gives_each_member_what_its_own_step_gives_in_one_collective(kind):
    """Uneven shapes on several dims, one flattened group: the flat-buffer layout
    of ``run_bucket`` must hand every member exactly its own step's result."""
    mesh = (2, 2)
    S = parse_placements
    shapes = [(6, 5), (3, 4, 2), (7,), (2, 9)]
    if kind == "all_reduce":
        steps = [RedistributeStep("all_reduce", (0, 1), 0, 0.0, S("P(sum)P(sum)"), S("RR"), reduce_op="sum")
                 for _ in shapes]
    else:
        steps = [RedistributeStep("reduce_scatter", (0, 1), 0, 0.0, S("P(sum)P(sum)"), S(f"S({d})S({d})"),
                                  tensor_dim=d, reduce_op="sum") for d in (1, 0, 0, 1)]
    gen = torch.Generator().manual_seed(3)
    inputs = [simulate.shard(torch.randn(shape, generator=gen), "P(sum)P(sum)", mesh) for shape in shapes]
    expected = [simulate.apply_step(x, step, mesh) for x, step in zip(inputs, steps)]

    def rank(coord, comm):
        return run_bucket([x[coord] for x in inputs], steps, mesh, coord, comm), list(comm.records)

    for coord, (outs, records) in run_threads(mesh, rank).items():
        assert [(k, d) for k, d, _ in records] == [(kind, (0, 1))]  # one collective for all four
        for i, want in enumerate(expected):
            torch.testing.assert_close(outs[i], want[coord], msg=lambda m: f"member {i} at {coord}: {m}")


# --------------------------------------------------------------------------- the joint graph


@pytest.fixture(scope="module")
def mlp_2x2():
    model, inputs = mlp.tiny()
    prep = prepare(model, inputs, (2, 2), ("dp", "tp"), profile="a100-sxm-80gb", device_type="cpu")  # fused reduce_scatters at these sizes
    return model, inputs, prep


def _run_plan(model, inputs, traced, plan, mesh):
    ref = run_joint(traced, dict(model.named_parameters()), inputs)

    def rank(coord, comm):
        runner = JointRunner(traced, plan, mesh, coord, comm=comm)
        params = {k: local_slice(p.detach(), placements_of(plan.params[k], len(mesh)), mesh, coord)
                  for k, p in model.named_parameters()}
        ins = [local_slice(x, placements_of(plan.inputs[n], len(mesh)), mesh, coord) for n, x in zip(traced.inputs, inputs)]
        return runner.run(params, {}, ins), comm.records

    return ref, run_threads(mesh, rank)


@pytest.mark.parametrize("baseline", ["ddp", "fsdp", "fsdp+tp"])
def test_joint_graph_on_simulated_ranks_matches_one_device(mlp_2x2, baseline):
    """Also the gradient buckets: DDP's all-reduces and FSDP's reduce-scatters run
    as one collective per bucket on a flat buffer, and the values still match."""
    model, inputs, prep = mlp_2x2
    plan = solve_prepared(prep, baseline=baseline, time_limit=10)
    if baseline == "fsdp":  # (all_reduce buckets: test_a_bucket_gives_each_member... and plan/test_solve.py)
        assert {b.collective for b in plan.buckets} == {"reduce_scatter"}
    mesh = (2, 2)
    ref, results = _run_plan(model, inputs, prep.traced, plan, mesh)
    bucketed = {m for b in plan.buckets for m in b.members}
    gathered = {m for g in plan.gather_buckets for m in g.members}
    planned = [(s.collective, s.mesh_dims) for r in plan.redistributions for s in r.steps
               if s.collective in COLLECTIVE_STEPS and r.to not in bucketed
               and (r.tensor, r.to, r.input_index) not in gathered]
    planned += [(b.collective, b.mesh_dims) for b in plan.buckets]
    planned += [("all_gather", g.mesh_dims) for g in plan.gather_buckets]
    assert planned, "the baseline should need collectives"
    for coord, (res, records) in results.items():
        torch.testing.assert_close(res.loss, ref.loss, rtol=1e-5, atol=1e-6)
        for fqn, g in res.grads.items():
            want = local_slice(ref.grads[fqn], placements_of(plan.params[fqn], 2), mesh, coord)
            torch.testing.assert_close(g, want, rtol=1e-4, atol=1e-6, msg=lambda m: f"{fqn} at {coord}: {m}")
        assert sorted((k, d) for k, d, _ in records) == sorted(planned)


def test_a_wrong_step_gives_a_wrong_gradient(mlp_2x2):
    """The comparison above can fail: a gradient sliced at the wrong positions is caught.
    (Priced on cpu-gloo without buckets, where FSDP's plan all-reduces a gradient, then slices it.)"""
    model, inputs, _ = mlp_2x2
    prep = prepare(model, inputs, (2, 2), ("dp", "tp"), profile="cpu-gloo", bucket_bytes=0)
    plan = solve_prepared(prep, baseline="fsdp", time_limit=10)
    assert not plan.buckets
    redistributions = list(plan.redistributions)
    for i, r in enumerate(redistributions):
        if r.to.startswith("grad:") and any(s.collective == "local_slice" for s in r.steps):
            # strided positions instead of contiguous chunks: same local shape, other values
            bad = tuple(replace(s, split_factor=2) if s.collective == "local_slice" else s for s in r.steps)
            redistributions[i] = replace(r, steps=bad)
            target = r.to[len("grad:"):]
            break
    else:  # the FSDP layout slices a replicated gradient somewhere; without one this test checks nothing
        pytest.fail("no sliced gradient in the FSDP plan: the test's premise no longer holds")
    broken = replace(plan, redistributions=tuple(redistributions))
    ref, results = _run_plan(model, inputs, prep.traced, broken, (2, 2))
    diffs = [float((res.grads[target] - local_slice(ref.grads[target], placements_of(plan.params[target], 2), (2, 2), c)).abs().max())
             for c, (res, _) in results.items()]
    assert max(diffs) > 1e-3


def test_load_refuses_a_plan_for_another_model(mlp_2x2):
    model, inputs, prep = mlp_2x2
    plan = solve_prepared(prep, baseline="ddp", time_limit=10)
    other, other_inputs = mlp.tiny(n_layers=1)
    other_prep = prepare(other, other_inputs, (2, 2), ("dp", "tp"), profile="h100-sxm-80gb", device_type="cpu")
    with pytest.raises(PlanError, match="graph"):
        JointRunner(other_prep.traced, plan, (2, 2), (0, 0))
    with pytest.raises(RuntimeLoadError, match="mesh"):
        JointRunner(prep.traced, plan, (4,), (0,))


def test_load_names_a_missing_redistribution(mlp_2x2):
    model, inputs, prep = mlp_2x2
    plan = solve_prepared(prep, baseline="fsdp", time_limit=10)
    dropped = plan.redistributions[0]
    broken = replace(plan, redistributions=plan.redistributions[1:])
    with pytest.raises(RuntimeLoadError, match=f"{dropped.tensor} -> {dropped.to}.*no redistribution"):
        JointRunner(prep.traced, broken, (2, 2), (0, 0), comm=object())


def test_local_slice_copies_and_follows_torch_chunk():
    x = torch.arange(10.0)
    parts = [local_slice(x, parse_placements("S(0)"), (4,), (r,)) for r in range(4)]
    assert [p.tolist() for p in parts] == [t.tolist() for t in torch.chunk(x, 4)]
    parts[0][0] = 99.0
    assert x[0] == 0.0  # a copy, never a view of the caller's tensor
    with pytest.raises(ValueError, match="partial"):
        local_slice(x, parse_placements("P(sum)"), (4,), (0,))
    assert format_placements(placements_of(None, 2)) == "RR"


def test_forward_only_gives_the_loss_with_fewer_collectives(mlp_2x2):
    """Evaluation (``torch.no_grad()``): only what the loss needs runs."""
    model, inputs, prep = mlp_2x2
    plan = solve_prepared(prep, baseline="fsdp", time_limit=10)
    ref = run_joint(prep.traced, dict(model.named_parameters()), inputs)
    mesh = (2, 2)

    def rank(coord, comm):
        runner = JointRunner(prep.traced, plan, mesh, coord, comm=comm)
        params = {k: local_slice(p.detach(), placements_of(plan.params[k], 2), mesh, coord)
                  for k, p in model.named_parameters()}
        ins = [local_slice(x, placements_of(plan.inputs[n], 2), mesh, coord) for n, x in zip(prep.traced.inputs, inputs)]
        forward = runner.run(params, {}, ins, forward_only=True)
        n_forward = len(comm.records)
        runner.run(params, {}, ins)
        # bytes moved: a step may issue fewer collectives (gather buckets), never fewer bytes
        return (forward, sum(b for *_, b in comm.records[:n_forward]),
                sum(b for *_, b in comm.records[n_forward:]))

    for coord, (res, n_forward, n_step) in run_threads(mesh, rank).items():
        torch.testing.assert_close(res.loss, ref.loss, rtol=1e-5, atol=1e-6)
        assert all(g is None for g in res.grads.values())
        assert 0 < n_forward < n_step


class _Scaled(torch.nn.Module):
    """``((x @ w) * torch.tensor([1, ..., 8]))[:, [0, 3]]``: two tensor constants in the graph."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8, generator=torch.Generator().manual_seed(0)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x @ self.w) * torch.tensor([float(i + 1) for i in range(8)]))[:, [0, 3]].sum()


def test_a_sharded_tensor_constant_is_sliced_per_rank_and_the_step_matches_one_device():
    model, x = _Scaled(), torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    mesh = (2,)
    prep = prepare(model, (x,), mesh, ("tp",), profile="cpu-gloo")
    plan = solve_prepared(prep, pins={"constant:_tensor_constant0": "S(0)"}, time_limit=10)
    assert plan.constants == {"_tensor_constant0": "S(0)", "_tensor_constant1": "R"}
    ref = run_joint(prep.traced, dict(model.named_parameters()), (x,))

    def rank(coord, comm):
        runner = JointRunner(prep.traced, plan, mesh, coord, comm=comm)
        params = {"w": local_slice(model.w.detach(), placements_of(plan.params["w"], 1), mesh, coord)}
        local_x = local_slice(x, placements_of(plan.inputs["x"], 1), mesh, coord)
        held = {name: value.clone() for name, value in runner.local_constants.items()}
        return runner.run(params, {}, [local_x]), held

    for coord, (res, held) in run_threads(mesh, rank).items():
        assert held["_tensor_constant0"].tolist() == [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]][coord[0]]
        assert held["_tensor_constant1"].tolist() == [0, 3]
        torch.testing.assert_close(res.loss, ref.loss)
        want = local_slice(ref.grads["w"], placements_of(plan.params["w"], 1), mesh, coord)
        torch.testing.assert_close(res.grads["w"], want)
    with pytest.raises(RuntimeLoadError, match="no placement for constant:_tensor_constant0"):
        JointRunner(prep.traced, replace(plan, constants={}), mesh, (0,), comm=object())
def test_a_gather_bucket_gives_each_member_what_its_own_all_gather_gives_in_one_collective():
    """Uneven shards on several tensor dims, one flattened group: the flat layout of
    ``run_gather`` hands every member exactly its own all_gather's result."""
    from autoshard.runtime.steps import run_gather

    mesh = (2, 2)
    S = parse_placements
    cases = [((6, 5), "S(0)S(0)", 0), ((3, 7, 2), "S(1)S(1)", 1), ((7,), "S(0)S(0)", 0), ((2, 9), "S(1)S(1)", 1)]
    steps = [RedistributeStep("all_gather", (0, 1), 0, 0.0, S(src), S("RR"), tensor_dim=d) for _, src, d in cases]
    gen = torch.Generator().manual_seed(5)
    inputs = [simulate.shard(torch.randn(shape, generator=gen), src, mesh) for shape, src, _ in cases]
    expected = [simulate.apply_step(x, step, mesh) for x, step in zip(inputs, steps)]

    def rank(coord, comm):
        return run_gather([x[coord] for x in inputs], steps, [c[0] for c in cases], mesh, coord, comm), \
            list(comm.records)

    for coord, (outs, records) in run_threads(mesh, rank).items():
        assert [(k, d) for k, d, _ in records] == [("all_gather", (0, 1))]  # one collective for all four
        for i, want in enumerate(expected):
            torch.testing.assert_close(outs[i], want[coord], rtol=0, atol=0, msg=lambda m: f"member {i} {coord}: {m}")
