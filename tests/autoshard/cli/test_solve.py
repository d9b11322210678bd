"""``autoshard solve`` and ``autoshard explain``: plans written, bad input refused in one line."""

from __future__ import annotations

import json

import pytest

from autoshard.cli import main
from autoshard.plan.format import Plan


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_solve_writes_a_plan_and_explain_reads_it(capsys, tmp_path) -> None:
    plan_path, problem_path, png = tmp_path / "plan.json", tmp_path / "problem.json", tmp_path / "memory.png"
    code, out, err = _run(capsys, "solve", "examples.models.mlp:tiny", "--kwargs", '{"batch_size": 16}',
                          "--mesh", "2x2", "--dims", "dp,tp", "--profile", "cpu-gloo", "--time-limit", "20",
                          "--pin", "layers.*.w1.weight=RR", "--dump-problem", str(problem_path),
                          "--compare-baselines", "-o", str(plan_path))
    assert code == 0, err
    plan = Plan.load(plan_path)
    assert plan.params["layers.1.w1.weight"] == "RR"
    assert "| layout | recompute | step ms" in out and "| ddp | none |" in out and "| solved |" in out
    problem = json.loads(problem_path.read_text())
    assert problem["format"] == "autoshard.problem/1" and len(problem["nodes"]) == plan.solver.problem_nodes
    code, out, err = _run(capsys, "explain", str(plan_path), "--plot", str(png))
    assert code == 0, err
    assert "| parameter | placement |" in out and "peak memory" in out
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("argv, message", [
    (["--mesh", "2x2", "--dims", "dp"], "--mesh/--dims"),
    (["--mesh", "2", "--profile", "no-such-gpu"], "unknown name 'no-such-gpu'"),
    (["--mesh", "2", "--memory-limit", "lots"], "--memory-limit"),
    (["--mesh", "2", "--pin", "*.nothing=R"], "matches no parameter"),
    (["--mesh", "2", "--pin", "layers.0.w1.weight=S(7)"], "cannot take S(7)"),
    (["--mesh", "2", "--kwargs", '{"no_such_field": 1}'], "no_such_field"),
    (["--mesh", "2", "--time-limit", "-1"], "--time-limit"),
])
def test_bad_input_gets_one_line_and_exit_2(capsys, tmp_path, argv, message) -> None:
    out_path = tmp_path / "plan.json"
    code, _, err = _run(capsys, "solve", "examples.models.mlp:tiny", *argv, "-o", str(out_path))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err and not out_path.exists()


def test_infeasible_memory_limit_exits_1_with_the_smallest_peak(capsys, tmp_path) -> None:
    out_path = tmp_path / "plan.json"
    code, _, err = _run(capsys, "solve", "examples.models.mlp:tiny", "--mesh", "2", "--memory-limit", "1KiB",
                        "--time-limit", "10", "-o", str(out_path))
    assert code == 1 and "smallest peak found" in err and not out_path.exists()


def test_explain_of_a_bad_file_is_one_line(capsys, tmp_path) -> None:
    bad = tmp_path / "plan.json"
    bad.write_text('{"format": "other"}')
    code, _, err = _run(capsys, "explain", str(bad))
    assert code == 2 and "format" in err and len(err.strip().splitlines()) == 1


def test_a_rule_that_fails_while_building_is_one_line_and_nothing_is_written(capsys, tmp_path, monkeypatch) -> None:
    import torch

    from autoshard.rules.registry import RuleRegistry

    strategies = RuleRegistry.strategies

    def failing_on_addmm(self, op, *args, **kwargs):  # a rule that raises on one call of the model
        if op is torch.ops.aten.addmm.default:
            raise IndexError("deliberately broken rule")
        return strategies(self, op, *args, **kwargs)

    monkeypatch.setattr(RuleRegistry, "strategies", failing_on_addmm)
    out_path, problem_path = tmp_path / "plan.json", tmp_path / "problem.json"
    code, out, err = _run(capsys, "solve", "examples.models.mlp:tiny", "--mesh", "2x2", "--dims", "dp,tp",
                          "--profile", "cpu-gloo", "--dump-problem", str(problem_path), "-o", str(out_path))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "node addmm (aten.addmm.default)" in lines[0] and "f32[8, 16]" in lines[0]
    assert "IndexError: deliberately broken rule" in lines[0]
    assert list(tmp_path.iterdir()) == []  # no plan, no problem, no temporary


def test_a_plan_over_the_device_once_reserved_is_refused_unless_allowed(capsys, tmp_path) -> None:
    """An H100 profile whose device holds 82 MiB (no headroom): the MLP's replicated plan peaks
    at 80.3 MiB live but its caching allocator reserves 84 MiB. Every parameter pinned
    replicated, no plan fits once reserved: exit 1, as for a memory limit no plan meets, unless
    --allow-over-reservation."""
    from pathlib import Path

    import hw_profiles

    profile = json.loads((Path(hw_profiles.__file__).parent / "data" / "h100-sxm-80gb.json").read_text())
    profile["name"] = "h100-82mib"
    profile["device"].update(memory_bytes=82 * 2**20, allocator_headroom=0.0)
    path = tmp_path / "h100-82mib.json"
    path.write_text(json.dumps(profile))
    out_path = tmp_path / "plan.json"
    argv = ["solve", "examples.models.mlp:tiny", "--kwargs", '{"dim": 512, "hidden_dim": 2048, "batch_size": 64}',
            "--mesh", "4", "--profile", str(path), "--time-limit", "20", "--pin", "*=R", "-o", str(out_path)]
    code, _, err = _run(capsys, *argv)
    assert code == 1 and "allocator's reservation" in err and "--allow-over-reservation" in err, err
    assert not out_path.exists()
    code, _, err = _run(capsys, *argv, "--allow-over-reservation")
    assert code == 0, err
    plan = Plan.load(out_path)
    assert plan.estimate.peak_memory_bytes <= 82 * 2**20 < plan.estimate.reserved_bytes


def test_the_command_as_a_process_ends_at_once_with_its_output_flushed(tmp_path) -> None:
    """Run as the process, ``autoshard solve`` ends without the interpreter's teardown
    (``autoshard.cli._EXIT_AT_ONCE``): what it printed into a pipe (block-buffered) and the plan it
    wrote are whole, and the exit code is the command's."""
    import subprocess
    import sys

    out_path = tmp_path / "plan.json"
    base = [sys.executable, "-m", "autoshard.cli", "solve", "examples.models.mlp:tiny", "--mesh", "2",
            "--profile", "cpu-gloo", "--time-limit", "20"]
    done = subprocess.run([*base, "-o", str(out_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith(f"plan written to {out_path}") and "| parameter | placement |" in done.stdout
    assert Plan.load(out_path).fingerprint.mesh_shape == (2,)
    bad = subprocess.run([*base, "--memory-limit", "lots"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("autoshard solve: error: --memory-limit"), bad.stderr
