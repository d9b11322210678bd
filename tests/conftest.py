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


SHARED_WORKER = {
    "tests/autoshard/runtime/test_context_parallel_gloo8.py": "eight_ranks",
    "tests/autoshard/runtime/test_expert_parallel_gloo8.py": "eight_ranks",
    "tests/autoshard/runtime/test_pipeline_tp_gloo.py": "eight_ranks",
    "tests/autoshard/runtime/test_gloo8.py": "eight_ranks",
    "tests/autoshard/search/test_pipeline_all_mm.py": "tiny_stage_pricing",
    "tests/autoshard/search/test_pipeline_selective.py": "tiny_stage_pricing",
}
"""Test modules that share an expensive session fixture (one spawn of 8 ranks; the tiny stage's solves),
by the fixture: under pytest-xdist they run on one worker, so it runs once. ``test_gloo8`` joins the
8-rank group although it spawns its own ranks: two spawns of 8 ranks at once (16 ranks on the CI's two
cores) crashed a gloo rank (SIGSEGV) once in four runs here; one after the other they never have."""

HEAVY_FIRST = (
    "eight_ranks", "tests/autoshard/runtime/test_context_parallel_gloo.py",
    "tests/autoshard/runtime/test_gloo.py", "tests/autoshard/runtime/test_api.py",
    "tests/autoshard/runtime/test_expert_parallel_gloo.py", "tests/autoshard/search/test_mesh_search.py",
    "tests/autoshard/runtime/test_mesh_choice.py", "tests/autoshard/runtime/test_pipeline_gloo.py",
    "tests/autoshard/calibrate/test_calibrate_ranks.py", "tests/autoshard/runtime/test_pipeline_api_gloo.py",
)
"""The longest work units (``--durations``, 2026-12-06: each 40-170 s), handed out first so that none
starts last and leaves one worker running alone. A stale list costs balance only."""


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``python -m pytest -n 2`` (the README's test command): pytest-xdist hands each worker whole test
    modules (their module fixtures, a spawn of ranks or a solve, set up once as in one process), the
    modules of :data:`SHARED_WORKER` together, the longest first (:data:`HEAVY_FIRST`). xdist's own
    ``loadgroup`` cannot do it under pytest 9 (it renames the node ids through an attribute pytest 9
    no longer reads)."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return SHARED_WORKER.get(path, path)

        def _assign_work_unit(self, node: Any) -> None:
            # the first call comes once the work queue (an OrderedDict of units) is built: heavy units first
            if not getattr(self, "heavy_first", False):
                self.heavy_first = True
                for scope in reversed(HEAVY_FIRST):
                    if scope in self.workqueue:
                        self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return ModuleScheduling(config, log)


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
