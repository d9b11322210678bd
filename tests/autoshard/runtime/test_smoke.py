"""The smoke every supported torch runs (``.ci/run`` runs it on the oldest one too):
import, solve the tiny LLaMA, one step on 4 gloo ranks equal to one device.

The oldest torch autoshard supports (``pyproject.toml``) is what GPU images and
clusters often run, a few releases behind: this keeps the path from a model to
a trained step working there, private tracing APIs included.
"""

from __future__ import annotations

import pytest
from gloo_ranks import assert_matches_one_device, equivalence, planned_collectives_issued, spawn

from autoshard.search.solve import prepare, solve_prepared
from examples.models import llama3

pytestmark = pytest.mark.slow

KW = {"batch_size": 4}
MESH = ((2, 2), ("dp", "tp"))


def test_tiny_llama_solved_then_one_gloo_step_on_2x2_equals_one_device(tmp_path) -> None:
    model, inputs = llama3.tiny(device="meta", **KW)
    plan = solve_prepared(prepare(model, inputs, *MESH, profile="cpu-gloo"), time_limit=30)
    assert plan.solver.status in ("optimal", "feasible", "timeout")
    path = tmp_path / "plan.json"
    plan.save(path)
    job = {"label": "llama-2x2", "factory": "llama3.tiny", "plan": str(path), "kwargs": KW}
    results = spawn(4, equivalence, ([(MESH, [job])], None, False), tmp_path / "ranks", timeout=300)
    assert_matches_one_device(results, "llama-2x2")
    planned_collectives_issued(plan, results, "llama-2x2")
