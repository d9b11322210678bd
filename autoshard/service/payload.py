"""Request bodies and options -> validated problems, with the limits that keep a shared box alive.

Why here and not in the routes: the service must refuse bad input before it
costs a worker (a malformed problem is a 400 that names the field, with the
solver's own messages from ``solver.problem``), bound what one request may
cost (body size, decompressed size, nodes and edges, time limit), and the
worker process parses the same bytes the same way. Only JSON crosses the
HTTP boundary; gzip bodies (``Content-Encoding: gzip``, or the gzip magic
bytes) are inflated with a bound, so a small bomb cannot fill memory.

>>> decode_body(b'{"nodes": []}', None, Limits()) == b'{"nodes": []}'
True
>>> problem_options({"time_limit": "5"}, Limits())["time_limit"]
5.0
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass
from typing import Any, Mapping

from hw_profiles.json_input import parse_json
from solver.io import FORMATS, detect_format, problem_from_json
from solver.pipeline import METHODS
from solver.problem import Problem, ProblemError

from autoshard.plan.options import DEFAULT_BACKEND, DEFAULT_TIME_LIMIT_S, PLAN_GAP

__all__ = ["BadRequest", "Limits", "decode_body", "problem_options", "plan_options", "parse_problem",
           "parse_plan", "count_sizes", "release_memory"]

INNER = ("trws", "treedp", "toulbar2")


class BadRequest(ValueError):
    """Input the service refuses: HTTP ``status`` and the ``field`` at fault."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.field = field


@dataclass(frozen=True, slots=True)
class Limits:
    """What one request may cost."""

    max_body_bytes: int = 512 * 2**20
    """Request body, before and after gzip inflation (413 beyond)."""
    max_nodes: int = 1_000_000
    """Problem nodes (413 beyond)."""
    max_edges: int = 4_000_000
    """Problem edges (413 beyond)."""
    max_time_limit_s: float = 600.0
    """The largest ``time_limit`` a request may ask (400 beyond)."""
    default_time_limit_s: float = DEFAULT_TIME_LIMIT_S
    """``time_limit`` when a problem request gives none."""

    def __post_init__(self) -> None:
        if self.max_body_bytes <= 0 or self.max_nodes <= 0 or self.max_edges <= 0:
            raise ValueError("limits: sizes must be positive")
        if not 0 < self.default_time_limit_s <= self.max_time_limit_s:
            raise ValueError("limits: need 0 < default time limit <= max time limit")


def decode_body(raw: bytes, content_encoding: str | None, limits: Limits) -> bytes:
    """The JSON bytes of a request body: gzip inflated (bounded), identity as is."""
    encoding = (content_encoding or "identity").strip().lower()
    if encoding not in ("identity", "gzip", "x-gzip"):
        raise BadRequest(415, f"Content-Encoding: {encoding!r} is not supported (gzip or none)", "Content-Encoding")
    if encoding == "identity" and raw[:2] != b"\x1f\x8b":
        return raw
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(raw, limits.max_body_bytes + 1)
    except zlib.error as exc:
        raise BadRequest(400, f"(body): corrupt gzip data: {exc}", "(body)") from None
    if len(out) > limits.max_body_bytes or inflater.unconsumed_tail:
        raise BadRequest(413, f"(body): more than {limits.max_body_bytes} bytes once inflated", "(body)")
    if not inflater.eof:
        raise BadRequest(400, "(body): truncated gzip data", "(body)")
    return out


def _number(query: Mapping[str, str], key: str, kind: type, default: Any, low: float, high: float) -> Any:
    text = query.get(key)
    if text is None:
        return default
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise BadRequest(400, f"{key}: expected a number, got {text!r}", key) from None
    if isinstance(value, float) and not math.isfinite(value) or not low <= value <= high:
        raise BadRequest(400, f"{key}: must be in [{low:g}, {high:g}], got {text!r}", key)
    return value


def _choice(query: Mapping[str, str], key: str, allowed: tuple[str, ...], default: Any) -> Any:
    text = query.get(key)
    if text is None:
        return default
    if text not in allowed:
        raise BadRequest(400, f"{key}: unknown {text!r} (expected one of {', '.join(allowed)})", key)
    return text


def _common(query: Mapping[str, str], limits: Limits, allowed: set[str], defaults: Mapping[str, Any]) -> dict:
    from solver.backends import BACKENDS

    unknown = sorted(set(query) - allowed)
    if unknown:
        raise BadRequest(400, f"{unknown[0]}: unknown option (known: {', '.join(sorted(allowed))})", unknown[0])
    return {
        "time_limit": _number(query, "time_limit", float, float(defaults["time_limit"]), 1e-3, limits.max_time_limit_s),
        "backend": _choice(query, "backend", tuple(sorted(BACKENDS)), defaults["backend"]),
        "gap": _number(query, "gap", float, float(defaults["gap"]), 0.0, 1.0),
        "seed": _number(query, "seed", int, 0, 0, 2**31 - 1),
        "threads": _number(query, "threads", int, None, 1, 1024),
    }


