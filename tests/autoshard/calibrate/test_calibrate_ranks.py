"""``autoshard calibrate-hardware`` on 4 real gloo ranks (CPU).

* a calibration under ``torchrun`` (test-sized ``--tiny`` set) writes a
  profile that validates and loads, and its alpha-beta and compute fits
  reproduce the measured times within the errors the profile stores;
* SIGINT to the process group mid-run (``--nproc-per-node``) and a failed rank
  leave the previous profile byte-identical, print one line, exit non-zero
  and leave no temporary file;
* ``--check`` on one process writes the accuracy report and the plot.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from autoshard.calibrate.fit import predict_compute
from autoshard.calibrate.measure_compute import ComputeSample
from costmodel.collectives import collective_time_s
from costmodel.mesh import MeshSpec
from hw_profiles import load

ROOT = Path(__file__).resolve().parents[3]
OLD = '{"previous": "profile"}\n'


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return {**env, **extra}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "autoshard.cli", "calibrate-hardware", *args]


def test_torchrun_tiny_calibration_writes_a_profile_whose_fits_hold(tmp_path):
    out, raw = tmp_path / "cpu-test.json", tmp_path / "raw.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", "-m",
           "autoshard.cli", "calibrate-hardware", "-o", str(out), "--tiny", "--measurements", str(raw)]
    done = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    profile = load(out)  # validates
    assert profile.name == "cpu-test" and profile.source == "measured" and profile.calibration.ranks == 4
    assert "one of 4 ranks" in profile.device.name
    fit_error = dict(profile.calibration.fit_error)
    data = json.loads(raw.read_text())
    mesh = MeshSpec(tuple(data["mesh"]["shape"]), tuple(data["mesh"]["dim_names"]))
    kinds = set()
    for s in data["collectives"]:
        predicted = collective_time_s(s["kind"], s["nbytes"], tuple(s["mesh_dims"]), mesh, profile)
        bound = fit_error[f"loopback.{s['kind']}"]
        assert abs(predicted - s["seconds"]) / s["seconds"] <= bound + 1e-9, s
        kinds.add(s["kind"])
    assert kinds == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "permute"}
    assert {tuple(s["mesh_dims"]) for s in data["collectives"]} == {(0,), (1,), (0, 1)}
    from autoshard.calibrate.runner import ERROR_GROUPS

    groups = set()
    for s in map(ComputeSample.from_dict, data["compute"]):
        for group, member in ERROR_GROUPS.items():
            if member(s, "fp32") and group in fit_error:
                assert abs(predict_compute(s, profile) - s.seconds) / s.seconds <= fit_error[group] + 1e-9, (group, s)
                groups.add(group)
    assert {"launch", "matmul", "attention", "attention_backward", "access"} <= groups
    # the new figures: a floor for scalar operands, a run curve, curves per dtype, the load
    assert profile.device.launch_scalar_s and profile.device.efficiency.run
    assert profile.device.efficiency.matmul_by_dtype and profile.calibration.load is not None
    # the overlap contention, measured by the calibration itself (it used to be copied in by hand)
    assert profile.overlap is not None and profile.overlap.source.startswith("measured")
    assert 0.0 <= profile.overlap.contention <= 1.0


def _collect(stream) -> list[str]:
    """Lines of ``stream``, read by a thread as they come."""
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(stream.readline, "")), daemon=True).start()
    return lines


def test_sigint_mid_run_leaves_the_old_profile_byte_identical(tmp_path):
    out = tmp_path / "cpu.json"
    out.write_text(OLD)
    proc = subprocess.Popen(_cli("--nproc-per-node", "4", "-o", str(out), "--quick"), cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines = _collect(proc.stderr)
    try:
        deadline = time.monotonic() + 90
        while not any("measuring" in line for line in lines) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert any("measuring" in line for line in lines), lines
        time.sleep(1.5)  # mid-run: the quick set takes ~30 s
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    time.sleep(0.2)
    assert proc.returncode == 130
    lines = [line.strip() for line in lines if line.strip() and "measuring" not in line]
    assert lines == [f"autoshard calibrate-hardware: interrupted; {out} left unchanged"], lines
    assert out.read_text() == OLD
    assert [p.name for p in tmp_path.iterdir()] == ["cpu.json"]


def _rank_pid(parent: int, rank: int) -> int:
    """The pid of the child of ``parent`` (``--nproc-per-node``) that runs ``rank``."""
    for pid in Path(f"/proc/{parent}/task/{parent}/children").read_text().split():
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"RANK={rank}".encode() in environ:
            return int(pid)
    raise AssertionError(f"no child of {parent} runs rank {rank}")


def _started(proc: subprocess.Popen, lines: list[str]) -> None:
    deadline = time.monotonic() + 90
    while not any("measuring" in line for line in lines) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert any("measuring" in line for line in lines), lines


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="finds the ranks' processes in /proc")
def test_a_rank_that_dies_is_reported_as_that_ranks_failure_not_as_an_interrupt(tmp_path):
    out = tmp_path / "cpu.json"
    out.write_text(OLD)
    proc = subprocess.Popen(_cli("--nproc-per-node", "4", "-o", str(out), "--quick"), cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines = _collect(proc.stderr)
    try:
        _started(proc, lines)
        os.kill(_rank_pid(proc.pid, 2), signal.SIGKILL)  # as the out-of-memory killer would; a crash is alike
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    time.sleep(0.2)
    lines = [line.strip() for line in lines if line.strip() and "measuring" not in line]
    assert proc.returncode == 1, lines
    assert lines == [f"autoshard calibrate-hardware: rank 2 was killed by SIGKILL (out of memory? the system log "
                     f"says); {out} left unchanged"], lines
    assert out.read_text() == OLD
    assert [p.name for p in tmp_path.iterdir()] == ["cpu.json"]


def test_sigterm_is_reported_as_a_stop_not_as_an_interrupt(tmp_path):
    out = tmp_path / "cpu.json"
    proc = subprocess.Popen(_cli("-o", str(out), "--quick"), cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines = _collect(proc.stderr)
    try:
        _started(proc, lines)
        time.sleep(1.5)  # mid-run, as the SIGINT test: not while the start-up still imports
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    time.sleep(0.2)
    lines = [line.strip() for line in lines if line.strip() and "measuring" not in line]
    assert proc.returncode == 143, lines
    assert lines == [f"autoshard calibrate-hardware: stopped by SIGTERM; nothing written to {out}"], lines
    assert list(tmp_path.iterdir()) == []


def test_failed_rank_leaves_the_old_profile_and_says_so_in_one_line(tmp_path):
    out = tmp_path / "cpu.json"
    out.write_text(OLD)
    done = subprocess.run(_cli("--nproc-per-node", "4", "-o", str(out), "--tiny"), cwd=ROOT, capture_output=True,
                          text=True, timeout=150, env=_env(AUTOSHARD_CALIBRATE_TEST_FAIL_RANK="2"))
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.strip() and "measuring" not in line]
    assert lines == [f"autoshard calibrate-hardware: rank 2: injected failure on rank 2 "
                     f"(AUTOSHARD_CALIBRATE_TEST_FAIL_RANK); {out} left unchanged"], done.stderr
    assert out.read_text() == OLD
    assert [p.name for p in tmp_path.iterdir()] == ["cpu.json"]


def test_check_writes_report_and_plot(tmp_path):
    report, plot = tmp_path / "report.md", tmp_path / "check.png"
    done = subprocess.run(_cli("--check", "cpu-gloo", "--tiny", "--report", str(report), "--plot", str(plot)),
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    text = report.read_text()
    assert "| compute |" in text and "## Per kind" in text and "examples.models.llama3:tiny" in text
    assert "## Drift of the machine since the calibration" in text  # fit-set items measured again
    # the load: this check's (sampled) and the calibration's (recorded in the profile)
    assert "- machine load during this check: load average (1/5/15 min)" in text
    assert "- machine load during the calibration: " in text and "other processes' runnable threads" in text
    kinds = {line.split("|")[2].strip() for line in text.splitlines() if line.startswith("| compute | ")}
    assert {"matmul", "elementwise", "attention"} <= kinds
    assert plot.stat().st_size > 10_000 and plot.read_bytes()[:4] == b"\x89PNG"
    assert text in done.stdout


@pytest.mark.parametrize("args,message", [
    ((), "give -o PROFILE.json"),
    (("-o", "x.json", "--check", "cpu-gloo"), "-o and --check"),
    (("--check", "no-such-profile"), "unknown name"),
    (("-o", "/no/such/dir/x.json"), "does not exist"),
    (("-o", "x.json", "--mesh", "2x"), "mesh"),
])
def test_bad_arguments_are_one_line_errors(args, message):
    done = subprocess.run(_cli(*args), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and message in done.stderr, done.stderr


def test_a_calibration_says_its_overlap_contention_measured_or_not():
    """The tiny 4-rank calibration above measures it (``measure_overlap``); one rank cannot, and
    the profile then says so instead of being read as full overlap."""
    from autoshard.calibrate.measure_overlap import unmeasured_overlap
    from autoshard.calibrate.timing import Job

    cpu = unmeasured_overlap(Job.single(), None)
    assert cpu["contention"] == 1.0 and cpu["source"].startswith("not measured")
    gloo = load("cpu-gloo")
    copied = unmeasured_overlap(Job.single(), gloo)
    assert copied["contention"] == gloo.overlap.contention and "copied from cpu-gloo" in copied["source"]
    # a base without a figure (the GPU profiles) does not stand for a measurement either
    assert unmeasured_overlap(Job.single(), load("h100-sxm-80gb"))["contention"] == 1.0
