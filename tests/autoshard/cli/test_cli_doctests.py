"""The examples in the docstrings of every module of the command line run as written."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import autoshard.cli

MODULES = sorted(m.name for m in pkgutil.iter_modules(autoshard.cli.__path__, "autoshard.cli."))


def test_every_subcommand_has_its_module_here() -> None:
    from autoshard.cli import _COMMANDS

    assert {module for _, module, _ in _COMMANDS} <= set(MODULES)


@pytest.mark.parametrize("name", ["autoshard.cli"] + MODULES)
def test_docstring_examples_hold(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
