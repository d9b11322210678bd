"""The plan-identity comparison (``benchmarks/plan_identity.py``): wall times and versions
are ignored, any other difference is found, and a missing file fails."""

from __future__ import annotations

import json

from benchmarks.plan_identity import CASES, compare

PLAN = {"format": "autoshard.plan/1", "fingerprint": {"graph": "sha256:1", "torch": "2.13.0", "autoshard": "0.1.0"},
        "params": {"w": "S(0)"}, "estimate": {"step_s": 0.25},
        "solver": {"status": "optimal", "seconds": 1.5, "timings": {"trace_s": 0.1}},
        "options": {"time_limit_s": 52.9, "mesh_search": {"seconds": 3.0, "trace_s": 0.2,
                                    "layouts": [{"shape": [4], "seconds": 1.0, "step_s": 0.25}]}}}
PROBLEM = {"nodes": [{"name": "param:w", "cost": [0.5]}], "autoshard": {"timings": {"build_s": 0.3}}}


def _folder(path, plan, problem):
    path.mkdir()
    (path / "case.plan.json").write_text(json.dumps(plan))
    (path / "case.problem.json").write_text(json.dumps(problem))
    return path


def _changed(data, path, value):
    data = json.loads(json.dumps(data))
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


def test_wall_times_and_versions_are_ignored(tmp_path) -> None:
    old = _folder(tmp_path / "old", PLAN, PROBLEM)
    plan = PLAN
    for path, value in ((("solver", "seconds"), 9.0), (("solver", "timings"), {"trace_s": 7.0}),
                        (("fingerprint", "torch"), "2.14.0"), (("options", "mesh_search", "seconds"), 8.0),
                        (("options", "mesh_search", "layouts", 0, "seconds"), 6.0),
                        (("options", "time_limit_s"), 52.2)):
        plan = _changed(plan, path, value)
    new = _folder(tmp_path / "new", plan, _changed(PROBLEM, ("autoshard", "timings"), {"build_s": 5.0}))
    assert compare(old, new) == 0


def test_a_solve_time_limit_counts_in_a_plan_without_a_mesh_search(tmp_path) -> None:
    plan = {k: v for k, v in PLAN.items() if k != "options"} | {"options": {"time_limit_s": 60.0}}
    old = _folder(tmp_path / "old", plan, PROBLEM)
    assert compare(old, _folder(tmp_path / "new", _changed(plan, ("options", "time_limit_s"), 30.0), PROBLEM)) == 1


def test_a_placement_a_number_a_name_or_a_missing_file_is_a_difference(tmp_path) -> None:
    old = _folder(tmp_path / "old", PLAN, PROBLEM)
    changes = [(_changed(PLAN, ("params", "w"), "R"), PROBLEM),
               (_changed(PLAN, ("estimate", "step_s"), 0.25000000000000006), PROBLEM),
               (_changed(PLAN, ("options", "mesh_search", "layouts", 0, "step_s"), 0.5), PROBLEM),
               (PLAN, _changed(PROBLEM, ("nodes", 0, "name"), "param:w2"))]
    for k, (plan, problem) in enumerate(changes):
        assert compare(old, _folder(tmp_path / f"new{k}", plan, problem)) == 1, k
    (tmp_path / "short").mkdir()
    (tmp_path / "short" / "case.plan.json").write_text(json.dumps(PLAN))
    assert compare(old, tmp_path / "short") == 1


def test_the_cases_cover_both_profiles_recomputation_and_a_mesh_search() -> None:
    flat = [" ".join(args) for args in CASES.values()]
    assert any("h100-sxm-80gb" in a for a in flat) and any(".json" in a for a in flat)
    assert any("--recompute" in a for a in flat) and any("--devices" in a for a in flat)
