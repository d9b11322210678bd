"""The examples in the docstrings of the recomputation and copy modules run and hold."""

import doctest
import importlib

import pytest

MODULES = ["autoshard.graph.regions", "autoshard.graph.recompute", "autoshard.graph.recompute_policy",
           "autoshard.graph.states", "autoshard.graph.copies", "autoshard.graph.tied_memory",
           "autoshard.program.memory", "autoshard.assembly.tidy_states"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_hold(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
