"""Validation of ``autoshard.hw_profile/1`` dicts: a JSON Schema for the shape
of the file, then the checks a schema cannot express (tier order, sorted
efficiency curves). Every failure raises :class:`ProfileError` whose message
starts with the path of the offending field, e.g.
``interconnect[0].collectives.all_reduce.alpha_s: -1 is less than the minimum of 0``.

Required keys are those of the example in docs/formats.md; shipped profiles add
``sources`` / ``source`` entries, more collective kinds, ``alpha_per_step_s``,
``bandwidth_Bps`` and ``calibration.method``, all optional here so that a
hand-written or measured profile with only ``all_reduce`` figures still loads.

``device.efficiency.memory`` is either one fraction (datasheet profiles) or a
curve ``[[bytes, fraction], ...]`` over the working set (measured profiles:
caches make small working sets faster), strictly ascending in bytes.
``device.efficiency.vector`` (optional) is the fraction of the fp32 peak that
elementwise and reduction FLOPs reach; ``device.efficiency.vector_by_op``
(optional) gives an aten op (``aten.silu``) its own fraction.

A figure that says ``"source": "published"`` must say where: a non-empty
``reference`` beside it (URL and table or figure), anywhere in the file
(``device.sources`` entries, collective entries, tiers, bus-bandwidth
curves); the message names the field that lacks it.

Figures must also be plausible, so that a broken measurement cannot be saved
or loaded: every number finite (no NaN or infinity), and each figure inside a
generous physical range (``_LIMITS`` below: a device with 1e20 B/s of memory
bandwidth, zero FLOP/s or a launch floor of a minute is refused, naming the
field).

>>> validate({**_example(), "device": {**_example()["device"], "launch_s": float("nan")}})
Traceback (most recent call last):
...
hw_profiles.schema.ProfileError: device.launch_s: nan is not a finite number

>>> validate({"format": "autoshard.hw_profile/1"})
Traceback (most recent call last):
...
hw_profiles.schema.ProfileError: (root): 'name' is a required property
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any, Mapping


from hw_profiles.json_input import MAX_DEPTH
from hw_profiles.profile import COLLECTIVE_KINDS, FORMAT, SOURCE_KINDS

__all__ = ["ProfileError", "SCHEMA", "validate"]


class ProfileError(ValueError):
    """A hardware profile that cannot be used; the message names the field."""


_MESSAGE_CHARS = 300
"""Longest schema message quoted in a :class:`ProfileError` (it may quote a whole value)."""

_POS = {"type": "number", "exclusiveMinimum": 0}
_NONNEG = {"type": "number", "minimum": 0}

# Plausible ranges, far outside any real device but tight enough to catch a
# unit slip or a broken timer (1e20 B/s, 1e-9 FLOP/s, a one-minute launch).
_LIMITS = {
    "flops": {"type": "number", "minimum": 1e6, "maximum": 1e18},  # 1 MFLOP/s .. 1 EFLOP/s per device
    "bandwidth": {"type": "number", "minimum": 1e6, "maximum": 1e15},  # 1 MB/s .. 1 PB/s
    "seconds": {"type": "number", "minimum": 0, "maximum": 10.0},  # latencies and launch floors
    "s_per_byte": {"type": "number", "minimum": 1e-16, "maximum": 1e-3},  # 1 KB/s .. 10 PB/s
    "memory_bytes": {"type": "integer", "minimum": 2**20, "maximum": 2**50},  # 1 MiB .. 1 PiB
}
_CURVE = {
    "type": "array",
    "minItems": 1,
    "items": {
        "type": "array",
        "prefixItems": [_POS, {"type": "number", "exclusiveMinimum": 0, "maximum": 1}],
        "minItems": 2,
        "maxItems": 2,
    },
}
_TEXT = {"type": "string", "minLength": 1}
_CITED = {"source": {"type": "string"}, "reference": _TEXT, "note": _TEXT}
"""A ``source`` with its optional ``reference`` and ``note`` (module docstring)."""
_CITATION = {
    "type": "object",
    "required": ["source"],
    "properties": {**_CITED, "source": {"enum": list(SOURCE_KINDS)}},
    "additionalProperties": False,
}
_BUS_CURVE = {
    "type": "object",
    "required": ["ranks", "points"],
    "properties": {
        "ranks": {"type": "integer", "minimum": 2},
        "points": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "array",
                "prefixItems": [_POS, _LIMITS["bandwidth"]],
                "minItems": 2,
                "maxItems": 2,
            },
        },
        **_CITED,
    },
    "additionalProperties": False,
}
_COLLECTIVE = {
    "type": "object",
    "required": ["alpha_s", "beta_s_per_byte"],
    "properties": {
        "alpha_s": _LIMITS["seconds"],
        "alpha_per_step_s": _LIMITS["seconds"],
        "beta_s_per_byte": _LIMITS["s_per_byte"],
        **_CITED,
        "bus_bandwidth": {"type": "array", "items": _BUS_CURVE},
    },
    "additionalProperties": False,
}
_THREE = {"type": "array", "items": _NONNEG, "minItems": 3, "maxItems": 3}
_LOAD = {
    "type": "object",
    "required": ["cores", "own_threads", "before", "after"],
    "properties": {
        "cores": {"type": "integer", "minimum": 1},
        "own_threads": {"type": "integer", "minimum": 0},
        "before": _THREE,
        "after": _THREE,
        "during_load1": {"type": "array", "items": _NONNEG},
        "foreign_runnable": {"type": "array", "items": _NONNEG},
        "foreign_load": _NONNEG,
        "threshold": _NONNEG,
        "foreign": {"type": "boolean"},
    },
    "additionalProperties": False,
}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["format", "name", "source", "device", "interconnect"],
    "properties": {
        "format": {"const": FORMAT},
        "name": {"type": "string", "minLength": 1},
        "source": {"type": "string", "minLength": 1},
        "device": {
            "type": "object",
            "required": ["name", "memory_bytes", "peak_flops", "memory_bandwidth_Bps", "launch_s", "efficiency"],
            "properties": {
                "name": {"type": "string"},
                "memory_bytes": _LIMITS["memory_bytes"],
                "peak_flops": {
                    "type": "object",
                    "minProperties": 1,
                    "additionalProperties": _LIMITS["flops"],
                },
                "memory_bandwidth_Bps": _LIMITS["bandwidth"],
                "launch_s": {**_LIMITS["seconds"], "maximum": 1.0},
                "launch_scalar_s": {**_LIMITS["seconds"], "maximum": 1.0},
                "allocator_headroom": {"type": "number", "minimum": 0, "maximum": 1},
                "step_op_s": {**_LIMITS["seconds"], "maximum": 1.0},
                "step_byte_s": {**_LIMITS["seconds"], "maximum": 1e-6},
                "matmul_byte_s": {**_LIMITS["seconds"], "maximum": 1e-6},
                "fresh_pages": {
                    "type": "object",
                    "required": ["above_bytes", "Bps"],
                    "additionalProperties": False,
                    "properties": {"above_bytes": _LIMITS["memory_bytes"], "Bps": _LIMITS["bandwidth"]},
                },
                "efficiency": {
                    "type": "object",
                    "required": ["matmul", "memory"],
                    "properties": {
                        "matmul": _CURVE,
                        "matmul_by_dtype": {"type": "object", "minProperties": 1, "additionalProperties": _CURVE},
                        "attention": _CURVE,
                        "attention_backward": _CURVE,
                        "memory": {
                            "anyOf": [{"type": "number", "exclusiveMinimum": 0, "maximum": 1}, _CURVE],
                        },
                        "vector": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                        "vector_by_op": {
                            "type": "object",
                            "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*\\.[A-Za-z_][A-Za-z0-9_]*$"},
                            "additionalProperties": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                        },
                        "run": _CURVE,
                        "optimizer": {
                            "type": "object",
                            "propertyNames": {"enum": ["foreach", "fused", "for-loop"]},
                            "additionalProperties": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                        },
                    },
                    "additionalProperties": False,
                },
                "sources": {"type": "object", "additionalProperties": {"anyOf": [{"type": "string"}, _CITATION]}},
            },
            "additionalProperties": False,
        },
        "interconnect": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["tier", "ranks", "collectives"],
                "properties": {
                    "tier": {"type": "string", "minLength": 1},
                    "ranks": {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}]},
                    "bandwidth_Bps": _LIMITS["bandwidth"],
                    "collectives": {
                        "type": "object",
                        "minProperties": 1,
                        "propertyNames": {"enum": list(COLLECTIVE_KINDS)},
                        "additionalProperties": _COLLECTIVE,
                    },
                    **_CITED,
                },
                "additionalProperties": False,
            },
        },
        "overlap": {
            "type": "object",
            "required": ["contention"],
            "properties": {
                "contention": {"type": "number", "minimum": 0, "maximum": 1,
                               "description": "0: a collective in flight hides fully behind compute; 1: overlap "
                                              "gains nothing (costmodel.overlap)."},
                "source": {"type": "string"},
                "skew_s": {"type": "number", "minimum": 0,
                           "description": "How late a collective starts, at most, after compute since the "
                                          "last one: the ranks' drift (costmodel.overlap)."},
            },
            "additionalProperties": False,
        },
        "calibration": {
            "type": "object",
            "properties": {
                "date": {"type": ["string", "null"]},
                "host": {"type": ["string", "null"]},
                "torch": {"type": ["string", "null"]},
                "method": {"type": "string"},
                "ranks": {"type": "integer", "minimum": 1},
                "fit_error": {"type": "object", "additionalProperties": _NONNEG},
                "load": _LOAD,
                "warnings": {"type": "array", "items": {"type": "string"}},
            },
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}

@functools.lru_cache(maxsize=None)
def _validator() -> Any:
    """The JSON-schema validator, or None where ``jsonschema`` is not installed: a
    GPU image that only runs plans solved elsewhere may lack it, and the checks of
    :func:`validate` other than the schema's still run there (one warning says so)."""
    try:
        import jsonschema
    except ImportError:
        logging.getLogger(__name__).warning(
            "jsonschema is not installed: hardware profiles are checked without their JSON schema")
        return None
    return jsonschema.Draft202012Validator(SCHEMA)


