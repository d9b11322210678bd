"""What the assembler reads: the :class:`AssemblyGraph` of a strategy graph and the
:class:`PlanRequest` that carries it as JSON (``autoshard.plan_request/1``).

Why a torch-free assembler: the plan service (``autoshard.service``) runs on a
small box without torch, and the plan it returns must be the plan that
``autoshard solve`` writes for the same problem and solution. So the plan is
assembled (``autoshard.assembly.assemble``) from an :class:`AssemblyGraph` - what
the strategy graph knows that the solver problem does not (node names and kinds,
every strategy's placements, every edge's tensor shape and itemsize, the mesh
and the profile) - and nothing else. ``autoshard.assembly.from_graph`` extracts it
from a ``StrategyGraph`` (sharing the graph's objects, no copies); a
:class:`PlanRequest` (the ``"autoshard"`` section of ``autoshard solve
--dump-problem``, and the body of ``POST /v1/plans``) carries it as JSON, whose
schema is ``autoshard.plan.schema.PLAN_REQUEST_SCHEMA``.

>>> from hw_profiles import load
>>> from costmodel.mesh import MeshSpec
>>> g = AssemblyGraph(MeshSpec((2,)), load("cpu-gloo"), (), (), {}, {}, {}, {})
>>> AssemblyGraph.from_dict(g.to_dict()).mesh.shape
(2,)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from costmodel.mesh import MeshSpec
from costmodel.placements import Placement, PlacementParseError, parse_placements
from hw_profiles import HardwareProfile, load_dict
from solver import Problem

from autoshard.plan.format import ASSEMBLY_FORMAT, EXCHANGE_KINDS, REQUEST_FORMAT, Fingerprint, PlanError

__all__ = ["AssemblyError", "StrategyPlacements", "AssemblyNode", "AssemblyEdge", "AssemblyGraph", "PlanRequest",
           "placement_text"]

Placements = tuple[Placement, ...]


class AssemblyError(PlanError):
    """An assembly section that cannot be read or does not fit its problem (names the field)."""


def placement_text(placements: Placements | None) -> str | None:
    """``S(0)R`` for a placement tuple (None stays None)."""
    return None if placements is None else "".join(str(p) for p in placements)


@dataclass(frozen=True, slots=True)
class StrategyPlacements:
    """The placements of one strategy: one tuple per output and per input (None: no tensor / not read).
    ``autoshard.rules.OpStrategy`` has the same two fields and serves in its place."""

    output_placements: tuple[Placements | None, ...]
    input_placements: tuple[Placements | None, ...]
    exchange: tuple[str, int] | None = None
    """``(kind, mesh_dim)`` of a strategy that is not a local op (``OpStrategy.exchange``)."""


@dataclass(frozen=True, slots=True)
class AssemblyNode:
    """One node of the strategy graph, as the plan names it."""

    name: str
    kind: str
    """``op``, ``param``, ``input``, ``grad``, ... (``autoshard.graph.builder.NODE_KINDS``)."""
    target: str
    """``aten.mm.default`` for ops; the parameter/buffer/input name otherwise."""
    strategies: Sequence[Any]
    """The node's strategies (:class:`StrategyPlacements` or ``OpStrategy``), in the problem's order."""
    states: tuple[int, ...] = ()
    """Recomputation states of the list, state-major (``autoshard.graph.recompute``; empty: none)."""
    region: str | None = None
    """The checkpoint region whose forward the node is (None: none)."""


@dataclass(frozen=True, slots=True)
class AssemblyEdge:
    """Output ``src_output`` of node ``src`` read as input ``dst_input`` of ``dst``; problem edge of the same index."""

    src: int
    dst: int
    src_output: int
    dst_input: int
    shape: tuple[int, ...]
    """Global shape of the tensor carried."""
    itemsize: int
    """Bytes per element."""
    dtype: str = ""
    """``torch.float32``: a gradient bucket's flat buffer has one dtype."""
    copy_live: tuple[tuple[int, int], ...] = ()
    """When a redistributed copy for this edge holds memory (``autoshard.graph.copies``)."""
    copy_live_recomputed: tuple[tuple[int, int], ...] = ()
    """The same when the reader is recomputed (empty: it never is)."""


