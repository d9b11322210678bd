"""``autoshard correct-profile``: the mode each flag asks for, and what it prints and writes."""

from __future__ import annotations

import argparse
import json

import pytest

from autoshard.calibrate import first_use
from autoshard.cli import correct_profile
from hw_profiles import load


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    correct_profile.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("flags, mode", [((), "here"), (("--remeasure",), "remeasure"), (("--calibrate",), "calibrate")])
def test_each_flag_asks_for_its_mode_and_the_profile_is_written(flags, mode, tmp_path, monkeypatch, capsys) -> None:
    asked = []
    base = load("cpu-gloo")
    record = {"mode": mode, "source": "cache", "date": "2026-11-28T20:00:00Z", "load": {},
              "machine": {"cpu": "some cpu", "cores": 2}, "ratios": {"launch": 1.5, "skew_s": 2e-3}}
    if mode == "calibrate":
        record["calibration"] = {"mode": "quick", "source": "measured", "date": "2026-11-28T19:58:00Z"}

    def fake(profile, *, ranks, mode):
        asked.append((ranks, mode))
        return profile, record

    monkeypatch.setattr(first_use, "corrected_profile", fake)
    out = tmp_path / "p.json"
    assert correct_profile.run(_args("--ranks", "3", *flags, "-o", str(out))) == 0
    assert asked == [(3, mode)]
    assert json.loads(out.read_text())["name"] == base.name
    printed = capsys.readouterr().out
    assert "launch: measured / profile 1.500" in printed and "skew:" in printed
    assert ("this machine calibrated (quick, measured" in printed) == (mode == "calibrate")


def test_remeasure_and_calibrate_are_one_or_the_other() -> None:
    with pytest.raises(SystemExit):
        _args("--remeasure", "--calibrate")
