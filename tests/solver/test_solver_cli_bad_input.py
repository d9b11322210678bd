"""``python -m solver`` given bad flags and bad files: a non-zero exit, one line
naming the flag or field (argparse's usage line may come before it), no
traceback, and nothing written: no output file, no temporary file."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOOD = {"format": "autoshard.problem/1", "nodes": [{"cost": [1.0, 2.0]}], "edges": []}


def _good(tmp: Path) -> list[str]:
    (tmp / "p.json").write_text(json.dumps(GOOD))
    return [str(tmp / "p.json")]


def _file(name: str, content: bytes | str) -> Callable[[Path], list[str]]:
    def make(tmp: Path) -> list[str]:
        path = tmp / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return [str(path)]
    return make


def _directory(tmp: Path) -> list[str]:
    (tmp / "d.json").mkdir()
    return [str(tmp / "d.json")]


def _missing_output_folder(tmp: Path) -> list[str]:
    return [*_good(tmp), "-o", str(tmp / "no" / "such" / "s.json")]


_SOLUTION = {"format": "autoshard.solution/1", "status": "optimal", "cost": 1, "choice": [0]}
_DEEP = b"[" * 100_000 + b"]" * 100_000
_TOO_DEEP = "malformed JSON: too deeply nested (arrays and objects deeper than the limit of 256) at line 1 column 257"
_BAD_FIELD = {"format": "autoshard.problem/1", "nodes": [{"cost": [1.0, True]}]}

# (id, files to make -> leading arguments, further arguments, what the last stderr line must contain)
CASES = [
    ("unknown flag", _good, ["--bogus"], "--bogus"),
    ("time limit nan", _good, ["--time-limit", "nan"], "--time-limit"),
    ("time limit inf", _good, ["--time-limit", "inf"], "--time-limit"),
    ("time limit -1", _good, ["--time-limit=-1"], "--time-limit"),
    ("time limit 1e300", _good, ["--time-limit", "1e300"], "--time-limit"),
    ("time limit x", _good, ["--time-limit", "x"], "--time-limit"),
    ("threads 0", _good, ["--threads", "0"], "--threads"),
    ("threads -1", _good, ["--threads=-1"], "--threads"),
    ("threads 1.5", _good, ["--threads", "1.5"], "--threads"),
    ("method nope", _good, ["--method", "nope"], "--method"),
    ("backend nope", _good, ["--backend", "nope"], "--backend"),
    ("inner nope", _good, ["--inner", "nope"], "--inner"),
    ("format nope", _good, ["--format", "nope"], "--format"),
    ("seed x", _good, ["--seed", "x"], "--seed"),
    ("missing file", lambda tmp: [str(tmp / "nope.json")], [], "nope.json: no such file"),
    ("directory", _directory, [], "d.json: is a directory"),
    ("output is a directory", _good, ["-o", "."], "-o .: is a directory"),
    ("empty file", _file("e.json", ""), [], "malformed JSON"),
    ("malformed JSON", _file("m.json", '{"nodes": [{"cost": [1,}'), [], "malformed JSON"),
    ("not UTF-8", _file("b.json", b'{"nodes": "\xff"}'), [], "not a text (UTF-8) JSON file"),
    ("gzip garbage", _file("g.json.gz", b"\x1f\x8b\x08\x00garbage"), [], "corrupt gzip data"),
    ("gzip of garbage", _file("h.json.gz", gzip.compress(b"\x00\x01not json")), [], "malformed JSON"),
    ("deeply nested arrays", _file("deep.json", _DEEP), [], _TOO_DEEP),
    ("deeply nested arrays, gzip", _file("deep.json.gz", gzip.compress(_DEEP)), [], _TOO_DEEP),
    ("deeply nested arrays as IOPDDL", _file("deep.json", _DEEP), ["--format", "iopddl"], _TOO_DEEP),
    ("deeply nested objects", _file("deep.json", '{"a":' * 100_000 + "1" + "}" * 100_000), [],
     "malformed JSON: too deeply nested (arrays and objects deeper than the limit of 256) at line 1 column 1281"),
    ("nested too deep inside a problem", _file("p.json", '{"nodes": [{"cost": ' + "[" * 300 + "]" * 300 + "}]}"), [],
     "malformed JSON: too deeply nested (arrays and objects deeper than the limit of 256) at line 1 column"),
    ("a solution given as the problem", _file("s.json", json.dumps(_SOLUTION)), [],
     "format: expected 'autoshard.problem/1', got 'autoshard.solution/1'"),
    ("a boolean cost", _file("f.json", json.dumps(_BAD_FIELD)), [], "nodes[0].cost[1]: expected a number, got true"),
    ("an unknown key", _file("k.json", json.dumps({**GOOD, "memory_limt": 5})), [], "memory_limt: unknown key"),
    ("iopddl forced on our format", _good, ["--format", "iopddl"], "problem: missing"),
    ("output into a missing folder", _missing_output_folder, [], "no such directory"),
    ("a bad flag with --server", _good, ["--server", "http://127.0.0.1:9", "--threads", "0"], "--threads"),
]


@pytest.mark.parametrize("make, extra, message", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, make, extra, message):
    args = make(tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    out = tmp_path / "s.json"
    if "-o" not in args:
        args = [*args, "-o", str(out)]
    # a short limit, should a case be solved by mistake, unless the case is about the limit
    limit = [] if any(arg.startswith("--time-limit") for arg in extra) else ["--time-limit", "5"]
    proc = subprocess.run([sys.executable, "-m", "solver", *args, *extra, *limit],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert lines and message in lines[-1], proc.stderr
    # argparse prints its usage before the error; anything else is one line
    usage = [line for line in lines[:-1] if not line.startswith(("usage:", " "))]
    assert not usage, proc.stderr
    assert proc.stdout == ""
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
