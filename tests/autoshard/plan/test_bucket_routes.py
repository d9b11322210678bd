"""Bucketed edges take the route they were priced at: on 2x2 the FSDP layout's per-dim
gather and reduction chains (cheaper alone on cpu-gloo, never bucketed) become one
flattened collective per bucket."""

from __future__ import annotations

import doctest

import pytest

import autoshard.plan.bucket_routes as bucket_routes
from autoshard.plan.solve import prepare, solve_prepared
from costmodel.steps import COLLECTIVE_STEPS
from examples.models import llama3


def test_docstring_example():
    assert doctest.testmod(bucket_routes).failed == 0


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
