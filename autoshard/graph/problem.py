"""Strategy graph -> solver problem (``autoshard.problem/1``), and back to names.

Nodes keep their order and names; edge matrices stay shared objects (an edge
of the problem refers to the graph's matrix itself, so repeated layers cost
the memory of one), and ``Problem.to_dict`` writes them once in ``matrices``.

>>> # problem = to_problem(graph, memory_limit=80e9, pins={3: 1})
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from solver import Problem
from solver.problem import Edge, Node

from autoshard.graph.builder import StrategyGraph
from autoshard.graph.recompute_policy import policy_masks, policy_ties

__all__ = ["to_problem", "strategy_labels"]


def strategy_labels(graph: StrategyGraph) -> list[tuple[str, ...]]:
    """Readable label of every strategy of every node (``S(0)R <- S(0)R, RR``);
    computed once per distinct strategy list."""
    cache: dict[int, tuple[str, ...]] = {}
    out = []
    for node in graph.nodes:
        key = id(node.strategies)
        if key not in cache:
            if node.kind == "op":
                cache[key] = tuple(str(s) for s in node.strategies)
            else:
                cache[key] = tuple("".join(str(p) for p in s.output_placements[0]) for s in node.strategies)
        out.append(cache[key])
    return out


def to_problem(
    graph: StrategyGraph,
    *,
    memory_limit: float | None = None,
    pins: Mapping[int, int] | None = None,
    ties: bool = True,
    labels: bool = False,
    recompute: str = "auto",
    allowed: Mapping[int, np.ndarray] | None = None,
) -> Problem:
    """The solver's problem for ``graph``: cost = compute time per strategy,
    edges = redistribution time matrices, memory with liveness.

    ``ties=False`` drops the tie groups (the parameter/gradient pairs are kept:
    they are what makes a gradient arrive in its parameter's placement).
    ``recompute``: the recomputation policy (``autoshard.graph.recompute_policy``;
    ``auto`` lets the solver choose). ``allowed``: node index -> mask of the
    strategies it may take (a restriction, as a baseline's layout rules);
    the others get an infinite cost, as do those the policy forbids.
    """
    names = strategy_labels(graph) if labels else [None] * len(graph.nodes)
    masks = dict(policy_masks(graph, recompute))
    for i, mask in (allowed or {}).items():
        masks[i] = masks[i] & mask if i in masks else np.asarray(mask, dtype=bool)
    nodes = tuple(
        Node(cost=n.compute_s if i not in masks else np.where(masks[i], n.compute_s, np.inf),
             memory_bytes=n.memory_bytes, live=n.live, name=n.name, strategies=label)
        for i, (n, label) in enumerate(zip(graph.nodes, names))
    )
    edges = tuple(Edge(e.src, e.dst, graph.matrices[e.matrix]) for e in graph.edges)
    groups = policy_ties(graph, recompute, graph.ties if ties else graph.required_ties)
    return Problem(nodes=nodes, edges=edges, memory_limit=memory_limit, ties=groups, pins=dict(pins or {}),
                   name="autoshard")

