"""autoshard.assembly.buckets: bucketed edges take the route they were priced at (on 2x2 the
FSDP layout's per-dim gather and reduction chains, cheaper alone on cpu-gloo, never bucketed,
become one flattened collective per bucket), and the gradient bucket cap is the one whose
simulated step is best."""

from __future__ import annotations

import dataclasses
import doctest

import pytest

import autoshard.assembly.buckets as buckets_module
from autoshard.assembly.assemble import StepPricing
from autoshard.assembly.buckets import BucketCaps, candidate_caps, choose_gradient_buckets
from autoshard.plan.format import Redistribution
from autoshard.program.schedule import build_schedule, simulate_schedule
from autoshard.search.solve import prepare, solve_prepared
from costmodel.buckets.grouping import group_buckets
from costmodel.mesh import MeshSpec
from costmodel.redistribute import plan_redistribute
from costmodel.redistribute_steps import COLLECTIVE_STEPS
from examples.models import llama3
from hw_profiles import load


def test_docstring_example():
    assert doctest.testmod(buckets_module).failed == 0


@pytest.fixture(scope="module")
def fsdp_2x2():
    model, inputs = llama3.tiny(device="meta", batch_size=4)
    prep = prepare(model, inputs, (2, 2), ("dp", "tp"), profile="cpu-gloo")
    return solve_prepared(prep, baseline="fsdp", time_limit=20)


def test_every_gradient_of_the_2x2_fsdp_layout_is_in_a_bucket_of_one_flattened_collective(fsdp_2x2):
    plan = fsdp_2x2
    grads = [r for r in plan.redistributions if r.to.startswith("grad:") and
             any(s.collective in COLLECTIVE_STEPS for s in r.steps)]
    bucketed = {m for b in plan.buckets for m in b.members}
    assert grads and {r.to for r in grads} <= bucketed
    assert all(b.mesh_dims == (0, 1) for b in plan.buckets)
    for r in grads:  # one collective, then local steps only
        assert [s.collective in COLLECTIVE_STEPS for s in r.steps][:1] == [True]
        assert not any(s.collective in COLLECTIVE_STEPS for s in r.steps[1:])


def test_the_2x2_fsdp_layout_gathers_its_weights_in_flattened_buckets(fsdp_2x2):
    plan = fsdp_2x2
    gathered = {tuple(m) for g in plan.gather_buckets for m in g.members}
    assert plan.gather_buckets and all(g.mesh_dims == (0, 1) for g in plan.gather_buckets)
    chains = [r for r in plan.redistributions if (r.tensor, r.to, r.input_index) in gathered]
    assert all(len(r.steps) == 1 and r.steps[0].mesh_dims == (0, 1) for r in chains)
    # what runs: the buckets plus the unbucketed collectives (was 119 per step before the bucketed routes)
    bucketed = {m for b in plan.buckets for m in b.members}
    rest = [r for r in plan.redistributions if r.to not in bucketed and (r.tensor, r.to, r.input_index) not in gathered
            and any(s.collective in COLLECTIVE_STEPS for s in r.steps)]
    assert len(plan.buckets) + len(plan.gather_buckets) + len(rest) <= 12


GLOO, MESH = load("cpu-gloo"), MeshSpec((4,))
FREE_COPIES = dataclasses.replace(GLOO, device=dataclasses.replace(GLOO.device, fresh_pages=None,
                                                                    memory_bandwidth_Bps=1e18, step_op_s=0.0))
"""cpu-gloo's collectives with copies that cost a launch: the choice on latency and overlap alone."""
GRAD_SHAPE = (1024, 2048)  # 8 MiB of float32


def _plan(backward_s: float | tuple[float, ...]):
    """A forward op and four backward ops, each making one 8 MiB gradient; ``backward_s``: the backward ops' times."""
    times = backward_s if isinstance(backward_s, tuple) else (backward_s,) * 4
    names = ("fwd", "b1", "b2", "b3", "b4")
    steps = plan_redistribute("P(sum)", "R", MESH, GRAD_SHAPE, 4, GLOO)
    redistributions = [Redistribution(f"b{i}", f"grad:w{i}", 0, 0, "P(sum)", "R", steps.steps, steps.cost_s)
                       for i in range(1, 5)]
    pricing = StepPricing(names, (1e-3,) + times, 0.0, tuple(range(6)), 0.0, None)
    grads = [(r.to, "torch.float32", r.steps) for r in redistributions]
    return pricing, redistributions, grads


def _simulated(pricing, redistributions, buckets):
    schedule = build_schedule(pricing.node_names, redistributions, buckets)
    return simulate_schedule(schedule, pricing.op_compute_s, redistributions, buckets).step_s


