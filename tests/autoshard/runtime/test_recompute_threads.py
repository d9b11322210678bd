"""The runtime executes the plan's activation recomputation (simulated ranks, threads).

A plan that recomputes (policies ``full`` and ``selective``; LLaMA and the MLP,
whose layers are checkpoint regions) gives the single-device loss and
gradients, and the parameters after three AdamW steps; each recomputed op's
input redistributions run again in its region's recomputation phase, where
the test's own reading of the graph says (``gloo_ranks.recompute_positions``);
a recomputed dropout draws the same mask again; the step holds fewer bytes
than without recomputation (recomputed values are not held from the forward
to the backward), and about what the plan's memory timeline says.
"""

from __future__ import annotations

import logging
from collections import Counter

import pytest
import torch
from gloo_ranks import recompute_positions, scheduled_trace
from threadcomm import run_threads

from costmodel.redistribute_steps import COLLECTIVE_STEPS

from autoshard.search.solve import prepare, solve_prepared
from autoshard.runtime.execute import JointRunner, RuntimeLoadError, local_slice, placements_of
from autoshard.trace import run_joint
from examples.models import llama3, mlp

PROFILE = "cpu-gloo"
MESH = (2,)
LLAMA_KW = {"batch_size": 8, "seq_len": 64}
"""Activations dominate this step's memory (about 4x the parameters, gradients and AdamW state)."""


@pytest.fixture(scope="module")
def llama():
    model, inputs = llama3.tiny(**LLAMA_KW)
    return model, inputs, prepare(model, inputs, MESH, ("dp",), profile=PROFILE)


def _warnings(caplog):
    return [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("autoshard")]


def _values(model):
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def _local(model, inputs, traced, plan, mesh, coord):
    n = len(mesh)
    params = {k: local_slice(p.detach(), placements_of(plan.params[k], n), mesh, coord)
              for k, p in model.named_parameters()}
    buffers = {k: local_slice(b, placements_of(plan.buffers[k], n), mesh, coord)
               for k, b in model.named_buffers() if k in plan.buffers}
    ins = [local_slice(x, placements_of(plan.inputs[k], n), mesh, coord) for k, x in zip(traced.inputs, inputs)]
    return params, buffers, ins


def _run(model, inputs, traced, plan, mesh=MESH, **options):
    def rank(coord, comm):
        runner = JointRunner(traced, plan, mesh, coord, comm=comm, graph=False, **options)
        result = runner.run(*_local(model, inputs, traced, plan, mesh, coord))
        return result, runner.last_step_peak_bytes, list(comm.trace)

    return run_threads(mesh, rank)


def _assert_matches(model, inputs, traced, plan, results, mesh=MESH):
    ref = run_joint(traced, _values(model), inputs)
    for coord, (res, *_) in results.items():
        torch.testing.assert_close(res.loss, ref.loss, rtol=1e-4, atol=1e-6)
        assert res.grads and all(g is not None for g in res.grads.values())
        for fqn, g in res.grads.items():
            want = local_slice(ref.grads[fqn], placements_of(plan.params[fqn], len(mesh)), mesh, coord)
            torch.testing.assert_close(g, want, rtol=1e-4, atol=1e-6, msg=lambda m, fqn=fqn: f"{fqn} {coord}: {m}")


@pytest.mark.parametrize("policy", ["full", "selective"])
def test_a_recomputing_llama_step_matches_one_device_and_reissues_the_recomputed_inputs(llama, policy):
    model, inputs, prep = llama
    plan = solve_prepared(prep, baseline="fsdp", recompute=policy, time_limit=10)
    assert plan.recompute and {n.region for n in plan.nodes if n.name in plan.recompute} == {"layers.0", "layers.1"}
    results = _run(model, inputs, prep.traced, plan)
    _assert_matches(model, inputs, prep.traced, plan, results)
    # FSDP: the recomputed matmuls gather their weights again, in the backward
    again = [(r.tensor, r.to, r.input_index) for r in plan.redistributions if r.to in plan.recompute
             and any(s.collective in COLLECTIVE_STEPS for s in r.steps)]
    assert again, "the recomputed ops read no redistributed input: the test would not see the recomputation's"
    want = scheduled_trace(plan, recompute_positions(prep.traced, plan))
    for coord, (_, _, trace) in results.items():
        assert trace == want, f"{coord}: the collective trace is not the schedule with the recomputation"
        recomputed = Counter(e for e, _, _, _, issue, wait in trace if e in set(again) and issue == wait)
        assert all(recomputed[e] >= 1 for e in again)


def test_recomputation_changes_no_bit_of_the_step(llama):
    """The same placements with and without recomputation: the recomputed ops run the
    same kernels on the same inputs, so the loss and every gradient are bitwise equal."""
    model, inputs, prep = llama
    plans = [solve_prepared(prep, baseline="fsdp", recompute=policy, time_limit=10) for policy in ("none", "full")]
    assert [n.out for n in plans[0].nodes] == [n.out for n in plans[1].nodes]
    assert plans[0].redistributions == plans[1].redistributions and plans[1].recompute
    without, with_ = (_run(model, inputs, prep.traced, plan) for plan in plans)
    for coord in without:
        assert torch.equal(without[coord][0].loss, with_[coord][0].loss)
        assert all(torch.equal(g, with_[coord][0].grads[k]) for k, g in without[coord][0].grads.items())


