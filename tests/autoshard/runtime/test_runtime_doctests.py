"""The runtime modules' doctests."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["autoshard.runtime.steps", "autoshard.runtime.execute", "autoshard.runtime.collectives",
           "autoshard.runtime.module", "autoshard.runtime.templates", "autoshard.runtime.traced_step",
           "autoshard.runtime.shards", "autoshard.runtime.live_bytes", "autoshard.runtime.binding",
           "autoshard.runtime.op_calls", "autoshard.program.actions"]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
