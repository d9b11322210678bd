"""The examples in the docstrings of autoshard.calibrate run as written."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "autoshard.calibrate", "autoshard.calibrate.timing", "autoshard.calibrate.measure_compute",
    "autoshard.calibrate.measure_collectives", "autoshard.calibrate.fit", "autoshard.calibrate.output",
    "autoshard.calibrate.heldout", "autoshard.calibrate.report", "autoshard.calibrate.runner",
    "autoshard.calibrate.launch", "autoshard.calibrate.measure_overlap", "autoshard.calibrate.check_scope",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_pass(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no example"
    assert result.failed == 0
