"""Reading problems and writing solutions: our format, the IOPDDL contest format, gzip.

``load_problem`` accepts ``autoshard.problem/1`` and the IOPDDL contest format
(XLA's exported auto-sharding problems, ``../shared/iopddl/README.md``), plain
or gzip-compressed, and detects which from the content. Files are written
atomically (temporary file in the same folder, then rename), so a reader never
sees half a file and an interrupted write leaves the old file in place.

IOPDDL semantics kept exactly: a node's memory counts at ``start <= t < end``
(``[0, 0]`` = nowhere); an edge's costs are flattened row-major
(``s_u * len(S_v) + s_v``); several edges on one pair add up; 1e18 means
forbidden.

>>> problem = load_problem("../shared/iopddl/asplos-2025-iopddl-V.json.gz")  # doctest: +SKIP
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from hw_profiles.json_input import parse_json
from solver.problem import FORBIDDEN_COST, Edge, Node, Problem, ProblemError
from solver.problem_values import json_text

__all__ = [
    "FORMATS",
    "load_json",
    "load_problem",
    "problem_from_json",
    "problem_from_iopddl",
    "problem_to_iopddl",
    "detect_format",
    "write_json_atomic",
    "write_text_atomic",
    "iopddl_choice_line",
]

FORMATS = ("autoshard", "iopddl")


def load_json(path: str | os.PathLike[str]) -> Any:
    """Parse a JSON file, gunzipping it when it starts with the gzip magic bytes
    (nesting bounded: :func:`hw_profiles.json_input.parse_json`)."""
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise ProblemError("(file)", f"corrupt gzip data: {exc}") from None
    try:
        return parse_json(raw)
    except json.JSONDecodeError as exc:
        raise ProblemError("(file)", f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except UnicodeDecodeError:
        raise ProblemError("(file)", "not a text (UTF-8) JSON file") from None


def detect_format(data: Any) -> str:
    """``"iopddl"`` for the contest's ``{"problem": {...}}`` layout, else ``"autoshard"``."""
    if isinstance(data, Mapping) and "problem" in data and "format" not in data:
        return "iopddl"
    return "autoshard"


def problem_from_json(data: Any, fmt: str | None = None) -> Problem:
    """Build a problem from parsed JSON in either format (detected when ``fmt`` is None)."""
    fmt = fmt or detect_format(data)
    if fmt == "iopddl":
        return problem_from_iopddl(data)
    if fmt == "autoshard":
        return Problem.from_dict(data)
    raise ValueError(f"unknown problem format {fmt!r} (expected one of {', '.join(FORMATS)})")


def load_problem(path: str | os.PathLike[str], fmt: str | None = None) -> Problem:
    """Read a problem file (JSON or gzip JSON, either format)."""
    return problem_from_json(load_json(path), fmt)


def _field(mapping: Any, key: str, path: str) -> Any:
    if not isinstance(mapping, Mapping) or key not in mapping:
        raise ProblemError(f"{path}.{key}" if path else key, "missing")
    return mapping[key]


