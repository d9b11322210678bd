"""The profile corrected at first use (``autoshard.calibrate.first_use``): measured
once per machine key and cached as JSON, a corrupt cache file warned about once and
measured again, and the plan records which correction priced it."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest

from hw_profiles import load
from hw_profiles.correction import ProfileCorrection, ReferenceTime

from autoshard.calibrate import correction_cache, first_use
from autoshard.plan.options import SolveOptions

BASE = load("cpu-gloo")


@pytest.fixture
def fake_measure(monkeypatch):
    """Replace the measurement by synthetic times (launches 2x slower): counts the calls."""
    calls = []

    def fake(profile, ranks, key):
        calls.append(key)
        return ProfileCorrection(profile.fingerprint, key, "2026-11-27T00:00:00Z",
                                 (ReferenceTime("add 1", "launch", 1.0, 4e-6, 8e-6),), {"before": [0.1, 0.1, 0.1]})

    monkeypatch.setattr(first_use, "_measure_spawned", fake)
    return calls


def test_measured_once_then_read_from_the_cache(tmp_path, fake_measure) -> None:
    profile, record = first_use.corrected_profile(BASE, ranks=4, folder=tmp_path)
    assert record["source"] == "measured" and record["ratios"] == {"launch": 2.0}
    assert profile.device.launch_s == pytest.approx(2 * BASE.device.launch_s)
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["format"] == "autoshard.profile_correction/1"
    again, record2 = first_use.corrected_profile(BASE, ranks=4, folder=tmp_path)
    assert record2["source"] == "cache" and again == profile
    assert len(fake_measure) == 1


def test_another_key_misses(tmp_path, fake_measure) -> None:
    first_use.corrected_profile(BASE, ranks=4, folder=tmp_path)
    first_use.corrected_profile(BASE, ranks=2, folder=tmp_path)  # other ranks on the host
    other = load("h100-sxm-80gb")  # another profile fingerprint
    first_use.corrected_profile(other, ranks=4, folder=tmp_path)
    assert len(fake_measure) == 3 and len(list(tmp_path.glob("*.json"))) == 3
    assert {k["ranks"] for k in fake_measure} == {2, 4}


def test_remeasure_ignores_the_cache(tmp_path, fake_measure) -> None:
    first_use.corrected_profile(BASE, ranks=4, folder=tmp_path)
    _, record = first_use.corrected_profile(BASE, ranks=4, folder=tmp_path, mode="remeasure")
    assert record["source"] == "measured" and len(fake_measure) == 2


def test_a_correction_under_foreign_load_is_reused_by_this_process_only(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(first_use, "_LOADED", {})
    calls = []

    def busy(profile, ranks, key):
        calls.append(key)
        return ProfileCorrection(profile.fingerprint, key, "2026-11-27T00:00:00Z",
                                 (ReferenceTime("add 1", "launch", 1.0, 4e-6, 8e-6),), {"foreign_load": 1.5})

    monkeypatch.setattr(first_use, "_measure_spawned", busy)
    profile, record = first_use.corrected_profile(BASE, ranks=4, folder=tmp_path)
    assert record["source"] == "measured under foreign load, not cached" and len(calls) == 1
    again, record = first_use.corrected_profile(BASE, ranks=4, folder=tmp_path)
    assert record["source"] == "measured under foreign load earlier in this process, not cached"
    assert again == profile and len(calls) == 1 and not list(tmp_path.glob("*.json"))  # never on disk
    first_use.corrected_profile(BASE, ranks=2, folder=tmp_path)  # another key is measured
    first_use.corrected_profile(BASE, ranks=4, folder=tmp_path, mode="remeasure")  # measures again
    assert len(calls) == 3
    monkeypatch.setattr(first_use, "LOADED_REUSE_S", 0.0)  # older than the reuse window: measured again
    _, record = first_use.corrected_profile(BASE, ranks=4, folder=tmp_path)
    assert record["source"] == "measured under foreign load, not cached" and len(calls) == 4


def test_a_quiet_measurement_replaces_the_loaded_one_in_memory_and_on_disk(tmp_path, monkeypatch,
                                                                            fake_measure) -> None:
    key = json.dumps(correction_cache.machine_key(BASE.fingerprint, ranks=4), sort_keys=True)
    loaded = ProfileCorrection(BASE.fingerprint, {}, "2026-11-27T00:00:00Z", (), {"foreign_load": 2.0})
    monkeypatch.setattr(first_use, "_LOADED", {key: (0.0, loaded)})  # measured long ago
    _, record = first_use.corrected_profile(BASE, ranks=4, folder=tmp_path)
    assert record["source"] == "measured" and first_use._LOADED == {} and len(list(tmp_path.glob("*.json"))) == 1


@pytest.mark.parametrize("busy", [False, True])
def test_a_measurement_under_foreign_load_stops_after_fewer_rounds(monkeypatch, busy) -> None:
    from types import SimpleNamespace

    from autoshard.calibrate.timing import Job, Settings

    timed: list[int] = []  # per measure() call: the round it belongs to (the times 1, 2, ... by round)
    asked: list[int] = []  # the rounds done when loaded() was asked
    monkeypatch.setattr(first_use, "measure", lambda job, fn, settings: SimpleNamespace(
        seconds=float(timed.append(len(timed) // 2) or timed[-1] + 1)))

    def loaded() -> bool:
        asked.append(len(timed) // 2)
        return busy

    fast = Settings(warmup=0, trials=1, min_trial_s=0.0)
    best, typical = first_use._interleaved(Job.single(), [lambda: None, lambda: None], [fast, fast], loaded)
    rounds = first_use.LOADED_ROUNDS if busy else first_use.ROUNDS
    assert first_use.LOADED_ROUNDS < first_use.ROUNDS
    assert len(timed) == 2 * rounds and best == [1.0, 1.0]  # every call timed in each round kept; fastest
    assert typical == [float(rounds // 2 + 1)] * 2  # the median round of those kept
    # asked only once the minimum is measured, then before each further round
    assert asked == ([first_use.LOADED_ROUNDS] if busy else list(range(first_use.LOADED_ROUNDS, first_use.ROUNDS)))


@pytest.mark.parametrize("text", ["{not json", json.dumps({"format": "autoshard.profile_correction/1"}), "[]"])
def test_a_corrupt_cache_file_warns_once_and_measures_again(tmp_path, fake_measure, text) -> None:
    first_use.corrected_profile(BASE, ranks=4, folder=tmp_path)
    (path,) = tmp_path.glob("*.json")
    path.write_text(text)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, record = first_use.corrected_profile(BASE, ranks=4, folder=tmp_path)
    lines = [str(w.message) for w in caught if "profile correction cache" in str(w.message)]
    assert len(lines) == 1 and "measuring again" in lines[0] and "\n" not in lines[0]
    assert record["source"] == "measured" and len(fake_measure) == 2
    assert ProfileCorrection.from_dict(json.loads(path.read_text())).ratios == {"launch": 2.0}  # rewritten


def test_a_cache_file_of_another_key_is_not_used(tmp_path, fake_measure) -> None:
    first_use.corrected_profile(BASE, ranks=4, folder=tmp_path)
    (path,) = tmp_path.glob("*.json")
    data = json.loads(path.read_text())
    data["machine"]["cpu"] = "another CPU"
    path.write_text(json.dumps(data))
    with pytest.warns(RuntimeWarning, match="another machine's key"):
        first_use.corrected_profile(BASE, ranks=4, folder=tmp_path)
    assert len(fake_measure) == 2


def test_the_default_folder_is_under_the_users_cache(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("AUTOSHARD_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert correction_cache.cache_dir() == tmp_path / "autoshard" / "profile-corrections"


def test_auto_corrects_only_a_cpu_profile_that_runs_here() -> None:
    assert first_use.resolve_mode("auto", BASE, runs_here=True) == "here"
    assert first_use.resolve_mode("auto", BASE, runs_here=False) == "off"
    assert first_use.resolve_mode("auto", load("h100-sxm-80gb"), runs_here=True) == "off"
    with pytest.raises(ValueError, match="profile_correction"):
        SolveOptions(profile_correction="sometimes")


def test_the_plan_records_the_correction_and_keeps_the_profiles_fingerprint(tmp_path, monkeypatch,
                                                                            fake_measure) -> None:
    from autoshard.search.solve import prepare, solve_prepared
    from examples.models import mlp

    monkeypatch.setenv("AUTOSHARD_CACHE_DIR", str(tmp_path))
    model, inputs = mlp.tiny()
    off = prepare(model, inputs, (2,), profile="cpu-gloo")
    assert off.options["profile_correction"] == {"mode": "off"}  # offline: auto is off
    here = prepare(model, inputs, (2,), profile="cpu-gloo", profile_correction="here", traced=off.traced)
    plan = solve_prepared(here, time_limit=20)
    record = plan.options["profile_correction"]
    assert record["mode"] == "here" and record["ratios"] == {"launch": 2.0} and record["machine"]["ranks"] == 2
    assert plan.fingerprint.profile == BASE.fingerprint  # the plan loads against the profile as named
    assert here.graph.profile.device.launch_s == pytest.approx(2 * BASE.device.launch_s)  # priced corrected
    assert plan.estimate.compute_s > solve_prepared(off, time_limit=20).estimate.compute_s


def test_a_real_measurement_on_one_process(tmp_path) -> None:
    """A few seconds of reference ops on this machine: every family but collectives (no ranks)."""
    profile, record = first_use.corrected_profile(BASE, ranks=1, folder=tmp_path)
    # measured either way; beside other work (a busy CI host) it says so and is not cached
    assert record["source"] in ("measured", "measured under foreign load, not cached")
    ratios = dict(record["ratios"])
    step_op_s, step_byte_s = ratios.pop("step_op_s"), ratios.pop("step_byte_s")
    matmul_byte_s = ratios.pop("matmul_byte_s")  # the thin GEMM's cost per byte packed
    assert 0.0 <= matmul_byte_s < 1e-8 and profile.device.matmul_byte_s == pytest.approx(matmul_byte_s, rel=1e-3)
    assert set(ratios) == {"launch", "matmul", "memory", "vector"}
    assert all(0.01 < r < 100 for r in ratios.values())
    assert 0.0 <= step_op_s < 0.01 and profile.device.step_op_s == pytest.approx(step_op_s, rel=1e-3)
    assert 0.0 <= step_byte_s < 1e-8 and profile.device.step_byte_s == pytest.approx(step_byte_s, rel=1e-3)
    assert profile.name == "cpu-gloo+corrected"


def test_every_op_of_a_step_pays_the_step_cost_and_views_do_not() -> None:
    """The strategy graph adds ``step_op_s`` to each op's compute (``autoshard.graph.builder``)."""
    import dataclasses

    from autoshard.search.solve import prepare
    from examples.models import mlp

    model, inputs = mlp.tiny()
    base = prepare(model, inputs, (1,), profile="cpu-gloo", recompute="none")
    stepped = dataclasses.replace(BASE, device=dataclasses.replace(BASE.device, step_op_s=1e-3))
    more = prepare(model, inputs, (1,), profile=stepped, recompute="none", traced=base.traced)
    paid = free = 0
    for a, b in zip(base.graph.nodes, more.graph.nodes):
        if a.kind != "op":
            continue
        for ca, cb in zip(a.compute_s, b.compute_s):
            if ca == 0.0 and cb == 0.0:  # a view: no kernel, no step cost
                free += 1
            else:
                assert cb == pytest.approx(ca + 1e-3)
                paid += 1
    assert paid > 0 and free > 0  # the tiny MLP has both (mm, t / view)


