"""The expert baselines' comparison: its module example, and the recomputation policies a baseline is tried with."""

from __future__ import annotations

import doctest
from types import SimpleNamespace

import autoshard.search.portfolio as portfolio


def _prep(regions: bool) -> SimpleNamespace:
    return SimpleNamespace(graph=SimpleNamespace(regions=("layers.0",) if regions else ()))


def test_a_layout_is_tried_with_the_policies_users_run_only_where_the_solver_chooses_them():
    assert portfolio.recompute_policies(_prep(True), "auto") == list(portfolio.BASELINE_POLICIES)
    assert portfolio.recompute_policies(_prep(False), "auto") == ["none"]  # nothing to recompute
    assert portfolio.recompute_policies(_prep(True), "full") == ["full"]  # the policy asked for


def test_the_module_example_holds():
    result = doctest.testmod(portfolio)
    assert result.attempted > 0 and result.failed == 0
