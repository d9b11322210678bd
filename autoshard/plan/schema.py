"""JSON Schemas (draft 2020-12) of the plan file (``autoshard.plan/1``) and of the
``"autoshard"`` section of a dumped problem (``autoshard.plan_request/1``).

Why: the plan is the one file that crosses from the solve to the runtime,
and people diff it, review it and feed it to their own tools. A schema lets
those tools check it without importing autoshard. The loaders
(:meth:`autoshard.plan.format.Plan.from_dict`,
:meth:`autoshard.assembly.request.PlanRequest.from_dict`) remain the authority
and check what a schema cannot (a fingerprint matching the model in hand,
strategy lists matching the problem); ``docs/schemas/generate.py`` writes
these dicts to ``docs/schemas/`` and ``tests/test_docs.py`` checks them
against plans the code writes. Torch-free, like the plan format itself.

Placements are checked against the text form the code writes
(``costmodel.placements.format_placements``: one entry per mesh dim, no
spaces), e.g. ``S(0)R``, ``P(sum)_S(1,sf=2)``. Unknown keys are refused, as
in ``solver.schemas``.

>>> import jsonschema
>>> jsonschema.Draft202012Validator(PLACEMENT).is_valid("S(0)P(sum)")
True
>>> jsonschema.Draft202012Validator(PLACEMENT).is_valid("S(0) x")
False
"""

from __future__ import annotations

from typing import Any

from costmodel.placements import REDUCE_OPS
from costmodel.redistribute_steps import COLLECTIVE_STEPS, LOCAL_STEPS
from hw_profiles import SCHEMA as PROFILE_SCHEMA
from solver.schemas import DRAFT
from solver.solution import Status

from autoshard.plan.format import ASSEMBLY_FORMAT, REQUEST_FORMAT
from autoshard.plan.format import FORMAT as PLAN_FORMAT
from autoshard.plan.pipeline_section import PIPELINE_SCHEMA

__all__ = ["PLACEMENT", "PLAN_SCHEMA", "PLAN_REQUEST_SCHEMA"]

_ONE = r"R|S\(-?[0-9]+\)|_S\(-?[0-9]+,sf=[1-9][0-9]*\)|P\((" + "|".join(REDUCE_OPS) + r")\)"

PLACEMENT: dict[str, Any] = {
    "type": "string",
    "pattern": f"^({_ONE})+$",
    "description": "One placement per mesh dim, concatenated: R, S(d), _S(d,sf=k), P(sum|avg|max|min).",
}
"""Schema of one tensor's placements on the mesh (``S(0)R``)."""

_PLACE = {"$ref": "#/$defs/placement"}
_PLACEMENT_OR_NULL = {"anyOf": [_PLACE, {"type": "null"}]}
_INDEX = {"type": "integer", "minimum": 0}
_SECONDS = {"type": "number", "minimum": 0}
_BYTES = {"type": "number", "minimum": 0}
_NAMES = {"type": "object", "additionalProperties": _PLACE}
_NUMBERS = {"type": "object", "additionalProperties": {"type": "number"}}

_FINGERPRINT = {
    "type": "object",
    "required": ["graph", "mesh", "profile"],
    "properties": {
        "graph": {"type": "string", "description": "sha256:<hex> of the traced joint graph."},
        "mesh": {
            "type": "object",
            "required": ["shape", "dim_names"],
            "properties": {
                "shape": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 1}},
                "dim_names": {"type": "array", "items": {"type": "string"}},
            },
            "additionalProperties": False,
        },
        "profile": {"type": "string", "description": "<name>@sha256:<hex> of the hardware profile."},
        "torch": {"type": "string"},
        "autoshard": {"type": "string"},
    },
    "additionalProperties": False,
}