def test_every_op_of_a_step_pays_for_the_bytes_it_touches() -> None:
    """``step_byte_s`` adds the op's bytes (as the rules price them) times it to each op of a step: an
    op of many bytes pays more than an op of few (a per-op figure could not tell them apart)."""
    from autoshard.search.solve import prepare
    from examples.models import mlp

    model, inputs = mlp.tiny()
    base = prepare(model, inputs, (1,), profile="cpu-gloo", recompute="none")
    per_byte = 1e-9
    stepped = dataclasses.replace(BASE, device=dataclasses.replace(BASE.device, step_byte_s=per_byte))
    more = prepare(model, inputs, (1,), profile=stepped, recompute="none", traced=base.traced)
    extra = sorted({round((cb - ca) / per_byte) for a, b in zip(base.graph.nodes, more.graph.nodes)
                    if a.kind == "op" for ca, cb in zip(a.compute_s, b.compute_s)})
    assert extra[0] == 0 and len(extra) > 2  # views pay nothing; the ops pay by their bytes, unequally
    mm = next(n for n in more.graph.nodes if n.target == "aten.mm.default")
    a, b = mm.outputs[0].shape  # the bytes of mm's output at least (its inputs too)
    assert (mm.compute_s[0] - base.graph.nodes[more.graph.nodes.index(mm)].compute_s[0]) / per_byte >= a * b * 4


