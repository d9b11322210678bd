"""Pins by name pattern: ``{"*.tok_embeddings.weight": "S(0)R"}`` -> problem pins.

A pattern (``fnmatch``: ``*``, ``?``, ``[...]``) is matched against every
parameter name (aliases of tied parameters included), every forward input
name (``tokens``; also written ``input:tokens``) and every tensor constant of
the graph as ``constant:<name>`` (``constant:_tensor_constant0``). Every pattern must match
something, and the placement must be one the tensor can take on the mesh
(even splits, no Partial); otherwise one error names the pattern and says
what would have been accepted.

>>> # resolve_pins(graph, {"layers.*.attention.wq.weight": "RS(0)"}) -> {node index: strategy index}
"""

from __future__ import annotations

import fnmatch
from typing import Mapping

from costmodel.placements import PlacementParseError, format_placements, parse_placements

from autoshard.graph.builder import StrategyGraph
from autoshard.graph.node_ids import tensor_node
from autoshard.assembly.request import placement_text

__all__ = ["PinError", "resolve_pins"]


class PinError(ValueError):
    """A pin that matches nothing or asks for a placement the tensor cannot take."""


def _targets(graph: StrategyGraph) -> list[tuple[str, int]]:
    """(name, node) for every pinnable tensor: parameters with their aliases, inputs, constants."""
    out = []
    for fqn, i in graph.params.items():
        out.append((fqn, i))
        out.extend((alias, i) for alias in graph.param_aliases.get(fqn, ()))
    for name, i in graph.inputs.items():
        out.append((name, i))
        out.append((tensor_node("input", name), i))
    out.extend((tensor_node("constant", name), i) for name, i in getattr(graph, "constants", {}).items())
    return out


def resolve_pins(graph: StrategyGraph, pins: Mapping[str, str]) -> dict[int, int]:
    """Problem pins (node index -> strategy index) for name-pattern pins."""
    targets = _targets(graph)
    by_name: dict[str, set[int]] = {}
    for name, i in targets:
        by_name.setdefault(name, set()).add(i)
    resolved: dict[int, int] = {}
    labels_of: dict[int, list[str]] = {}
    for pattern, text in pins.items():
        try:
            wanted = format_placements(parse_placements(text))
        except PlacementParseError as exc:
            raise PinError(f"pin {pattern}={text}: {exc}") from None
        if len(parse_placements(text)) != graph.mesh.ndim:
            raise PinError(f"pin {pattern}={text}: needs one placement per mesh dim ({graph.mesh.ndim})")
        if any(c in pattern for c in "*?["):
            matched = sorted({i for name, i in targets if fnmatch.fnmatchcase(name, pattern)})
        else:  # an exact name (every expert baseline's pins): no scan of every target
            matched = sorted(by_name.get(pattern, ()))
        if not matched:
            raise PinError(f"pin {pattern}={text}: matches no parameter or input name")
        for i in matched:
            node = graph.nodes[i]
            labels = labels_of.get(i)
            if labels is None:
                labels = labels_of[i] = [placement_text(s.output_placements[0]) for s in node.strategies]
            if wanted not in labels:
                shape = "x".join(map(str, node.outputs[0].shape))
                raise PinError(
                    f"pin {pattern}={text}: {node.target} (shape {shape}) cannot take {wanted} on mesh "
                    f"{'x'.join(map(str, graph.mesh.shape))} (possible: {', '.join(labels[:8])}"
                    f"{', ...' if len(labels) > 8 else ''})"
                )
            k = labels.index(wanted)
            if resolved.get(i, k) != k:
                raise PinError(f"pin {pattern}={text}: {node.target} is already pinned to {labels[resolved[i]]}")
            resolved[i] = k
    return resolved
