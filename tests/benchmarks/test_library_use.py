"""benchmarks/ as a small library: scripts load models, start gloo ranks and time steps through
``benchmarks/common``, never edit ``sys.path`` and never import the tests' helpers; each runs as a
file and as a module from the repository root."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
SOURCES = sorted(BENCHMARKS.rglob("*.py"))
TEST_MODULES = {p.stem for p in (ROOT / "tests").rglob("*.py")} | {"tests", "conftest"}
LIBRARY_ONLY = {  # call -> the one library module that may make it
    "start_processes": "benchmarks/common/gloo.py", "init_process_group": "benchmarks/common/gloo.py",
    "import_module": None, "load_model": "benchmarks/common/models.py",
}
SHIM = 'if __name__ == "__main__" and not __package__:'


def _problems(path: Path, tree: ast.AST) -> list[str]:
    """What ``path`` does that a benchmark must leave to the library."""
    name = path.relative_to(ROOT).as_posix()
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                and node.value.id == "sys"):
            out.append(f"{name}:{node.lineno}: uses sys.path")
        if isinstance(node, ast.Import):
            out += [f"{name}:{node.lineno}: imports {a.name} (a test helper)" for a in node.names
                    if a.name.split(".")[0] in TEST_MODULES]
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in TEST_MODULES:
                out.append(f"{name}:{node.lineno}: imports from {node.module} (a test helper)")
        if isinstance(node, ast.Call):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            fake = called == "init_process_group" and node.args and ast.unparse(node.args[0]) == "'fake'"
            if called in LIBRARY_ONLY and LIBRARY_ONLY[called] != name and not fake:  # a fake group starts nothing
                out.append(f"{name}:{node.lineno}: calls {called} (the library's: "
                           f"{LIBRARY_ONLY[called] or 'benchmarks.common.models.load'})")
    return out


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.relative_to(BENCHMARKS).as_posix())
def test_no_sys_path_no_test_helpers_no_own_launcher(path):
    problems = _problems(path, ast.parse(path.read_text(), str(path)))
    assert not problems, "\n".join(problems)


def test_the_check_catches_each_kind():
    source = ("import sys\nsys.path.insert(0, 'x')\nfrom gloo_ranks import spawn\nimport tests.autoshard\n"
              "import torch.multiprocessing as mp\nmp.start_processes(f)\nimportlib.import_module('m')\n")
    problems = _problems(BENCHMARKS / "x.py", ast.parse(source))
    assert sorted(p.split(": ", 1)[1].split(" (")[0] for p in problems) == [
        "calls import_module", "calls start_processes", "imports from gloo_ranks", "imports tests.autoshard",
        "uses sys.path"]
    assert _problems(BENCHMARKS / "common" / "gloo.py", ast.parse("mp.start_processes(f)\n")) == []
    assert _problems(BENCHMARKS / "x.py", ast.parse("dist.init_process_group('fake', store=s)\n")) == []


def _scripts() -> list[Path]:
    return [p for p in SOURCES if p.parent == BENCHMARKS and 'if __name__ == "__main__":' in p.read_text()]


@pytest.mark.parametrize("path", _scripts(), ids=lambda p: p.name)
def test_every_script_reruns_as_the_module_when_run_as_a_file(path):
    """The guard comes before any import of ``benchmarks.*`` (as a file, those would fail)."""
    tree = ast.parse(path.read_text())
    body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    body = [n for n in body if not (isinstance(n, ast.ImportFrom) and n.module == "__future__")]
    want = ast.parse(SHIM + "\n    import _as_module\n").body[0]
    assert ast.dump(body[0]) == ast.dump(want), f"{path.name}: the first statement is not the guard"


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_a_script_runs_as_a_file_and_as_a_module():
    as_file = _run(["benchmarks/cli_startup.py", "--help"], ROOT)
    as_module = _run(["-m", "benchmarks.cli_startup", "--help"], ROOT)
    assert as_file.returncode == 0 and as_module.returncode == 0, as_file.stderr + as_module.stderr
    assert as_file.stdout == as_module.stdout and "--repeat" in as_file.stdout


def test_a_script_run_elsewhere_says_where_to_run_it(tmp_path):
    done = _run([str(BENCHMARKS / "cli_startup.py"), "--help"], tmp_path)
    assert done.returncode != 0
    assert done.stderr.strip().count("\n") == 0 and "run it from the repository root" in done.stderr
    assert "Traceback" not in done.stderr
