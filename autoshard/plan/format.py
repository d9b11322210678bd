"""The plan file (``autoshard.plan/1``): what a solve produces and the runtime runs.

Human-readable, diffable, versioned JSON (never pickled), as in docs/formats.md:
``fingerprint``, per-parameter and per-input placements, per-node strategies,
every redistribution with its collective steps, the estimate and the solver's
report. Extra keys (``buffers``, ``constants``, ``param_aliases``, ``options``,
``baseline``, ``buckets``, ``schedule``, ``pipeline``) carry what the runtime and
``autoshard explain`` need; ``constants`` (the placements of the tensors the
forward makes from Python data, ``autoshard.trace.TracedGraph.constants``) is
written only when the graph has some, so plans of other models are unchanged.
A bucket (``costmodel.buckets.grouping.Bucket``) lists gradient sinks whose one-step
reductions the runtime issues as one collective instead of their own steps.
The schedule (``autoshard.program.schedule``) says where each collective is
issued and waited; it is checked against the plan's nodes, redistributions
and buckets when the plan is read. ``recompute`` lists the op nodes whose
forward the backward recomputes (``autoshard.graph.recompute``; empty when
none), each node names its checkpoint region (``region``: the repeated block
whose forward it is), and the estimate reports the recomputation's time
(``recompute_s``) and the peak the same placements would reach without it. A
``recompute`` entry must name a node of the plan that can be replayed
(:func:`recompute_problem`: no random op other than dropout, no op with side
effects), checked torch-free at load.

Loading checks the fingerprint against the model, mesh and profile in hand
and names the part that differs; ``allow_profile_change`` accepts a plan
solved for another profile (the layout is still runnable, only its estimate
is for other hardware).

>>> fp = Fingerprint("sha256:ab", (2, 2), ("dp", "tp"), "h100@sha256:cd", "2.13.0", "0.1.0")
>>> fp.differences(Fingerprint("sha256:ab", (4,), ("dp",), "h100@sha256:cd", "2.13.0", "0.1.0"))
['mesh (plan: 2x2 dp,tp; here: 4 dp)']
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from costmodel.buckets.grouping import Bucket, GatherBucket
from costmodel.redistribute_steps import RedistributeStep, StepError
from hw_profiles.json_input import parse_json

from autoshard.plan.pipeline_section import PipelineError, PipelineSection
from autoshard.plan.program_section import ProgramSection, ProgramSectionError, check_program_section
from autoshard.program.schedule import Schedule, ScheduleError, check_schedule

__all__ = ["FORMAT", "ASSEMBLY_FORMAT", "REQUEST_FORMAT", "PlanError", "Fingerprint", "PlanNode", "Redistribution", "Estimate", "SolverReport", "Plan",
           "recompute_problem"]

FORMAT = "autoshard.plan/1"

ASSEMBLY_FORMAT = "autoshard.assembly/1"
"""The assembler's input (``autoshard.assembly.request.AssemblyGraph``) inside a plan request."""

REQUEST_FORMAT = "autoshard.plan_request/1"
"""A plan request (``autoshard.assembly.request.PlanRequest``): the ``"autoshard"`` section of a
dumped problem and the body of ``POST /v1/plans``; named here, beside the plan's own format, so
that the schemas (``autoshard.plan.schema``) need nothing from the assembler."""


class PlanError(ValueError):
    """A plan file that cannot be read, or does not belong to what is in hand."""