_STEP = {
    "type": "object",
    "required": ["collective", "mesh_dims", "bytes"],
    "properties": {
        "collective": {"enum": list(COLLECTIVE_STEPS + LOCAL_STEPS)},
        "mesh_dims": {
            "type": "array",
            "minItems": 1,
            "items": _INDEX,
            "description": "Several: one collective on the flattened group of these mesh dims.",
        },
        "bytes": {**_INDEX, "description": "Per-rank buffer the step is priced on (largest rank)."},
        "cost_s": _SECONDS,
        "src": _PLACE,
        "dst": _PLACE,
        "tensor_dim": {"type": "integer"},
        "split_tensor_dim": {"type": "integer"},
        "reduce_op": {"enum": list(REDUCE_OPS)},
        "split_factor": {"type": "integer", "minimum": 1},
        "relayout_s": _SECONDS,
    },
    "additionalProperties": False,
}

_NODE = {
    "type": "object",
    "required": ["name", "op", "out", "in"],
    "properties": {
        "name": {"type": "string", "description": "The fx node name in the traced joint graph."},
        "op": {"type": "string", "description": "aten.mm.default, ..."},
        "out": {
            "anyOf": [_PLACE, {"type": "null"}, {"type": "array", "items": _PLACEMENT_OR_NULL}],
            "description": "Placement of the output, or a list for several outputs (null: not a tensor).",
        },
        "in": {
            "type": "array",
            "items": _PLACEMENT_OR_NULL,
            "description": "Required placement of each tensor input (null: data not read).",
        },
        "region": {"type": "string",
                   "description": "The repeated block (checkpoint region) whose forward the op belongs to."},
        "exchange": {"type": "object", "required": ["kind", "mesh_dim"], "additionalProperties": False,
                     "properties": {"kind": {"enum": ["expert_dispatch", "context_gather", "context_gather_balanced", "context_ring", "context_whole_kv", "context_whole_kv_balanced"]}, "mesh_dim": {"type": "integer", "minimum": 0}},
                     "description": "Only for a strategy that is not a local op: the exchange the runtime runs it with (expert_dispatch: expert parallelism, autoshard.runtime.expert_ops; context_gather, context_gather_balanced: attention split along the sequence with K/V gathered; context_ring: with the K/V blocks passed around the ring; context_whole_kv, context_whole_kv_balanced: K/V taken whole and dK/dV left partial, the collectives being the plan's own redistributions, autoshard.rules.context_parallel) and the mesh dim of its process group."},
    },
    "additionalProperties": False,
}

_REDISTRIBUTION = {
    "type": "object",
    "required": ["tensor", "to", "from", "to_placement", "steps"],
    "properties": {
        "tensor": {"type": "string", "description": "Producing node."},
        "output": {**_INDEX, "description": "Which output of the producer (default 0)."},
        "to": {"type": "string", "description": "Reading node."},
        "input": {**_INDEX, "description": "Which tensor input of the reader (default 0)."},
        "from": _PLACE,
        "to_placement": _PLACE,
        "steps": {"type": "array", "items": _STEP},
        "cost_s": _SECONDS,
        "reuses": {"type": "object", "required": ["to"], "additionalProperties": False,
                   "description": "The earlier redistribution (reader, input) of the same tensor to the same "
                                  "placement whose result this edge reads; its own steps are empty.",
                   "properties": {"to": {"type": "string"}, "input": _INDEX}},
    },
    "additionalProperties": False,
}

_BUCKET = {
    "type": "object",
    "required": ["collective", "mesh_dims", "reduce_op", "dtype", "members", "bytes"],
    "properties": {
        "collective": {"enum": ["all_reduce", "reduce_scatter"]},
        "mesh_dims": {"type": "array", "minItems": 1, "items": _INDEX},
        "reduce_op": {"enum": list(REDUCE_OPS)},
        "dtype": {"type": "string", "description": "torch.float32, ...: the flat buffer has one dtype."},
        "members": {
            "type": "array",
            "minItems": 1,
            "items": {"type": "string"},
            "description": "Gradient sinks (grad:<fqn>) in buffer order.",
        },
        "bytes": _INDEX,
        "cost_s": _SECONDS,
        "pack_s": {**_SECONDS, "description": "Copies into the flat buffer before the issue (compute stream)."},
        "unpack_s": {**_SECONDS, "description": "Copies out of the reduced buffer after the wait (compute stream)."},
    },
    "additionalProperties": False,
}

