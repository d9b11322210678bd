"""Every ``autoshard`` command refuses bad flags and bad files the same way:
a non-zero exit code (2 for usage errors, as argparse does), ONE line on
stderr naming the flag or field (argparse's usage block before its error
line is allowed), no traceback, and nothing written: no output file, no
partial or temporary file.

Each row runs the real command line as a subprocess (``python -m
autoshard.cli``) from the repository root. Rows are chosen to fail before
torch is imported or any work starts (a tenth of a second each); the few
that need torch say so. ``serve`` and ``calibrate-hardware`` rows only
check flags: none may start a server or a measurement (the timeout guards it).
"""

from __future__ import annotations

import copy
import json
import os
import re
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

USAGE = "usage"  # argparse's usage block, then `...: error: ...`, exit 2
ERROR = "error"  # exactly one non-empty line on stderr


@dataclass(frozen=True)
class Row:
    argv: tuple[str, ...]
    """The command line after ``autoshard``; ``{tmp}`` is the row's own folder."""
    message: str
    """Text the error line must contain (the flag or field it names)."""
    kind: str = ERROR
    code: int = 2


DEEP = "too deeply nested (arrays and objects deeper than the limit of 256)"
DEEP_ARG = "[" * 5000 + "]" * 5000  # deeper than Python's recursion limit, short enough for a command line


