r"""Shape classes: one redistribution search structure for every tensor shape that splits alike.

The strategy graph prices a table of redistribution costs for every tensor shape of the
model (``costmodel.redistribute.redistribute_costs``). The search graph behind a table
(``costmodel.redistribute_search``) depends on the tensor's shape in two ways: its
*structure* (which steps exist between which placements, and which of them re-lay the
data out: ``SearchGraph._relayouts``) reads the shape only through the sizes its dims
take when split (is a split even, is a local extent 1, does a flat split match the
nested one); its *prices* read it through the bytes of each state's largest local shard.

Claim. On a mesh of :math:`M = \prod_k m_k` ranks, every split of a tensor dim the
planner makes (for states without a strided placement of the caller's, i.e. the shared
signatures) divides it by a product :math:`q` of the sizes of *distinct* mesh dims:
each mesh dim holds one placement; a flattened group is a set of distinct dims; a
strided shard ``_S(d, sf=m_k)`` on mesh dim :math:`j` is made only by gathering
``S(d)`` on :math:`k < j` (E1), after which no dim before :math:`j` can shard
:math:`d` again while it lasts (E1, E4, E5 need no later dim sharding :math:`d`), and
its split divides by :math:`m_j m_k`. So :math:`q \mid M`. A dim of size :math:`s` with
:math:`M \mid s` and :math:`s > M` therefore splits evenly under every state and every
step, flat and nested splits agree, and no local extent is 1 (:math:`s/q \ge s/M > 1`):
every structural fact is the same for all such :math:`s`.

The class of a shape (:func:`shape_class`) replaces each such dim by :data:`ANY`.
Tensors of one class share states, edges and relayout flags (built once, on demand,
from the first shape met: the representative); only bytes differ, and those are exact:
a class dim's local extent is :math:`s / q` with :math:`q = s_{rep} / \ell_{rep}` read
off the representative's local extent :math:`\ell_{rep}` under the same state.

Prices and distances. A tensor's edge weights are :func:`costmodel.redistribute_prices.price_step`
on its own bytes, the function the search graph prices its edges with, so every weight
is the same float. The shared-pricing filter of ``costmodel.redistribute_search`` holds
for a strided set as for none (E5's strided slices depend on the set, not on the ops),
so one structure per (class, strided set) serves every signature: a signature keeps the
edges whose target holds only its Partial ops. Its table is a Bellman-Ford from all its
sources at once, one vectorised relaxation of every kept edge per round,
:math:`d[:, v] \leftarrow \min(d[:, v], \min_{u \to v} d[:, u] + w_{uv})`, until nothing
changes: floating-point addition is monotone, so ``min`` and ``+ w`` commute and each entry
is the minimum over paths of their weights summed from the source, edge by edge, which is
what the planner's Dijkstra returns: the tables equal ``plan_redistribute``'s costs, bit
for bit (tests/costmodel/test_redistribute_classes.py). Tiny Mistral on 2x2: 53 tensor
shapes in 28 classes, 61 graphs of strided signatures in a handful; 23,622 edges built
instead of 60,650, and the build 4.3 -> 2.4 s.

>>> from hw_profiles import load
>>> from costmodel.mesh import MeshSpec
>>> mesh = MeshSpec((2, 2))
>>> shape_class((16, 64), mesh) == shape_class((32, 128), mesh), shape_class((2, 4, 6), mesh)
(True, (2, 4, 6))
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Sequence

import numpy as np

from costmodel.mesh import MeshSpec
from costmodel.placements import Partial, Placement, StridedShard
from costmodel.redistribute_search import SHARED_OPS, SearchGraph
from costmodel.redistribute_prices import StepPrices, price_step, step_prices
from hw_profiles import HardwareProfile

__all__ = ["ANY", "ClassEdges", "TensorTable", "ops_mask", "shape_class", "tensor_table"]

ANY = -1
"""A class dim: a multiple of the mesh's rank count larger than it."""

_OP_BIT = {op: 1 << k for k, op in enumerate(SHARED_OPS)}