def test_calibrate_measures_this_machine_once_then_corrects_that_profile(tmp_path, monkeypatch,
                                                                       fake_measure) -> None:
    """``profile_correction="calibrate"``: a real (tiny) calibrate-hardware on 2 local ranks, cached
    per machine; the step correction then applies to the calibrated profile (its own key)."""
    monkeypatch.setattr(first_use, "CALIBRATION", "tiny")
    runs = []
    real = first_use._calibrate_spawned

    def calibrate(p, r):  # the real one, its load record dropped: whether it is cached must not hang on
        runs.append(r)    # what else the machine runs meanwhile (that rule has its own test)
        calibrated = real(p, r)
        return dataclasses.replace(calibrated, calibration=dataclasses.replace(calibrated.calibration, load=None))

    monkeypatch.setattr(first_use, "_calibrate_spawned", calibrate)
    profile, record = first_use.corrected_profile(BASE, ranks=2, mode="calibrate", folder=tmp_path)
    calibration = record["calibration"]
    assert record["mode"] == "calibrate" and calibration["source"] == "measured" and runs == [2]
    assert calibration["profile"].startswith("cpu-gloo-calibrated-here@") and calibration["mode"] == "tiny"
    assert fake_measure[-1]["profile"] == calibration["profile"]  # the correction is of the calibrated profile
    assert profile.name == "cpu-gloo-calibrated-here+corrected" and profile.source == "measured"
    assert profile.device.launch_s != BASE.device.launch_s
    again, record2 = first_use.corrected_profile(BASE, ranks=2, mode="calibrate", folder=tmp_path)
    assert record2["calibration"]["source"] == "cache" and runs == [2] and again == profile


