"""Process groups end with the job: after ``destroy_process_groups`` no gloo
worker thread is left to outlive the interpreter (one that is left may abort
the rank at exit: ``autoshard.runtime.process_group``), whatever the runtime
imported after the group was created and whatever reference cycles hold a
flattened mesh."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from gloo_ranks import spawn, teardown  # noqa: E402


def test_destroy_process_groups_leaves_no_gloo_thread_behind(tmp_path):
    results = spawn(4, teardown, (), tmp_path / "ranks")
    for rank, result in enumerate(results):
        assert result["after_destroy_process_groups"] == 0, (rank, result)
        assert result["nn_defaults_holding_a_group"] == [], (rank, result)