def shape_class(shape: Sequence[int], mesh: MeshSpec, strided: Sequence[StridedShard] = ()) -> tuple[int, ...]:
    """The shape with every dim that splits alike under every state replaced by :data:`ANY`
    (module docstring); with the strided placements of a signature of its own, their split
    factors join the divisors (each at most once per mesh dim)."""
    ranks = mesh.size * math.prod(sp.split_factor for sp in strided) ** mesh.ndim
    return tuple(ANY if s % ranks == 0 and s > ranks else int(s) for s in shape)


def ops_mask(ops: Sequence[str]) -> int:
    """Bit mask of Partial ops (one bit per op of :data:`SHARED_OPS`)."""
    mask = 0
    for op in ops:
        mask |= _OP_BIT[op]
    return mask


@dataclass(slots=True)
class ClassEdges:
    """States and edges of one shape class on one mesh, built from the representative's
    search graph (its state ids are the class's): every state known and every state they
    lead to, so a row of distances covers everything reachable from its source."""

    graph: SearchGraph
    class_dims: tuple[bool, ...]
    divisors: list = field(default_factory=list)
    """Per state id: for each dim, ``q`` of a class dim (local extent ``s / q``) or the
    local extent itself."""
    state_masks: list = field(default_factory=list)
    """Per state id: the Partial ops it holds (:func:`ops_mask`)."""
    expanded: int = 0
    """States ``0 .. expanded - 1`` have their out-edges built."""
    heads: list = field(default_factory=list)
    targets: list = field(default_factory=list)
    specs: list = field(default_factory=list)
    """Per edge: ``(kind, group, size, relayout_in, relayout_out)``."""
    by_mask: dict = field(default_factory=dict)
    """Ops mask -> (edge count when built, the Bellman-Ford arrays of the edges it keeps)."""

    def state_id(self, state: tuple[Placement, ...]) -> int:
        return self.graph.state_id(state)

    def _divisors(self, sid: int) -> tuple[int, ...]:
        while len(self.divisors) <= sid:
            k = len(self.divisors)
            local = self.graph._local_shape(self.graph.states[k])
            self.divisors.append(tuple(
                s // n if is_class else n
                for s, n, is_class in zip(self.graph.shape, local, self.class_dims)))
        return self.divisors[sid]

    def close(self) -> None:
        """Build the out-edges of every state known, and of every state they reach."""
        graph = self.graph
        while self.expanded < len(graph.states):
            sid = self.expanded
            state = graph.states[sid]
            self.state_masks.append(ops_mask([p.reduce_op for p in state if isinstance(p, Partial)]))
            for target, *spec in graph._build_edges(state):  # unpriced: (state, kind, group, size, flags)
                self.heads.append(sid)
                self.targets.append(graph.state_id(target))
                self.specs.append(tuple(spec))
            self.expanded += 1

    def arrays(self, mask: int) -> tuple[np.ndarray, ...]:
        """``(heads, edge ids, targets, starts)``: the edges whose target holds only ``mask``'s
        ops (the shared-edges filter; their heads too, as every state a source of ``mask``
        reaches), sorted by target for ``np.minimum.reduceat``."""
        cached = self.by_mask.get(mask)
        if cached is not None and cached[0] == len(self.targets):
            return cached[1]
        state_masks = np.asarray(self.state_masks, dtype=np.int64)
        heads = np.asarray(self.heads, dtype=np.int64)
        tails = np.asarray(self.targets, dtype=np.int64)
        # every target is expanded (close), so its ops are the state's
        keep = ((state_masks[tails] & ~mask) == 0) & ((state_masks[heads] & ~mask) == 0)
        ids = np.nonzero(keep)[0]
        ids = ids[np.argsort(tails[ids], kind="stable")]
        targets, starts = np.unique(tails[ids], return_index=True)
        out = (heads[ids], ids, targets, starts)
        self.by_mask[mask] = (len(self.targets), out)
        return out


_CLASSES: dict[tuple, ClassEdges] = {}
_MAX_CLASSES = 1024


