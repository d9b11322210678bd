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

from typing import Any, Mapping, Sequence

import numpy as np

from costmodel.buckets.grouping import bucket_window
from costmodel.placements import Partial

from autoshard.graph.copies import BUCKET_BOUND_FACTOR, copy_possible, fsdp2_payload_ends, fsdp2_reduction
from autoshard.graph.memory import local_bytes
from autoshard.graph.node_ids import MemoryCopyId, MemoryPieceId
from autoshard.graph.recompute import member_pieces
from autoshard.graph.regions import RegionAnalysis
from autoshard.graph.states import RECOMPUTE, strategy_states
from autoshard.graph.strategy_graph import GraphEdge, GraphNode
from autoshard.rules import OpStrategy, TensorMeta

__all__ = ["BOUND", "PIECE", "InputCopy", "TiedMemory"]

BOUND = "bound"
PIECE = "piece"

InputCopy = tuple[np.ndarray, TensorMeta, int, "np.ndarray | None", int, int]
"""(edge matrix, tensor, reader input position, view copy columns or None, producer node, producer output)
of one input edge."""

EXACT_COPY_FRACTION = 1 / 256
"""A reader input whose bound is at least this share of the device's memory *in every strategy of
the reader* gets an exact copy node instead: there the bound is memory no choice avoids, although
the producer may deliver the input as the reader wants it (a loss reading the whole logits). Smaller
bounds, or bounds that some reader strategy avoids, stay bounds: one op's inputs at one time."""


