"""The strategy-graph problem (``autoshard.problem/1``) and its validation.

A problem has nodes, each with ``k`` candidate strategies (a cost and a memory
figure per strategy, and optionally a half-open live interval), and edges whose
``k_src x k_dst`` matrices price every pair of strategies. The task is to pick
one strategy per node minimising the sum of node and edge costs, such that at
every time t the memory of the nodes live at t stays within ``memory_limit``
(nodes without ``live`` count at every time). ``ties`` force groups of nodes to
pick the same index; ``pins`` force one node's index.

Edges may share one matrix (top-level ``matrices``, an edge giving
``"matrix": k`` instead of ``"cost"``): in memory the edges then hold the same
array, checked once, and :meth:`Problem.to_dict` writes an array used by
several edges that way.

Forbidden strategies and pairs: ``null`` in JSON, or any cost >= 1e18 (real
exported problems, e.g. XLA's, use 1e18). In memory they are ``inf``.

The reader refuses, naming the field, any key it does not know (a misspelt
``memory`` must not read as "no memory"; the ``autoshard`` section that
``autoshard solve --dump-problem`` adds is the one extra key, passed over) and
``true``/``false`` where a number belongs.

>>> p = Problem.from_dict({"format": "autoshard.problem/1",
...     "nodes": [{"cost": [1, 2]}, {"cost": [3, 0]}],
...     "edges": [{"src": 0, "dst": 1, "cost": [[0, 5], [5, 0]]}]})
>>> p.num_nodes, p.nodes[1].num_strategies
(2, 2)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from solver.problem_values import (EDGE_KEYS, FORBIDDEN_COST, NODE_KEYS, TOP_KEYS, ProblemError, all_valid_costs,
                                   all_valid_memory, check_costs, cost_array, matrix_array,
                                   number_list, refuse_unknown_key)

__all__ = [
    "FORMAT",
    "FORBIDDEN_COST",
    "ProblemError",
    "Node",
    "Edge",
    "Problem",
]

FORMAT = "autoshard.problem/1"

@dataclass(frozen=True, slots=True, eq=False)
class Node:
    """One op or tensor of the strategy graph.

    ``cost`` and ``memory_bytes`` have one entry per strategy; ``live`` is the
    half-open interval ``[start, end)`` of times at which the memory counts, or
    None for "always" (parameters, optimizer state).
    """

    cost: np.ndarray
    memory_bytes: np.ndarray
    live: tuple[int, int] | None = None
    name: str = ""
    strategies: tuple[str, ...] | None = None

    @property
    def num_strategies(self) -> int:
        return int(self.cost.shape[0])


@dataclass(frozen=True, slots=True, eq=False)
class Edge:
    """A resharding (or any pairwise) cost: ``cost[a, b]`` when src picks a and dst picks b."""

    src: int
    dst: int
    cost: np.ndarray


@dataclass(frozen=True, slots=True, eq=False)
class Problem:
    """A strategy-graph problem; build with :meth:`from_dict` or directly.

    The constructor validates everything; a bad field raises
    :class:`ProblemError` naming it.
    """

    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...] = ()
    memory_limit: float | None = None
    ties: tuple[tuple[int, ...], ...] = ()
    pins: Mapping[int, int] = field(default_factory=dict)
    name: str = ""

    def __post_init__(self) -> None:
        self._validate()

    # -- sizes -------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def num_edges(self) -> int:
        return len(self.edges)

    def num_choices(self) -> int:
        """Total number of (node, strategy) pairs."""
        return sum(node.num_strategies for node in self.nodes)

    # -- validation --------------------------------------------------------
    def _validate(self) -> None:
        n = len(self.nodes)
        # Fast path: check all costs and memory at once; walk node by node only
        # to name the field when something is wrong.
        costs_ok = n == 0 or all_valid_costs([node.cost for node in self.nodes])
        memory_ok = n == 0 or all_valid_memory([node.memory_bytes for node in self.nodes])
        for i, node in enumerate(self.nodes):
            k = node.cost.shape[0] if node.cost.ndim == 1 else -1
            if k < 1:
                raise ProblemError(f"nodes[{i}].cost", "a node needs at least one strategy")
            if not costs_ok:
                check_costs(node.cost, f"nodes[{i}].cost")
            if node.memory_bytes.shape != (k,):
                raise ProblemError(
                    f"nodes[{i}].memory",
                    f"expected {k} entries (one per strategy), got {node.memory_bytes.shape[0]}",
                )
            if not memory_ok and (not np.all(np.isfinite(node.memory_bytes)) or (node.memory_bytes < 0).any()):
                raise ProblemError(f"nodes[{i}].memory", "memory must be finite and non-negative")
            if node.live is not None:
                start, end = node.live
                if start > end:
                    raise ProblemError(f"nodes[{i}].live", f"start {start} after end {end}")
            if node.strategies is not None and len(node.strategies) != k:
                raise ProblemError(
                    f"nodes[{i}].strategies", f"expected {k} labels (one per cost), got {len(node.strategies)}"
                )
        # shared matrices (one array for many edges) are checked once
        distinct = {id(edge.cost): edge.cost for edge in self.edges}
        edges_ok = not self.edges or all_valid_costs([m.ravel() for m in distinct.values()])
        for j, edge in enumerate(self.edges):
            for end_name, index in (("src", edge.src), ("dst", edge.dst)):
                if not 0 <= index < n:
                    raise ProblemError(f"edges[{j}].{end_name}", f"node {index} out of range (problem has {n} nodes)")
            if edge.src == edge.dst:
                raise ProblemError(f"edges[{j}]", f"self-loop on node {edge.src}")
            shape = (self.nodes[edge.src].num_strategies, self.nodes[edge.dst].num_strategies)
            if edge.cost.shape != shape:
                got = "x".join(str(s) for s in edge.cost.shape)
                raise ProblemError(
                    f"edges[{j}].cost", f"expected a {shape[0]}x{shape[1]} matrix (src x dst strategies), got {got}"
                )
            if not edges_ok:
                check_costs(edge.cost, f"edges[{j}].cost")
        if self.memory_limit is not None:
            if not (isinstance(self.memory_limit, (int, float)) and math.isfinite(self.memory_limit)) or self.memory_limit < 0:
                raise ProblemError("memory_limit", f"must be a non-negative number, got {self.memory_limit!r}")
        seen_in_tie: dict[int, int] = {}
        for t, group in enumerate(self.ties):
            for member in group:
                if not 0 <= member < n:
                    raise ProblemError(f"ties[{t}]", f"node {member} out of range (problem has {n} nodes)")
                if member in seen_in_tie and seen_in_tie[member] != t:
                    raise ProblemError(f"ties[{t}]", f"node {member} is also in ties[{seen_in_tie[member]}]")
                seen_in_tie[member] = t
            if group:
                k0 = self.nodes[group[0]].num_strategies
                for member in group[1:]:
                    k = self.nodes[member].num_strategies
                    if k != k0:
                        raise ProblemError(
                            f"ties[{t}]",
                            f"nodes {group[0]} and {member} have different strategy counts ({k0} vs {k})",
                        )
        for node_index, strategy in self.pins.items():
            if not 0 <= node_index < n:
                raise ProblemError(f"pins[{node_index}]", f"node {node_index} out of range (problem has {n} nodes)")
            k = self.nodes[node_index].num_strategies
            if not 0 <= strategy < k:
                raise ProblemError(
                    f"pins[{node_index}]", f"strategy {strategy} out of range (node {node_index} has {k} strategies)"
                )

    # -- JSON --------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Problem":
        """Build from the ``autoshard.problem/1`` JSON object (docs/formats.md)."""
        if not isinstance(data, Mapping):
            raise ProblemError("(root)", f"expected a JSON object, got {type(data).__name__}")
        fmt = data.get("format", FORMAT)
        if fmt != FORMAT:
            raise ProblemError("format", f"expected {FORMAT!r}, got {fmt!r}")
        if not data.keys() <= TOP_KEYS:
            refuse_unknown_key(data, TOP_KEYS, "")
        raw_nodes = data.get("nodes")
        if not isinstance(raw_nodes, list):
            raise ProblemError("nodes", "missing or not a list")
        nodes = tuple(_node_from_dict(raw, i) for i, raw in enumerate(raw_nodes))
        raw_edges = data.get("edges", [])
        if not isinstance(raw_edges, list):
            raise ProblemError("edges", "not a list")
        matrices = _matrices_from_json(data.get("matrices", []))
        edges = tuple(_edge_from_dict(raw, j, nodes, matrices) for j, raw in enumerate(raw_edges))
        limit = data.get("memory_limit")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float))):
            raise ProblemError("memory_limit", f"must be a number or null, got {limit!r}")
        ties = _ties_from_json(data.get("ties", []))
        pins = _pins_from_json(data.get("pins", {}))
        name = data.get("name", "")
        return cls(nodes=nodes, edges=edges, memory_limit=None if limit is None else float(limit),
                   ties=ties, pins=pins, name=str(name))

    def to_dict(self) -> dict[str, Any]:
        """The ``autoshard.problem/1`` JSON object; forbidden costs become ``null``."""
        out: dict[str, Any] = {"format": FORMAT}
        if self.name:
            out["name"] = self.name
        out["nodes"] = [_node_to_dict(node) for node in self.nodes]
        # An array used by several edges is written once, in "matrices".
        uses: dict[int, int] = {}
        for e in self.edges:
            uses[id(e.cost)] = uses.get(id(e.cost), 0) + 1
        shared: dict[int, int] = {}
        matrices: list[list[list[float | None]]] = []
        edges: list[dict[str, Any]] = []
        for e in self.edges:
            if uses[id(e.cost)] > 1:
                if id(e.cost) not in shared:
                    shared[id(e.cost)] = len(matrices)
                    matrices.append([_costs_to_json(row) for row in e.cost])
                edges.append({"src": e.src, "dst": e.dst, "matrix": shared[id(e.cost)]})
            else:
                edges.append({"src": e.src, "dst": e.dst, "cost": [_costs_to_json(row) for row in e.cost]})
        if matrices:
            out["matrices"] = matrices
        out["edges"] = edges
        if self.memory_limit is not None:
            out["memory_limit"] = self.memory_limit
        if self.ties:
            out["ties"] = [list(group) for group in self.ties]
        if self.pins:
            out["pins"] = {str(k): v for k, v in sorted(self.pins.items())}
        return out


def _costs_to_json(values: np.ndarray) -> list[float | None]:
    return [None if math.isinf(v) else _plain_number(v) for v in values.tolist()]


def _plain_number(value: float) -> float | int:
    return int(value) if float(value).is_integer() and abs(value) < 2**53 else value


def _node_to_dict(node: Node) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if node.name:
        out["name"] = node.name
    if node.strategies is not None:
        out["strategies"] = list(node.strategies)
    out["cost"] = _costs_to_json(node.cost)
    out["memory"] = [_plain_number(v) for v in node.memory_bytes.tolist()]
    if node.live is not None:
        out["live"] = list(node.live)
    return out


def _node_from_dict(raw: Any, i: int) -> Node:
    path = f"nodes[{i}]"
    if not isinstance(raw, Mapping):
        raise ProblemError(path, "expected an object")
    if not raw.keys() <= NODE_KEYS:
        refuse_unknown_key(raw, NODE_KEYS, path)
    if "cost" not in raw:
        raise ProblemError(f"{path}.cost", "missing")
    cost = cost_array(raw["cost"], f"{path}.cost")
    k = cost.shape[0]
    memory_raw = raw.get("memory")
    if memory_raw is None:
        memory = np.zeros(k, dtype=np.float64)
    else:
        if not isinstance(memory_raw, (list, tuple)):
            raise ProblemError(f"{path}.memory", "expected a list of numbers")
        memory = np.array(number_list(memory_raw, f"{path}.memory"), dtype=np.float64)
    live_raw = raw.get("live")
    live = None
    if live_raw is not None:
        if (
            not isinstance(live_raw, (list, tuple))
            or len(live_raw) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in live_raw)
        ):
            raise ProblemError(f"{path}.live", f"expected [start, end] integers, got {live_raw!r}")
        live = (int(live_raw[0]), int(live_raw[1]))
    labels = raw.get("strategies")
    if labels is not None:
        if not isinstance(labels, (list, tuple)) or not all(isinstance(s, str) for s in labels):
            raise ProblemError(f"{path}.strategies", "expected a list of strings")
        labels = tuple(labels)
    name = raw.get("name", "")
    return Node(cost=cost, memory_bytes=memory, live=live, name=str(name), strategies=labels)


def _matrices_from_json(raw: Any) -> list[np.ndarray]:
    """The optional top-level ``matrices``: shared edge matrices, parsed once."""
    if not isinstance(raw, list):
        raise ProblemError("matrices", "expected a list of matrices")
    out = []
    for k, matrix in enumerate(raw):
        if not isinstance(matrix, list) or not matrix or not all(isinstance(row, list) for row in matrix):
            raise ProblemError(f"matrices[{k}]", "expected a non-empty matrix (list of rows)")
        if any(len(row) != len(matrix[0]) for row in matrix):
            raise ProblemError(f"matrices[{k}]", "rows of different lengths")
        arr = matrix_array(matrix, f"matrices[{k}]")
        check_costs(arr, f"matrices[{k}]")
        arr[arr >= FORBIDDEN_COST] = math.inf
        out.append(arr)
    return out


def _edge_from_dict(raw: Any, j: int, nodes: Sequence[Node], matrices: Sequence[np.ndarray] = ()) -> Edge:
    path = f"edges[{j}]"
    if not isinstance(raw, Mapping):
        raise ProblemError(path, "expected an object")
    if not raw.keys() <= EDGE_KEYS:
        refuse_unknown_key(raw, EDGE_KEYS, path)
    ends = []
    for key in ("src", "dst"):
        value = raw.get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ProblemError(f"{path}.{key}", f"expected a node index, got {value!r}")
        if not 0 <= value < len(nodes):
            raise ProblemError(f"{path}.{key}", f"node {value} out of range (problem has {len(nodes)} nodes)")
        ends.append(value)
    shape = (nodes[ends[0]].num_strategies, nodes[ends[1]].num_strategies)
    if "matrix" in raw:
        if "cost" in raw:
            raise ProblemError(path, "give one of cost and matrix, not both")
        k = raw["matrix"]
        if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k < len(matrices):
            raise ProblemError(f"{path}.matrix", f"expected an index into matrices (0..{len(matrices) - 1}), got {k!r}")
        if matrices[k].shape != shape:
            got = "x".join(str(d) for d in matrices[k].shape)
            raise ProblemError(f"{path}.matrix", f"matrices[{k}] is {got}, expected {shape[0]}x{shape[1]} (src x dst strategies)")
        return Edge(src=ends[0], dst=ends[1], cost=matrices[k])
    matrix = raw.get("cost")
    if not isinstance(matrix, list) or not all(isinstance(row, list) for row in matrix):
        raise ProblemError(f"{path}.cost", f"expected a {shape[0]}x{shape[1]} matrix (list of rows)")
    if len(matrix) != shape[0] or any(len(row) != shape[1] for row in matrix):
        got_rows = len(matrix)
        got_cols = len(matrix[0]) if matrix else 0
        raise ProblemError(
            f"{path}.cost",
            f"expected a {shape[0]}x{shape[1]} matrix (src x dst strategies), got {got_rows}x{got_cols}",
        )
    arr = matrix_array(matrix, f"{path}.cost")
    check_costs(arr, f"{path}.cost")
    arr[arr >= FORBIDDEN_COST] = math.inf
    return Edge(src=ends[0], dst=ends[1], cost=arr)


def _ties_from_json(raw: Any) -> tuple[tuple[int, ...], ...]:
    if not isinstance(raw, list):
        raise ProblemError("ties", "expected a list of lists of node indices")
    groups = []
    for t, group in enumerate(raw):
        if not isinstance(group, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in group):
            raise ProblemError(f"ties[{t}]", "expected a list of node indices")
        groups.append(tuple(group))
    return tuple(groups)


def _pins_from_json(raw: Any) -> dict[int, int]:
    if not isinstance(raw, Mapping):
        raise ProblemError("pins", "expected an object mapping node index to strategy index")
    pins: dict[int, int] = {}
    for key, value in raw.items():
        try:
            node_index = int(key)
        except (TypeError, ValueError):
            raise ProblemError(f"pins[{key!r}]", "key must be a node index") from None
        if not isinstance(value, int) or isinstance(value, bool):
            raise ProblemError(f"pins[{key}]", f"strategy must be an integer, got {value!r}")
        pins[node_index] = value
    return pins
