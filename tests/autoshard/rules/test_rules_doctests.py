"""The examples in the rules package's docstrings run and hold."""

import doctest
import importlib
import pkgutil

import pytest

import autoshard.rules

MODULES = sorted(m.name for m in pkgutil.iter_modules(autoshard.rules.__path__, "autoshard.rules."))


@pytest.mark.parametrize("name", ["autoshard.rules"] + MODULES)
def test_docstring_examples_hold(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
