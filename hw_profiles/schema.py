"""Validation of ``autoshard.hw_profile/1`` dicts: a JSON Schema for the shape
of the file, then the checks a schema cannot express (tier order, sorted
efficiency curves). Every failure raises :class:`ProfileError` whose message
starts with the path of the offending field, e.g.
``interconnect[0].collectives.all_reduce.alpha_s: -1 is less than the minimum of 0``.

Required keys are those of DESIGN.md's example; shipped profiles add
``sources`` / ``source`` entries, more collective kinds, ``alpha_per_step_s``,
``bandwidth_Bps`` and ``calibration.method``, all optional here so that a
hand-written or measured profile with only ``all_reduce`` figures still loads.

>>> validate({"format": "autoshard.hw_profile/1"})
Traceback (most recent call last):
...
hw_profiles.schema.ProfileError: (root): 'name' is a required property
"""

from __future__ import annotations

from typing import Any, Mapping

import jsonschema

from hw_profiles.profile import COLLECTIVE_KINDS, FORMAT

__all__ = ["ProfileError", "SCHEMA", "validate"]


class ProfileError(ValueError):
    """A hardware profile that cannot be used; the message names the field."""


_POS = {"type": "number", "exclusiveMinimum": 0}
_NONNEG = {"type": "number", "minimum": 0}
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
_COLLECTIVE = {
    "type": "object",
    "required": ["alpha_s", "beta_s_per_byte"],
    "properties": {
        "alpha_s": _NONNEG,
        "alpha_per_step_s": _NONNEG,
        "beta_s_per_byte": _POS,
        "source": {"type": "string"},
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
                "memory_bytes": {"type": "integer", "exclusiveMinimum": 0},
                "peak_flops": {
                    "type": "object",
                    "minProperties": 1,
                    "additionalProperties": _POS,
                },
                "memory_bandwidth_Bps": _POS,
                "launch_s": _NONNEG,
                "efficiency": {
                    "type": "object",
                    "required": ["matmul", "memory"],
                    "properties": {
                        "matmul": _CURVE,
                        "attention": _CURVE,
                        "memory": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                    },
                    "additionalProperties": False,
                },
                "sources": {"type": "object", "additionalProperties": {"type": "string"}},
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
                    "bandwidth_Bps": _POS,
                    "collectives": {
                        "type": "object",
                        "minProperties": 1,
                        "propertyNames": {"enum": list(COLLECTIVE_KINDS)},
                        "additionalProperties": _COLLECTIVE,
                    },
                    "source": {"type": "string"},
                },
                "additionalProperties": False,
            },
        },
        "calibration": {
            "type": "object",
            "properties": {
                "date": {"type": ["string", "null"]},
                "host": {"type": ["string", "null"]},
                "torch": {"type": ["string", "null"]},
                "method": {"type": "string"},
                "fit_error": {"type": "object", "additionalProperties": _NONNEG},
            },
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}

_VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def _path(parts: Any) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(root)"


def validate(data: Mapping[str, Any], *, where: str = "") -> None:
    """Raise :class:`ProfileError` (message: ``[where: ]field: problem``) unless
    ``data`` is a valid ``autoshard.hw_profile/1`` dict."""
    prefix = f"{where}: " if where else ""
    if not isinstance(data, Mapping):
        raise ProfileError(f"{prefix}(root): expected a JSON object, got {type(data).__name__}")
    error = jsonschema.exceptions.best_match(_VALIDATOR.iter_errors(data))
    if error is not None:
        raise ProfileError(f"{prefix}{_path(error.absolute_path)}: {error.message}")
    _check_semantics(data, prefix)


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
    for key in ("matmul", "attention"):
        points = efficiency.get(key, [])
        flops = [p[0] for p in points]
        if flops != sorted(set(flops)):
            raise ProfileError(f"{prefix}device.efficiency.{key}: points must have strictly ascending flops")