def _rows() -> list[Row]:
    o = ("-o", "{tmp}/out.json")
    spec = "examples.models.mlp:tiny"
    cal = ("calibrate-hardware", "-o", "{tmp}/out.json")
    serve = ("serve", "--cache", "{tmp}/cache")
    return [
        # the top level
        Row(("nope",), "invalid choice: 'nope'", USAGE),
        Row(("--bogus",), "unrecognized arguments: --bogus", USAGE),
        # demo
        Row(("demo", "--bogus"), "unrecognized arguments", USAGE),
        Row(("demo", "--time-limit", "abc"), "--time-limit", USAGE),
        Row(("demo", "--time-limit", "nan"), "--time-limit"),
        Row(("demo", "--time-limit", "-1"), "--time-limit"),
        Row(("demo", "--time-limit", "inf"), "--time-limit"),
        Row(("demo", "--path", "{tmp}/missing"), "--path {tmp}/missing: no such folder"),
        # coverage
        Row(("coverage",), "MODULE:FACTORY", USAGE),
        Row(("coverage", "foo"), "expected MODULE:FACTORY"),
        Row(("coverage", "examples.models.nope:tiny"),
            "cannot import module 'examples.models.nope' (from spec 'examples.models.nope:tiny'): No module named"),
        Row(("coverage", "examples.models.nope:tiny"), "run from the repository root or pass --path DIR"),
        Row(("coverage", "light_model:nope", "--path", "{tmp}"), "module 'light_model' has no factory 'nope'"),
        Row(("coverage", "broken_model:build", "--path", "{tmp}"),
            "importing 'broken_model' (from spec 'broken_model:build') failed: RuntimeError: broken at import"),
        Row(("coverage", "light_model:build", "--path", "{tmp}/missing"), "--path"),
        Row(("coverage", spec, "--kwargs", "{bad"), "--kwargs is not valid JSON"),
        Row(("coverage", spec, "--kwargs", "[1]"), "--kwargs must be a JSON object"),
        Row(("coverage", spec, "--kwargs", DEEP_ARG), f"--kwargs is not valid JSON: {DEEP}"),
        # validate-rules (flags checked before torch is imported)
        Row(("validate-rules", "--bogus"), "unrecognized arguments", USAGE),
        Row(("validate-rules", "--cases", "abc"), "--cases", USAGE),
        Row(("validate-rules", "--cases", "0"), "--cases"),
        Row(("validate-rules", "--cases", "99999999"), "--cases"),
        Row(("validate-rules", "--max-strategies", "-3"), "--max-strategies"),
        Row(("validate-rules", "--failures", "-1"), "--failures"),
        # solve: flags
        Row(("solve", spec), "--mesh: give a mesh shape (e.g. --mesh 8x8) or --devices N"),
        # solve --devices: the mesh search's flags
        Row(("solve", spec, "--devices", "0", *o), "--devices: must be between 1 and"),
        Row(("solve", spec, "--devices", "-8", *o), "--devices: must be between 1 and"),
        Row(("solve", spec, "--devices", "abc", *o), "--devices: invalid int value", USAGE),
        Row(("solve", spec, "--devices", "2.5", *o), "--devices: invalid int value", USAGE),
        Row(("solve", spec, "--devices", "99999999", *o), "--devices: must be between 1 and"),
        Row(("solve", spec, "--devices", "8", "--devices-per-node", "3", *o),
            "--devices-per-node: 3 does not divide --devices 8"),
        Row(("solve", spec, "--devices", "8", "--devices-per-node", "0", *o), "--devices-per-node: must be between"),
        Row(("solve", spec, "--devices", "8", "--mesh", "2x4", *o), "--mesh and --devices: give one"),
        Row(("solve", spec, "--devices", "8", "--dims", "dp", *o), "--dims: only with --mesh"),
        Row(("solve", spec, "--devices", "12", *o), "--devices: 12 is not a multiple of profile h100-sxm-80gb's 8"),
        Row(("solve", spec, "--devices", "4", "--devices-per-node", "2", "--profile", "cpu-gloo", *o),
            "--devices-per-node: profile cpu-gloo has one interconnect tier"),
        Row(("solve", spec, "--devices", "8", "--jobs", "0", *o), "--jobs: must be between 1 and"),
        Row(("solve", spec, "--devices", "8", "--no-cache", "--cache-dir", "{tmp}", *o), "--cache-dir and --no-cache"),
        Row(("solve", spec, "--devices", "8", "--time-limit", "nan", *o), "--time-limit"),
        Row(("solve", spec, "--mesh", "2", "--devices-per-node", "2", *o), "--devices-per-node: only with --devices"),
        Row(("solve", spec, "--mesh", "2", "--jobs", "2", *o), "--jobs: only with --devices"),
        Row(("solve", spec, "--mesh", "2", "--no-cache", *o), "--no-cache: only with --devices"),
        Row(("solve", spec, "--mesh", "2", "--bogus"), "unrecognized arguments", USAGE),
        Row(("solve", spec, "--mesh", "3x0", *o), "--mesh"),
        Row(("solve", spec, "--mesh", "abc", *o), "--mesh"),
        Row(("solve", spec, "--mesh", "99999999x99999999", *o), "--mesh: at most"),
        Row(("solve", spec, "--mesh", "2x2", "--dims", "dp", *o), "--mesh/--dims"),
        Row(("solve", spec, "--mesh", "2", "--time-limit", "nan", *o), "--time-limit"),
        Row(("solve", spec, "--mesh", "2", "--time-limit", "inf", *o), "--time-limit"),
        Row(("solve", spec, "--mesh", "2", "--time-limit", "-1", *o), "--time-limit"),
        Row(("solve", spec, "--mesh", "2", "--time-limit", "1e9", *o), "--time-limit"),
        Row(("solve", spec, "--mesh", "2", "--time-limit", "abc", *o), "--time-limit", USAGE),
        Row(("solve", spec, "--mesh", "2", "--memory-limit", "nan", *o), "--memory-limit"),
        Row(("solve", spec, "--mesh", "2", "--memory-limit=-5GiB", *o), "--memory-limit"),
        Row(("solve", spec, "--mesh", "2", "--memory-limit", "1e400", *o), "--memory-limit"),
        Row(("solve", spec, "--mesh", "2", "--memory-limit", "0", *o), "--memory-limit"),
        Row(("solve", spec, "--mesh", "2", "--memory-limit", "lots", *o), "--memory-limit"),
        Row(("solve", spec, "--mesh", "2", "--backend", "nope", *o), "--backend: invalid choice: 'nope'", USAGE),
        Row(("solve", spec, "--mesh", "2", "--optimizer", "nope", *o), "--optimizer: invalid choice", USAGE),
        Row(("solve", spec, "--mesh", "2", "--baseline", "nope", *o), "--baseline: invalid choice", USAGE),
        Row(("solve", spec, "--mesh", "2", "--search", "nope", *o), "--search: invalid choice", USAGE),
        Row(("solve", spec, "--mesh", "2", "--pin", "no-equals-sign", *o), "--pin"),
        Row(("solve", spec, "--mesh", "2", "--recompute", "sometimes", *o), "--recompute: unknown policy 'sometimes'"),
        Row(("solve", spec, "--mesh", "2", "--recompute", "every:1", *o), "--recompute: unknown policy 'every:1'"),
        Row(("solve", spec, "--mesh", "2", "--pin", "*.weight=S(0", *o), "--pin *.weight=S(0: "),
        Row(("solve", spec, "--mesh", "2", "--kwargs", "{bad", *o), "--kwargs"),
        Row(("solve", spec, "--mesh", "2", "--kwargs", DEEP_ARG, *o), f"--kwargs is not valid JSON: {DEEP}"),
        # solve: files
        Row(("solve", spec, "--mesh", "2", "-o", "{tmp}/missing/dir/out.json"),
            "-o/--output {tmp}/missing/dir/out.json: folder {tmp}/missing/dir does not exist"),
        Row(("solve", spec, "--mesh", "2", "-o", "{tmp}"), "is a folder"),
        Row(("solve", spec, "--mesh", "2", "--dump-problem", "{tmp}/missing/p.json", *o), "--dump-problem"),
        Row(("solve", spec, "--mesh", "2", "--profile", "nope", *o), "unknown name 'nope'"),
        Row(("solve", spec, "--mesh", "2", "--profile", "{tmp}/missing.json", *o), "No such file"),
        Row(("solve", spec, "--mesh", "2", "--profile", "{tmp}/a-folder", *o), "Is a directory"),
        Row(("solve", spec, "--mesh", "2", "--profile", "{tmp}/malformed.json", *o), "not valid JSON"),
        Row(("solve", spec, "--mesh", "2", "--profile", "{tmp}/deep.json", *o), f"{{tmp}}/deep.json: not valid JSON (line 1: {DEEP})"),
        Row(("solve", spec, "--mesh", "2", "--profile", "{tmp}/nan.json", *o), "device.launch_s: nan"),
        Row(("solve", spec, "--mesh", "2", "--profile", "{tmp}/plan.json", *o), "(root)"),
        Row(("solve", "foo", "--mesh", "2", *o), "expected MODULE:FACTORY"),
        Row(("solve", "examples.models.nope:tiny", "--mesh", "2", *o), "pass --path DIR"),
        Row(("solve", spec, "--mesh", "2", "--path", "{tmp}/missing", *o), "--path"),
        # explain
        Row(("explain",), "PLAN.json", USAGE),
        Row(("explain", "{tmp}/plan.json", "--top", "abc"), "--top", USAGE),
        Row(("explain", "{tmp}/missing.json"), "cannot read (No such file or directory)"),
        Row(("explain", "{tmp}/a-folder"), "cannot read (Is a directory)"),
        Row(("explain", "{tmp}/malformed.json"), "malformed JSON"),
        Row(("explain", "{tmp}/deep.json"), f"{{tmp}}/deep.json: malformed JSON: {DEEP} at line 1"),
        Row(("explain", "{tmp}/deep-object.json"), f"{{tmp}}/deep-object.json: malformed JSON: {DEEP} at line 257"),
        Row(("explain", "{tmp}/list.json"), "(root): expected a JSON object"),
        Row(("explain", "{tmp}/solution.json"), "format: expected 'autoshard.plan/1', got 'autoshard.solution/1'"),
        Row(("explain", "{tmp}/nan.json"), "format: expected 'autoshard.plan/1'"),  # a profile passed as plan
        Row(("explain", "{tmp}/bad-placement.json"), "params.fc.weight"),
        Row(("explain", "{tmp}/recompute-missing.json", "--plot", "{tmp}/memory.png"),
            "recompute[0]: no op node named 'nope' in the plan"),
        Row(("explain", "{tmp}/recompute-random.json"),
            "recompute[0]: noise (aten.bernoulli.p) cannot be recomputed: draws random numbers"),
        Row(("explain", "{tmp}/recompute-inplace.json"),
            "recompute[0]: bump (aten.add_.Tensor) cannot be recomputed: writes its input in place"),
        Row(("explain", "{tmp}/recompute-twice.json"), "recompute[1]: relu is listed twice"),
        Row(("explain", "{tmp}/plan.json", "--top", "-1"), "--top"),
        Row(("explain", "{tmp}/plan.json", "--plot", "{tmp}/missing/memory.png"), "--plot"),
        Row(("explain", "{tmp}/plan.json", "--plot-layouts", "{tmp}/missing/layouts.png"), "--plot-layouts"),
        Row(("explain", "{tmp}/plan.json", "--plot-layouts", "{tmp}/layouts.png"),
            "--plot-layouts: {tmp}/plan.json is not the plan of a mesh search"),
        # calibrate-hardware: flags only, nothing is measured
        Row(("calibrate-hardware",), "give -o PROFILE.json"),
        Row(("calibrate-hardware", "-o", "{tmp}/missing/dir/p.json"), "folder {tmp}/missing/dir does not exist"),
        Row(("calibrate-hardware", "-o", "{tmp}"), "is a folder"),
        Row((*cal, "--bogus"), "unrecognized arguments", USAGE),
        Row((*cal, "--backend", "nope"), "--backend: invalid choice", USAGE),
        Row((*cal, "--timeout", "nan"), "--timeout"),
        Row((*cal, "--timeout", "inf"), "--timeout"),
        Row((*cal, "--timeout", "0"), "--timeout"),
        Row((*cal, "--threads", "0"), "--threads"),
        Row((*cal, "--threads", "abc"), "--threads", USAGE),
        Row((*cal, "--nproc-per-node", "0"), "--nproc-per-node"),
        Row((*cal, "--nproc-per-node", "1000000"), "--nproc-per-node"),
        Row((*cal, "--mesh", "3x0"), "--mesh"),
        Row((*cal, "--mesh", "abc"), "--mesh"),
        Row((*cal, "--dims", "dp"), "--dims: needs --mesh"),
        Row((*cal, "--name", ""), "--name"),
        Row((*cal, "--base", "nope"), "unknown name 'nope'"),
        Row((*cal, "--report", "{tmp}/missing/r.md"), "--report"),
        Row((*cal, "--measurements", "{tmp}/missing/m.json"), "--measurements"),
        Row((*cal, "--model", "foo"), "expected MODULE:FACTORY"),
        Row((*cal, "--model", "examples.models.nope:tiny"), "pass --path DIR"),
        Row((*cal, "--model-kwargs", "{bad"), "--model-kwargs"),
        Row((*cal, "--model-kwargs", DEEP_ARG), f"--model-kwargs is not valid JSON: {DEEP}"),
        Row((*cal, "--base", "{tmp}/deep.json"), f"{{tmp}}/deep.json: not valid JSON (line 1: {DEEP})"),
        Row((*cal, "--path", "{tmp}/missing"), "--path {tmp}/missing: no such folder"),
        Row(("calibrate-hardware", "--check", "{tmp}/nan.json"), "device.launch_s: nan is not a finite number"),
        Row(("calibrate-hardware", "--check", "{tmp}/zero.json"), "device.peak_flops"),
        Row(("calibrate-hardware", "--check", "{tmp}/missing.json"), "cannot read"),
        Row(("calibrate-hardware", "--check", "{tmp}/deep.json"), f"{{tmp}}/deep.json: not valid JSON (line 1: {DEEP})"),
        # serve: flags only, nothing listens
        Row((*serve, "--bogus"), "unrecognized arguments", USAGE),
        Row((*serve, "--log-level", "nope"), "--log-level: invalid choice", USAGE),
        Row((*serve, "--port", "70000"), "--port"),
        Row((*serve, "--port", "abc"), "--port"),
        Row((*serve, "--workers", "0"), "--workers"),
        Row((*serve, "--workers", "1e9"), "--workers"),
        Row((*serve, "--max-queue", "-1"), "--max-queue"),
        Row((*serve, "--max-body", "nan"), "--max-body"),
        Row((*serve, "--max-nodes", "0"), "--max-nodes"),
        Row((*serve, "--max-edges", "abc"), "--max-edges"),
        Row((*serve, "--max-time-limit", "nan"), "--max-time-limit"),
        Row((*serve, "--max-time-limit", "inf"), "--max-time-limit"),
        Row((*serve, "--time-limit", "0"), "--time-limit"),
        Row((*serve, "--cache-size", "0"), "--cache-size"),
        Row((*serve, "--token-file", "{tmp}/missing"), "--token-file"),
        Row(("serve", "--cache", "{tmp}/missing/dir/cache"), "folder {tmp}/missing/dir does not exist"),
        # check-profile: one line per file, exit 1 when one is bad
        Row(("check-profile",), "PROFILE", USAGE),
        Row(("check-profile", "{tmp}/missing.json"), "{tmp}/missing.json: no such file", code=1),
        Row(("check-profile", "nope"), "nope: no such file, nor a shipped profile", code=1),
        Row(("check-profile", "{tmp}/a-folder"), "is a folder", code=1),
        Row(("check-profile", "{tmp}/malformed.json"), "not valid JSON", code=1),
        Row(("check-profile", "{tmp}/deep.json"), f"{{tmp}}/deep.json: not valid JSON (line 1: {DEEP})", code=1),
        Row(("check-profile", "{tmp}/deep-in-profile.json"), "deep-in-profile.json: not valid JSON (line 1: too deeply", code=1),
        Row(("check-profile", "{tmp}/list.json"), "(root): expected a JSON object", code=1),
        Row(("check-profile", "{tmp}/nan.json"), "device.launch_s: nan is not a finite number", code=1),
        # correct-profile: a bad profile or rank count before anything is measured
        Row(("correct-profile", "nope"), "nope: no such file, nor a shipped profile", code=1),
        Row(("correct-profile", "{tmp}/malformed.json"), "not valid JSON", code=1),
        Row(("correct-profile", "--ranks", "0"), "--ranks: must be 1 or more", code=1),
        Row(("correct-profile", "--ranks", "x"), "--ranks", USAGE),
        # solve --profile-correction: one of its choices
        Row(("solve", spec, "--mesh", "2", "--profile-correction", "always"), "invalid choice: 'always'", USAGE),
        Row(("check-profile", "{tmp}/inf.json"), "device.memory_bandwidth_Bps: inf is not a finite number", code=1),
        Row(("check-profile", "{tmp}/zero.json"), "device.peak_flops.bf16", code=1),
        Row(("check-profile", "{tmp}/absurd.json"), "device.memory_bandwidth_Bps", code=1),
        Row(("check-profile", "{tmp}/plan.json"), "{tmp}/plan.json: ", code=1),
    ]


