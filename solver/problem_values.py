"""Reading a problem file's values: numbers, cost lists and matrices, naming the field on error.

JSON gives lists of Python ``int``/``float``/``None``; these helpers turn them
into float64 arrays (``null`` and costs >= ``FORBIDDEN_COST`` as ``inf``) and
refuse everything else (``true``, ``"1"``, NaN, negative costs) with a
:class:`ProblemError` whose message starts with the field's path, e.g.
``nodes[3].cost[0]: expected a number, got true``.

>>> cost_array([1, None, 2e18], "nodes[0].cost").tolist()
[1.0, inf, inf]
>>> cost_array([1, True], "nodes[0].cost")
Traceback (most recent call last):
...
solver.problem_values.ProblemError: nodes[0].cost[1]: expected a number, got true
"""

from __future__ import annotations

import itertools
import json
import math
import numbers
from typing import Any, Mapping

import numpy as np

__all__ = ["FORBIDDEN_COST", "ProblemError", "TOP_KEYS", "NODE_KEYS", "EDGE_KEYS", "refuse_unknown_key",
           "json_text", "number_list", "matrix_array", "cost_array", "check_costs", "all_valid_costs",
           "all_valid_memory"]

# Costs at or above this are "forbidden", as in XLA's exports (1e18).
FORBIDDEN_COST = 1e18


class ProblemError(ValueError):
    """A problem that does not follow the format; the message names the field."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}")
        self.field = field_path


# Keys each object may have. A misspelt key must not pass as an absent one
# ("memmory" would mean "no memory"); "autoshard" is the section that
# `autoshard solve --dump-problem` adds and the solver does not read.
TOP_KEYS = frozenset({"format", "name", "nodes", "matrices", "edges", "memory_limit", "ties", "pins", "autoshard"})
NODE_KEYS = frozenset({"name", "strategies", "cost", "memory", "live"})
EDGE_KEYS = frozenset({"src", "dst", "cost", "matrix"})

# JSON numbers arrive as exactly these types; checking the set of types of a
# list (C speed) keeps the common cases to one pass, and catches true/false,
# which Python and numpy would otherwise take as 1 and 0.
_PLAIN_NUMBERS = frozenset({int, float})
_NUMBERS_OR_NULL = frozenset({int, float, type(None)})


def refuse_unknown_key(raw: Mapping[str, Any], allowed: frozenset[str], path: str) -> None:
    """Raise for the first key of ``raw`` not in ``allowed`` (callers test
    ``raw.keys() <= allowed`` inline first: this runs once per node and edge)."""
    unknown = sorted(str(key) for key in raw.keys() - allowed)[0]
    raise ProblemError(f"{path}.{unknown}" if path else unknown,
                       f"unknown key (allowed: {', '.join(sorted(allowed))})")


def json_text(value: Any) -> str:
    """How a value looked in the file (``true``, ``null``, ``"1"``), for messages."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def number_list(values: list | tuple, field_path: str, *, null: float | None = None) -> list[Any]:
    """``values`` as a list, ``None`` replaced by ``null`` when that is given;
    refuses anything else that is not a number, booleans included, naming its index."""
    kinds = set(map(type, values))
    if kinds <= _PLAIN_NUMBERS:
        return values if isinstance(values, list) else list(values)
    if null is not None and kinds <= _NUMBERS_OR_NULL:
        return [null if v is None else v for v in values]
    out: list[Any] = []
    for i, v in enumerate(values):
        if v is None and null is not None:
            out.append(null)
        elif isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)):
            out.append(v)  # e.g. numpy scalars from a dict built in Python
        else:
            raise ProblemError(f"{field_path}[{i}]", f"expected a number, got {json_text(v)}")
    return out


def matrix_array(rows: list, field_path: str) -> np.ndarray:
    """A list of equally long rows of costs (``null``: forbidden) as a float64 matrix."""
    shape = (len(rows), len(rows[0]) if rows else 0)
    kinds = set(map(type, itertools.chain.from_iterable(rows)))
    if kinds <= _PLAIN_NUMBERS:
        return np.array(rows, dtype=np.float64).reshape(shape)
    if kinds <= _NUMBERS_OR_NULL:
        return np.array([[math.inf if v is None else v for v in row] for row in rows], dtype=np.float64).reshape(shape)
    return np.array([number_list(row, f"{field_path}[{a}]", null=math.inf) for a, row in enumerate(rows)],
                    dtype=np.float64).reshape(shape)


def cost_array(values: Any, field_path: str) -> np.ndarray:
    """Costs as float64 with ``inf`` for forbidden; rejects negative and NaN."""
    if isinstance(values, np.ndarray):
        arr = values.astype(np.float64, copy=True)
    else:
        if not isinstance(values, (list, tuple)):
            raise ProblemError(field_path, f"expected a list of costs, got {type(values).__name__}")
        arr = np.array(number_list(values, field_path, null=math.inf), dtype=np.float64)
    if arr.ndim != 1:
        raise ProblemError(field_path, "expected a flat list of costs")
    check_costs(arr, field_path)
    arr[arr >= FORBIDDEN_COST] = math.inf
    return arr


def check_costs(arr: np.ndarray, field_path: str) -> None:
    bad = np.isnan(arr)
    if bad.any():
        index = np.unravel_index(int(np.argmax(bad)), arr.shape)
        raise ProblemError(field_path + "".join(f"[{i}]" for i in index), "cost is NaN")
    bad = arr < 0
    if bad.any():
        index = np.unravel_index(int(np.argmax(bad)), arr.shape)
        raise ProblemError(
            field_path + "".join(f"[{i}]" for i in index), f"negative cost {arr[index]!r}"
        )


def all_valid_costs(arrays: list[np.ndarray]) -> bool:
    flat = np.concatenate(arrays)
    return not (np.isnan(flat).any() or (flat < 0).any())


def all_valid_memory(arrays: list[np.ndarray]) -> bool:
    flat = np.concatenate(arrays)
    return bool(np.isfinite(flat).all() and (flat >= 0).all())