def _need(data: Mapping[str, Any], key: str, where: str) -> Any:
    if not isinstance(data, Mapping):
        raise PlanError(f"{where}: expected an object")
    if key not in data:
        raise PlanError(f"{where}.{key}: missing")
    return data[key]


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """What a plan was solved for."""

    graph: str
    """``sha256:<hex>`` of the traced joint graph (ops, wiring, shapes, dtypes)."""
    mesh_shape: tuple[int, ...]
    dim_names: tuple[str, ...]
    profile: str
    """``name@sha256:<hex>`` of the hardware profile."""
    torch: str
    autoshard: str

    def to_dict(self) -> dict[str, Any]:
        return {"graph": self.graph, "mesh": {"shape": list(self.mesh_shape), "dim_names": list(self.dim_names)},
                "profile": self.profile, "torch": self.torch, "autoshard": self.autoshard}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Fingerprint":
        mesh = _need(data, "mesh", "fingerprint")
        try:
            return cls(str(_need(data, "graph", "fingerprint")), tuple(int(s) for s in _need(mesh, "shape", "fingerprint.mesh")),
                       tuple(str(n) for n in _need(mesh, "dim_names", "fingerprint.mesh")),
                       str(_need(data, "profile", "fingerprint")), str(data.get("torch", "")), str(data.get("autoshard", "")))
        except (TypeError, ValueError) as exc:
            raise PlanError(f"fingerprint: {exc}") from None

    def differences(self, here: "Fingerprint", *, allow_profile_change: bool = False) -> list[str]:
        """The parts of this (the plan's) fingerprint that differ from ``here``, each
        as ``part (plan: ...; here: ...)``; torch/autoshard versions are not compared."""
        out = []
        if self.graph != here.graph:
            out.append(f"graph (plan: {self.graph[:19]}; here: {here.graph[:19]}: another model, input shape or dtype)")
        if (self.mesh_shape, self.dim_names) != (here.mesh_shape, here.dim_names):
            def text(fp: Fingerprint) -> str:
                return "x".join(map(str, fp.mesh_shape)) + " " + ",".join(fp.dim_names)
            out.append(f"mesh (plan: {text(self)}; here: {text(here)})")
        if self.profile != here.profile and not allow_profile_change:
            out.append(f"profile (plan: {self.profile[:40]}; here: {here.profile[:40]})")
        return out


_RANDOM_OPS = frozenset({
    "bernoulli", "rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "normal", "uniform",
    "multinomial", "randperm", "exponential", "geometric", "cauchy", "log_normal", "random", "poisson",
    "rrelu_with_noise", "_standard_gamma", "_sample_dirichlet", "binomial",
})
"""Ops that draw random numbers and are not dropout (replaying them draws other numbers)."""


def recompute_problem(op: str) -> str | None:
    """Why op ``aten.<name>.<overload>`` cannot be recomputed, from its name only
    (None: it can). Torch-free: the graph builder decides from the op's schema;
    this check catches a hand-edited plan. Dropout (and attention with
    ``dropout_p``) is replayed from the same random state.

    >>> recompute_problem("aten.mm.default") is None, recompute_problem("aten.add_.Tensor")
    (True, 'writes its input in place (a side effect)')
    """
    parts = op.split(".")
    if len(parts) < 2 or parts[0] != "aten":
        return "not an ATen op"
    base, overload = parts[1], parts[2] if len(parts) > 2 else ""
    if base.endswith("_") and not base.startswith("__") or overload == "out" or overload.endswith("_out"):
        return "writes its input in place (a side effect)" if base.endswith("_") else "writes an out= argument"
    if base in _RANDOM_OPS:
        return "draws random numbers (only dropout is replayed)"
    return None


EXCHANGE_KINDS = ("expert_dispatch", "context_gather", "context_gather_balanced", "context_ring", "context_whole_kv",
                  "context_whole_kv_balanced")
"""Exchanges a plan node may be run with (``autoshard.rules.core.OpStrategy.exchange``)."""