@dataclass(frozen=True, slots=True, eq=False)
class AssemblyGraph:
    """What plan assembly needs beyond the problem (module docstring)."""

    mesh: MeshSpec
    profile: HardwareProfile
    nodes: tuple[AssemblyNode, ...]
    edges: tuple[AssemblyEdge, ...]
    params: Mapping[str, int]
    """Parameter FQN -> node index."""
    inputs: Mapping[str, int]
    buffers: Mapping[str, int]
    param_aliases: Mapping[str, tuple[str, ...]]
    bucket_bytes: int = 0
    """Gradient bucket cap of the runtime (``costmodel.buckets.grouping``; 0: no buckets)."""
    constants: Mapping[str, int] = field(default_factory=dict)
    """Tensor constant name -> node index (written only when there are some)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON form; strategy lists shared by several nodes are written once."""
        lists: list[list[list[list[str | None]]]] = []
        list_index: dict[int, int] = {}
        nodes = []
        for node in self.nodes:
            key = id(node.strategies)
            if key not in list_index:
                list_index[key] = len(lists)
                lists.append([_strategy_entry(s) for s in node.strategies])
            entry = {"name": node.name, "kind": node.kind, "target": node.target, "strategies": list_index[key]}
            if node.states:
                entry["states"] = list(node.states)
            if node.region is not None:
                entry["region"] = node.region
            nodes.append(entry)
        data = {
            "format": ASSEMBLY_FORMAT,
            "mesh": {"shape": list(self.mesh.shape), "dim_names": list(self.mesh.dim_names),
                     "strides": list(self.mesh.strides)},
            "profile": self.profile.to_dict(),
            "strategy_lists": lists,
            "nodes": nodes,
            "edges": [[e.src, e.dst, e.src_output, e.dst_input, list(e.shape), e.itemsize, e.dtype]
                      + ([[list(x) for x in e.copy_live], [list(x) for x in e.copy_live_recomputed]]
                         if e.copy_live or e.copy_live_recomputed else [])
                      for e in self.edges],
            "params": dict(self.params), "inputs": dict(self.inputs), "buffers": dict(self.buffers),
            "param_aliases": {k: list(v) for k, v in self.param_aliases.items()},
            "bucket_bytes": self.bucket_bytes,
        }
        if self.constants:
            data["constants"] = dict(self.constants)
        return data

    @classmethod
    def from_dict(cls, data: Any, where: str = "autoshard.assembly") -> "AssemblyGraph":
        """Parse :meth:`to_dict`'s form; a bad field raises :class:`AssemblyError` naming it."""
        if not isinstance(data, Mapping):
            raise AssemblyError(f"{where}: expected an object")
        if data.get("format") != ASSEMBLY_FORMAT:
            raise AssemblyError(f"{where}.format: expected {ASSEMBLY_FORMAT!r}, got {data.get('format')!r}")
        mesh_raw = _get(data, "mesh", where, Mapping)
        try:
            mesh = MeshSpec(tuple(mesh_raw.get("shape", ())), tuple(mesh_raw.get("dim_names", ())),
                            tuple(mesh_raw.get("strides", ())))
        except (TypeError, ValueError) as exc:
            raise AssemblyError(f"{where}.mesh: {exc}") from None
        try:
            profile = load_dict(dict(_get(data, "profile", where, Mapping)), where=f"{where}.profile")
        except ValueError as exc:
            raise AssemblyError(str(exc)) from None
        parsed: dict[str | None, Placements | None] = {None: None}
        lists = [_strategy_list(raw, f"{where}.strategy_lists[{i}]", parsed, len(mesh.shape))
                 for i, raw in enumerate(_get(data, "strategy_lists", where, list))]
        nodes = []
        for i, raw in enumerate(_get(data, "nodes", where, list)):
            path = f"{where}.nodes[{i}]"
            k = _get(raw, "strategies", path, int)
            if not 0 <= k < len(lists):
                raise AssemblyError(f"{path}.strategies: no strategy list {k} (there are {len(lists)})")
            states = raw.get("states", [])
            if not (isinstance(states, list) and all(isinstance(x, int) and 0 <= x <= 2 for x in states)
                    and (not states or len(lists[k]) % len(states) == 0)):
                raise AssemblyError(f"{path}.states: expected state codes 0-2 dividing the strategy count")
            region = raw.get("region")
            if region is not None and not isinstance(region, str):
                raise AssemblyError(f"{path}.region: expected a string")
            nodes.append(AssemblyNode(str(_get(raw, "name", path, str)), str(_get(raw, "kind", path, str)),
                                      str(_get(raw, "target", path, str)), lists[k], tuple(states), region))
        edges = []
        for j, raw in enumerate(_get(data, "edges", where, list)):
            try:
                src, dst, out, inp, shape, itemsize, dtype, *lives = raw
                if len(lives) not in (0, 2):
                    raise ValueError
                live, live_rc = (tuple((int(a), int(b)) for a, b in x) for x in lives) if lives else ((), ())
                edges.append(AssemblyEdge(int(src), int(dst), int(out), int(inp), tuple(int(s) for s in shape),
                                          int(itemsize), str(dtype), live, live_rc))
            except (TypeError, ValueError):
                raise AssemblyError(f"{where}.edges[{j}]: expected [src, dst, output, input, shape, itemsize, "
                                    "dtype] (and optionally [copy intervals], [recomputed copy intervals])") from None
        names = {}
        for key in ("params", "inputs", "buffers", "constants"):
            table = _get(data, key, where, Mapping) if key != "constants" or key in data else {}
            for name, index in table.items():
                if not isinstance(index, int) or not 0 <= index < len(nodes):
                    raise AssemblyError(f"{where}.{key}[{name!r}]: not a node index")
            names[key] = {str(k): int(v) for k, v in table.items()}
        aliases = {str(k): tuple(str(a) for a in v) for k, v in data.get("param_aliases", {}).items()}
        bucket_bytes = data.get("bucket_bytes", 0)
        if not isinstance(bucket_bytes, int) or isinstance(bucket_bytes, bool):
            raise AssemblyError(f"{where}.bucket_bytes: expected an integer, got {bucket_bytes!r}")
        return cls(mesh, profile, tuple(nodes), tuple(edges), names["params"], names["inputs"], names["buffers"],
                   aliases, bucket_bytes, names["constants"])

    def check(self, problem: Problem, where: str = "autoshard.assembly") -> None:
        """Raise :class:`AssemblyError` unless this graph describes ``problem`` node for node, edge for edge."""
        if len(self.nodes) != problem.num_nodes:
            raise AssemblyError(f"{where}.nodes: {len(self.nodes)} nodes, the problem has {problem.num_nodes}")
        for i, (node, pnode) in enumerate(zip(self.nodes, problem.nodes)):
            if len(node.strategies) != pnode.num_strategies:
                raise AssemblyError(f"{where}.nodes[{i}]: {len(node.strategies)} strategies, "
                                    f"problem node {i} has {pnode.num_strategies}")
        if len(self.edges) != problem.num_edges:
            raise AssemblyError(f"{where}.edges: {len(self.edges)} edges, the problem has {problem.num_edges}")
        for j, (edge, pedge) in enumerate(zip(self.edges, problem.edges)):
            if (edge.src, edge.dst) != (pedge.src, pedge.dst):
                raise AssemblyError(f"{where}.edges[{j}]: joins {edge.src}->{edge.dst}, "
                                    f"problem edge {j} joins {pedge.src}->{pedge.dst}")


