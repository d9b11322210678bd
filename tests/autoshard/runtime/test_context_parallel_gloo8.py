"""Context-parallel plans on 8 gloo ranks, mesh (2, 2, 2) ``dp, cp, tp``, equal one device.

The example LLaMA (one layer, batch 2: split by ``dp``) with its attention nodes restricted to
the load-balanced exchange on the middle mesh dim: the loss
and every gradient shard equal the single-device run on each of two SGD steps, and each rank
issues exactly the plan's collectives and the exchanges ``planned_context_collectives`` counts
on the CP mesh dim (the helpers of ``test_context_parallel_gloo``). Hugging Face's Mistral
(sliding window, an explicit mask split on its query rows, the contiguous exchange) passed here
too (2026-12-05) but is left to the 4-rank test: the mask path is the same on 4 ranks, and each
model on 8 ranks adds its tracing in every rank. The plan is forced beside the seeded search's
strategies for the other nodes (``forced_plan`` on a 3-dim mesh: 7 s, where their full
enumeration took 128 s of the test's 139 s).
"""

from __future__ import annotations

import pytest
from test_context_parallel_gloo import assert_equal_one_device, label_of

pytestmark = [pytest.mark.slow]

MESH, NAMES = (2, 2, 2), ("dp", "cp", "tp")
JOBS = [("llama3.tiny", "context_gather_balanced", {"n_layers": 1})]


@pytest.fixture(scope="module")
def run(ranks_2x2x2):
    """The plans and results of the spawn this test shares with ``test_expert_parallel_gloo8``
    and ``test_pipeline_tp_gloo`` (``ranks_2x2x2.py``)."""
    return ranks_2x2x2


@pytest.mark.parametrize("factory,kind,overrides", JOBS, ids=[label_of(f, k) for f, k, _ in JOBS])
def test_dp_cp_tp_plan_equals_one_device(run, factory, kind, overrides) -> None:
    plans, results = run
    label = label_of(factory, kind)
    assert_equal_one_device(plans[label], results, label, kind, n_attention_layers=1, mesh_dim=1)
