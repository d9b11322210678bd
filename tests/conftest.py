"""Fixtures shared by every test package.

``traced_tiny(name)`` traces the ``tiny`` factory of ``examples.models.<name>``
once per test session (on meta tensors) and hands out the same
:class:`autoshard.trace.TracedGraph`; treat it as read-only.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

import pytest

EXAMPLE_MODELS = ("mlp", "gpt2", "llama3", "moe", "convnet", "vit")
"""Modules under ``examples.models`` that have a ``tiny`` factory."""


@pytest.fixture(scope="session", autouse=True)
def private_user_cache(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``$XDG_CACHE_HOME`` (cached plans, profile corrections) is a folder of this test session's:
    tests neither read what an earlier run left there (a stale correction) nor write into the
    user's cache; rank processes inherit it."""
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if before is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = before


@pytest.fixture(scope="session")
def traced_tiny() -> Callable[[str], Any]:
    """``traced_tiny("llama3")`` -> the joint graph of ``examples.models.llama3.tiny``."""
    from autoshard.trace import trace_joint

    cache: dict[str, Any] = {}

    def get(name: str) -> Any:
        if name not in cache:
            module = importlib.import_module(f"examples.models.{name}")
            cache[name] = trace_joint(*module.tiny(device="meta"))
        return cache[name]

    return get