_GATHER_BUCKET = {
    "type": "object",
    "required": ["mesh_dims", "dtype", "members", "bytes"],
    "properties": {
        "collective": {"const": "all_gather"},
        "mesh_dims": {"type": "array", "minItems": 1, "items": _INDEX},
        "dtype": {"type": "string"},
        "members": {
            "type": "array",
            "minItems": 1,
            "items": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "string"}, _INDEX],
                      "minItems": 3, "maxItems": 3},
            "description": "[producer, reader, reader input] of each leaf all_gather, in buffer order.",
        },
        "bytes": _INDEX,
        "cost_s": _SECONDS,
        "pack_s": {**_SECONDS, "description": "The shards' copy into the flat buffer before the issue."},
        "unpack_s": {**_SECONDS, "description": "Each member's copy out of the gathered buffer after the wait."},
    },
    "additionalProperties": False,
}

_ESTIMATE = {
    "type": "object",
    "required": ["step_s", "compute_s", "comm_s", "peak_memory_bytes"],
    "properties": {
        "step_s": _SECONDS,
        "compute_s": _SECONDS,
        "comm_s": _SECONDS,
        "relayout_s": _SECONDS,
        "recompute_s": {**_SECONDS, "description": "Recomputed ops' compute and input redistributions, again."},
        "exposed_comm_s": {**_SECONDS, "description": "The part of comm_s the step pays (not hidden behind compute "
                                                      "in the simulated schedule)."},
        "peak_memory_bytes": _BYTES,
        "peak_without_recompute_bytes": {"type": ["number", "null"], "minimum": 0,
                                         "description": "The peak of the same placements without recomputation."},
        "memory_limit_bytes": {"type": ["number", "null"], "minimum": 0},
        "reserved_bytes": {**_BYTES, "description": "What the CUDA caching allocator reserves for the step "
                                                    "(max_memory_reserved), replayed; absent on CPU profiles."},
    },
    "additionalProperties": False,
}

_SCHEDULE_ITEM = {
    "type": "object",
    "required": ["issue", "wait"],
    "properties": {
        "edge": {
            "type": "array",
            "prefixItems": [{"type": "string"}, {"type": "string"}, _INDEX],
            "minItems": 3,
            "maxItems": 3,
            "description": "[producer, reader, reader input] of a redistribution.",
        },
        "bucket": {**_INDEX, "description": "Index of a gradient bucket in buckets."},
        "gather": {**_INDEX, "description": "Index of a gather bucket in gather_buckets."},
        "issue": {**_INDEX, "description": "Position where it is issued (before op nodes[issue])."},
        "wait": {**_INDEX, "description": "Position where it is waited (>= issue; len(nodes): before the optimizer)."},
    },
    "oneOf": [{"required": ["edge"]}, {"required": ["bucket"]}, {"required": ["gather"]}],
    "additionalProperties": False,
}

_SCHEDULE = {
    "type": "object",
    "required": ["positions", "prefetch", "collectives"],
    "properties": {
        "positions": {**_INDEX, "description": "Number of op nodes; positions run over 0..positions."},
        "prefetch": {**_INDEX, "description": "Prefetch depth of parameter (leaf) gathers."},
        "collectives": {"type": "array", "items": _SCHEDULE_ITEM, "description": "In issue order."},
        "leaf_views": {"type": "array", "items": {"type": "string"},
                       "description": "Op nodes that only view a leaf (t(weight)): made before position 0, so their "
                                      "gathers are leaf gathers (prefetched, in gather buckets). Absent: none."},
    },
    "additionalProperties": False,
}