@dataclass(frozen=True, slots=True)
class PlanNode:
    """The strategy chosen for one op node: placements of its outputs and inputs."""

    name: str
    op: str
    out: tuple[str | None, ...]
    inputs: tuple[str | None, ...]
    region: str | None = None
    """The checkpoint region (repeated block, ``layers.3``) whose forward it belongs to; None: none."""
    exchange: tuple[str, int] | None = None
    """None: a local op. Otherwise ``(kind, mesh_dim)``: the runtime runs the op with that
    exchange over the mesh dim's process group (``expert_dispatch``: ``autoshard.runtime.expert_ops``)."""

    def to_dict(self) -> dict[str, Any]:
        out = self.out[0] if len(self.out) == 1 else list(self.out)
        data = {"name": self.name, "op": self.op, "out": out, "in": list(self.inputs)}
        if self.region is not None:
            data["region"] = self.region
        if self.exchange is not None:
            data["exchange"] = {"kind": self.exchange[0], "mesh_dim": self.exchange[1]}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> "PlanNode":
        out = _need(data, "out", where)
        outs = tuple(out) if isinstance(out, list) else (out,)
        ins = tuple(_need(data, "in", where))
        for key, texts in (("out", outs), ("in", ins)):
            for i, text in enumerate(texts):
                if text is not None:
                    _placement_text(text, f"{where}.{key}[{i}]")
        region = data.get("region")
        if region is not None and not isinstance(region, str):
            raise PlanError(f"{where}.region: expected a module path string, got {region!r}")
        exchange = data.get("exchange")
        if exchange is not None:
            if (not isinstance(exchange, Mapping) or exchange.get("kind") not in EXCHANGE_KINDS
                    or not isinstance(exchange.get("mesh_dim"), int) or exchange["mesh_dim"] < 0):
                raise PlanError(f"{where}.exchange: expected {{kind: one of {', '.join(EXCHANGE_KINDS)}, "
                                f"mesh_dim: a mesh dim}}, got {exchange!r}")
            exchange = (exchange["kind"], exchange["mesh_dim"])
        return cls(str(_need(data, "name", where)), str(_need(data, "op", where)), outs, ins, region, exchange)


@dataclass(frozen=True, slots=True)
class Redistribution:
    """One edge whose producer and reader placements differ, and the steps that fix it."""

    tensor: str
    """The producing node."""
    to: str
    """The reading node."""
    input_index: int
    """Which tensor input of the reader."""
    output_index: int
    """Which output of the producer."""
    src: str
    dst: str
    steps: tuple[RedistributeStep, ...]
    cost_s: float
    reuses: tuple[str, int] | None = None
    """(reader, input) of an earlier redistribution of the same tensor to the same placement
    whose result this edge reads (no steps of its own: ``autoshard.program.shared_copies``)."""

    def to_dict(self) -> dict[str, Any]:
        out = {"tensor": self.tensor, "output": self.output_index, "to": self.to, "input": self.input_index,
               "from": self.src, "to_placement": self.dst, "steps": [s.to_dict() for s in self.steps],
               "cost_s": self.cost_s}
        if self.reuses is not None:
            out["reuses"] = {"to": self.reuses[0], "input": self.reuses[1]}
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> "Redistribution":
        try:
            steps = tuple(RedistributeStep.from_dict(s) for s in _need(data, "steps", where))
        except StepError as exc:
            raise PlanError(f"{where}: {exc}") from None
        reuses = data.get("reuses")
        if reuses is not None:
            if steps or not isinstance(reuses, Mapping) or "to" not in reuses:
                raise PlanError(f"{where}.reuses: an object {{to, input}} on a redistribution without steps")
            reuses = (str(reuses["to"]), int(reuses.get("input", 0)))
        return cls(str(_need(data, "tensor", where)), str(_need(data, "to", where)), int(data.get("input", 0)),
                   int(data.get("output", 0)), _placement_text(_need(data, "from", where), f"{where}.from"),
                   _placement_text(_need(data, "to_placement", where), f"{where}.to_placement"),
                   steps, float(data.get("cost_s", sum(s.cost_s for s in steps))), reuses)