def class_edges(mesh: MeshSpec, shape: tuple[int, ...], profile: HardwareProfile, fuse: bool,
                strided: tuple[StridedShard, ...] = ()) -> ClassEdges:
    """The structure of ``shape``'s class, built from the first shape of the class met (the
    representative; its graph is priced with that call's profile and a unit itemsize, of
    which only the structure and the local shapes are read): the edges priced with every
    Partial op, and local slices into ``strided`` (the strided placements of a signature)."""
    cls = shape_class(shape, mesh, strided)
    key = (mesh, cls, fuse, strided)
    edges = _CLASSES.get(key)
    if edges is None:
        if len(_CLASSES) >= _MAX_CLASSES:
            _CLASSES.clear()
        graph = SearchGraph(mesh, shape, 1, profile, fuse, SHARED_OPS, strided, structure_only=True)
        edges = _CLASSES[key] = ClassEdges(graph, tuple(c == ANY for c in cls))
    return edges


@dataclass(slots=True)
class TensorTable:
    """Distances between placements of one tensor (shape, itemsize) on one mesh and profile,
    over its class's structure with its own prices; rows memoised per (ops mask, source)."""

    edges: ClassEdges
    shape: tuple[int, ...]
    itemsize: int
    prices: StepPrices
    state_bytes: list = field(default_factory=list)
    weights: list = field(default_factory=list)
    weight_array: np.ndarray | None = None
    rows: dict = field(default_factory=dict)

    def _bytes(self, sid: int) -> int:
        while len(self.state_bytes) <= sid:
            k = len(self.state_bytes)
            local = [s // q if is_class else q for s, q, is_class in
                     zip(self.shape, self.edges._divisors(k), self.edges.class_dims)]
            self.state_bytes.append(math.prod(local) * self.itemsize)
        return self.state_bytes[sid]

    def _weights(self) -> np.ndarray:
        cls = self.edges
        if self.weight_array is None or len(self.weights) < len(cls.targets):
            for e in range(len(self.weights), len(cls.targets)):
                kind, group, size, r_in, r_out = cls.specs[e]
                b_in, b_out = self._bytes(cls.heads[e]), self._bytes(cls.targets[e])
                self.weights.append(price_step(self.prices, kind, group, size, b_in, b_out, r_in, r_out)[0])
            self.weight_array = np.asarray(self.weights, dtype=np.float64)
        return self.weight_array

    def distance_rows(self, mask: int, sources: Sequence[int]) -> np.ndarray:
        """``dist[i, t]``: the cost of the cheapest steps from state id ``sources[i]`` to state
        id ``t`` under ``mask``'s Partial ops (``inf`` where unreachable), over every state id
        known now. A row is memoised per (mask, source):
        the class's states were closed under its edges when it was computed, so a state
        met later is unreachable from its source."""
        cls = self.edges
        missing = [s for s in dict.fromkeys(sources) if (mask, s) not in self.rows]
        if missing:
            cls.close()
            heads, edge_ids, targets, starts = cls.arrays(mask)
            weight = self._weights()[edge_ids]
            n = len(cls.graph.states)
            dist = np.full((len(missing), n), np.inf)
            dist[np.arange(len(missing)), missing] = 0.0
            if len(edge_ids):
                for _ in range(n):  # Bellman-Ford (module docstring); a shortest path has < n edges
                    best_in = np.minimum.reduceat(dist[:, heads] + weight, starts, axis=1)
                    improved = np.minimum(dist[:, targets], best_in)
                    if np.array_equal(improved, dist[:, targets]):
                        break
                    dist[:, targets] = improved
            for i, sid in enumerate(missing):
                self.rows[mask, sid] = dist[i]
        out = np.full((len(sources), len(cls.graph.states)), np.inf)
        for i, sid in enumerate(sources):
            row = self.rows[mask, sid]
            out[i, : len(row)] = row
        return out


@lru_cache(maxsize=1024)
def tensor_table(mesh: MeshSpec, shape: tuple[int, ...], itemsize: int, profile: HardwareProfile, fuse: bool,
                 strided: tuple[StridedShard, ...] = ()) -> TensorTable:
    """The distance table of one tensor (and the strided placements of its signatures), on its
    shape class's structure."""
    return TensorTable(class_edges(mesh, shape, profile, fuse, strided), shape, itemsize, step_prices(mesh, profile))


def clear_cache() -> None:
    """Forget every class structure and tensor table."""
    _CLASSES.clear()
    tensor_table.cache_clear()