def problem_from_iopddl(data: Mapping[str, Any]) -> Problem:
    """Convert the IOPDDL contest layout (see module docstring)."""
    prob = _field(data, "problem", "")
    nodes_raw = _field(prob, "nodes", "problem")
    intervals = _field(nodes_raw, "intervals", "problem.nodes")
    costs = _field(nodes_raw, "costs", "problem.nodes")
    usages = _field(nodes_raw, "usages", "problem.nodes")
    if not (isinstance(intervals, list) and isinstance(costs, list) and isinstance(usages, list)):
        raise ProblemError("problem.nodes", "intervals, costs and usages must be lists")
    if not len(intervals) == len(costs) == len(usages):
        raise ProblemError(
            "problem.nodes",
            f"intervals, costs and usages differ in length ({len(intervals)}, {len(costs)}, {len(usages)})",
        )
    cost_flat, cost_off = _flatten(costs, "problem.nodes.costs")
    usage_flat, usage_off = _flatten(usages, "problem.nodes.usages")
    if not np.array_equal(cost_off, usage_off):
        i = int(np.flatnonzero(np.diff(cost_off) != np.diff(usage_off))[0])
        raise ProblemError(f"problem.nodes.usages[{i}]", "expected one usage per cost")
    try:
        # an empty list would give shape (0,), not (0, 2)
        live = np.asarray(intervals, dtype=np.int64) if intervals else np.zeros((0, 2), np.int64)
    except (TypeError, ValueError):
        live = None
    if live is None or live.shape != (len(intervals), 2):
        bad = next((i for i, iv in enumerate(intervals) if not (isinstance(iv, list) and len(iv) == 2)), 0)
        raise ProblemError(f"problem.nodes.intervals[{bad}]", f"expected [start, end], got {intervals[bad]!r}")
    cost_flat[cost_flat >= FORBIDDEN_COST] = np.inf
    live_list = live.tolist()
    nodes = [
        Node(cost=cost_flat[cost_off[i] : cost_off[i + 1]], memory_bytes=usage_flat[usage_off[i] : usage_off[i + 1]],
             live=(live_list[i][0], live_list[i][1]))
        for i in range(len(costs))
    ]
    edges_raw = _field(prob, "edges", "problem")
    pairs = _field(edges_raw, "nodes", "problem.edges")
    edge_costs = _field(edges_raw, "costs", "problem.edges")
    if not (isinstance(pairs, list) and isinstance(edge_costs, list)) or len(pairs) != len(edge_costs):
        raise ProblemError("problem.edges", "nodes and costs must be lists of the same length")
    n = len(nodes)
    try:
        ends = np.asarray(pairs, dtype=np.int64) if pairs else np.zeros((0, 2), np.int64)
    except (TypeError, ValueError):
        ends = None
    if ends is None or ends.shape != (len(pairs), 2):
        bad = next((j for j, pr in enumerate(pairs) if not (isinstance(pr, list) and len(pr) == 2)), 0)
        raise ProblemError(f"problem.edges.nodes[{bad}]", f"expected [u, v], got {pairs[bad]!r}")
    if ends.size and (ends.min() < 0 or ends.max() >= n):
        j = int(np.flatnonzero((ends < 0).any(axis=1) | (ends >= n).any(axis=1))[0])
        raise ProblemError(f"problem.edges.nodes[{j}]", f"node out of range (problem has {n} nodes)")
    flat, off = _flatten(edge_costs, "problem.edges.costs")
    sizes = np.diff(cost_off)
    expected = sizes[ends[:, 0]] * sizes[ends[:, 1]] if ends.size else np.zeros(0, np.int64)
    if not np.array_equal(np.diff(off), expected):
        j = int(np.flatnonzero(np.diff(off) != expected)[0])
        raise ProblemError(
            f"problem.edges.costs[{j}]",
            f"expected {sizes[ends[j, 0]]}x{sizes[ends[j, 1]]}={expected[j]} costs, got {off[j + 1] - off[j]}",
        )
    flat[flat >= FORBIDDEN_COST] = np.inf
    pairs_list = ends.tolist()
    edges = [
        Edge(src=u, dst=v, cost=flat[off[j] : off[j + 1]].reshape(int(sizes[u]), int(sizes[v])))
        for j, (u, v) in enumerate(pairs_list)
    ]
    limit = prob.get("usage_limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float))):
        raise ProblemError("problem.usage_limit", f"must be a number, got {limit!r}")
    return Problem(
        nodes=tuple(nodes),
        edges=tuple(edges),
        memory_limit=None if limit is None else float(limit),
        name=str(prob.get("name", "")),
    )


def _flatten(lists: list, field_path: str) -> tuple[np.ndarray, np.ndarray]:
    """One float64 array of all numbers in a list of lists, and the offsets of each list.

    numpy reads true/false as 1/0; the set of the numbers' types (one more pass
    at C speed: 0.02 s on IOPDDL P's 1.4 million numbers, 0.13 s on R's 6.5
    million, against 1 s to parse R) catches them."""
    try:
        lengths = np.fromiter((len(item) for item in lists), dtype=np.int64, count=len(lists))
        plain = set(map(type, itertools.chain.from_iterable(lists))) <= {int, float}
        flat = np.fromiter(itertools.chain.from_iterable(lists), dtype=np.float64, count=int(lengths.sum()))
    except (TypeError, ValueError):
        plain = False
    if not plain:
        for i, item in enumerate(lists):
            if not isinstance(item, list):
                raise ProblemError(f"{field_path}[{i}]", "expected a list of numbers")
            for k, v in enumerate(item):
                if not isinstance(v, (int, float)) or isinstance(v, bool):
                    raise ProblemError(f"{field_path}[{i}][{k}]", f"expected a number, got {json_text(v)}")
        raise ProblemError(field_path, "expected lists of numbers")
    off = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum(lengths, out=off[1:])
    return flat, off


def problem_to_iopddl(problem: Problem) -> dict[str, Any]:
    """The contest layout of a problem (ties and pins cannot be expressed there).

    IOPDDL has no "always live": its ``[0, 0]`` means "counts nowhere", the
    opposite of our absent ``live``. A node without ``live`` is written with
    the interval spanning every other node's (``[0, 1]`` when none has one),
    which gives every choice the same peak: outside that span no other node is
    live, so the always-live ones alone count there, as they do inside it.
    Numbers are written as integers where integral (the contest's files hold
    only integers) and as floats otherwise, which the reader accepts: rounding
    memory or costs would change the problem. No memory limit: no
    ``usage_limit``, which the reader takes as none.
    """
    if problem.ties or problem.pins:
        raise ValueError("the IOPDDL format has no ties or pins")

    def number_list(values: np.ndarray) -> list[float | int]:
        return [FORBIDDEN_COST if not np.isfinite(v) else (int(v) if float(v).is_integer() else float(v))
                for v in values.tolist()]

    spans = [node.live for node in problem.nodes if node.live is not None and node.live[0] < node.live[1]]
    always = [min(s for s, _ in spans), max(e for _, e in spans)] if spans else [0, 1]
    out: dict[str, Any] = {
        "name": problem.name,
        "nodes": {
            "intervals": [list(node.live) if node.live is not None else list(always) for node in problem.nodes],
            "costs": [number_list(node.cost) for node in problem.nodes],
            "usages": [number_list(node.memory_bytes) for node in problem.nodes],
        },
        "edges": {
            "nodes": [[e.src, e.dst] for e in problem.edges],
            "costs": [number_list(e.cost.ravel()) for e in problem.edges],
        },
    }
    if problem.memory_limit is not None:
        out["usage_limit"] = int(problem.memory_limit) if float(problem.memory_limit).is_integer() \
            else problem.memory_limit
    return {"problem": out}


def write_text_atomic(path: str | os.PathLike[str], text: str, *, parents: bool = False) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically: see :func:`write_bytes_atomic`."""
    write_bytes_atomic(path, text.encode("utf-8"), parents=parents)


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, *, parents: bool = False) -> None:
    """Write ``data`` to ``path`` atomically (temp file + fsync + rename), with the
    permissions a plain ``open`` would give (the user's umask). The folder must
    exist unless ``parents=True`` (a user's typo must not create directories);
    a failure leaves no file behind."""
    target = Path(path)
    if parents:
        target.parent.mkdir(parents=True, exist_ok=True)
    elif not target.parent.is_dir():
        raise FileNotFoundError(f"{target.parent}: no such directory (for {target.name})")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600 files
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_json_atomic(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 1) -> None:
    """Serialise ``obj`` as JSON and write it atomically."""
    write_text_atomic(path, json.dumps(obj, indent=indent) + "\n")


def _umask() -> int:
    mask = os.umask(0o022)  # the only portable way to read it is to set it
    os.umask(mask)
    return mask


def iopddl_choice_line(choice: Sequence[int]) -> str:
    """The contest's output: ``[s0, s1, ...]``."""
    return "[" + ", ".join(str(int(c)) for c in choice) + "]"