@dataclass(frozen=True, slots=True)
class Estimate:
    """Predicted time and memory of one training step on the busiest rank."""

    step_s: float
    compute_s: float
    """Ops and the optimizer update."""
    comm_s: float
    """Collectives (their re-layout copies included)."""
    relayout_s: float
    """Local steps of redistributions (slices, zero fills)."""
    peak_memory_bytes: float
    memory_limit_bytes: float | None
    recompute_s: float = 0.0
    """The recomputation: the forward compute of the recomputed ops again, and
    the redistributions of their inputs again (part of :attr:`step_s`, not of
    :attr:`compute_s` or :attr:`comm_s`)."""
    peak_without_recompute_bytes: float | None = None
    """The peak of the same placements with nothing recomputed (None: nothing is)."""
    exposed_comm_s: float | None = None
    """The part of ``comm_s`` the step pays: ``step_s - compute_s - relayout_s``
    of the two-stream simulation of the plan's schedule (``costmodel.overlap``);
    None in plans priced before schedules (``step_s`` is then the plain sum)."""
    reserved_bytes: float | None = None
    """What PyTorch's CUDA caching allocator reserves for the step (``max_memory_reserved``:
    the live tensors plus the blocks it keeps), replayed by ``autoshard.program.reservation``;
    None on CPU profiles (no caching allocator) and in plans priced before it."""

    @property
    def fits(self) -> bool:
        return self.memory_limit_bytes is None or self.peak_memory_bytes <= self.memory_limit_bytes

    def to_dict(self) -> dict[str, Any]:
        out = {"step_s": self.step_s, "compute_s": self.compute_s, "comm_s": self.comm_s,
               "relayout_s": self.relayout_s, "recompute_s": self.recompute_s,
               "peak_memory_bytes": self.peak_memory_bytes,
               "peak_without_recompute_bytes": self.peak_without_recompute_bytes,
               "memory_limit_bytes": self.memory_limit_bytes}
        if self.exposed_comm_s is not None:
            out["exposed_comm_s"] = self.exposed_comm_s
        if self.reserved_bytes is not None:
            out["reserved_bytes"] = self.reserved_bytes
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Estimate":
        without = data.get("peak_without_recompute_bytes")
        return cls(*(float(_need(data, k, "estimate")) for k in ("step_s", "compute_s", "comm_s")),
                   float(data.get("relayout_s", 0.0)), float(_need(data, "peak_memory_bytes", "estimate")),
                   None if data.get("memory_limit_bytes") is None else float(data["memory_limit_bytes"]),
                   float(data.get("recompute_s", 0.0)), None if without is None else float(without),
                   None if data.get("exposed_comm_s") is None else float(data["exposed_comm_s"]),
                   None if data.get("reserved_bytes") is None else float(data["reserved_bytes"]))


@dataclass(frozen=True, slots=True, init=False)
class SolverReport:
    """How the solve went.

    The sizes are counts of the solver problem's nodes and edges (one node
    per op, parameter or input, each picking a strategy; one edge per
    pairwise cost table). Plans written before they were named so call them
    ``variables`` / ``constraints`` / ``reduced_variables``; those keys and
    keyword arguments are still read."""

    backend: str
    status: str
    gap: float | None
    seconds: float
    problem_nodes: int
    """Problem nodes before reduction."""
    problem_edges: int
    """Problem edges before reduction (each a pairwise cost table)."""
    reduced_nodes: int | None
    """Problem nodes left after the solver's exact reductions (None: not reported)."""
    timings: Mapping[str, float]
    """Seconds per phase: trace, build, solve, plan."""

    def __init__(self, backend: str, status: str, gap: float | None, seconds: float, problem_nodes: int = 0,
                 problem_edges: int = 0, reduced_nodes: int | None = None, timings: Mapping[str, float] | None = None,
                 *, variables: int | None = None, constraints: int | None = None,
                 reduced_variables: int | None = None) -> None:
        # the old keyword names stay accepted so that callers written for them keep working
        values = {"backend": backend, "status": status, "gap": gap, "seconds": seconds,
                  "problem_nodes": problem_nodes if variables is None else variables,
                  "problem_edges": problem_edges if constraints is None else constraints,
                  "reduced_nodes": reduced_nodes if reduced_variables is None else reduced_variables,
                  "timings": dict(timings or {})}
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @property
    def variables(self) -> int:
        """Old name of :attr:`problem_nodes`."""
        return self.problem_nodes

    @property
    def constraints(self) -> int:
        """Old name of :attr:`problem_edges`."""
        return self.problem_edges

    @property
    def reduced_variables(self) -> int | None:
        """Old name of :attr:`reduced_nodes`."""
        return self.reduced_nodes

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "status": self.status, "gap": self.gap, "seconds": self.seconds,
                "problem_nodes": self.problem_nodes, "problem_edges": self.problem_edges,
                "reduced_nodes": self.reduced_nodes, "timings": dict(self.timings)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SolverReport":
        def first(*keys: str) -> Any:  # the current key, else its name in older plans
            return next((data[k] for k in keys if data.get(k) is not None), None)

        return cls(str(_need(data, "backend", "solver")), str(_need(data, "status", "solver")),
                   None if data.get("gap") is None else float(data["gap"]), float(data.get("seconds", 0.0)),
                   int(first("problem_nodes", "variables") or 0), int(first("problem_edges", "constraints") or 0),
                   first("reduced_nodes", "reduced_variables"), dict(data.get("timings", {})))


