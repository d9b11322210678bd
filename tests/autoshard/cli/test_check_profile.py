"""``autoshard check-profile``: every shipped profile passes, by name and by
file; a bad one among good ones is one error line and exit code 1. (Each
kind of bad file has its row in ``test_cli_bad_input.py``.)"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from autoshard.cli.check_profile import run
from hw_profiles import available, load

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = sorted((ROOT / "hw_profiles" / "data").glob("*.json"))


def _check(capsys: pytest.CaptureFixture[str], *profiles: str) -> tuple[int, list[str], list[str]]:
    code = run(argparse.Namespace(profiles=list(profiles)))
    out = capsys.readouterr()
    return code, out.out.splitlines(), out.err.splitlines()


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_profile_passes_by_file_and_by_name(capsys: pytest.CaptureFixture[str], path: Path) -> None:
    code, out, err = _check(capsys, str(path), path.stem)
    assert code == 0 and err == []
    profile = load(path.stem)
    summary = f"({profile.name}, {profile.source}: {profile.device.name}, "
    assert out[0].startswith(f"ok: {path} {summary}") and out[1].startswith(f"ok: {path.stem} {summary}")
    assert out[0].split(" ", 2)[2] == out[1].split(" ", 2)[2] and f"tiers {profile.interconnect[0].tier}" in out[0]


def test_the_summary_names_the_profile_its_memory_and_tiers(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _check(capsys, "h100-sxm-80gb")
    assert code == 0
    assert out[0].startswith("ok: h100-sxm-80gb (h100-sxm-80gb, measured: ")
    assert "GiB, tiers nvlink(8) > " in out[0]


def test_a_bad_file_among_good_ones_is_one_error_line_and_exit_1(capsys: pytest.CaptureFixture[str],
                                                                  tmp_path: Path) -> None:
    bad = load("cpu-gloo").to_dict()
    bad["interconnect"][0]["collectives"]["all_reduce"]["beta_s_per_byte"] = 0.0
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    code, out, err = _check(capsys, "cpu-gloo", str(tmp_path / "bad.json"), "b200")
    assert code == 1
    assert [line.split(" ")[1] for line in out] == ["cpu-gloo", "b200"]
    assert err == [f"autoshard check-profile: error: {tmp_path / 'bad.json'}: "
                   "interconnect[0].collectives.all_reduce.beta_s_per_byte: 0.0 is less than the minimum of 1e-16"]


def test_a_calibrated_profile_written_elsewhere_passes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    data = load("cpu-gloo").to_dict()
    data["name"] = "my-cpu"
    (tmp_path / "my-cpu.json").write_text(json.dumps(data, indent=1))
    code, out, _ = _check(capsys, str(tmp_path / "my-cpu.json"))
    assert code == 0 and out[0].startswith(f"ok: {tmp_path / 'my-cpu.json'} (my-cpu, measured: ")


def test_the_command_line_runs_without_torch() -> None:
    code = ("import sys; from autoshard.cli import main; rc = main(['check-profile', *sys.argv[1:]]); "
            "print('torch' in sys.modules, rc, file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", code, *available()], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.stderr.strip() == "False 0", result.stderr
    assert len(result.stdout.splitlines()) == len(available())