ROWS = _rows()


def _plan_example() -> dict:
    """The plan example of docs/formats.md (a valid plan of a small MLP)."""
    text = (ROOT / "docs" / "formats.md").read_text()
    return json.loads(re.search(r"<!-- schema: plan -->\s*```json\n(.*?)```", text, re.S).group(1))


def _inputs(folder: Path) -> None:
    """The bad (and a few good) files every row may name."""
    from hw_profiles import load

    profile = load("cpu-gloo").to_dict()

    def profile_with(path: tuple, value: object) -> dict:
        data = copy.deepcopy(profile)
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        return data

    plan = _plan_example()
    bad_placement = copy.deepcopy(plan)
    bad_placement["params"] = {"fc.weight": "S(0"}

    def recomputing(names: list[str], op: str | None = None) -> dict:
        bad = copy.deepcopy(plan)
        if op is not None:  # a node of that op, named as the row's message says
            bad["nodes"].append({"name": names[0], "op": op, "out": "S(0)", "in": ["S(0)"]})
        bad["recompute"] = names
        return bad

    files = {
        "plan.json": json.dumps(plan),
        "bad-placement.json": json.dumps(bad_placement),
        "recompute-missing.json": json.dumps(recomputing(["nope"])),
        "recompute-random.json": json.dumps(recomputing(["noise"], "aten.bernoulli.p")),
        "recompute-inplace.json": json.dumps(recomputing(["bump"], "aten.add_.Tensor")),
        "recompute-twice.json": json.dumps(recomputing(["relu", "relu"])),
        "solution.json": json.dumps({"format": "autoshard.solution/1", "status": "optimal", "choice": [0]}),
        "malformed.json": "{bad",
        "deep.json": "[" * 100_000 + "]" * 100_000,
        "deep-object.json": '{"a":\n' * 100_000 + "1" + "}" * 100_000,
        "deep-in-profile.json": json.dumps({**profile, "device": {**profile["device"], "sources": {"x": "DEEP"}}})
        .replace('"DEEP"', "[" * 300 + "]" * 300),
        "list.json": "[1, 2]",
        # json.dumps writes NaN and Infinity, as a broken tool would
        "nan.json": json.dumps(profile_with(("device", "launch_s"), float("nan"))),
        "inf.json": json.dumps(profile_with(("device", "memory_bandwidth_Bps"), float("inf"))),
        "zero.json": json.dumps(profile_with(("device", "peak_flops", "bf16"), 0.0)),
        "absurd.json": json.dumps(profile_with(("device", "memory_bandwidth_Bps"), 1e20)),
        "light_model.py": "def build():\n    return object(), ()\n",
        "broken_model.py": "raise RuntimeError('broken at import')\n",
    }
    for name, text in files.items():
        (folder / name).write_text(text)
    (folder / "a-folder").mkdir()


