"""The gradient bucket cap chosen by the simulated step (autoshard.plan.gradient_buckets)."""

from __future__ import annotations

import dataclasses
import doctest

import pytest

import autoshard.plan.gradient_buckets as gradient_buckets
from autoshard.plan.assemble import StepPricing
from autoshard.plan.format import Redistribution
from autoshard.plan.gradient_buckets import GRADIENT_CAPS, choose_gradient_buckets
from autoshard.plan.schedule import build_schedule, simulate_schedule
from costmodel.bucketing import group_buckets
from costmodel.mesh import MeshSpec
from costmodel.redistribute import plan_redistribute
from hw_profiles import load

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


def test_docstring_example():
    assert doctest.testmod(gradient_buckets).failed == 0


def test_no_buckets_when_the_graph_has_none():
    pricing, redistributions, grads = _plan(0.0)
    assert choose_gradient_buckets(grads, pricing, redistributions, mesh=MESH, profile=GLOO, cap=0) == ((), 0)


@pytest.mark.parametrize("backward_s", [0.0, 0.5])
def test_the_chosen_cap_simulates_no_slower_than_any_other(backward_s):
    pricing, redistributions, grads = _plan(backward_s)
    buckets, cap = choose_gradient_buckets(grads, pricing, redistributions, mesh=MESH, profile=GLOO, cap=25 * 2**20)
    assert buckets == group_buckets(grads, MESH, GLOO, cap)
    best = _simulated(pricing, redistributions, buckets)
    for other in GRADIENT_CAPS:
        assert best <= _simulated(pricing, redistributions, group_buckets(grads, MESH, GLOO, other)) * (1 + 1e-9)


def test_no_compute_left_to_hide_under_takes_one_bucket_and_long_backward_ops_take_small_ones():
    # nothing runs after the gradients: one call latency beats four where packing the flat buffer
    # costs nothing; with cpu-gloo's copies (a buffer of 32 MiB or more is faulted in at every
    # step, costmodel.bucketing) two 16 MiB buckets beat one of 32 MiB
    pricing, redistributions, grads = _plan(0.0)
    buckets, cap = choose_gradient_buckets(grads, pricing, redistributions, mesh=MESH, profile=FREE_COPIES,
                                           cap=25 * 2**20)
    assert len(buckets) == 1 and len(buckets[0].members) == 4
    buckets, cap = choose_gradient_buckets(grads, pricing, redistributions, mesh=MESH, profile=GLOO, cap=25 * 2**20)
    assert [b.members for b in buckets] == [("grad:w1", "grad:w2"), ("grad:w3", "grad:w4")]
    # b2 and b3 outlast a reduction, b4 takes no time: the pair (w1, w2) hides under b3, the pair
    # (w3, w4) shows; 25 MiB (w1..w3 after b3) shows three reductions, one per gradient two and two latencies
    pricing, redistributions, grads = _plan((0.5, 0.5, 0.5, 0.0))
    buckets, cap = choose_gradient_buckets(grads, pricing, redistributions, mesh=MESH, profile=FREE_COPIES,
                                           cap=25 * 2**20)
    assert cap == 16 * 2**20
    assert [b.members for b in buckets] == [("grad:w1", "grad:w2"), ("grad:w3", "grad:w4")]
