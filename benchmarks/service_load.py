"""Load on ``autoshard serve``: many mixed problems from concurrent clients on loopback.

Why: a team's plan service sees bursts of small and medium problems, the same
problem asked by several people, and now and then a production-sized one.
This sends ``--requests`` of them (small random problems, medium ones that
use their whole time limit, IOPDDL instances from ``../shared/iopddl/``, some
requests repeated) from ``--clients`` threads, each submit -> poll -> fetch,
and reports throughput, latency (p50/p99, submit to result), that no job was
lost or solved twice (every request has its result, identical requests have
identical results, and the server's cache misses equal the distinct requests)
and the server's resident memory at the start and the end.

    python benchmarks/service_load.py                       # starts its own server
    python benchmarks/service_load.py --server http://host:8470 --requests 400
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/service_load.py`: re-executed as the module

import argparse
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from autoshard.service.client import ServiceClient, ServiceError

ROOT = Path(__file__).resolve().parents[1]

IOPDDL = ROOT.parent / "shared" / "iopddl"


def random_problem(rnd: random.Random, nodes: int, k: int, memory: bool) -> dict[str, Any]:
    """A chain-plus-random-edges problem; with ``memory`` a binding memory limit (the solver works longer)."""
    out = [{"cost": [rnd.randint(0, 100) for _ in range(k)], "memory": [rnd.randint(1, 100) for _ in range(k)],
            "live": [i, i + rnd.randint(1, 20)]} for i in range(nodes)]
    edges = [{"src": j, "dst": i, "cost": [[rnd.randint(0, 100) for _ in range(k)] for _ in range(k)]}
             for i in range(1, nodes) for j in rnd.sample(range(i), min(i, 2))]
    problem = {"format": "autoshard.problem/1", "nodes": out, "edges": edges}
    if memory:
        problem["memory_limit"] = 40 * 20 * 2
    return problem


def workload(n: int, seed: int, iopddl: list[str]) -> list[tuple[str, bytes, dict[str, Any]]]:
    """``n`` requests (label, body, options): 60 % small, 25 % medium, 5 % IOPDDL, 10 % repeats."""
    rnd = random.Random(seed)
    bodies: dict[str, bytes] = {}
    for name in iopddl:
        bodies[name] = (IOPDDL / f"asplos-2025-iopddl-{name}.json.gz").read_bytes()
    out: list[tuple[str, bytes, dict[str, Any]]] = []
    for i in range(n):
        draw = rnd.random()
        if draw < 0.6:
            body = json.dumps(random_problem(rnd, rnd.randint(5, 60), rnd.randint(2, 6), False)).encode()
            out.append(("small", body, {"time_limit": 2}))
        elif draw < 0.85:
            body = json.dumps(random_problem(rnd, rnd.randint(100, 250), 6, True)).encode()
            out.append(("medium", body, {"time_limit": 1.5}))
        elif draw < 0.9 and iopddl:
            name = rnd.choice(iopddl)
            out.append((f"iopddl-{name}", bodies[name], {"time_limit": 6}))
        elif out:
            out.append(rnd.choice(out))  # a repeat: the cache or the solve in flight answers it
        else:
            out.append(("small", json.dumps(random_problem(rnd, 5, 2, False)).encode(), {"time_limit": 2}))
    rnd.shuffle(out)
    return out


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (the forkserver and the workers it forked)."""
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            kids = [int(c) for t in Path(f"/proc/{parent}/task").iterdir()
                    for c in (t / "children").read_text().split()]
        except OSError:
            kids = []
        out += kids
        todo += kids
    return out


def one_request(client: ServiceClient, body: bytes, options: dict[str, Any]) -> dict[str, Any]:
    """Submit (retrying a 429 after its Retry-After), wait, fetch; latency and the result."""
    start = time.perf_counter()
    while True:
        try:
            job = client.submit_problem(body, **options)
            break
        except ServiceError as exc:
            if exc.status != 429:
                raise
            found = re.search(r"Retry-After: (\d+)", str(exc))
            time.sleep(int(found.group(1)) if found else 1)
    result = client.wait(job["id"])
    return {"latency": time.perf_counter() - start, "id": job["id"], "cached": job["cached"],
            "shared": job["shared"], "cost": result["cost"], "choice": result["choice"], "status": result["status"]}