def test_a_calibration_that_fails_is_one_error_line_and_nothing_cached(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(first_use, "CALIBRATION", "no-such-mode")
    with pytest.raises(RuntimeError, match="the calibration of this machine failed: .*no-such-mode"):
        first_use.calibrated_profile(BASE, ranks=1, folder=tmp_path)
    assert not list(tmp_path.glob("*.json"))


def test_a_calibration_under_foreign_load_is_used_but_not_cached(tmp_path, monkeypatch) -> None:
    from hw_profiles.profile import LoadRecord

    busy = LoadRecord(cores=2, own_threads=4, before=(1.0, 1.0, 1.0), after=(3.0, 2.0, 1.0), foreign_load=2.0,
                      foreign=True)
    flagged = dataclasses.replace(BASE, calibration=dataclasses.replace(BASE.calibration, load=busy))
    runs = []
    monkeypatch.setattr(first_use, "_calibrate_spawned", lambda p, r: runs.append(r) or flagged)
    profile, record = first_use.calibrated_profile(BASE, ranks=4, folder=tmp_path)
    assert profile == flagged and record["source"] == "measured under foreign load, not cached"
    assert not list(tmp_path.glob("*.json"))
    first_use.calibrated_profile(BASE, ranks=4, folder=tmp_path)
    assert runs == [4, 4]


def test_an_unusable_calibrated_profile_cache_warns_and_calibrates_again(tmp_path, monkeypatch) -> None:
    runs = []
    monkeypatch.setattr(first_use, "_calibrate_spawned", lambda p, r: runs.append(r) or BASE)
    first_use.calibrated_profile(BASE, ranks=4, folder=tmp_path)
    (path,) = tmp_path.glob("calibrated-*.json")
    path.write_text('{"key": {}, "profile": {}}')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, record = first_use.calibrated_profile(BASE, ranks=4, folder=tmp_path)
    assert record["source"] == "measured" and runs == [4, 4]
    assert any("calibrated profile cache" in str(w.message) for w in caught)
