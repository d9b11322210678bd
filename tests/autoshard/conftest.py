"""Solved plans shared by the plan tests (each solve costs about a second)."""

from __future__ import annotations

import pytest

from autoshard.search.solve import Prepared, prepare
from examples.models import mlp


@pytest.fixture(scope="session")
def megatron_mlp() -> Prepared:
    """Two residual MLP blocks 1024 -> 4096 -> 1024 without bias, batch 8, on a
    1-D tensor-parallel mesh of 4 H100s: weights dominate, so Megatron's
    column-then-row split is the optimum."""
    model, inputs = mlp.small(device="meta", n_layers=2, batch_size=8, bias=False)
    return prepare(model, inputs, (4,), ("tp",), profile="h100-sxm-80gb")


@pytest.fixture(scope="session")
def dp_mlp() -> Prepared:
    """Four MLP blocks 256 -> 1024 -> 256, batch 64, on a 2x2 mesh (dp, tp)."""
    model, inputs = mlp.small(device="meta", dim=256, hidden_dim=1024, n_layers=4, batch_size=64)
    return prepare(model, inputs, (2, 2), ("dp", "tp"), profile="h100-sxm-80gb")