_SOLVER = {
    "type": "object",
    "required": ["backend", "status"],
    "properties": {
        "backend": {"type": "string"},
        "status": {"enum": [s.value for s in Status]},
        "gap": {"type": ["number", "null"], "minimum": 0},
        "seconds": _SECONDS,
        "problem_nodes": {**_INDEX, "description": "Solver problem nodes (ops, parameters, inputs) before reduction."},
        "problem_edges": {**_INDEX, "description": "Solver problem edges (pairwise cost tables) before reduction."},
        "reduced_nodes": {"type": ["integer", "null"], "minimum": 0,
                          "description": "Problem nodes left after the solver's exact reductions."},
        # the names of plans written before the counts were named for what they count
        "variables": {**_INDEX, "deprecated": True, "description": "Older plans' name of problem_nodes."},
        "constraints": {**_INDEX, "deprecated": True, "description": "Older plans' name of problem_edges."},
        "reduced_variables": {"type": ["integer", "null"], "minimum": 0, "deprecated": True,
                              "description": "Older plans' name of reduced_nodes."},
        "timings": {**_NUMBERS, "description": "Seconds per phase: trace_s, build_s, solve_s, plan_s, ..."},
    },
    "additionalProperties": False,
}

_PROGRAM = {
    "type": "object",
    "description": "One rank's step program in run order (docs/formats.md, Program); absent in plans written before it.",
    "required": ["version", "actions"],
    "properties": {
        "version": {"const": 1},
        "actions": {"type": "array", "items": {
            "type": "string",
            "pattern": r"^(compute \S+|recompute \S+ \S+ [0-9]+|(issue|wait|pack|unpack) [0-9]+|free \S+( \S+)*)$"}},
    },
    "additionalProperties": False,
}

PLAN_SCHEMA: dict[str, Any] = {
    "$schema": DRAFT,
    "title": PLAN_FORMAT,
    "description": "A sharding plan: placements of every parameter, input and op, the redistributions "
                   "between them with their collective steps, and the estimate (docs/formats.md).",
    "type": "object",
    "required": ["format", "fingerprint", "params", "nodes", "estimate", "solver"],
    "properties": {
        "format": {"const": PLAN_FORMAT},
        "fingerprint": _FINGERPRINT,
        "params": {**_NAMES, "description": "Every parameter name (tied aliases included) -> placement."},
        "param_aliases": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}}},
        "inputs": {**_NAMES, "description": "Forward argument (or keyword) name -> placement."},
        "buffers": _NAMES,
        "constants": {**_NAMES, "description": "Tensor constant of the graph (_tensor_constant0: a tensor the forward "
                                               "makes from Python data) -> placement; absent when there is none."},
        "nodes": {"type": "array", "items": _NODE},
        "redistributions": {"type": "array", "items": _REDISTRIBUTION},
        "estimate": _ESTIMATE,
        "solver": _SOLVER,
        "options": {"type": "object", "description": "How the plan was solved (optimizer, pins, baseline, ...)."},
        "memory_timeline": {
            "type": "array",
            "items": {
                "type": "array",
                "prefixItems": [{"type": "integer"}, _BYTES],
                "minItems": 2,
                "maxItems": 2,
            },
            "description": "[time, bytes live] wherever the live memory changes.",
        },
        "buckets": {"type": "array", "items": _BUCKET},
        "recompute": {"type": "array", "items": {"type": "string"}, "uniqueItems": True,
                      "description": "Op nodes whose forward the backward recomputes (empty: none)."},
        "gather_buckets": {"type": "array", "items": _GATHER_BUCKET,
                           "description": "Parameter (leaf) all-gathers issued as one collective each."},
        "schedule": {**_SCHEDULE, "description": "Where each collective is issued and waited (per rank, the same "
                                                 "on every rank)."},
        "pipeline": {**PIPELINE_SCHEMA, "description": "Pipeline stages, microbatches and torch schedule; absent: "
                                                        "one stage."},
        "program": _PROGRAM,
    },
    "additionalProperties": False,
    "$defs": {"placement": PLACEMENT},
}

_STRATEGY = {
    "type": "array",
    "prefixItems": [
        {"type": "array", "items": _PLACEMENT_OR_NULL, "description": "Output placements."},
        {"type": "array", "items": _PLACEMENT_OR_NULL, "description": "Input placements."},
    ],
    "minItems": 2,
    "maxItems": 2,
}

_INTERVALS = {"type": "array", "items": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "integer"}],
                                          "minItems": 2, "maxItems": 2}}

