"""The examples in the validation package's docstrings run and hold."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import autoshard.validation

MODULES = sorted(m.name for m in pkgutil.iter_modules(autoshard.validation.__path__, "autoshard.validation."))


@pytest.mark.parametrize("name", ["autoshard.validation"] + MODULES)
def test_docstring_examples_hold(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