def _path(parts: Any) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(root)"


def _best_match(errors: Any) -> Any:
    import jsonschema

    return jsonschema.exceptions.best_match(errors)


def validate(data: Mapping[str, Any], *, where: str = "") -> None:
    """Raise :class:`ProfileError` (message: ``[where: ]field: problem``) unless
    ``data`` is a valid ``autoshard.hw_profile/1`` dict."""
    prefix = f"{where}: " if where else ""
    if not isinstance(data, Mapping):
        raise ProfileError(f"{prefix}(root): expected a JSON object, got {type(data).__name__}")
    _check_finite(data, (), prefix)
    _check_citations(data, (), prefix)
    validator = _validator()
    error = None if validator is None else _best_match(validator.iter_errors(data))
    if error is not None:
        message = error.message  # may quote the whole offending value: one line of readable length
        if len(message) > _MESSAGE_CHARS:
            message = message[:_MESSAGE_CHARS] + "..."
        raise ProfileError(f"{prefix}{_path(error.absolute_path)}: {message}")
    _check_semantics(data, prefix)


def _check_finite(value: Any, path: tuple, prefix: str) -> None:
    """NaN and infinity pass JSON Schema's range keywords (every comparison
    with NaN is false), so they are refused here first (the first in document
    order is named). So is nesting deeper than a file may have
    (``hw_profiles.json_input.MAX_DEPTH``), before the schema's validator
    walks the value or quotes it in a message, both recursively; this walk is
    a loop."""
    stack = [(value, path)]
    while stack:
        value, path = stack.pop()
        if len(path) > MAX_DEPTH:
            raise ProfileError(f"{prefix}{_path(path[:2])}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, float) and not math.isfinite(value):
            raise ProfileError(f"{prefix}{_path(path)}: {value} is not a finite number")
        if isinstance(value, Mapping):
            stack.extend(((item, (*path, key)) for key, item in reversed(value.items())))
        elif isinstance(value, (list, tuple)):
            stack.extend(((item, (*path, i)) for i, item in reversed(list(enumerate(value)))))


def _check_citations(value: Any, path: tuple, prefix: str) -> None:
    """Every object saying ``"source": "published"`` names its reference
    (checked before the schema, whose message would not say why)."""
    if isinstance(value, Mapping):
        if path and value.get("source") == "published":  # the root's source is the profile's kind
            reference = value.get("reference")
            if not isinstance(reference, str) or not reference.strip():
                raise ProfileError(f"{prefix}{_path((*path, 'reference'))}: a figure with source \"published\" "
                                   "needs a reference (URL and which table or figure)")
        for key, item in value.items():
            _check_citations(item, (*path, key), prefix)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_citations(item, (*path, i), prefix)


def _ascending(points: Any, where: str, unit: str) -> None:
    xs = [p[0] for p in points]
    if xs != sorted(set(xs)):
        raise ProfileError(f"{where}: points must have strictly ascending {unit}")


def _check_semantics(data: Mapping[str, Any], prefix: str) -> None:
    tiers = data["interconnect"]
    # Tiers go from inner to outer: ranks strictly grow, only the last is unbounded.
    for i, tier in enumerate(tiers):
        ranks = tier["ranks"]
        last = i == len(tiers) - 1
        if ranks is None and not last:
            raise ProfileError(f"{prefix}interconnect[{i}].ranks: only the last (outermost) tier may be null")
        if last and ranks is not None:
            raise ProfileError(f"{prefix}interconnect[{i}].ranks: the last (outermost) tier must be null")
        if i > 0 and ranks is not None:
            inner = tiers[i - 1]["ranks"]
            if ranks <= inner or ranks % inner:
                raise ProfileError(
                    f"{prefix}interconnect[{i}].ranks: {ranks} must be a larger multiple of the inner tier's {inner}"
                )
    names = [t["tier"] for t in tiers]
    if len(set(names)) != len(names):
        raise ProfileError(f"{prefix}interconnect: tier names repeat ({names})")
    efficiency = data["device"]["efficiency"]
    for key, unit in (("matmul", "flops"), ("attention", "flops"), ("attention_backward", "flops"),
                      ("memory", "bytes"), ("run", "run lengths")):
        points = efficiency.get(key, [])
        if not isinstance(points, list):
            continue  # the scalar form of memory
        _ascending(points, f"{prefix}device.efficiency.{key}", unit)
    for dtype, points in efficiency.get("matmul_by_dtype", {}).items():
        _ascending(points, f"{prefix}device.efficiency.matmul_by_dtype.{dtype}", "flops")
        if dtype not in data["device"]["peak_flops"]:
            raise ProfileError(f"{prefix}device.efficiency.matmul_by_dtype.{dtype}: no device.peak_flops.{dtype} "
                               "to scale it")
    for i, tier in enumerate(tiers):
        for kind, fit in tier["collectives"].items():
            where = f"{prefix}interconnect[{i}].collectives.{kind}.bus_bandwidth"
            ranks = [c["ranks"] for c in fit.get("bus_bandwidth", [])]
            if ranks != sorted(set(ranks)):
                raise ProfileError(f"{where}: curves must have strictly ascending ranks, got {ranks}")
            limit = tier["ranks"]
            for j, curve in enumerate(fit.get("bus_bandwidth", [])):
                if limit is not None and curve["ranks"] > limit:
                    raise ProfileError(f"{where}[{j}].ranks: {curve['ranks']} ranks do not fit the tier's {limit}")
                _ascending(curve["points"], f"{where}[{j}].points", "bytes")


def _example() -> dict[str, Any]:
    from hw_profiles.profile import _EXAMPLE

    return dict(_EXAMPLE)
