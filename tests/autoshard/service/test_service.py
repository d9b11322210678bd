"""``autoshard serve`` on loopback: submit, poll, fetch; the cache (also after a restart); shared
solves; cancel; the limits (400, 401, 413, 429); a killed worker fails its job only; metrics."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from autoshard.service.client import ServiceClient, ServiceError  # noqa: E402
from solver import Problem, solve  # noqa: E402

from service_helpers import TOKEN, Server, hard_problem, metric, small_problem  # noqa: E402


@pytest.fixture()
def client(server) -> ServiceClient:
    return ServiceClient(server.url, token=TOKEN)


def _wait_state(client: ServiceClient, job_id: str, states: tuple[str, ...], timeout_s: float = 30) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = client.status(job_id)
        if status["state"] in states:
            return status
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} never reached {states}: {status}")


def _raw(method: str, url: str, body: bytes | None = None, headers: dict | None = None) -> tuple[int, Any, bytes]:
    """(status, headers (case-insensitive), body) of one request, errors included."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def test_submit_poll_fetch_and_the_cache(client) -> None:
    problem = small_problem(offset=10)
    job = client.submit_problem(problem, time_limit=5)
    assert job["state"] == "queued" and not job["cached"]
    seen = [client.status(job["id"])["state"]]
    result = client.wait(job["id"], on_progress=lambda s: seen.append(s["state"]))
    local = solve(Problem.from_dict(problem), time_limit=5)
    assert tuple(result["choice"]) == local.choice and result["cost"] == local.cost == 12
    assert seen[-1] == "done" and set(seen) <= {"queued", "running", "done"}
    status = client.status(job["id"])
    assert status["incumbent"] == 12 and status["gap"] == 0.0 and status["progress"]["fraction"] == 1.0
    # the same request again: from the cache, with no solve started
    misses, hits = metric(client, "autoshard_cache_misses"), metric(client, "autoshard_cache_hits")
    again = client.submit_problem(problem, time_limit=5)
    cached = client.result(again["id"])
    assert (metric(client, "autoshard_cache_misses"), metric(client, "autoshard_cache_hits")) == (misses, hits + 1)
    assert again["cached"] and again["id"] != job["id"] and cached["choice"] == result["choice"]
    # other options are another key; the same bytes gzip-compressed are the same content
    assert not client.submit_problem(problem, time_limit=6)["cached"]
    status, headers, body = _raw("POST", client.url + "/v1/problems?time_limit=5",
                                 gzip.compress(json.dumps(problem, separators=(",", ":")).encode()),
                                 {"Content-Encoding": "gzip", "Authorization": f"Bearer {TOKEN}",
                                  "Content-Type": "application/json"})
    assert status == 200 and json.loads(body)["cached"] is True


def test_a_cache_hit_reports_the_status_of_the_solve_it_repeats(client) -> None:
    problem = small_problem(offset=40)
    first = client.submit_problem(problem, time_limit=5)
    client.wait(first["id"])
    solved = client.status(first["id"])
    again = client.submit_problem(problem, time_limit=5)
    assert again["cached"] and not first["cached"]
    hit = client.status(again["id"])
    assert solved["status"] == "optimal" and hit["status"] == solved["status"]
    assert (hit["incumbent"], hit["bound"], hit["gap"]) == (solved["incumbent"], solved["bound"], solved["gap"]) \
        == (42, 42, 0.0)
    assert hit["state"] == "done" and hit["cached"] and hit["progress"]["fraction"] == 1.0


def test_deeply_nested_json_is_a_400_naming_the_body(client) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    wrapped = b'{"nodes": ' + b"[" * 300 + b"]" * 300 + b"}"
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    for path, body, extra in (("/v1/problems", deep, {}), ("/v1/problems?format=iopddl", deep, {}),
                              ("/v1/problems", wrapped, {}), ("/v1/plans", deep, {}),
                              ("/v1/problems", gzip.compress(deep), {"Content-Encoding": "gzip"})):
        status, _, answer = _raw("POST", client.url + path, body, {**headers, **extra})
        assert status == 400, (path, status, answer[:300])
        data = json.loads(answer)
        assert data["field"] == "(body)" and "too deeply nested" in data["detail"], data
        assert "\n" not in data["detail"] and len(data["detail"]) < 200, data
    assert client.health()["status"] == "ok" and client.solve_problem(small_problem(offset=50), time_limit=5).cost == 52


