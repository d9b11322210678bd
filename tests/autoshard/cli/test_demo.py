"""``autoshard demo``: its tables read whole in an 80-column terminal, and a
first run's kernel compilation does not leave the solver table unproven."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("rich")

from autoshard.cli import demo  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
PROBLEM = ROOT / "examples" / demo.EXAMPLE_PROBLEM


def _console():
    from rich.console import Console

    return Console(width=80, record=True, file=io.StringIO(), color_system=None)


def _assert_fits(text: str) -> None:
    assert "…" not in text, f"a cell was truncated at 80 columns:\n{text}"
    assert max(len(line) for line in text.splitlines()) <= 80


def test_reshard_table_fits_80_columns():
    console = _console()
    demo.reshard_section(console)
    text = console.export_text()
    _assert_fits(text)
    assert "all_gather[0, 1]" in text


def test_solver_table_fits_80_columns_and_every_answer_checks():
    console = _console()
    demo.solver_section(console, PROBLEM, time_limit=20.0)
    text = console.export_text()
    _assert_fits(text)
    assert "MISMATCH" not in text
    rows = [line for line in text.splitlines() if line.startswith(("│ cbc", "│ cpsat"))]
    assert len(rows) == 2 and all(" ok " in row for row in rows)
    assert "cost ms" in text and "peak/limit" in text


def test_layout_table_fits_80_columns_with_every_policy_name():
    estimate = SimpleNamespace(step_s=1.234567, compute_s=1.2, comm_s=0.01, relayout_s=0.0,
                               peak_memory_bytes=123.45 * 2**20)
    plan = SimpleNamespace(estimate=estimate)
    rows = [("solved", "auto", plan, None), ("fsdp+tp", "selective", plan, None), ("ddp", "every:2", plan, None),
            ("fsdp", "none", None, "input tokens (batch 32) is not divisible by the mesh")]
    console = _console()
    console.print(demo.layout_table(rows))
    text = console.export_text()
    _assert_fits(text)
    assert "selective" in text and "every:2" in text and "1234.567" in text


def test_a_solve_left_unproven_by_compilation_runs_again(monkeypatch):
    import solver
    from solver import Status, load_problem

    problem = load_problem(PROBLEM)
    real = solver.solve(problem, backend="cpsat", time_limit=20.0)
    assert real.status is Status.OPTIMAL
    calls = []

    def fake_solve(p, backend, time_limit):
        calls.append(backend)
        if len(calls) == 1:  # the first run: compiled, out of time
            return replace(real, status=Status.TIMEOUT, stats={**real.stats, "compile_seconds": 19.0})
        return replace(real, stats={**real.stats, "compile_seconds": 0.0})

    monkeypatch.setattr(solver, "solve", fake_solve)
    solution, check, compiled, rerun = demo._solve_checked(problem, "cbc", 20.0)
    assert calls == ["cbc", "cbc"] and rerun and compiled == 19.0
    assert solution.status is Status.OPTIMAL and check == "ok"


def test_a_proven_solve_is_not_run_again(monkeypatch):
    import solver
    from solver import load_problem

    problem = load_problem(PROBLEM)
    real = solver.solve(problem, backend="cpsat", time_limit=20.0)
    calls = []

    def fake_solve(p, backend, time_limit):
        calls.append(backend)
        return replace(real, stats={**real.stats, "compile_seconds": 3.0})

    monkeypatch.setattr(solver, "solve", fake_solve)
    _, check, compiled, rerun = demo._solve_checked(problem, "cpsat", 20.0)
    assert calls == ["cpsat"] and not rerun and compiled == 3.0 and check == "ok"


def test_an_unproven_plan_gets_one_line_and_a_proven_one_none():
    assert demo.unproven_note("optimal", 0.0, 40.0) is None
    note = demo.unproven_note("timeout", 0.0123, 40.0)
    assert "\n" not in note and "gap 1.2%" in note and "--time-limit 40" in note
    assert "gap" not in demo.unproven_note("feasible", None, 20.0)


def test_demo_doctests():
    import doctest

    assert doctest.testmod(demo).failed == 0