@dataclass(frozen=True, slots=True)
class Plan:
    """A solved sharding plan (module docstring). Build with :func:`autoshard.solve`."""

    fingerprint: Fingerprint
    params: Mapping[str, str]
    """Every ``named_parameters()`` name (aliases of tied parameters included) -> placement."""
    inputs: Mapping[str, str]
    buffers: Mapping[str, str]
    nodes: tuple[PlanNode, ...]
    redistributions: tuple[Redistribution, ...]
    estimate: Estimate
    solver: SolverReport
    param_aliases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    """How it was solved: optimizer, ties, pins, memory limit, baseline."""
    memory_timeline: tuple[tuple[int, float], ...] = ()
    """(time, bytes) at every point where the live memory changes, for plots."""
    buckets: tuple[Bucket, ...] = ()
    """Gradient reductions issued as one collective each (their members'
    redistributions keep their steps for reading; the runtime runs the bucket)."""
    constants: Mapping[str, str] = field(default_factory=dict)
    """Tensor constant of the graph (``_tensor_constant0``) -> placement; each rank holds its slice."""
    recompute: tuple[str, ...] = ()
    """Op nodes whose forward the backward recomputes, in graph order (empty: none)."""
    gather_buckets: tuple[GatherBucket, ...] = ()
    """Parameter all-gathers issued as one collective each (``costmodel.buckets.grouping``;
    their members' redistributions keep their steps for reading)."""
    schedule: Schedule | None = None
    """Issue and wait position of every collective (``autoshard.program.schedule``);
    None in plans written before schedules (the runtime then builds the default one)."""
    pipeline: PipelineSection | None = None
    """The pipeline stages, microbatches and torch schedule (``autoshard.plan.pipeline_section``);
    None: one stage (plans without a ``pipeline`` dim, and plans written before it)."""
    program: ProgramSection | None = None
    """One rank's step program, action by action (``autoshard.plan.program_section``): what the
    estimate priced and the runtime runs; None in plans written before it (the runtime derives it)."""

    def to_dict(self) -> dict[str, Any]:
        data = {
            "format": FORMAT,
            "fingerprint": self.fingerprint.to_dict(),
            "params": dict(self.params),
            "param_aliases": {k: list(v) for k, v in self.param_aliases.items()},
            "inputs": dict(self.inputs),
            "buffers": dict(self.buffers),
            "nodes": [n.to_dict() for n in self.nodes],
            "redistributions": [r.to_dict() for r in self.redistributions],
            "estimate": self.estimate.to_dict(),
            "solver": self.solver.to_dict(),
            "options": dict(self.options),
            "memory_timeline": [list(p) for p in self.memory_timeline],
            "buckets": [b.to_dict() for b in self.buckets],
            "recompute": list(self.recompute),
            **({"gather_buckets": [g.to_dict() for g in self.gather_buckets]} if self.gather_buckets else {}),
            **({"schedule": self.schedule.to_dict()} if self.schedule is not None else {}),
            **({"pipeline": self.pipeline.to_dict()} if self.pipeline is not None else {}),
            **({"program": self.program.to_dict()} if self.program is not None else {}),
        }
        if self.constants:  # absent for graphs without constants: their plans stay as they were
            data["constants"] = dict(self.constants)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Plan":
        if not isinstance(data, Mapping):
            raise PlanError("(root): expected a JSON object")
        if data.get("format") != FORMAT:
            raise PlanError(f"format: expected {FORMAT!r}, got {data.get('format')!r}")
        try:
            plan = cls(
                fingerprint=Fingerprint.from_dict(_need(data, "fingerprint", "(root)")),
                params={str(k): _placement_text(v, f"params.{k}") for k, v in _need(data, "params", "(root)").items()},
                inputs={str(k): _placement_text(v, f"inputs.{k}") for k, v in data.get("inputs", {}).items()},
                buffers={str(k): _placement_text(v, f"buffers.{k}") for k, v in data.get("buffers", {}).items()},
                nodes=tuple(PlanNode.from_dict(n, f"nodes[{i}]") for i, n in enumerate(_need(data, "nodes", "(root)"))),
                redistributions=tuple(Redistribution.from_dict(r, f"redistributions[{i}]")
                                      for i, r in enumerate(data.get("redistributions", []))),
                estimate=Estimate.from_dict(_need(data, "estimate", "(root)")),
                solver=SolverReport.from_dict(_need(data, "solver", "(root)")),
                param_aliases={str(k): tuple(v) for k, v in data.get("param_aliases", {}).items()},
                options=dict(data.get("options", {})),
                memory_timeline=tuple((int(t), float(b)) for t, b in data.get("memory_timeline", [])),
                buckets=tuple(_from_object(Bucket, b, f"buckets[{i}]")
                              for i, b in enumerate(data.get("buckets", []))),
                constants={str(k): _placement_text(v, f"constants.{k}") for k, v in data.get("constants", {}).items()},
                gather_buckets=tuple(_from_object(GatherBucket, g, f"gather_buckets[{i}]")
                                     for i, g in enumerate(data.get("gather_buckets", []))),
                schedule=None if data.get("schedule") is None else Schedule.from_dict(data["schedule"]),
                pipeline=None if data.get("pipeline") is None else PipelineSection.from_dict(data["pipeline"]),
                program=None if data.get("program") is None else ProgramSection.from_dict(data["program"]),
            )
            _check_pipeline_mesh(plan)
            plan = replace(plan, recompute=_recompute_list(data.get("recompute", []), plan.nodes))
            _check_gathers(plan)
            if plan.schedule is not None:
                check_schedule(plan.schedule, [n.name for n in plan.nodes], plan.redistributions, plan.buckets,
                               gathers=plan.gather_buckets)
            if plan.program is not None:
                if plan.schedule is None:
                    raise PlanError("program: recorded without the schedule whose collectives it names")
                check_program_section(plan.program, [n.name for n in plan.nodes], plan.recompute, plan.schedule)
            return plan
        except (ScheduleError, PipelineError, ProgramSectionError) as exc:
            raise PlanError(str(exc)) from None
        except (TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, PlanError):
                raise
            raise PlanError(f"malformed plan: {exc}") from None

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the JSON atomically (a reader never sees half a file)."""
        from solver.io import write_text_atomic

        write_text_atomic(path, json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, expect: Fingerprint | None = None,
             allow_profile_change: bool = False) -> "Plan":
        """Read a plan file; with ``expect``, refuse one solved for another
        model, mesh or profile, naming the part that differs."""
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise PlanError(f"{path}: cannot read ({exc.strerror})") from None
        try:
            data = parse_json(text)
        except json.JSONDecodeError as exc:
            raise PlanError(f"{path}: malformed JSON: {exc.msg} at line {exc.lineno}") from None
        plan = cls.from_dict(data)
        if expect is not None:
            plan.check(expect, allow_profile_change=allow_profile_change)
        return plan

    def check(self, here: Fingerprint, *, allow_profile_change: bool = False) -> None:
        """Raise :class:`PlanError` naming every part of the fingerprint that differs."""
        diffs = self.fingerprint.differences(here, allow_profile_change=allow_profile_change)
        if diffs:
            raise PlanError("plan does not match: " + "; ".join(diffs))


def _check_pipeline_mesh(plan: Plan) -> None:
    """The pipeline section's mesh dim is one of the plan's, of its ``n_ranks``."""
    pipe, fp = plan.pipeline, plan.fingerprint
    if pipe is None:
        return
    if pipe.mesh_dim not in fp.dim_names:
        raise PlanError(f"pipeline.mesh_dim: {pipe.mesh_dim!r} is not a dim of the plan's mesh {list(fp.dim_names)}")
    size = fp.mesh_shape[fp.dim_names.index(pipe.mesh_dim)]
    if size != pipe.n_ranks:
        raise PlanError(f"pipeline.n_ranks: {pipe.n_ranks}, but mesh dim {pipe.mesh_dim!r} has {size} ranks")


def _recompute_list(data: Any, nodes: tuple[PlanNode, ...]) -> tuple[str, ...]:
    """The ``recompute`` names, each a node of the plan that can be replayed (one error naming the first that is not)."""
    if not isinstance(data, list):
        raise PlanError(f"recompute: expected a list of node names, got {type(data).__name__}")
    ops = {n.name: n.op for n in nodes}
    seen: set[str] = set()
    for i, name in enumerate(data):
        if not isinstance(name, str):
            raise PlanError(f"recompute[{i}]: expected a node name, got {name!r}")
        if name in seen:
            raise PlanError(f"recompute[{i}]: {name} is listed twice")
        seen.add(name)
        if name not in ops:
            raise PlanError(f"recompute[{i}]: no op node named {name!r} in the plan")
        why = recompute_problem(ops[name])
        if why is not None:
            raise PlanError(f"recompute[{i}]: {name} ({ops[name]}) cannot be recomputed: {why}")
    return tuple(data)


def _from_object(cls: Any, data: Any, where: str) -> Any:
    """``cls.from_dict(data)`` (a gradient or gather bucket), its errors as one :class:`PlanError` naming ``where``."""
    if not isinstance(data, Mapping):
        raise PlanError(f"{where}: expected an object")
    try:
        return cls.from_dict(data)
    except ValueError as exc:
        raise PlanError(f"{where}: {exc}") from None


def _check_gathers(plan: Plan) -> None:
    """Every gather bucket member is a redistribution of exactly one all_gather
    on the bucket's mesh dims, and in one bucket only."""
    from costmodel.buckets.grouping import gatherable_step

    by_edge = {(r.tensor, r.to, r.input_index): r for r in plan.redistributions}
    seen: set[tuple[str, str, int]] = set()
    for i, bucket in enumerate(plan.gather_buckets):
        for member in bucket.members:
            r = by_edge.get(member)
            step = gatherable_step(r.steps) if r is not None else None
            if step is None or tuple(step.mesh_dims) != bucket.mesh_dims or member in seen:
                raise PlanError(f"gather_buckets[{i}]: {member[0]} -> {member[1]} (input {member[2]}) is not a "
                                f"redistribution of one all_gather over mesh dims {list(bucket.mesh_dims)} (or is in "
                                "two buckets)")
            seen.add(member)


def _placement_text(value: Any, where: str) -> str:
    """A placement string that parses (``S(0)R``); PlanError naming the field otherwise."""
    from costmodel.placements import PlacementParseError, parse_placements

    if not isinstance(value, str):
        raise PlanError(f"{where}: expected a placement string like 'S(0)R', got {value!r}")
    try:
        parse_placements(value)
    except (PlacementParseError, ValueError) as exc:
        raise PlanError(f"{where}: {exc}") from None
    return value
