"""autoshard.calibrate.load: runnable threads of other processes counted from
/proc (a fake one here), the foreign-load flag at its threshold, and a
calibration under foreign load stored with its warning in the profile."""

from __future__ import annotations

import os

import pytest

from autoshard.calibrate.load import FOREIGN_THRESHOLD, LoadMonitor, foreign_runnable
from hw_profiles import LoadRecord, load, load_dict


def _task(root, pid: int, tid: int, state: str, comm: str = "job (x) y") -> None:
    folder = root / str(pid) / "task" / str(tid)
    folder.mkdir(parents=True)
    (folder / "stat").write_text(f"{tid} ({comm}) {state} 1 2 3\n")


def test_foreign_runnable_counts_running_threads_of_other_processes_only(tmp_path):
    _task(tmp_path, 100, 100, "R")  # ours
    _task(tmp_path, 100, 101, "R")  # ours, another thread
    _task(tmp_path, 200, 200, "R", comm="make (with) parens")  # a name with ") " inside: the state follows the last ")"
    _task(tmp_path, 200, 201, "S")
    _task(tmp_path, 300, 300, "R")
    (tmp_path / "self").mkdir()  # not a pid
    assert foreign_runnable({100}, proc=str(tmp_path)) == 2
    assert foreign_runnable({100}, proc=str(tmp_path / "missing")) is None


def test_record_flags_foreign_load_at_the_threshold():
    monitor = LoadMonitor(own_pids={os.getpid()}, own_threads=4)
    monitor.foreign = [0.0, 0.0, 1.0, 1.0]
    assert monitor.record().foreign_load == 0.5 and monitor.record().foreign  # at the threshold: flagged
    monitor.foreign = [0.0, 1.0, 0.0, 0.0]
    assert not monitor.record().foreign and FOREIGN_THRESHOLD == 0.5


def test_monitor_samples_while_running():
    monitor = LoadMonitor(own_pids={os.getpid()}, own_threads=1, interval_s=0.005)
    monitor.start()
    import time

    time.sleep(0.05)
    monitor.stop()
    record = monitor.record()
    assert len(record.during_load1) >= 3 and record.cores >= 1 and len(record.before) == 3
    assert "load average" in record.text()


def test_profile_calibrated_under_foreign_load_carries_the_flag_and_the_warning():
    from autoshard.calibrate.fit import FitError
    from autoshard.calibrate.output import assemble_profile
    from autoshard.calibrate.timing import Job

    cpu = load("cpu-gloo").to_dict()
    busy = LoadRecord(cores=2, own_threads=4, before=(6.0, 5.5, 5.0), after=(8.0, 6.5, 5.5),
                      foreign_runnable=(2.0, 3.0), foreign_load=2.5, foreign=True)
    data = assemble_profile(name="busy", job=Job.single(), threads=1, device=cpu["device"],
                            device_sources={}, interconnect=cpu["interconnect"], tier_sources={},
                            collective_errors={}, compute_errors={"matmul": FitError.of([0.1])},
                            measured_tiers=0, method="test", load=busy)
    profile = load_dict(data)
    assert profile.calibration.load.foreign and profile.calibration.load.foreign_load == 2.5
    (warning,) = profile.calibration.warnings
    assert warning.startswith("measured under foreign load") and "quiet host" in warning
    quiet = assemble_profile(name="quiet", job=Job.single(), threads=1, device=cpu["device"],
                             device_sources={}, interconnect=cpu["interconnect"], tier_sources={},
                             collective_errors={}, compute_errors={}, measured_tiers=0, method="test",
                             load=LoadRecord(2, 4, (0.1, 0.1, 0.1), (4.0, 2.0, 1.0)))
    assert "warnings" not in quiet["calibration"] and quiet["calibration"]["load"]["foreign"] is False


@pytest.mark.parametrize("foreign", [True, False])
def test_load_record_round_trips(foreign):
    record = LoadRecord(cores=2, own_threads=4, before=(1.0, 2.0, 3.0), after=(4.0, 5.0, 6.0),
                        during_load1=(3.5,), foreign_runnable=(1.0,), foreign_load=1.0, foreign=foreign)
    assert LoadRecord.from_dict(record.to_dict()) == record