_PROFILE = {key: value for key, value in PROFILE_SCHEMA.items() if key != "$schema"}

_ASSEMBLY = {
    "type": "object",
    "required": ["format", "mesh", "profile", "strategy_lists", "nodes", "edges", "params", "inputs", "buffers"],
    "properties": {
        "format": {"const": ASSEMBLY_FORMAT},
        "mesh": {
            "type": "object",
            "properties": {
                "shape": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 1}},
                "dim_names": {"type": "array", "items": {"type": "string"}},
                "strides": {"type": "array", "items": {"type": "integer", "minimum": 1}},
            },
            "additionalProperties": False,
        },
        "profile": {**_PROFILE, "description": "The whole hardware profile (hw_profile.schema.json)."},
        "strategy_lists": {
            "type": "array",
            "items": {"type": "array", "items": _STRATEGY},
            "description": "Distinct strategy lists, each written once: [[outputs], [inputs]] per strategy.",
        },
        "nodes": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "kind", "target", "strategies"],
                "properties": {
                    "name": {"type": "string"},
                    "kind": {"type": "string", "description": "op, param, buffer, input, tangent, grad, ..."},
                    "target": {"type": "string", "description": "aten.mm.default for ops, else the tensor's name."},
                    "strategies": {**_INDEX, "description": "Index into strategy_lists."},
                    "states": {"type": "array", "items": {"enum": [0, 1, 2]},
                               "description": "Recomputation states of the list (0 keep, 1 hold, 2 recompute), "
                                              "state-major: the list is the strategy list once per state."},
                    "region": {"type": "string", "description": "Checkpoint region (repeated block)."},
                },
                "additionalProperties": False,
            },
            "description": "One per problem node, in the problem's order.",
        },
        "edges": {
            "type": "array",
            "items": {
                "type": "array",
                "prefixItems": [_INDEX, _INDEX, _INDEX, _INDEX, {"type": "array", "items": _INDEX}, _INDEX,
                                {"type": "string"}, _INTERVALS, _INTERVALS],
                "minItems": 7,
                "maxItems": 9,
            },
            "description": "[src, dst, src output, dst input, global shape, itemsize, dtype] and, where a "
                           "redistributed copy can hold memory, [its intervals] and [its intervals when the "
                           "reader is recomputed]; one per problem edge.",
        },
        "params": {"type": "object", "additionalProperties": _INDEX},
        "inputs": {"type": "object", "additionalProperties": _INDEX},
        "buffers": {"type": "object", "additionalProperties": _INDEX},
        "constants": {"type": "object", "additionalProperties": _INDEX,
                      "description": "Tensor constant name -> node index; absent when there is none."},
        "param_aliases": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}}},
        "bucket_bytes": {**_INDEX, "description": "Gradient bucket cap; 0: no buckets."},
    },
    "additionalProperties": False,
}

PLAN_REQUEST_SCHEMA: dict[str, Any] = {
    "$schema": DRAFT,
    "title": REQUEST_FORMAT,
    "description": "The \"autoshard\" section of a problem dumped by autoshard solve --dump-problem (the body of "
                   "POST /v1/plans): what turns the problem's solution into a plan without torch (docs/formats.md).",
    "type": "object",
    "required": ["format", "fingerprint", "assembly", "options", "timings", "solve"],
    "properties": {
        "format": {"const": REQUEST_FORMAT},
        "fingerprint": _FINGERPRINT,
        "assembly": _ASSEMBLY,
        "options": {"type": "object", "description": "Copied into the plan's options."},
        "timings": {**_NUMBERS, "description": "Seconds of the stages before the solve (trace_s, build_s)."},
        "solve": {
            "type": "object",
            "properties": {
                "time_limit": {"type": "number", "exclusiveMinimum": 0},
                "backend": {"type": "string"},
                "gap": {"type": "number", "minimum": 0, "maximum": 1},
            },
            "description": "How autoshard solve ran the solver; the service's defaults for this request.",
        },
    },
    "additionalProperties": False,
    "$defs": {"placement": PLACEMENT},
}
