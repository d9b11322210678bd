"""The plan service's client: standard library only (``urllib``), so it adds no dependency
(answers are parsed by ``hw_profiles.json_input``, of this distribution, imported on the first call).

Why a client of its own: ``autoshard.solve(..., server=URL)``, ``autoshard
solve --server URL`` and ``python -m solver FILE --server URL`` hand the
solve to a shared ``autoshard serve`` and must give back the same objects as a
local solve (:class:`solver.Solution`, :class:`autoshard.plan.format.Plan`).
Every failure is one :class:`ServiceError` line (a ``ValueError``, so the
command lines print it as their other user errors): unreachable server,
refused input (the server's message names the field), failed or cancelled
job. Bodies over ``GZIP_ABOVE`` bytes go gzip-compressed. The token comes
from ``token=`` or the ``AUTOSHARD_TOKEN`` environment variable.

>>> client = ServiceClient("http://127.0.0.1:8470")   # doctest: +SKIP
>>> solution = client.solve_problem({"nodes": [{"cost": [1, 2]}]}, time_limit=5)   # doctest: +SKIP
>>> solution.choice   # doctest: +SKIP
(0,)
"""

from __future__ import annotations

import gzip
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Mapping

__all__ = ["ServiceError", "ServiceClient", "GZIP_ABOVE", "TOKEN_ENV"]

GZIP_ABOVE = 1 << 20
TOKEN_ENV = "AUTOSHARD_TOKEN"
FINAL = ("done", "failed", "cancelled")


class ServiceError(ValueError):
    """The service could not give an answer; ``status`` is the HTTP status (None: no answer)."""

    def __init__(self, message: str, status: int | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.field = field


class ServiceClient:
    """Talks to one ``autoshard serve`` at ``url`` (``http://host:port``).

    >>> ServiceClient("http://127.0.0.1:8470/").url
    'http://127.0.0.1:8470'
    """

    def __init__(self, url: str, *, token: str | None = None, timeout_s: float = 60.0) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ServiceError(f"server {url!r}: expected a URL such as http://host:8470")
        self.url = url.rstrip("/")
        self.token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        self.timeout_s = timeout_s

    # -- HTTP ----------------------------------------------------------------
    def request(self, method: str, path: str, body: bytes | None = None, *, query: Mapping[str, Any] | None = None,
                gzipped: bool = False) -> tuple[int, bytes]:
        """One call; returns (status, body) for 2xx, raises :class:`ServiceError` otherwise."""
        url = self.url + path
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
            if not gzipped and len(body) > GZIP_ABOVE:
                body, gzipped = gzip.compress(body, compresslevel=1), True
            if gzipped:
                headers["Content-Encoding"] = "gzip"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(url, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                data = _parse(raw)
                detail, field = data.get("detail", raw.decode(errors="replace")), data.get("field")
            except (ValueError, AttributeError):
                detail, field = raw.decode(errors="replace").strip()[:300], None
            if exc.code == 429:
                detail += f" (Retry-After: {exc.headers.get('Retry-After', '?')} s)"
            raise ServiceError(f"server {self.url}: {exc.code}: {detail}", exc.code, field) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            reason = getattr(reason, "strerror", None) or str(reason)
            raise ServiceError(f"server {self.url}: unreachable ({reason})") from None

    def _json(self, method: str, path: str, body: bytes | None = None, **kwargs: Any) -> dict[str, Any]:
        _, raw = self.request(method, path, body, **kwargs)
        try:
            return _parse(raw)
        except ValueError:
            raise ServiceError(f"server {self.url}: answered {path} with something that is not JSON") from None

    # -- endpoints ---------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        """``GET /healthz``."""
        return self._json("GET", "/healthz")

    def submit_problem(self, problem: Any, **options: Any) -> dict[str, Any]:
        """``POST /v1/problems``: ``problem`` is a :class:`solver.Problem`, a JSON-able
        dict, or the bytes of a (possibly gzip) problem file; options as query
        (``time_limit``, ``backend``, ``method``, ``seed``, ``threads``, ``gap``, ``inner``, ``format``)."""
        body, gzipped = _body(problem)
        return self._json("POST", "/v1/problems", body, query=options, gzipped=gzipped)

    def submit_plan(self, request: Any, **options: Any) -> dict[str, Any]:
        """``POST /v1/plans`` with a dumped problem (dict or bytes; ``autoshard solve --dump-problem``)."""
        body, gzipped = _body(request)
        return self._json("POST", "/v1/plans", body, query=options, gzipped=gzipped)

    def status(self, job_id: str) -> dict[str, Any]:
        """``GET /v1/jobs/{id}``: state, progress, incumbent, bound, gap."""
        return self._json("GET", f"/v1/jobs/{urllib.parse.quote(job_id)}")

    def result(self, job_id: str) -> dict[str, Any]:
        """``GET /v1/jobs/{id}/result``."""
        return self._json("GET", f"/v1/jobs/{urllib.parse.quote(job_id)}/result")

    def cancel(self, job_id: str) -> dict[str, Any]:
        """``DELETE /v1/jobs/{id}``."""
        return self._json("DELETE", f"/v1/jobs/{urllib.parse.quote(job_id)}")

    def wait(self, job_id: str, *, timeout_s: float | None = None,
             on_progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Poll until the job is final (20 ms first, then slower, at most 1 s apart); the
        result of a ``done`` job, :class:`ServiceError` for a failed or cancelled one."""
        start, pause = time.monotonic(), 0.02
        while True:
            status = self.status(job_id)
            if on_progress is not None:
                on_progress(status)
            if status["state"] in FINAL:
                break
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                raise ServiceError(f"server {self.url}: job {job_id} not finished after {timeout_s:g} s")
            time.sleep(pause)
            pause = min(pause * 1.5, 1.0)
        if status["state"] != "done":
            raise ServiceError(f"server {self.url}: job {job_id} {status['state']}: {status.get('error')}")
        return self.result(job_id)

    # -- whole solves -------------------------------------------------------------
    def solve_problem(self, problem: Any, *, on_progress: Callable[[dict[str, Any]], None] | None = None,
                      **options: Any) -> Any:
        """Submit, wait, and return the :class:`solver.Solution` (as a local ``solver.solve``)."""
        from solver.solution import Solution

        job = self.submit_problem(problem, **options)
        return Solution.from_dict(self.wait(job["id"], on_progress=on_progress))

    def solve_plan(self, request: Any, *, on_progress: Callable[[dict[str, Any]], None] | None = None,
                   **options: Any) -> tuple[Any, Any]:
        """Submit a dumped problem, wait; (:class:`Plan` or None when no plan fits, :class:`Solution`)."""
        from solver.solution import Solution

        from autoshard.plan.format import Plan

        job = self.submit_plan(request, **options)
        data = self.wait(job["id"], on_progress=on_progress)
        plan = Plan.from_dict(data["plan"]) if data.get("plan") else None
        return plan, Solution.from_dict(data["solution"])


def _parse(raw: bytes) -> Any:
    """An answer of the server as JSON, nesting bounded (a ``ValueError`` otherwise)."""
    from hw_profiles.json_input import parse_json

    return parse_json(raw)


def _body(obj: Any) -> tuple[bytes, bool]:
    """(JSON bytes, already gzip) of a problem given as bytes, a dict or a Problem."""
    if isinstance(obj, (bytes, bytearray)):
        return bytes(obj), obj[:2] == b"\x1f\x8b"
    if hasattr(obj, "to_dict"):
        obj = obj.to_dict()
    return json.dumps(obj, allow_nan=False, separators=(",", ":")).encode(), False