def test_identical_requests_in_flight_share_one_solve(client) -> None:
    problem = hard_problem(seed=1)
    first = client.submit_problem(problem, time_limit=20)
    second = client.submit_problem(problem, time_limit=20)
    assert second["id"] == first["id"] and second["shared"]
    cancelled = client.cancel(first["id"])
    assert cancelled["state"] == "cancelled"
    with pytest.raises(ServiceError, match="cancelled"):
        client.wait(first["id"])


def test_cancel_stops_a_running_solve(client) -> None:
    # a long limit: on a loaded machine the first bound comes late, and the cancel ends the solve anyway
    job = client.submit_problem(hard_problem(seed=2), time_limit=120)
    running = _wait_state(client, job["id"], ("running",))
    pid = running["worker_pid"]
    deadline = time.monotonic() + 100
    while running["incumbent"] is None or running["bound"] is None:  # progress: incumbent, then a bound
        assert time.monotonic() < deadline, running
        time.sleep(0.1)
        running = client.status(job["id"])
    assert running["bound"] <= running["incumbent"] and 0 <= running["gap"] <= 1
    assert 0 < running["progress"]["fraction"] < 1 and running["progress"]["stage"]
    start = time.monotonic()
    assert client.cancel(job["id"])["state"] == "cancelled"
    while time.monotonic() - start < 10:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the worker of a cancelled job still runs")
    with pytest.raises(ServiceError) as err:
        client.result(job["id"])
    assert err.value.status == 409


def test_a_killed_worker_fails_its_job_only(client) -> None:
    doomed = client.submit_problem(hard_problem(seed=3), time_limit=30)
    other = client.submit_problem(hard_problem(seed=4), time_limit=3)
    running = _wait_state(client, doomed["id"], ("running",))
    _wait_state(client, other["id"], ("running", "done"))
    os.kill(running["worker_pid"], signal.SIGKILL)
    failed = _wait_state(client, doomed["id"], ("failed", "done", "cancelled"))
    assert failed["state"] == "failed" and "worker process died" in failed["error"]
    assert client.wait(other["id"], timeout_s=30)["status"] in ("optimal", "feasible", "timeout")
    # the dead worker was replaced: the next job runs
    assert client.solve_problem(small_problem(offset=20), time_limit=5).cost == 22


def test_bad_input_is_400_naming_the_field(client) -> None:
    bad = small_problem()
    bad["nodes"][1]["cost"] = [3, -1]
    with pytest.raises(ServiceError) as err:
        client.submit_problem(bad)
    assert err.value.status == 400 and err.value.field == "nodes[1].cost[1]" and "negative cost" in str(err.value)
    for body, field in ((b"{not json", "(body)"), (json.dumps({"nodes": "x"}).encode(), "nodes"),
                        (json.dumps({"problem": {"nodes": {}}}).encode(), "problem.nodes.intervals")):
        with pytest.raises(ServiceError) as err:
            client.submit_problem(body)
        assert err.value.status == 400 and err.value.field == field, err.value
    with pytest.raises(ServiceError) as err:
        client.submit_problem(small_problem(), time_limit=10_000)
    assert err.value.status == 400 and err.value.field == "time_limit"
    with pytest.raises(ServiceError) as err:
        client.submit_problem(small_problem(), colour="blue")
    assert err.value.field == "colour"
    status, _, _ = _raw("POST", client.url + "/v1/problems", b"x", {"Content-Type": "text/plain",
                                                                    "Authorization": f"Bearer {TOKEN}"})
    assert status == 415


