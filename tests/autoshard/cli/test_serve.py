"""Bad input to ``autoshard serve`` and to the clients is one line and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import socket

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from autoshard.cli import main  # noqa: E402
from solver.cli import main as solver_main  # noqa: E402


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("argv, message", [
    (["--port", "http"], "--port: expected an integer"),
    (["--port", "70000"], "--port: must be between 0 and 65535"),
    (["--workers", "0"], "--workers: must be between 1"),
    (["--max-body", "lots"], "--max-body: expected a size"),
    (["--time-limit", "900"], "--time-limit: must not exceed --max-time-limit"),
    (["--token-file", "/no/such/token"], "--token-file /no/such/token: cannot read"),
    (["--cache", "/dev/null/cache"], "--cache /dev/null/cache: not a writable folder"),
])
def test_serve_refuses_bad_flags_in_one_line(capsys, tmp_path, argv, message) -> None:
    args = ["serve", "--cache", str(tmp_path / "cache")] if "--cache" not in argv else ["serve"]
    assert main([*args, *argv]) == 2
    line = _one_line(capsys)
    assert line.startswith("autoshard serve: error:") and message in line, line


def test_serve_refuses_an_empty_token_file_and_a_busy_port(capsys, tmp_path) -> None:
    empty = tmp_path / "token"
    empty.write_text("\n")
    assert main(["serve", "--cache", str(tmp_path), "--token-file", str(empty)]) == 2
    assert "expected one token" in _one_line(capsys)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert main(["serve", "--cache", str(tmp_path), "--port", str(port)]) == 2
        assert f"cannot listen on 127.0.0.1:{port}" in _one_line(capsys)


def _dead_url() -> str:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_clients_say_in_one_line_that_the_server_is_unreachable(capsys, tmp_path) -> None:
    problem = tmp_path / "p.json"
    problem.write_text(json.dumps({"nodes": [{"cost": [1, 2]}]}))
    url = _dead_url()
    assert solver_main([str(problem), "--server", url, "--quiet"]) == 2
    line = _one_line(capsys)
    assert f"server {url}: unreachable" in line, line
    assert main(["solve", "examples.models.mlp:tiny", "--mesh", "2", "--server", url, "-o",
                 str(tmp_path / "plan.json")]) == 2
    line = _one_line(capsys)
    assert f"server {url}: unreachable" in line and not (tmp_path / "plan.json").exists(), line
    assert solver_main([str(problem), "--server", "not a url", "--quiet"]) == 2
    assert "expected a URL" in _one_line(capsys)