def _get(data: Any, key: str, where: str, kind: type) -> Any:
    if not isinstance(data, Mapping) or key not in data:
        raise AssemblyError(f"{where}.{key}: missing")
    value = data[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise AssemblyError(f"{where}.{key}: expected {kind.__name__}, got {type(value).__name__}")
    return value


def _strategy_list(raw: Any, where: str, parsed: dict[str | None, Placements | None],
                   mesh_dims: int) -> tuple[StrategyPlacements, ...]:
    def one(text: Any, path: str) -> Placements | None:
        if text not in parsed:
            try:
                placements = parse_placements(text)
            except PlacementParseError as exc:
                raise AssemblyError(f"{path}: {exc}") from None
            if len(placements) != mesh_dims:
                raise AssemblyError(f"{path}: {text!r} has {len(placements)} mesh dims, the mesh has {mesh_dims}")
            parsed[text] = placements
        return parsed[text]

    if not isinstance(raw, list):
        raise AssemblyError(f"{where}: expected a list of strategies")
    out = []
    for k, strategy in enumerate(raw):
        if not (isinstance(strategy, list) and len(strategy) in (2, 3)
                and all(isinstance(s, list) for s in strategy[:2])):
            raise AssemblyError(f"{where}[{k}]: expected [[outputs...], [inputs...]] (and an exchange)")
        outs, ins = strategy[:2]
        exchange = None
        if len(strategy) == 3:
            raw_exchange = strategy[2]
            if (not isinstance(raw_exchange, dict) or raw_exchange.get("kind") not in EXCHANGE_KINDS
                    or type(raw_exchange.get("mesh_dim")) is not int
                    or not 0 <= raw_exchange["mesh_dim"] < mesh_dims):
                raise AssemblyError(f"{where}[{k}][2]: expected an exchange {{kind: one of "
                                    f"{', '.join(EXCHANGE_KINDS)}, mesh_dim: 0..{mesh_dims - 1}}}")
            exchange = (raw_exchange["kind"], raw_exchange["mesh_dim"])
        out.append(StrategyPlacements(tuple(one(t, f"{where}[{k}]") for t in outs),
                                      tuple(one(t, f"{where}[{k}]") for t in ins), exchange))
    return tuple(out)


def _strategy_entry(strategy: Any) -> list[Any]:
    """A strategy's JSON form: ``[[outputs], [inputs]]``, then its exchange where it has one."""
    entry: list[Any] = [[placement_text(p) for p in strategy.output_placements],
                        [placement_text(p) for p in strategy.input_placements]]
    if strategy.exchange is not None:
        entry.append({"kind": strategy.exchange[0], "mesh_dim": strategy.exchange[1]})
    return entry


@dataclass(frozen=True, slots=True, eq=False)
class PlanRequest:
    """The ``"autoshard"`` section of a dumped problem: everything that turns its solution into a plan."""

    fingerprint: Fingerprint
    assembly: AssemblyGraph
    options: Mapping[str, Any] = field(default_factory=dict)
    """``plan.options`` (optimizer, ties, pins, memory limit, baseline, time limit, backend)."""
    timings: Mapping[str, float] = field(default_factory=dict)
    """Seconds of the stages before the solve (trace, build)."""
    solve: Mapping[str, Any] = field(default_factory=dict)
    """How ``autoshard solve`` ran the solver: ``time_limit``, ``backend``, ``gap``."""

    def to_dict(self) -> dict[str, Any]:
        return {"format": REQUEST_FORMAT, "fingerprint": self.fingerprint.to_dict(),
                "assembly": self.assembly.to_dict(), "options": dict(self.options),
                "timings": dict(self.timings), "solve": dict(self.solve)}

    @classmethod
    def from_dict(cls, data: Any, where: str = "autoshard") -> "PlanRequest":
        if not isinstance(data, Mapping):
            raise AssemblyError(f"{where}: missing or not an object (dump the problem with autoshard solve "
                                "--dump-problem)")
        if data.get("format") != REQUEST_FORMAT:
            raise AssemblyError(f"{where}.format: expected {REQUEST_FORMAT!r}, got {data.get('format')!r}")
        try:
            fingerprint = Fingerprint.from_dict(_get(data, "fingerprint", where, Mapping))
        except PlanError as exc:
            raise AssemblyError(f"{where}.{exc}") from None
        assembly = AssemblyGraph.from_dict(data.get("assembly"), f"{where}.assembly")
        if assembly.profile.fingerprint != fingerprint.profile:
            raise AssemblyError(f"{where}.assembly.profile: does not match fingerprint.profile")
        if (assembly.mesh.shape, assembly.mesh.dim_names) != (fingerprint.mesh_shape, fingerprint.dim_names):
            raise AssemblyError(f"{where}.assembly.mesh: does not match fingerprint.mesh")
        return cls(fingerprint, assembly, dict(_get(data, "options", where, Mapping)),
                   dict(_get(data, "timings", where, Mapping)), dict(_get(data, "solve", where, Mapping)))
