"""Context-parallel plans on 8 gloo ranks, mesh (2, 2, 2) ``dp, cp, tp``, equal one device.

The example LLaMA (one layer, batch 2: split by ``dp``) with its attention nodes restricted to
the load-balanced exchange on the middle mesh dim: the loss
and every gradient shard equal the single-device run on each of two SGD steps, and each rank
issues exactly the plan's collectives and the exchanges ``planned_context_collectives`` counts
on the CP mesh dim (the helpers of ``test_context_parallel_gloo``). Hugging Face's Mistral
(sliding window, an explicit mask split on its query rows, the contiguous exchange) passed here
too (2026-12-05) but is left to the 4-rank test: this mesh's plans take minutes to force on the
CI's two cores, and the mask path is the same on 4 ranks.
"""

from __future__ import annotations

import pytest
from gloo_ranks import spawn
from test_context_parallel_gloo import assert_equal_one_device, forced_plan, label_of, run_jobs

pytestmark = [pytest.mark.slow]

MESH, NAMES = (2, 2, 2), ("dp", "cp", "tp")
JOBS = [("llama3.tiny", "context_gather_balanced", {"n_layers": 1})]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cp8")
    plans, jobs = {}, []
    for factory, kind, overrides in JOBS:
        label = label_of(factory, kind)
        plan = plans[label] = forced_plan(factory, kind, MESH, NAMES, mesh_dim=1, overrides=overrides)
        path = tmp / f"{label}.json"
        plan.save(path)
        jobs.append({"label": label, "factory": factory, "plan": str(path), "overrides": overrides})
    results = spawn(8, run_jobs, ([((MESH, NAMES), jobs)],), tmp / "ranks", timeout=900)
    return plans, results


@pytest.mark.parametrize("factory,kind,overrides", JOBS, ids=[label_of(f, k) for f, k, _ in JOBS])
def test_dp_cp_tp_plan_equals_one_device(run, factory, kind, overrides) -> None:
    plans, results = run
    label = label_of(factory, kind)
    assert_equal_one_device(plans[label], results, label, kind, n_attention_layers=1, mesh_dim=1)