def _listing(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if "__pycache__" not in p.parts}


def _run(argv: list[str], *, cwd: Path = ROOT, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "COLUMNS": "100"}
    env.pop("WORLD_SIZE", None)  # a calibration row must not believe it is a torchrun rank
    return subprocess.run([sys.executable, "-m", "autoshard.cli", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _assert_one_line(row: Row, result: subprocess.CompletedProcess, tmp: str) -> None:
    err = result.stderr
    assert "Traceback" not in err + result.stdout, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines, f"nothing on stderr (exit {result.returncode})"
    message = row.message.replace("{tmp}", tmp)
    if row.kind == USAGE:
        # argparse: `usage: ...` (wrapped over indented lines), then `prog: error: ...`
        assert lines[0].startswith("usage: ") and all(line.startswith(" ") for line in lines[1:-1]), err
        assert re.match(r"autoshard( [a-z-]+)?: error: ", lines[-1]), err
    else:
        assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
        assert lines[0].startswith("autoshard "), err
    assert message in lines[-1], f"{message!r} not in {lines[-1]!r}"


@pytest.mark.parametrize("row", ROWS, ids=lambda r: " ".join(r.argv).replace("{tmp}", "T")[:80])
def test_bad_input_is_one_line_and_writes_nothing(row: Row, tmp_path: Path) -> None:
    _inputs(tmp_path)
    before = _listing(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in row.argv]
    result = _run(argv, timeout=60)
    assert result.returncode == row.code, f"exit {result.returncode}, expected {row.code}:\n{result.stderr}"
    _assert_one_line(row, result, str(tmp_path))
    assert not (tmp_path / "out.json").exists()
    assert _listing(tmp_path) == before, f"stray files: {sorted(_listing(tmp_path) - before)}"


# -- the choices that autoshard.cli.solve copies (its --help must not import torch) ---------


def test_solve_choices_agree_with_their_sources() -> None:
    pytest.importorskip("torch")
    from autoshard.graph.memory import OPTIMIZERS
    from autoshard.cli import solve as solve_command
    from autoshard.search.baselines import BASELINES
    from solver.backends import BACKENDS

    assert set(solve_command.BACKEND_CHOICES) == set(BACKENDS)
    assert solve_command.OPTIMIZER_CHOICES == OPTIMIZERS
    assert solve_command.BASELINE_CHOICES == BASELINES
    from autoshard.plan.options import DEFAULT_SEARCH_TIME_LIMIT_S, SolveOptions

    defaults = SolveOptions()
    assert solve_command.SHOWN_DEFAULTS == {"profile": defaults.profile, "backend": defaults.backend,
                                        "optimizer": defaults.optimizer, "time_limit": defaults.time_limit,
                                        "search_time_limit": DEFAULT_SEARCH_TIME_LIMIT_S}


def test_help_imports_no_torch() -> None:
    code = ("import sys; from autoshard.cli import build_parser; "
            "[build_parser([c, '--help']) for c in ('solve', 'explain', 'demo', 'coverage', 'calibrate-hardware', "
            "'check-profile', 'serve', 'validate-rules')] + [build_parser(['--help'])]; print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr


# -- model specs: --path and the current directory -------------------------------------------


def test_a_spec_resolves_from_a_path_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autoshard.trace.model_spec import load_model

    (tmp_path / "pathmodel_a.py").write_text("def build(n=1):\n    return 'model', {'n': n}\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert load_model("pathmodel_a:build", {"n": 3}, paths=[str(tmp_path)]) == ("model", {"n": 3})


def test_a_spec_resolves_from_the_current_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autoshard.trace.model_spec import load_model

    (tmp_path / "cwdmodel_b.py").write_text("def build():\n    return 'model', ()\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(tmp_path)
    assert load_model("cwdmodel_b:build") == ("model", ())


def test_a_missing_dependency_of_the_model_is_not_blamed_on_the_path(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from autoshard.trace.model_spec import import_factory

    (tmp_path / "needs_c.py").write_text("import no_such_package_c\ndef build():\n    pass\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(ValueError, match=r"importing 'needs_c' .* failed: No module named 'no_such_package_c'$"):
        import_factory("needs_c:build", [str(tmp_path)])


def test_examples_resolve_from_another_folder_with_path(tmp_path: Path) -> None:
    """As after `pip install`: the repository's examples are not importable
    from elsewhere, unless --path names the checkout."""
    pytest.importorskip("torch")
    result = _run(["coverage", "examples.models.mlp:tiny"], cwd=tmp_path)
    assert result.returncode == 2 and "pass --path DIR" in result.stderr, result.stderr
    result = _run(["coverage", "examples.models.mlp:tiny", "--json", "--path", str(ROOT)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["model"] == "examples.models.mlp:tiny"
    assert sorted(os.listdir(tmp_path)) == []


# -- outputs for people -----------------------------------------------------------------------


def test_explain_plot_follows_the_umask(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from autoshard.plan.explain import plot_memory
    from autoshard.plan.format import Plan

    plan = Plan.from_dict(_plan_example())
    old = os.umask(0o022)
    try:
        plot_memory(plan, str(tmp_path / "memory.png"))
    finally:
        os.umask(old)
    png = tmp_path / "memory.png"
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert stat.S_IMODE(png.stat().st_mode) == 0o644
    assert sorted(os.listdir(tmp_path)) == ["memory.png"]


def test_explain_prints_small_sizes_in_a_readable_unit() -> None:
    from autoshard.plan.explain import explain_text
    from autoshard.plan.format import Plan

    text = explain_text(Plan.from_dict(_plan_example()))
    assert "| peak memory | 9.38 KiB |" in text and "0.00 GiB" not in text


def test_plans_keep_their_old_solver_keys_readable() -> None:
    from autoshard.plan.format import Plan

    data = _plan_example()
    solver = data["solver"]
    old = {**{k: v for k, v in solver.items() if k not in ("problem_nodes", "problem_edges", "reduced_nodes")},
           "variables": solver["problem_nodes"], "constraints": solver["problem_edges"],
           "reduced_variables": solver["reduced_nodes"]}
    plan = Plan.from_dict({**data, "solver": old})
    assert (plan.solver.problem_nodes, plan.solver.problem_edges, plan.solver.reduced_nodes) == (35, 40, 8)
    assert plan.to_dict()["solver"] == solver