def start_server(workers: int, cache: str) -> tuple[subprocess.Popen, str]:
    log = Path(cache) / "server.log"
    Path(cache).mkdir(parents=True, exist_ok=True)
    handle = open(log, "wb")
    proc = subprocess.Popen([sys.executable, "-m", "autoshard.service", "--port", "0", "--cache", cache,
                             "--workers", str(workers), "--max-queue", "256"], cwd=ROOT, stdout=handle,
                            stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.search(r"listening on (http://\S+)", log.read_text(errors="replace"))
        if found:
            return proc, found.group(1)
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {log.read_text()}")
        time.sleep(0.1)
    raise SystemExit("server did not start")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2, help="worker processes of the server started here")
    parser.add_argument("--server", help="use this server instead of starting one (RSS is then not reported)")
    parser.add_argument("--iopddl", default="V,P", help="IOPDDL instances among the requests (comma list)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    names = [n for n in args.iopddl.split(",") if n and (IOPDDL / f"asplos-2025-iopddl-{n}.json.gz").exists()]
    requests = workload(args.requests, args.seed, names)
    proc = None
    if args.server:
        url = args.server
    else:
        proc, url = start_server(args.workers, tempfile.mkdtemp(prefix="autoshard-load-"))
    client = ServiceClient(url, timeout_s=120)
    pid = proc.pid if proc else None
    rss_start = rss_bytes(pid) if pid else 0
    peak = [rss_start]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            if pid:
                peak[0] = max(peak[0], rss_bytes(pid))

    threading.Thread(target=sample, daemon=True).start()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.clients) as pool:
        outcomes = list(pool.map(lambda r: _safe(client, r), requests))
    wall = time.perf_counter() - t0
    done.set()
    rss_end = rss_bytes(pid) if pid else 0
    workers_rss = sum(rss_bytes(c) for c in descendants(pid)) if pid else 0
    metrics = client.request("GET", "/metrics")[1].decode()
    if proc is not None:
        proc.terminate()
        proc.wait(30)

    ok = [o for o in outcomes if "error" not in o]
    lost = len(outcomes) - len(ok)
    by_body: dict[tuple, set] = {}
    for (label, body, options), o in zip(requests, outcomes):
        if "error" not in o:
            by_body.setdefault((body, json.dumps(options, sort_keys=True)), set()).add((o["cost"], tuple(o["choice"])))
    inconsistent = sum(1 for answers in by_body.values() if len(answers) > 1)
    misses = _metric(metrics, "autoshard_cache_misses_total")
    hits = _metric(metrics, "autoshard_cache_hits_total")
    shared = _metric(metrics, "autoshard_shared_requests_total")
    latencies = sorted(o["latency"] for o in ok)
    rows = [("requests", f"{len(requests)} from {args.clients} clients"), ("wall", f"{wall:.1f} s"),
            ("throughput", f"{len(ok) / wall:.2f} req/s"),
            ("latency p50", f"{statistics.median(latencies) * 1e3:.0f} ms" if latencies else "-"),
            ("latency p99", f"{latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] * 1e3:.0f} ms"
             if latencies else "-"),
            ("lost (no result)", str(lost)),
            ("distinct requests / solves run (cache misses)", f"{len(by_body)} / {misses:.0f}"),
            ("duplicated solves", str(int(misses - len(by_body)))),
            ("identical requests with different answers", str(inconsistent)),
            ("cache hits / attached to a solve in flight", f"{hits:.0f} / {shared:.0f}")]
    for label in sorted({r[0] for r in requests}):
        ls = sorted(o["latency"] for (lab, _, _), o in zip(requests, outcomes) if lab == label and "error" not in o)
        if ls:
            rows.append((f"p50 latency {label} ({len(ls)})", f"{statistics.median(ls) * 1e3:.0f} ms"))
    if pid:
        rows += [("server RSS start / end / peak", f"{rss_start / 2**20:.0f} / {rss_end / 2**20:.0f} / "
                  f"{peak[0] / 2**20:.0f} MiB"), ("forkserver + workers RSS at end", f"{workers_rss / 2**20:.0f} MiB")]
    print("| measure | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    errors = [o["error"] for o in outcomes if "error" in o]
    if errors:
        print("\nerrors:", *sorted(set(errors))[:5], sep="\n  ")
    return 0 if not lost and not inconsistent and misses == len(by_body) else 1


def _safe(client: ServiceClient, request: tuple[str, bytes, dict[str, Any]]) -> dict[str, Any]:
    try:
        return one_request(client, request[1], request[2])
    except ServiceError as exc:
        return {"error": str(exc)}


def _metric(text: str, name: str) -> float:
    found = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


if __name__ == "__main__":
    sys.exit(main())
