"""Helpers of the service tests: a real ``autoshard serve`` subprocess on loopback, and problems."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "s3cret-token-for-tests"


class Server:
    """``python -m autoshard.service --port 0 ...`` (the torch-free entry point; ``cli=True``:
    ``python -m autoshard.cli serve``) as a subprocess; ``url`` once it listens."""

    def __init__(self, cache: Path, log: Path, *args: str, cli: bool = False) -> None:
        self.cache, self.log, self.args = cache, log, args
        self.command = ["autoshard.cli", "serve"] if cli else ["autoshard.service"]
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> "Server":
        handle = open(self.log, "ab")
        start = self.log.stat().st_size if self.log.exists() else 0
        self.proc = subprocess.Popen(
            [sys.executable, "-m", *self.command, "--port", "0", "--cache", str(self.cache), *self.args],
            cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        handle.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = self.log.read_bytes()[start:].decode(errors="replace")
            found = re.search(r"listening on (http://\S+)", text)
            if found:
                self.url = found.group(1)
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {text}")
            time.sleep(0.05)
        raise RuntimeError("server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def small_problem(offset: int = 0) -> dict[str, Any]:
    """Two nodes; optimum (1, 1) at cost 2 + offset."""
    return {"format": "autoshard.problem/1",
            "nodes": [{"cost": [1 + offset, 2 + offset]}, {"cost": [3, 0]}],
            "edges": [{"src": 0, "dst": 1, "cost": [[0, 5], [5, 0]]}]}


def hard_problem(n: int = 300, k: int = 8, seed: int = 0) -> dict[str, Any]:
    """Random costs under a binding memory limit: the solver works until its time limit (0.3 MB)."""
    rnd = random.Random(seed)
    nodes = [{"cost": [rnd.randint(0, 100) for _ in range(k)], "memory": [rnd.randint(1, 100) for _ in range(k)],
              "live": [i, i + rnd.randint(1, 30)]} for i in range(n)]
    edges = [{"src": j, "dst": i, "cost": [[rnd.randint(0, 100) for _ in range(k)] for _ in range(k)]}
             for i in range(1, n) for j in rnd.sample(range(i), min(i, 3))]
    return {"format": "autoshard.problem/1", "nodes": nodes, "edges": edges, "memory_limit": 600}


def metric(client: Any, name: str) -> float:
    """A counter of the service's ``/metrics`` (Prometheus text), 0 when absent.

    Cache tests assert on these counters (a hit starts no solve) rather than on
    wall time, which a loaded machine stretches and an idle one cannot prove."""
    _, text = client.request("GET", "/metrics")
    total = 0.0
    for line in text.decode().splitlines():
        if line.startswith(name) and not line.startswith("#"):
            head, _, value = line.rpartition(" ")
            if head.split("{")[0] in (name, name + "_total"):
                total += float(value)
    return total
