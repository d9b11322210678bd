"""torchtitan's LLaMA-3 (the ``zoo`` extra) traces as torchtitan trains it, and every op has a rule.

Skipped where torchtitan is not installed (it is not a CI dependency: ``pip install '.[zoo]'``)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchtitan")

from autoshard.validation.coverage import compute_coverage  # noqa: E402
from autoshard.rules import load_rules  # noqa: E402
from autoshard.trace import run_joint, trace_joint  # noqa: E402
from examples.models import titan  # noqa: E402


def test_titan_llama3_joint_graph_matches_eager_and_is_covered():
    model, inputs = titan.titan_llama3()
    traced = trace_joint(model, inputs)
    result = run_joint(traced, {**dict(model.named_parameters()), **dict(model.named_buffers())}, inputs)
    loss = model(*inputs)
    loss.backward()
    torch.testing.assert_close(result.loss, loss.detach())
    for fqn, param in model.named_parameters():
        torch.testing.assert_close(result.grads[fqn], param.grad, msg=fqn)
    report = compute_coverage(traced, load_rules(), model="titan_llama3")
    assert all(row.covered for row in report.ops), [row.op for row in report.ops if not row.covered]


def test_titan_llama3_8b_builds_on_meta_with_torchtitans_own_shapes():
    model, (tokens, labels) = titan.titan_llama3_8b(n_layers=2)
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert model.model.layers["0"].feed_forward.w1.weight.shape == (14336, 4096)
    assert tokens.shape == labels.shape == (8, 1024)
