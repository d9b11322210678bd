"""The command-line solve benchmark (``benchmarks/cli_solve.py``): a child's plan gives its status
and phases, a failed child its last line, the children get their own cache folder, and the row says
whether the 10 s target was met."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.cli_solve import CliRun, _row, child_env, run_once, solve_command

FAKE_SOLVE = ("import json, sys; json.dump({'solver': {'status': 'optimal', 'timings': {'trace_s': 0.5, "
              "'build_s': 0.25}}}, open(sys.argv[1], 'w'))")


def test_a_child_that_writes_a_plan_reports_its_status_and_phases(tmp_path) -> None:
    plan = tmp_path / "p.json"
    run = run_once([sys.executable, "-c", FAKE_SOLVE, str(plan)], child_env(tmp_path, None), plan,
                   tmp_path / "log", None)
    assert run.status == "optimal" and run.phases == {"trace_s": 0.5, "build_s": 0.25}
    assert run.wall_s > 0 and run.cpu_s >= 0


def test_a_child_that_fails_reports_its_exit_code_and_last_line(tmp_path) -> None:
    plan = tmp_path / "p.json"
    cmd = [sys.executable, "-c", "import sys; print('autoshard solve: error: no such model', file=sys.stderr); "
           "sys.exit(2)"]
    run = run_once(cmd, child_env(tmp_path, None), plan, tmp_path / "log", str(tmp_path / "lock"))
    assert run.status == "rc=2: autoshard solve: error: no such model" and run.phases == {}


def test_children_get_their_own_cache_folder_and_bytecode_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    env = child_env(tmp_path / "cache", tmp_path / "pyc")
    assert env["AUTOSHARD_CACHE_DIR"] == str(tmp_path / "cache") and env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "pyc")
    assert "PYTHONDONTWRITEBYTECODE" not in env
    assert child_env(tmp_path, None)["PYTHONDONTWRITEBYTECODE"] == "1"


def test_the_row_meets_the_target_only_when_both_runs_do() -> None:
    fast, slow = CliRun(8.0, 7.0, "optimal", {"trace_s": 2.0}), CliRun(10.5, 9.0, "optimal", {"trace_s": 2.0})
    assert _row("hf_llama", fast, fast).endswith("| optimal | met |")
    assert _row("hf_mamba", slow, fast).endswith("| warm only |")
    assert _row("hf_mamba", slow, slow).endswith("| missed |")
    assert "| 6.0 |" in _row("hf_llama", fast, fast)  # other = wall - phases


def test_the_command_is_the_users() -> None:
    cmd = solve_command("hf_mamba2", "2x2", "cpu-gloo", Path("/tmp/p.json"))
    assert cmd[1:] == ["-m", "autoshard.cli", "solve", "examples.models.hf:hf_mamba2", "--mesh", "2x2",
                       "--profile", "cpu-gloo", "-o", "/tmp/p.json"]
