"""The examples in the service's and the assembler's docstrings run."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize("name", ["autoshard.service.cache", "autoshard.service.payload",
                                  "autoshard.service.client", "autoshard.service.app", "autoshard.service.job_routes",
                                  "autoshard.service.ops_routes", "autoshard.assembly.assemble"])
def test_docstring_examples(name: str) -> None:
    if name in ("autoshard.service.app", "autoshard.service.job_routes",
                "autoshard.service.ops_routes"):
        pytest.importorskip("fastapi")
        pytest.importorskip("uvicorn")
        pytest.importorskip("prometheus_client")
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
