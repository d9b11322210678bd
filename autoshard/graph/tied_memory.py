"""Memory-only nodes tied to the node whose choice they follow.

A problem node has one live interval (``autoshard.problem/1``); memory that
depends on a node's choice over other intervals goes into extra nodes with
the same strategy list, zero cost and no edges, tied to it (``ties``: the
solver merges them into one variable with several memory terms). Two kinds,
told apart by ``target``:

- ``piece`` (exact): the ``gap`` and ``tail`` of a closure member's storage
  (``autoshard.graph.recompute``, C5);
- ``bound`` (an upper bound, ``autoshard.graph.copies``): ``in`` - the
  redistributed copies of a reader's inputs over the copies' intervals
  (again at ``t_rc`` for a recomputed reader); ``payload`` - a partial
  gradient's bucket payload at its producer; ``buckets`` - the waiting
  members and payload of gradient buckets, over the backward.

The plan assembler counts ``piece`` nodes as they are and replaces ``bound``
nodes by the copies and buckets that really happen.

>>> BOUND, PIECE
('bound', 'piece')
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from costmodel.placements import Partial

from autoshard.graph.copies import BUCKET_BOUND_FACTOR, copy_possible
from autoshard.graph.memory import local_bytes
from autoshard.graph.recompute import member_pieces, strategy_states
from autoshard.graph.regions import RECOMPUTE, RegionAnalysis
from autoshard.rules import OpStrategy, TensorMeta

__all__ = ["BOUND", "PIECE", "InputCopy", "TiedMemory"]

BOUND = "bound"
PIECE = "piece"

InputCopy = tuple[np.ndarray, TensorMeta, int, "np.ndarray | None"]
"""(edge matrix, tensor, reader input position, view copy columns or None) of one input edge."""


class TiedMemory:
    """Adds tied memory-only nodes to a graph under construction (``builder._Builder``)."""

    def __init__(self, builder: Any, analysis: RegionAnalysis) -> None:
        self.b = builder
        self.analysis = analysis
        self._bounds: dict[tuple, np.ndarray] = {}

    def _add(self, owner: int, role: str, kind_target: str, live: tuple[int, int], memory: np.ndarray,
             suffix: str = "") -> None:
        from autoshard.graph.builder import GraphNode  # the node type of the graph being built

        v = self.b.nodes[owner]
        name = f"memory:{role}:{v.name}{suffix}"
        i = self.b.add(GraphNode(name, "memory", kind_target, v.strategies, np.zeros(len(v.strategies)),
                                 memory.astype(np.float64), live, (), f"memory|{role}|{v.signature}",
                                 v.states, v.region))
        self.b.union.union(owner, i)

    def pieces(self, i: int, fx_name: str, time: int, base_memory: np.ndarray) -> tuple[int, int]:
        """The gap and tail pieces of closure member ``fx_name`` (node ``i``); returns its own interval."""
        own, pieces = member_pieces(self.analysis, fx_name, time, base_memory)
        for piece in pieces:
            self._add(i, piece.role, PIECE, piece.live, piece.memory)
        return own

    def input_copies(self, i: int, inputs: Sequence[InputCopy],
                     lives: Sequence[tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]]) -> None:
        """The ``in`` bound nodes of reader ``i``: per input, its bound over the
        copy's intervals (``lives``: when the reader runs once, when recomputed)."""
        v = self.b.nodes[i]
        states = strategy_states(v.states, len(v.strategies))
        recomputed = states == RECOMPUTE
        by_interval: dict[tuple[int, int], np.ndarray] = {}
        for (matrix, tensor, position, view_copies), (keep, again) in zip(inputs, lives):
            key = (id(matrix), v.signature, position, view_copies is None)
            part = self._bounds.get(key)
            if part is None:
                possible = copy_possible(matrix) if view_copies is None else view_copies
                part = np.array([local_bytes(tensor, s.input_placements[position], self.b.mesh_shape) if ok else 0
                                 for s, ok in zip(v.strategies, possible)], dtype=np.float64)
                self._bounds[key] = part
            if not part.any():
                continue
            for interval in keep:
                by_interval[interval] = by_interval.get(interval, 0.0) + np.where(recomputed, 0.0, part)
            for interval in (again if recomputed.any() else ()):
                by_interval[interval] = by_interval.get(interval, 0.0) + np.where(recomputed, part, 0.0)
        for n, (live, memory) in enumerate(sorted(by_interval.items())):
            if live[0] < live[1] and np.any(memory):
                self._add(i, "in", BOUND, live, np.asarray(memory, dtype=np.float64), f":{n}" if n else "")

    def gradient_payloads(self, producers: Sequence[tuple[int, int]], cap: int, first: int, end: int) -> None:
        """``payload`` bounds on each gradient producer (node, time) and one ``buckets`` node."""
        partial = False
        for i, t in producers:
            v = self.b.nodes[i]
            if v.kind != "op":
                continue
            memory = np.array([
                local_bytes(v.outputs[0], s.output_placements[0], self.b.mesh_shape)
                if s.output_placements[0] is not None and any(isinstance(p, Partial) for p in s.output_placements[0])
                else 0
                for s in v.strategies], dtype=np.float64)
            partial = partial or bool(memory.any())
            if memory.any() and f"memory:payload:{v.name}" not in self.b.index:
                self._add(i, "payload", BOUND, (t, t + 1), memory)
        if cap > 0 and partial:  # some gradient may need a reduction, so buckets may form
            from autoshard.graph.builder import GraphNode
            from autoshard.graph.placements import replicated

            rep = replicated(len(self.b.mesh_shape))
            self.b.add(GraphNode("memory:buckets", "memory", BOUND, (OpStrategy((rep,), ()),), np.zeros(1),
                                 np.array([float(BUCKET_BOUND_FACTOR * cap)]), (first, end), (), "memory|buckets"))
