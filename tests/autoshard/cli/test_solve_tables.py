"""``autoshard solve`` keeps its redistribution tables in the cache folder: a second solve reads
them and writes the same plan; the store is not left in use for the rest of the process."""

from __future__ import annotations

import json

from autoshard.cli import main
from costmodel.redistribute_disk import active_store


def _plan_without_wall_times(path) -> dict:
    plan = json.loads(path.read_text())
    for key in ("seconds", "timings"):
        plan["solver"].pop(key, None)
    return plan


def test_second_solve_reads_the_tables_and_writes_the_same_plan(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("AUTOSHARD_CACHE_DIR", str(tmp_path / "cache"))
    argv = ["solve", "examples.models.mlp:tiny", "--mesh", "2x2", "--profile", "cpu-gloo", "--time-limit", "20"]
    assert main([*argv, "-o", str(tmp_path / "first.json")]) == 0
    (tables,) = (tmp_path / "cache" / "redistribute").glob("*.npz")
    assert active_store() is None
    written = tables.stat().st_mtime_ns
    assert main([*argv, "-o", str(tmp_path / "second.json")]) == 0
    capsys.readouterr()
    assert tables.stat().st_mtime_ns == written  # every table was read back: nothing new to write
    assert _plan_without_wall_times(tmp_path / "first.json") == _plan_without_wall_times(tmp_path / "second.json")