def test_no_buckets_when_the_graph_has_none():
    pricing, redistributions, grads = _plan(0.0)
    assert choose_gradient_buckets(grads, pricing, redistributions, mesh=MESH, profile=GLOO, cap=0) == ((), BucketCaps(0))


@pytest.mark.parametrize("backward_s", [0.0, 0.5, (0.0, 0.5, 0.0, 0.0)])
def test_the_chosen_caps_simulate_no_slower_than_any_other_candidate(backward_s):
    pricing, redistributions, grads = _plan(backward_s)
    buckets, caps = choose_gradient_buckets(grads, pricing, redistributions, mesh=MESH, profile=GLOO, cap=25 * 2**20)
    assert buckets == group_buckets(grads, MESH, GLOO, caps.cap, first_cap=caps.first_cap)
    best = _simulated(pricing, redistributions, buckets)
    for other in candidate_caps(25 * 2**20):
        grouping = group_buckets(grads, MESH, GLOO, other.cap, first_cap=other.first_cap)
        assert best <= _simulated(pricing, redistributions, grouping) * (1 + 1e-9)


def test_no_compute_left_to_hide_under_takes_one_bucket_and_long_backward_ops_take_small_ones():
    # nothing runs after the gradients: one call latency beats four where packing the flat buffer
    # costs nothing; with cpu-gloo's copies (a buffer of 32 MiB or more is faulted in at every
    # step, costmodel.buckets.grouping) two 16 MiB buckets beat one of 32 MiB
    pricing, redistributions, grads = _plan(0.0)
    buckets, cap = choose_gradient_buckets(grads, pricing, redistributions, mesh=MESH, profile=FREE_COPIES,
                                           cap=25 * 2**20)
    assert len(buckets) == 1 and len(buckets[0].members) == 4
    buckets, cap = choose_gradient_buckets(grads, pricing, redistributions, mesh=MESH, profile=GLOO, cap=25 * 2**20)
    assert max(b.bytes for b in buckets) < 32 * 2**20
    # two calls either way, and the first gradient alone (1 MiB first bucket) packs no copy of its own:
    # 24 MiB packed beats the two 16 MiB buckets' 32
    assert [b.members for b in buckets] == [("grad:w2", "grad:w3", "grad:w4")] and cap.first_cap == 2**20
    # b2 and b3 outlast a reduction, b4 takes no time: the pair (w1, w2) hides under b3, the pair
    # (w3, w4) shows; 25 MiB (w1..w3 after b3) shows three reductions, one per gradient two and two latencies
    pricing, redistributions, grads = _plan((0.5, 0.5, 0.5, 0.0))
    buckets, cap = choose_gradient_buckets(grads, pricing, redistributions, mesh=MESH, profile=FREE_COPIES,
                                           cap=25 * 2**20)
    assert cap == BucketCaps(16 * 2**20)
    assert [b.members for b in buckets] == [("grad:w1", "grad:w2"), ("grad:w3", "grad:w4")]



def test_a_first_bucket_is_taken_only_where_its_reduction_hides_under_the_rest_of_the_backward():
    # b2 is long: w1 alone (DDP's 1 MiB first bucket) reduces under it, then w2..w4 in one call
    pricing, redistributions, grads = _plan((0.0, 0.5, 0.0, 0.0))
    buckets, caps = choose_gradient_buckets(grads, pricing, redistributions, mesh=MESH, profile=FREE_COPIES,
                                            cap=25 * 2**20)
    assert caps.first_cap == 2**20
    assert [b.members for b in buckets] == [("grad:w2", "grad:w3", "grad:w4")]
    plain = min(_simulated(pricing, redistributions, group_buckets(grads, MESH, FREE_COPIES, c.cap))
                for c in candidate_caps(25 * 2**20) if c.first_cap is None)
    assert _simulated(pricing, redistributions, buckets) < plain
    # where a collective beside compute slows it as much as it runs (contention 1) hiding gains nothing
    contended = dataclasses.replace(pricing, contention=1.0)
    _, caps = choose_gradient_buckets(grads, contended, redistributions, mesh=MESH, profile=FREE_COPIES,
                                      cap=25 * 2**20)
    assert caps.first_cap is None
    # nothing runs after the gradients: nothing to hide, the extra call is not taken
    pricing, redistributions, grads = _plan(0.0)
    _, caps = choose_gradient_buckets(grads, pricing, redistributions, mesh=MESH, profile=FREE_COPIES,
                                      cap=25 * 2**20)
    assert caps.first_cap is None
