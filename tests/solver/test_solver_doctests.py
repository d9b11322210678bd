"""The examples in the docstrings of the solver modules run as written."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["solver.pipeline", "solver.compiled", "solver.treedp", "solver.tolerance", "solver.memory_points",
           "solver.pricing", "solver.restrict", "solver.exact", "solver.trws", "solver.trws_plan",
           "solver.budget", "solver.jit", "solver.problem_values", "solver.reduction_report"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_pass(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no example"
    assert result.failed == 0