class TiedMemory:
    """Adds tied memory-only nodes to a graph under construction (``builder._Builder``)."""

    def __init__(self, builder: Any, analysis: RegionAnalysis) -> None:
        self.b = builder
        self.analysis = analysis
        self.exact_bytes = EXACT_COPY_FRACTION * float(builder.profile.device.memory_bytes)
        self.copy_nodes: list[tuple[int, int, int]] = []  # (copy node, reader, input position)
        self._matrices: dict[tuple, int] = {}
        self._bounds: dict[tuple, np.ndarray] = {}

    def _add(self, owner: int, role: str, kind_target: str, live: tuple[int, int], memory: np.ndarray,
             part: int = 0) -> None:
        v = self.b.nodes[owner]
        name = str(MemoryPieceId(role, v.name, part))
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
        for (matrix, tensor, position, view_copies, src, src_output), (keep, again) in zip(inputs, lives):
            key = (id(matrix), v.signature, position, view_copies is None)
            part = self._bounds.get(key)
            if part is None:
                possible = copy_possible(matrix) if view_copies is None else view_copies
                part = np.array([local_bytes(tensor, s.input_placements[position], self.b.mesh_shape) if ok else 0
                                 for s, ok in zip(v.strategies, possible)], dtype=np.float64)
                self._bounds[key] = part
            if not part.any():
                continue
            if view_copies is None and part.min() >= self.exact_bytes and len(keep) == 1:
                self._exact_copy(i, src, src_output, tensor, position, keep[0])
                keep = ()
            for interval in keep:
                by_interval[interval] = by_interval.get(interval, 0.0) + np.where(recomputed, 0.0, part)
            for interval in (again if recomputed.any() else ()):
                by_interval[interval] = by_interval.get(interval, 0.0) + np.where(recomputed, part, 0.0)
        for n, (live, memory) in enumerate(sorted(by_interval.items())):
            if live[0] < live[1] and np.any(memory):
                self._add(i, "in", BOUND, live, np.asarray(memory, dtype=np.float64), n)

    def _exact_copy(self, i: int, src: int, src_output: int, tensor: TensorMeta, position: int,
                    live: tuple[int, int]) -> None:
        """A ``copy`` node for input ``position`` of reader ``i``: its strategies are
        (placement p, no copy) and (p, copy) for every placement p the reader takes
        the input in; the edge from the reader makes p the reader's, the edge from
        the producer allows "no copy" only where the producer's placement is p.
        Exact: the copy's bytes count when and only when a redistribution happens."""

        v, u = self.b.nodes[i], self.b.nodes[src]
        wanted = [s.input_placements[position] for s in v.strategies]
        places = list(dict.fromkeys(wanted))
        n = len(places)
        where = {p: j for j, p in enumerate(places)}
        memory = np.concatenate([np.zeros(n), [float(local_bytes(tensor, p, self.b.mesh_shape)) for p in places]])
        strategies = tuple(OpStrategy((p,), ()) for p in places) * 2
        signature = f"copy|{v.signature}|{position}"
        c = self.b.add(GraphNode(str(MemoryCopyId(v.name, position)), "memory", BOUND, strategies, np.zeros(2 * n),
                                 memory, live, (tensor,), signature, (), v.region))

        def reader() -> np.ndarray:
            m = np.full((len(v.strategies), 2 * n), np.inf)
            for k, p in enumerate(wanted):
                m[k, where[p]] = m[k, n + where[p]] = 0.0
            return m

        def producer() -> np.ndarray:
            m = np.zeros((len(u.strategies), 2 * n))
            for a, s in enumerate(u.strategies):
                m[a, :n] = [0.0 if s.output_placements[src_output] == p else np.inf for p in places]
            return m

        for (a, out, build, key) in ((i, 0, reader, ("reader", signature)),
                                     (src, src_output, producer, ("producer", u.signature, src_output, signature))):
            index = self._matrices.get(key)
            if index is None:
                index = len(self.b.pricer.matrices)
                self.b.pricer.matrices.append(build())
                self._matrices[key] = index
            self.b.edges.append(GraphEdge(a, c, out, 0, tensor, index))
            self.b.copy_live.append(())
            self.b.copy_live_recomputed.append(())
        self.copy_nodes.append((c, i, position))

    def tie_copies(self) -> None:
        """Tie the copy nodes of tied readers (repeated layers choose alike)."""
        first: dict[tuple[int, int, str], int] = {}
        for c, reader, position in self.copy_nodes:
            key = (self.b.union.find(reader), position, self.b.nodes[c].signature)
            if key in first:
                self.b.union.union(first[key], c)
            else:
                first[key] = c

    def gradient_payloads(self, producers: Sequence[tuple[int, int, float]], cap: int,
                          units: Sequence[str] | None = None, scale: float = 1.0,
                          backward_end: Mapping[str, int] | None = None) -> None:
        """Bucket bounds on each gradient producer, given as (node, time, full bytes)
        in the order buckets form (``autoshard.graph.copies``): ``payload`` at its
        time, and ``waiting`` (twice its partial output: waiting, and its part of
        the payload) until the last gradient that can share its bucket is made
        (``costmodel.buckets.grouping.bucket_window``).
        ``units`` (one per producer: FSDP2's reductions, ``costmodel.buckets.grouping`` and
        ``autoshard.program.memory``): a unit reduces at ``R_u``, one past the later
        of its last gradient and its backward's end (``backward_end``), and holds its
        reduce-scatter input until the next unit's ``R``; so a gradient waits (its
        output) over ``[t + 1, R_u + 1)`` and its part of the payload, ``scale`` times
        its output (the reduce dtype's itemsize over the gradient's), lives over
        ``[R_u, R_next)``."""
        times = [t for _, t, _ in producers]
        sizes = [b for _, _, b in producers]
        last: dict[str, int] = {}
        for u, t in zip(units or (), times):
            last[u] = max(last.get(u, t), t)
        reduce_at = {u: fsdp2_reduction(t, (backward_end or {}).get(u, 0)) for u, t in last.items()}
        payload_end = fsdp2_payload_ends(reduce_at.values())
        for j, (i, t, _) in enumerate(producers):
            v = self.b.nodes[i]
            if v.kind != "op" or str(MemoryPieceId("payload", v.name)) in self.b.index:
                continue
            memory = np.array([
                local_bytes(v.outputs[0], s.output_placements[0], self.b.mesh_shape)
                if s.output_placements[0] is not None and any(isinstance(p, Partial) for p in s.output_placements[0])
                else 0
                for s in v.strategies], dtype=np.float64)
            if not memory.any():
                continue
            if units is not None:  # waits (partial) for its unit's reduction, then its cast part of the payload
                r = reduce_at[units[j]]
                self._add(i, "waiting", BOUND, (t + 1, r + 1), memory)
                self._add(i, "payload", BOUND, (r, payload_end[r]), scale * memory)
                continue
            self._add(i, "payload", BOUND, (t, t + 1), memory)
            first, end = bucket_window(sizes, j, cap)
            last = max(times[first:end + 1])
            if last > t:
                self._add(i, "waiting", BOUND, (t + 1, last + 1), BUCKET_BOUND_FACTOR * memory)