def test_an_mlp_whose_layers_are_regions_recomputes_and_matches_one_device():
    model, inputs = mlp.tiny(n_layers=3)
    prep = prepare(model, inputs, (2, 2), ("dp", "tp"), profile=PROFILE)
    plan = solve_prepared(prep, baseline="fsdp+tp", recompute="full", time_limit=10)
    assert plan.recompute
    results = _run(model, inputs, prep.traced, plan, mesh=(2, 2))
    _assert_matches(model, inputs, prep.traced, plan, results, mesh=(2, 2))
    want = scheduled_trace(plan, recompute_positions(prep.traced, plan))
    assert all(trace == want for _, _, trace in results.values())


def test_recomputed_values_are_freed_after_the_forward(llama):
    """The runtime's own live-bytes peak: lower with recomputation than without,
    and within 15 % of the plan's peak once the AdamW state (2 x the local
    parameters: the plan counts it, the runtime does not hold it) is added."""
    model, inputs, prep = llama
    peaks = {}
    for policy in ("none", "full"):
        plan = solve_prepared(prep, baseline="fsdp", recompute=policy, time_limit=10)
        results = _run(model, inputs, prep.traced, plan)
        params = {k: p for k, p in model.named_parameters()}
        for coord, (_, peak, _) in results.items():
            local = sum(local_slice(p.detach(), placements_of(plan.params[k], 1), MESH, coord).nbytes
                        for k, p in params.items())
            assert plan.options.get("optimizer", "adamw") == "adamw"
            with_optimizer = peak + 2 * local
            assert abs(with_optimizer - plan.estimate.peak_memory_bytes) <= 0.15 * plan.estimate.peak_memory_bytes, \
                (policy, coord, peak, with_optimizer, plan.estimate.peak_memory_bytes)
            peaks.setdefault(policy, []).append(peak)
    assert max(peaks["full"]) < 0.8 * min(peaks["none"]), peaks


def test_three_adamw_steps_with_recomputation_follow_one_device_and_the_traced_step(llama, caplog):
    """One rank (no collectives): the second and third steps run the traced graph of
    the per-rank program, recomputation included."""
    model, inputs, _ = llama
    prep = prepare(model, inputs, (1,), ("dp",), profile=PROFILE)
    plan = solve_prepared(prep, recompute="full", time_limit=10)
    assert plan.recompute
    reference = {k: p.detach().clone().requires_grad_(True) for k, p in model.named_parameters()}
    ref_opt = torch.optim.AdamW(list(reference.values()), lr=1e-2)
    runner = JointRunner(prep.traced, plan, (1,), (0,))
    params = {k: p.detach().clone().requires_grad_(True) for k, p in model.named_parameters()}
    opt = torch.optim.AdamW(list(params.values()), lr=1e-2)
    buffers = dict(model.named_buffers())
    with caplog.at_level(logging.WARNING, logger="autoshard"):
        for _ in range(3):
            ref = run_joint(prep.traced, {**reference, **buffers}, inputs)
            got = runner.run({k: p.detach() for k, p in params.items()}, buffers, list(inputs))
            torch.testing.assert_close(got.loss, ref.loss, rtol=1e-4, atol=1e-6)
            for k in params:
                params[k].grad, reference[k].grad = got.grads[k].clone(), ref.grads[k].clone()
            opt.step()
            ref_opt.step()
    assert runner.step_graph is not None and not _warnings(caplog)
    for k in params:
        torch.testing.assert_close(params[k], reference[k], rtol=1e-4, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")


def test_a_recomputed_dropout_draws_its_mask_again(caplog):
    """One rank, so that one generator serves it (threads would share it): the
    recomputation replays the first draw's random state, and the step equals the
    single-device one from the same seed; the traced step cannot restore a
    random state, so later steps are interpreted, with one warning."""
    model, inputs = mlp.tiny(dropout=0.25)
    prep = prepare(model, inputs, (1,), ("dp",), profile=PROFILE)
    plan = solve_prepared(prep, recompute="full", time_limit=10)
    assert any(n.startswith("native_dropout") for n in plan.recompute)
    runner = JointRunner(prep.traced, plan, (1,), (0,))
    with caplog.at_level(logging.WARNING, logger="autoshard"):
        for seed in (3, 4):
            torch.manual_seed(seed)
            ref = run_joint(prep.traced, _values(model), inputs)
            after_ref = torch.rand(3)
            torch.manual_seed(seed)
            got = runner.run(dict(model.named_parameters()), {}, list(inputs))
            assert torch.equal(torch.rand(3), after_ref)  # the stream goes on where the single-device run's does
            torch.testing.assert_close(got.loss, ref.loss, rtol=1e-4, atol=1e-6)
            for k, g in got.grads.items():
                torch.testing.assert_close(g, ref.grads[k], rtol=1e-4, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")
    assert runner.step_graph is None
    assert [r.getMessage().split(" (")[0] for r in _warnings(caplog)] == ["autoshard: the step recomputes random ops"]


def test_load_refuses_a_recompute_the_graph_cannot_run(llama):
    model, inputs, prep = llama
    plan = solve_prepared(prep, baseline="fsdp", recompute="full", time_limit=10)
    from dataclasses import replace

    with pytest.raises(RuntimeLoadError, match="recompute"):
        JointRunner(prep.traced, replace(plan, recompute=("loss_fn_not_an_op",)), MESH, (0,), comm=object())
