"""benchmarks/runtime_step.py: which profile prices the plans. --calibrate-first
measures one in the same run (the calibration command is faked here: a real
one takes minutes) and prices with it; without it, the named profile, and
the output says which and under what load."""

from __future__ import annotations

import argparse
import json
import subprocess

import pytest

from benchmarks.runtime_step import select_profile
from hw_profiles import load


def _args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"profile": "cpu-gloo", "calibrate_first": False, **kw})


def test_without_calibrating_the_named_profile_and_its_load_are_reported(tmp_path):
    profile, line = select_profile(_args(), tmp_path)
    assert profile == "cpu-gloo"
    from hw_profiles import load

    calibration = load("cpu-gloo").calibration
    assert line.startswith(f"Profile: cpu-gloo (calibrated {calibration.date}") and "Load average now" in line
    assert ("load average" in line) == (calibration.load is not None)  # the calibration's own load, when recorded


def test_calibrate_first_runs_a_quick_calibration_and_prices_with_its_profile(tmp_path, monkeypatch):
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        out = cmd[cmd.index("-o") + 1]
        data = load("cpu-gloo").to_dict()
        data["calibration"]["load"] = {"cores": 2, "own_threads": 4, "before": [0.1, 0.1, 0.1],
                                       "after": [3.9, 1.2, 0.5], "foreign_load": 0.0, "foreign": False}
        with open(out, "w") as handle:
            json.dump(data, handle)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(subprocess, "run", fake_run)
    profile, line = select_profile(_args(calibrate_first=True), tmp_path)
    (cmd,) = calls
    assert cmd[1:4] == ["-m", "autoshard.cli", "calibrate-hardware"] and "--quick" in cmd and "4" in cmd
    assert profile == str(tmp_path / "calibrated.json") and load(profile).calibration.load is not None
    assert "calibrated in this run" in line and "other processes' runnable threads" in line


def test_a_failed_calibration_stops_the_benchmark(tmp_path, monkeypatch):
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kwargs: subprocess.CompletedProcess(cmd, 1))
    with pytest.raises(SystemExit, match="calibration failed"):
        select_profile(_args(calibrate_first=True), tmp_path)