def problem_options(query: Mapping[str, str], limits: Limits) -> dict[str, Any]:
    """Options of ``POST /v1/problems`` from its query string (``?time_limit=10&backend=cpsat``):
    ``time_limit``, ``backend``, ``gap``, ``seed``, ``threads``, ``method``, ``inner``, ``format``."""
    from solver.tolerance import DEFAULT_GAP

    allowed = {"time_limit", "backend", "gap", "seed", "threads", "method", "inner", "format"}
    options = _common(query, limits, allowed,
                      {"time_limit": limits.default_time_limit_s, "backend": DEFAULT_BACKEND, "gap": DEFAULT_GAP})
    options["method"] = _choice(query, "method", METHODS, "auto")
    options["inner"] = _choice(query, "inner", INNER, None)
    options["format"] = _choice(query, "format", FORMATS, None)
    return options


def plan_options(query: Mapping[str, str], solve: Mapping[str, Any], limits: Limits) -> dict[str, Any]:
    """Options of ``POST /v1/plans``: the query string over the request's own
    ``autoshard.solve`` section (how ``autoshard solve`` ran the solver)."""
    defaults = {"time_limit": min(float(solve.get("time_limit", limits.default_time_limit_s)), limits.max_time_limit_s),
                "backend": str(solve.get("backend", DEFAULT_BACKEND)), "gap": float(solve.get("gap", PLAN_GAP))}
    return _common(query, limits, {"time_limit", "backend", "gap", "seed", "threads"}, defaults)


def _load(body: bytes) -> Any:
    try:
        return parse_json(body)
    except json.JSONDecodeError as exc:
        raise BadRequest(400, f"(body): malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                         "(body)") from None
    except UnicodeDecodeError:
        raise BadRequest(400, "(body): not UTF-8 JSON", "(body)") from None


def count_sizes(data: Any, fmt: str) -> tuple[int, int]:
    """(nodes, edges) of a parsed problem document, without building it."""
    if fmt == "iopddl":
        prob = data.get("problem") if isinstance(data, Mapping) else None
        nodes = (prob or {}).get("nodes", {}) if isinstance(prob, Mapping) else {}
        edges = (prob or {}).get("edges", {}) if isinstance(prob, Mapping) else {}
        costs = nodes.get("costs") if isinstance(nodes, Mapping) else None
        pairs = edges.get("nodes") if isinstance(edges, Mapping) else None
        return (len(costs) if isinstance(costs, list) else 0), (len(pairs) if isinstance(pairs, list) else 0)
    nodes = data.get("nodes") if isinstance(data, Mapping) else None
    edges = data.get("edges") if isinstance(data, Mapping) else None
    return (len(nodes) if isinstance(nodes, list) else 0), (len(edges) if isinstance(edges, list) else 0)


def _check_sizes(data: Any, fmt: str, limits: Limits) -> None:
    nodes, edges = count_sizes(data, fmt)
    if nodes > limits.max_nodes:
        raise BadRequest(413, f"nodes: {nodes} nodes, more than this server's limit of {limits.max_nodes}", "nodes")
    if edges > limits.max_edges:
        raise BadRequest(413, f"edges: {edges} edges, more than this server's limit of {limits.max_edges}", "edges")


def _problem(data: Any, fmt: str | None) -> Problem:
    try:
        return problem_from_json(data, fmt)
    except ProblemError as exc:
        raise BadRequest(400, str(exc), exc.field) from None
    except (TypeError, AttributeError) as exc:  # a shape the format's reader does not expect
        raise BadRequest(400, f"(body): not a {fmt or 'problem'} document ({exc})", "(body)") from None


def parse_problem(body: bytes, fmt: str | None, limits: Limits) -> Problem:
    """The validated problem of a ``POST /v1/problems`` body (either format, detected
    unless ``fmt``); :class:`BadRequest` naming the field otherwise."""
    data = _load(body)
    fmt = fmt or detect_format(data)
    _check_sizes(data, fmt, limits)
    return _problem(data, fmt)


def parse_plan(body: bytes, limits: Limits) -> tuple[Problem, Any]:
    """(problem, :class:`autoshard.assembly.request.PlanRequest`) of a ``POST /v1/plans``
    body: a problem dumped by ``autoshard solve --dump-problem``, checked to fit its section."""
    from autoshard.assembly.request import AssemblyError, PlanRequest

    data = _load(body)
    if not isinstance(data, Mapping):
        raise BadRequest(400, "(root): expected a JSON object", "(root)")
    _check_sizes(data, "autoshard", limits)
    try:
        request = PlanRequest.from_dict(data.get("autoshard"))
    except AssemblyError as exc:
        message = str(exc)
        raise BadRequest(400, message, message.split(":", 1)[0]) from None
    problem = _problem({k: v for k, v in data.items() if k != "autoshard"}, "autoshard")
    try:
        request.assembly.check(problem)
    except AssemblyError as exc:
        message = str(exc)
        raise BadRequest(400, message, message.split(":", 1)[0]) from None
    return problem, request


def release_memory() -> None:
    """Return freed heap pages to the system (glibc ``malloc_trim``; a no-op elsewhere):
    parsing a large problem leaves the server's resident memory high long after."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
