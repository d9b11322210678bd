"""benchmarks/ddp_buckets.py and the choice it measures: on the unseen transformer's DDP layout
(4 ranks), DDP's 1 MiB first bucket (the head's gradient alone, under the rest of the backward)
is priced slower than one bucket at cpu-gloo's contention and faster where overlap gains more;
the benchmark's forced grouping is the plan's."""

from __future__ import annotations

import dataclasses

import pytest

import autoshard.assembly.assemble as assemble
from autoshard.assembly import buckets
from autoshard.search.solve import prepare, solve_prepared
from benchmarks.common.unseen_model import transformer
from benchmarks.ddp_buckets import only_grouping


@pytest.fixture(scope="module")
def unseen_ddp():
    """(prepared problem, the assembler's gradient-bucket call as (args, kwargs, result))."""
    calls = []

    def spy(*args, **kwargs):
        out = buckets.choose_gradient_buckets(*args, **kwargs)
        calls.append((args, kwargs, out))
        return out

    model, inputs = transformer(device="meta")
    prep = prepare(model, inputs, (4,), ("dp",), profile="cpu-gloo")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(assemble, "choose_gradient_buckets", spy)
        solve_prepared(prep, baseline="ddp", time_limit=20)
    return prep, calls[-1]


def test_cpu_gloo_keeps_one_bucket_and_less_contention_takes_ddps_first_bucket(unseen_ddp):
    _, ((grads, pricing, redistributions), kwargs, (chosen, caps)) = unseen_ddp
    assert pricing.contention == pytest.approx(0.84) and grads[0][0] == "grad:head.weight"
    assert caps.first_cap is None and [len(b.members) for b in chosen] == [len(grads)]
    # hiding the head's reduction saves (1 - kappa) of it; at 0.5 that outweighs one more call
    less = dataclasses.replace(pricing, contention=0.5)
    early, caps = buckets.choose_gradient_buckets(grads, less, redistributions, **kwargs)
    assert caps.first_cap == 2**20
    assert [b.members for b in early] == [tuple(g[0] for g in grads[1:])]


def test_the_forced_grouping_is_the_plans_and_the_choice_comes_back(unseen_ddp):
    prep, _ = unseen_ddp
    saved = buckets.candidate_caps
    with only_grouping(2**20, 25 * 2**20):
        forced = solve_prepared(prep, baseline="ddp", time_limit=20)
    assert buckets.candidate_caps is saved
    (bucket,) = forced.buckets
    assert "grad:head.weight" not in bucket.members and len(bucket.members) == 28
    chosen = solve_prepared(prep, baseline="ddp", time_limit=20)
    assert [len(b.members) for b in chosen.buckets] == [29]
    assert chosen.estimate.step_s < forced.estimate.step_s  # what the price says of DDP's grouping here