def test_size_limits_are_413(client) -> None:
    big = json.dumps({"nodes": [{"cost": [0.5] * 8}] * 60_000}).encode()
    assert len(big) > 2 * 2**20
    status, _, body = _raw("POST", client.url + "/v1/problems", big,
                           {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    assert status == 413 and json.loads(body)["field"] == "(body)"
    bomb = gzip.compress(big)  # small on the wire, over the limit once inflated
    with pytest.raises(ServiceError) as err:
        client.submit_problem(bomb)
    assert err.value.status == 413
    with pytest.raises(ServiceError) as err:
        client.submit_problem({"nodes": [{"cost": [0]}] * 6000})
    assert err.value.status == 413 and err.value.field == "nodes"


def test_a_full_queue_is_429_with_retry_after(client) -> None:
    jobs = [client.submit_problem(hard_problem(seed=10 + i), time_limit=30) for i in range(2)]
    for job in jobs:  # both workers busy
        _wait_state(client, job["id"], ("running",))
    queued = [client.submit_problem(hard_problem(seed=20 + i), time_limit=30) for i in range(2)]
    assert client.status(queued[1]["id"])["queue_position"] == 1
    status, headers, body = _raw("POST", client.url + "/v1/problems?time_limit=30",
                                 json.dumps(hard_problem(seed=30)).encode(),
                                 {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    assert status == 429 and int(headers["Retry-After"]) >= 1, body
    for job in jobs + queued:
        client.cancel(job["id"])
    assert client.solve_problem(small_problem(offset=30), time_limit=5).cost == 32


def test_a_token_is_required(server) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        status, got, _ = _raw("GET", server.url + "/v1/jobs/nope", headers=headers)
        assert status == 401 and got["WWW-Authenticate"] == "Bearer"
        status, _, _ = _raw("POST", server.url + "/v1/problems", json.dumps(small_problem()).encode(), headers)
        assert status == 401
        assert _raw("GET", server.url + "/metrics", headers=headers)[0] == 401
    assert _raw("GET", server.url + "/v1/jobs/nope", headers={"Authorization": f"Bearer {TOKEN}"})[0] == 404
    assert _raw("GET", server.url + "/healthz")[0] == 200
    with pytest.raises(ServiceError, match="401"):
        ServiceClient(server.url, token="wrong").submit_problem(small_problem())


def test_metrics_and_openapi(client) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    client.solve_problem(small_problem(offset=40), time_limit=5)
    client.solve_problem(small_problem(offset=40), time_limit=5)
    _, text = client.request("GET", "/metrics")
    families = {f.name: f for f in text_string_to_metric_families(text.decode())}
    for name in ("autoshard_jobs", "autoshard_solve_seconds", "autoshard_cache_hits", "autoshard_cache_misses",
                 "autoshard_queue_length", "autoshard_jobs_finished"):
        assert name in families, sorted(families)
    states = {s.labels["state"]: s.value for s in families["autoshard_jobs"].samples}
    assert states["done"] >= 2 and set(states) >= {"queued", "running", "failed", "cancelled"}
    hits = [s.value for s in families["autoshard_cache_hits"].samples if s.name == "autoshard_cache_hits_total"]
    assert hits and hits[0] >= 1
    spec = json.loads(client.request("GET", "/openapi.json")[1])
    assert {"/v1/problems", "/v1/plans", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/result", "/healthz",
            "/metrics"} <= set(spec["paths"])
    assert "delete" in spec["paths"]["/v1/jobs/{job_id}"]


def test_the_cache_survives_a_restart(tmp_path, token_file) -> None:
    first = Server(tmp_path / "cache", tmp_path / "log", "--workers", "1", cli=True).start()  # autoshard serve
    try:
        client = ServiceClient(first.url)
        solution = client.solve_problem(small_problem(offset=50), time_limit=5)
    finally:
        first.stop()
    second = Server(tmp_path / "cache", tmp_path / "log", "--workers", "1").start()
    try:
        client = ServiceClient(second.url)
        job = client.submit_problem(small_problem(offset=50), time_limit=5)
        result = client.result(job["id"])
        assert job["cached"] and job["state"] == "done"
        assert metric(client, "autoshard_cache_misses") == 0 and metric(client, "autoshard_cache_hits") == 1
        assert tuple(result["choice"]) == solution.choice
    finally:
        second.stop()


def test_the_server_process_imports_no_torch(server) -> None:
    modules = Path(f"/proc/{server.proc.pid}/maps").read_text()
    assert "libtorch" not in modules


def test_the_service_imports_no_torch() -> None:
    code = ("import sys, autoshard.service.app, autoshard.service.worker, autoshard.service.client, "
            "autoshard.cli.serve, autoshard.assembly.assemble; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
