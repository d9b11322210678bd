"""JSON Schemas (draft 2020-12) of ``autoshard.problem/1`` and ``autoshard.solution/1``.

Why a schema beside the loaders: tools outside this repository (another
front end writing problems, a dashboard reading solutions, an editor
checking a hand-written file) need a machine-readable description of the
files, without Python. The loaders in :mod:`solver.problem` and
:mod:`solver.solution` stay the authority: they check field by field with
messages that name the field, and they also check what a schema cannot say
(edge matrices sized by their end nodes' strategy counts, ``live`` start <=
end, indices in range, tie members with equal strategy counts). The
schemas are written out as ``docs/schemas/*.schema.json`` by
``docs/schemas/generate.py``; ``tests/test_docs.py`` checks that the files
equal what this module says and that files the solver writes are valid.

Both refuse unknown keys in a problem (a typo such as ``"memroy"`` would
otherwise silently mean "no memory"; ``autoshard`` is the one extra section,
written by ``autoshard solve --dump-problem``), booleans where a number is
expected, and an edge that gives both ``cost`` and ``matrix``. A solution's
``peak_memory`` is the old name of ``peak_memory_bytes``: still read, and
allowed here so that older files stay valid.

>>> import jsonschema
>>> jsonschema.Draft202012Validator(PROBLEM_SCHEMA).is_valid({"nodes": [{"cost": [1, 2]}]})
True
>>> jsonschema.Draft202012Validator(PROBLEM_SCHEMA).is_valid({"nodes": [{"cost": [-1]}]})
False
"""

from __future__ import annotations

from typing import Any

from solver.problem import FORMAT as PROBLEM_FORMAT
from solver.solution import FORMAT as SOLUTION_FORMAT
from solver.solution import Status

__all__ = ["DRAFT", "PROBLEM_SCHEMA", "SOLUTION_SCHEMA"]

DRAFT = "https://json-schema.org/draft/2020-12/schema"

_INDEX = {"type": "integer", "minimum": 0}
_COST = {
    "type": ["number", "null"],
    "minimum": 0,
    "description": "Non-negative cost (seconds, or any one unit); null or any value >= 1e18 marks it forbidden.",
}
_MATRIX = {
    "type": "array",
    "minItems": 1,
    "items": {"type": "array", "minItems": 1, "items": _COST},
    "description": "Rows: the source node's strategies; columns: the destination node's.",
}

_NODE = {
    "type": "object",
    "required": ["cost"],
    "properties": {
        "name": {"type": "string", "description": "For messages and plans; need not be unique."},
        "strategies": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Labels, one per entry of cost (optional).",
        },
        "cost": {
            "type": "array",
            "minItems": 1,
            "items": _COST,
            "description": "One cost per strategy; its length is the node's strategy count.",
        },
        "memory": {
            "type": ["array", "null"],
            "items": {"type": "number", "minimum": 0},
            "description": "Bytes per strategy (same length as cost); absent or null: zero.",
        },
        "live": {
            "type": ["array", "null"],
            "prefixItems": [{"type": "integer"}, {"type": "integer"}],
            "minItems": 2,
            "maxItems": 2,
            "description": "[start, end): the memory counts at every time t with start <= t < end; "
                           "absent or null: at every time.",
        },
    },
    "additionalProperties": False,
}

_EDGE = {
    "type": "object",
    "required": ["src", "dst"],
    "properties": {
        "src": {**_INDEX, "description": "Node index."},
        "dst": {**_INDEX, "description": "Node index (not src)."},
        "cost": {**_MATRIX, "description": "cost[a][b]: cost when src picks a and dst picks b."},
        "matrix": {**_INDEX, "description": "Index into the top-level matrices, instead of cost."},
    },
    "oneOf": [{"required": ["cost"]}, {"required": ["matrix"]}],
    "additionalProperties": False,
}

PROBLEM_SCHEMA: dict[str, Any] = {
    "$schema": DRAFT,
    "title": PROBLEM_FORMAT,
    "description": "A strategy-graph problem: pick one strategy per node, minimising node plus edge costs, "
                   "with the memory of live nodes within memory_limit at every time (docs/formats.md).",
    "type": "object",
    "required": ["nodes"],
    "properties": {
        "format": {"const": PROBLEM_FORMAT, "description": "Optional; when present, exactly this."},
        "name": {"type": "string"},
        "nodes": {"type": "array", "items": _NODE},
        "matrices": {
            "type": "array",
            "items": _MATRIX,
            "description": "Edge matrices shared by several edges (an edge gives \"matrix\": k).",
        },
        "edges": {"type": "array", "items": _EDGE},
        "memory_limit": {"type": ["number", "null"], "minimum": 0, "description": "Bytes; null or absent: none."},
        "ties": {
            "type": "array",
            "items": {"type": "array", "items": _INDEX},
            "description": "Groups of node indices that must pick the same strategy index.",
        },
        "pins": {
            "type": "object",
            "propertyNames": {"pattern": "^[0-9]+$"},
            "additionalProperties": _INDEX,
            "description": "Node index (as a string) -> the strategy index it must pick.",
        },
        "autoshard": {
            "type": "object",
            "description": "Written by autoshard solve --dump-problem; ignored by the solver "
                           "(plan_request.schema.json).",
        },
    },
    "additionalProperties": False,
}

_OPTIONAL_NUMBER = {"type": ["number", "null"]}

SOLUTION_SCHEMA: dict[str, Any] = {
    "$schema": DRAFT,
    "title": SOLUTION_FORMAT,
    "description": "The solver's answer to a problem: one strategy index per node and how the solve ended "
                   "(docs/formats.md).",
    "type": "object",
    "required": ["choice", "status"],
    "properties": {
        "format": {"const": SOLUTION_FORMAT, "description": "Optional; when present, exactly this."},
        "status": {
            "enum": [s.value for s in Status],
            "description": "optimal: proven; feasible: not proven, the method stopped; timeout: the time limit "
                           "came first; infeasible: proven that nothing fits.",
        },
        "cost": {**_OPTIONAL_NUMBER, "minimum": 0, "description": "Objective of choice; null without a solution."},
        "lower_bound": {**_OPTIONAL_NUMBER, "description": "Best proven bound on the optimum; null if none."},
        "gap": {**_OPTIONAL_NUMBER, "minimum": 0, "description": "(cost - lower_bound) / cost; null without both."},
        "seconds": {"type": "number", "minimum": 0, "description": "Wall time of the solve."},
        "backend": {"type": "string", "description": "Exact backend used: cbc, cpsat, ..."},
        "peak_memory_bytes": {**_OPTIONAL_NUMBER, "minimum": 0, "description": "Peak memory of choice, bytes."},
        "peak_memory": {**_OPTIONAL_NUMBER, "minimum": 0, "deprecated": True,
                        "description": "Old name of peak_memory_bytes; read, no longer written."},
        "message": {"type": "string"},
        "choice": {
            "type": "array",
            "items": _INDEX,
            "description": "Strategy index per node, in node order; empty without a solution.",
        },
        "stats": {"type": "object", "description": "Diagnostics (sizes before and after reduction, methods run)."},
    },
    "additionalProperties": False,
}
