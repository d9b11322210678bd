"""The examples in the docstrings of costmodel and hw_profiles run as written."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "costmodel.placements", "costmodel.shard_shapes", "costmodel.redistribute_steps", "costmodel.simulate", "costmodel.mesh",
    "costmodel.compute", "costmodel.collectives", "costmodel.redistribute", "costmodel.overlap", "costmodel.buckets.routes",
    "costmodel.expert_parallel", "costmodel.pipeline_schedules", "costmodel.pipeline_simulate", "costmodel.stage_cuts",
    "hw_profiles", "hw_profiles.profile", "hw_profiles.schema",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_pass(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no example"
    assert result.failed == 0
