"""``benchmarks/step_parts.py``: the predicted parts it reads from a plan add up to the plan's estimate."""

from __future__ import annotations

import pytest

from benchmarks.step_parts import _kind, predicted_parts


def test_predicted_parts_price_every_op_of_the_plan_and_add_up_to_its_compute() -> None:
    from autoshard.search.solve import prepare, solve_prepared
    from examples.models import mlp

    model, inputs = mlp.tiny()
    prep = prepare(model, inputs, (2,), profile="cpu-gloo", recompute="none")
    plan = solve_prepared(prep, baseline="ddp", time_limit=10)
    parts = predicted_parts(prep.graph, plan)
    assert sum(parts["counts"].values()) == len(plan.nodes)  # every node matched to its strategy
    assert parts["ops_s"] + parts["tail_s"] == pytest.approx(plan.estimate.compute_s, rel=1e-9)
    assert parts["per_op"]["aten.mm.default"] > 0


@pytest.mark.parametrize("event, kind", [("c10d::wait_tensor", "wait"), ("c10d::allreduce_", "issue"),
                                         ("aten::_fused_adamw_", "optimizer"), ("aten::mm", "op")])
def test_profiler_events_fall_in_their_part(event, kind) -> None:
    assert _kind(event) == kind
