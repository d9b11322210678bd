"""The examples in the assembly package's docstrings run and hold."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import autoshard.assembly

MODULES = sorted(m.name for m in pkgutil.iter_modules(autoshard.assembly.__path__, "autoshard.assembly."))


def test_the_package_lists_every_module_it_holds():
    listed = autoshard.assembly.__doc__
    assert [m for m in MODULES if f":mod:`{m}`" not in listed] == []


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_hold(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
