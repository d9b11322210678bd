"""Fixtures of the service tests; ``service_helpers`` (this folder) goes on ``sys.path``.
Modules that need the server skip when FastAPI, uvicorn or prometheus-client is missing."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from service_helpers import TOKEN, Server  # noqa: E402


@pytest.fixture(scope="module")
def token_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("token") / "token"
    path.write_text(TOKEN + "\n")
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory, token_file) -> Any:
    """Two workers, a queue of 2, a token, a 2 MiB body limit, 5000 nodes at most."""
    base = tmp_path_factory.mktemp("serve")
    srv = Server(base / "cache", base / "server.log", "--workers", "2", "--max-queue", "2", "--token-file",
                 str(token_file), "--max-body", "2MiB", "--max-nodes", "5000", "--max-time-limit", "120")
    srv.start()
    yield srv
    srv.stop()
