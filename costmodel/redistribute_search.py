"""The redistribution planner's search graph: states, edges (one step each) and their prices.

Search. States are placement tuples (one placement per mesh dim); an edge is
one step (``costmodel.redistribute_steps``) on one mesh dim or on one flattened group of mesh
dims; its weight is the step's time from ``costmodel.collectives`` and
``costmodel.compute`` for the largest local shard of the state it leaves.
Dijkstra from ``src`` (ties: fewer steps) stops once ``dst`` is settled and is
kept to be resumed by the next query from the same source; all states of one
signature ``(mesh, shape, itemsize, profile, fuse, extra placements)`` share
one lazily built edge list. All pairs of placements therefore cost at most one
full search per source, and a single query only what it needs. The cost table of
many pairs (``redistribute_costs``, the strategy graph's edge matrices) runs one
vectorised Bellman-Ford per signature from all its sources at once, on a structure
shared by every tensor shape that splits alike (``costmodel.redistribute_classes``:
the same edges and the same sums as Dijkstra here, so the same costs).

Shared pricing. The signatures of one tensor (same mesh, shape, itemsize,
profile, fuse) differ only in the Partial ops and strided placements their
edges may create: E6 creates ``P(op)`` only for an op of ``src``/``dst``, E7
``P(sum)`` only when ``sum`` is one, E5's strided slice only into a strided
placement of ``src``/``dst``; every other edge's existence and price depend on
the state alone, and no other edge adds a Partial op. So, for signatures with no
strided placement, the edges of a state are priced once with every op allowed
(``_SharedEdges``) and a signature keeps those whose target holds only its own
Partial ops: the same edges, in the same order (ops are tried in sorted order in
both), hence the same distances and the same plans, at one pricing per state
and tensor instead of one per state and signature (a tiny decoder on 2x2: 1,142
signatures, 53 tensors).

Edges (``k`` a mesh dim of size ``m``; "later dims" are mesh dims ``j > k``;
each rule keeps the literal step semantics equal to the placement semantics,
which ``tests/costmodel`` checks by simulation):

(E1) ``S(d) -> R`` all_gather on ``k`` when no later dim shards ``d``; when
     exactly one later dim ``j`` holds ``S(d)``, the same all_gather gives
     ``R`` on ``k`` and ``_S(d,sf=m)`` on ``j`` (DTensor's right-to-left order).
     ``_S(d,sf) -> R`` all_gather plus a reorder, when no later dim shards ``d``.
(E2) ``P(op) -> R`` all_reduce, when no later Partial dim has an op that does
     not commute with ``op`` (reductions are undone innermost first; sum and
     avg commute, max and min only with themselves).
(E3) ``P(sum|avg) -> S(d)`` reduce_scatter, E2's condition and no later dim
     shards ``d``.
(E4) ``S(d) -> S(e)`` all_to_all, no later dim shards ``d`` or ``e``.
(E5) ``R -> S(d)`` local_slice, no later dim shards ``d``; ``R -> _S(d,sf)``
     for a strided placement of ``src``/``dst``; ``R`` on ``k`` with
     ``_S(d,sf=m)`` on the only later dim sharding ``d`` -> ``S(d)`` on both, when
     the slice is even.
(E6) ``R -> P(op)``: local_zero_fill (sum: rank 0 keeps the value) or
     local_copy (avg, max, min) - never free.
(E7) ``S(d) -> P(sum)`` local_zero_pad, no later dim shards ``d``.
(E8) permute of two mesh dims of equal size: their placements swap
     (``S(0)R -> RS(0)``, ``P(sum)S(1) -> S(1)P(sum)``), when no other mesh dim
     after the first shards the same tensor dims, Partial ops commute, and
     every rank's shard has the same shape.
(F)  With ``fuse=True``, E1 (plain ``S(d)``), E2, E3, E4, E5, E6 and E7 also
     run on a group ``G`` of >= 2 mesh dims that the mesh layout can flatten
     (``MeshSpec.can_flatten``): every dim of ``G`` makes the same change, no
     mesh dim outside ``G`` after ``min(G)`` shards the tensor dims involved,
     and splitting flat over ``|G|`` ranks gives the same chunks as splitting
     dim by dim (always true when the sizes divide evenly).

Prices, with ``B`` / ``B'`` the largest local shard before / after the step,
``coll`` from ``costmodel.collectives`` and ``copy`` / ``fill`` from
``costmodel.compute`` (``*_single`` collectives work on tensor dim 0, so a
tensor dim that is not the outermost non-trivial one costs a re-layout copy,
as does padding uneven shards):

    all_gather      coll(|G| B) [+ copy(|G| B) if dim not leading / uneven / from _S]
    all_reduce      coll(B)
    reduce_scatter  coll(B) [+ copy(B) if dim not leading / uneven]
    all_to_all      coll(max(B, B')) [+ copy(B) to pack] [+ copy(B') to unpack]
    permute         coll(B) (point to point, outermost tier crossed)
    local_slice     copy(B');  local_zero_fill fill(B);  local_copy copy(B);
    local_zero_pad  fill(B' + B)

Mesh dims of size 1 are searched as ``R`` (any placement there holds the same
local tensor), so steps name ``R`` on them whatever ``src`` and ``dst`` say.

Every edge leads to a valid placement; from any state all-``R`` is reachable
(E1, E2 right to left) and from all-``R`` any placement (E5 left to right, E6),
so a plan always exists.
"""


from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field
from functools import lru_cache

from costmodel.shard_shapes import _max_local_shape, flat_matches_nested, piece_extents
from costmodel.mesh import MeshSpec
from costmodel.placements import (
    Partial,
    Placement,
    Replicate,
    Shard,
    StridedShard,
)
from costmodel.redistribute_prices import StepPrices, price_step, step_prices
from costmodel.redistribute_steps import RedistributeStep
from hw_profiles import HardwareProfile

__all__ = ["PlannerError", "SHARED_OPS", "SearchGraph", "canonical", "search_graph", "shared_edges"]

_R = Replicate()
_COMMUTING = {frozenset({"sum"}), frozenset({"avg"}), frozenset({"max"}), frozenset({"min"}), frozenset({"sum", "avg"})}


class PlannerError(ValueError):
    """Arguments the planner cannot use, or a target it cannot reach."""


def _commute(a: str, b: str) -> bool:
    commute = _COMMUTES.get((a, b))
    if commute is None:
        commute = _COMMUTES[a, b] = frozenset({a, b}) in _COMMUTING
    return commute


_COMMUTES: dict[tuple[str, str], bool] = {}
"""Memo of :func:`_commute` (asked for every Partial pair of every state; a handful of ops)."""


def _sdim(p: Placement) -> int | None:
    return p.dim if isinstance(p, (Shard, StridedShard)) else None


def _strided(d: int, sf: int) -> Placement:
    return Shard(d) if sf == 1 else StridedShard(d, sf)


@dataclass(frozen=True, slots=True)
class _Edge:
    state: tuple[Placement, ...]
    cost_s: float
    step: RedistributeStep
    relayouts: tuple[bool, bool]
    """Whether the step copies before / after its collective (``costmodel.redistribute_prices``)."""


@dataclass(slots=True)
class SearchGraph:
    """Edges of one planner signature, built on demand, and cached trees."""

    mesh: MeshSpec
    shape: tuple[int, ...]
    itemsize: int
    profile: HardwareProfile
    fuse: bool
    partial_ops: tuple[str, ...]
    strided: tuple[StridedShard, ...]
    ids: dict = field(default_factory=dict)
    states: list = field(default_factory=list)
    adjacency: dict = field(default_factory=dict)
    searches: dict = field(default_factory=dict)
    local_shapes: dict = field(default_factory=dict)
    local_bytes: dict = field(default_factory=dict)
    evens: dict = field(default_factory=dict)
    group_sizes: dict = field(default_factory=dict)
    prices: StepPrices | None = None
    groups: tuple[tuple[int, ...], ...] = ()
    pairs: tuple[tuple[int, int], ...] = ()
    """Mesh dims E8 may swap: equal sizes > 1 that flatten together."""
    shared: "_SharedEdges | None" = None
    """The tensor's edges priced with every Partial op allowed (module docstring, shared pricing)."""
    structure_only: bool = False
    """Edges as ``(state, kind, group, group size, relayout before, relayout after)``, unpriced:
    a shape class's structure (``costmodel.redistribute_classes``) is priced per tensor, so the
    representative's prices and steps would be built only to be dropped (3-D meshes: 200,000 edges)."""

    def __post_init__(self) -> None:
        n = self.mesh.ndim
        # Mesh dims of size 1 hold R in every searched state (see canonical).
        real = [k for k in range(n) if self.mesh.shape[k] > 1]
        multi = [
            g
            for size in range(2, len(real) + 1)
            for g in itertools.combinations(real, size)
            if self.mesh.can_flatten(g)
        ]
        self.groups = tuple((k,) for k in real) + (tuple(multi) if self.fuse else ())
        # pricing asks the same few questions of ~10^5 edges per model: memoised per graph
        self.group_sizes = {g: self.mesh.group_size(g) for g in self.groups}
        self.pairs = tuple((k, j) for k, j in itertools.combinations(range(n), 2)
                           if self.mesh.shape[k] == self.mesh.shape[j] != 1 and self.mesh.can_flatten((k, j)))
        self.prices = step_prices(self.mesh, self.profile)

    # ------------------------------------------------------------ helpers

    def _local_shape(self, state: tuple[Placement, ...]) -> tuple[int, ...]:
        shape = self.local_shapes.get(state)
        if shape is None:
            shape = self.local_shapes[state] = _max_local_shape(self.shape, state, self.mesh.shape)
        return shape

    def _bytes(self, state: tuple[Placement, ...]) -> int:
        """Bytes of the largest local shard: what every step is priced on."""
        nbytes = self.local_bytes.get(state)
        if nbytes is None:
            nbytes = self.local_bytes[state] = math.prod(self._local_shape(state)) * self.itemsize
        return nbytes

    def _leading(self, state: tuple[Placement, ...], d: int) -> bool:
        """Tensor dim ``d`` is the outermost non-trivial dim of the local shard, so
        ``*_single`` collectives (which work on dim 0) need no re-layout copy."""
        return all(s == 1 for s in self._local_shape(state)[:d])

    def _even(self, state: tuple[Placement, ...], first: int, d: int, parts: int) -> bool:
        key = (state, first, d, parts)
        even = self.evens.get(key)
        if even is None:
            even = self.evens[key] = all(
                e % parts == 0 for e in piece_extents(self.shape, state, self.mesh.shape, first, d))
        return even

    def _flat_ok(self, state: tuple[Placement, ...], group: tuple[int, ...], d: int) -> bool:
        if len(group) == 1:
            return True
        sizes = tuple(self.mesh.shape[g] for g in group)
        return all(
            flat_matches_nested(e, sizes)
            for e in piece_extents(self.shape, state, self.mesh.shape, group[0], d)
        )

    def _later_shards(self, state: tuple[Placement, ...], group: tuple[int, ...], d: int) -> list[int]:
        return [j for j in range(group[0] + 1, len(state)) if j not in group and _sdim(state[j]) == d]

    def _partial_ok(self, state: tuple[Placement, ...], group: tuple[int, ...], op: str) -> bool:
        return all(
            _commute(op, state[j].reduce_op)
            for j in range(group[0] + 1, len(state))
            if j not in group and isinstance(state[j], Partial)
        )

    # ------------------------------------------------------------ edges

    def state_id(self, state: tuple[Placement, ...]) -> int:
        """Small integer for a state: the search hashes ints, not placement tuples."""
        sid = self.ids.get(state)
        if sid is None:
            sid = self.ids[state] = len(self.states)
            self.states.append(state)
        return sid

    def out_edges(self, sid: int) -> list[tuple[int, float, RedistributeStep]]:
        cached = self.adjacency.get(sid)
        if cached is None:
            if self.shared is None:
                cached = [(self.state_id(e.state), e.cost_s, e.step) for e in self._build_edges(self.states[sid])]
            else:  # the tensor's edges whose target holds only this signature's Partial ops (same state ids)
                allowed = frozenset(self.partial_ops)
                cached = [edge for ops, edge in self.shared.of(sid) if ops <= allowed]
            self.adjacency[sid] = cached
        return cached

    def _edge(
        self,
        kind: str,
        group: tuple[int, ...],
        src: tuple[Placement, ...],
        dst: tuple[Placement, ...],
        **fields,
    ) -> _Edge | None:
        if dst == src:
            return None
        size = self.group_sizes.get(group) or self.mesh.group_size(group)
        flags = self._relayouts(kind, group, size, src, dst, fields)
        if self.structure_only:
            return (dst, kind, group, size, *flags)  # type: ignore[return-value]
        cost, nbytes, relayout = price_step(self.prices, kind, group, size, self._bytes(src), self._bytes(dst), *flags)
        step = RedistributeStep(
            collective=kind,
            mesh_dims=group,
            bytes=int(nbytes),
            cost_s=cost,
            src=src,
            dst=dst,
            relayout_s=relayout,
            **fields,
        )
        return _Edge(dst, cost, step, flags)

    def _relayouts(self, kind, group, size: int, src, dst, fields) -> tuple[bool, bool]:
        """Whether a step re-lays its data out before / after its collective: ``*_single``
        collectives work on tensor dim 0 and on even chunks (module docstring, prices)."""
        d = fields.get("tensor_dim")
        if kind == "all_gather":  # gathered on dim 0, then moved / unpadded / reordered
            return (not self._leading(dst, d) or not self._even(src, group[0], d, size)
                    or isinstance(src[group[0]], StridedShard)), False
        if kind == "reduce_scatter":  # input packed with dim d first / padded
            return not self._leading(src, d) or not self._even(src, group[0], d, size), False
        if kind == "all_to_all":  # chunks packed to send; received chunks concatenated along d
            e = fields["split_tensor_dim"]
            return not self._leading(src, e) or not self._even(src, group[0], e, size), not self._leading(dst, d)
        return False, False

    def _build_edges(self, state: tuple[Placement, ...]) -> list[_Edge]:
        edges: list[_Edge | None] = []
        for group in self.groups:
            head = state[group[0]]
            if any(state[g] != head for g in group):
                continue  # a step changes every mesh dim of its group the same way
            if isinstance(head, Shard):
                edges.extend(self._shard_edges(state, group, head.dim))
            elif isinstance(head, StridedShard):
                edges.extend(self._strided_edges(state, group, head))
            elif isinstance(head, Partial):
                edges.extend(self._partial_edges(state, group, head.reduce_op))
            else:
                edges.extend(self._replicate_edges(state, group))
        edges.extend(self._permute_edges(state))
        return [e for e in edges if e is not None]

    @staticmethod
    def _with(state: tuple[Placement, ...], changes: dict[int, Placement]) -> tuple[Placement, ...]:
        new = list(state)
        for k, p in changes.items():
            new[k] = p
        return tuple(new)

    def _shard_edges(self, state, group, d: int) -> list[_Edge | None]:
        out: list[_Edge | None] = []
        later = self._later_shards(state, group, d)
        on_group = lambda p: self._with(state, {g: p for g in group})  # noqa: E731
        if not later:
            # (E1) all_gather
            out.append(self._edge("all_gather", group, state, on_group(_R), tensor_dim=d))
            # (E4) all_to_all to every other tensor dim
            for e in range(len(self.shape)):
                if e != d and not self._later_shards(state, group, e) and self._flat_ok(state, group, e):
                    out.append(self._edge("all_to_all", group, state, on_group(Shard(e)), tensor_dim=d, split_tensor_dim=e))
            # (E7) local_zero_pad
            if "sum" in self.partial_ops:
                out.append(self._edge("local_zero_pad", group, state, on_group(Partial("sum")), tensor_dim=d))
        elif len(group) == 1 and len(later) == 1 and state[later[0]] == Shard(d):
            # (E1) gathering the outer of two S(d) leaves a strided shard on the inner one
            new = self._with(state, {group[0]: _R, later[0]: _strided(d, self.mesh.shape[group[0]])})
            out.append(self._edge("all_gather", group, state, new, tensor_dim=d))
        return out

    def _strided_edges(self, state, group, head: StridedShard) -> list[_Edge | None]:
        # (E1) all_gather + reorder; single mesh dim only
        if len(group) == 1 and not self._later_shards(state, group, head.dim):
            return [self._edge("all_gather", group, state, self._with(state, {group[0]: _R}), tensor_dim=head.dim)]
        return []

    def _partial_edges(self, state, group, op: str) -> list[_Edge | None]:
        if not self._partial_ok(state, group, op):
            return []
        on_group = lambda p: self._with(state, {g: p for g in group})  # noqa: E731
        # (E2) all_reduce
        out = [self._edge("all_reduce", group, state, on_group(_R), reduce_op=op)]
        # (E3) reduce_scatter (functional collectives: sum and avg)
        if op in ("sum", "avg"):
            for d in range(len(self.shape)):
                if not self._later_shards(state, group, d) and self._flat_ok(state, group, d):
                    out.append(self._edge("reduce_scatter", group, state, on_group(Shard(d)), tensor_dim=d, reduce_op=op))
        return out

    def _replicate_edges(self, state, group) -> list[_Edge | None]:
        out: list[_Edge | None] = []
        on_group = lambda p: self._with(state, {g: p for g in group})  # noqa: E731
        k = group[0]
        for d in range(len(self.shape)):
            later = self._later_shards(state, group, d)
            if not later and self._flat_ok(state, group, d):
                # (E5) local_slice, plain or into a strided placement of src/dst
                out.append(self._edge("local_slice", group, state, on_group(Shard(d)), tensor_dim=d))
                if len(group) == 1:
                    for sp in self.strided:
                        if sp.dim == d:
                            out.append(
                                self._edge("local_slice", group, state, on_group(sp), tensor_dim=d, split_factor=sp.split_factor)
                            )
            elif (
                len(group) == 1
                and len(later) == 1
                and state[later[0]] == _strided(d, self.mesh.shape[k])
                and self._even(state, k, d, self.mesh.shape[k])
            ):
                # (E5) R, _S(d,sf=m) -> S(d), S(d): keep block r of the m equal blocks
                out.append(
                    self._edge("local_slice", group, state, self._with(state, {k: Shard(d), later[0]: Shard(d)}), tensor_dim=d)
                )
        # (E6) R -> P
        for op in self.partial_ops:
            kind = "local_zero_fill" if op == "sum" else "local_copy"
            out.append(self._edge(kind, group, state, on_group(Partial(op))))
        return out

    def _permute_edges(self, state: tuple[Placement, ...]) -> list[_Edge | None]:
        """(E8) swap the placements of two mesh dims of equal size."""
        out: list[_Edge | None] = []
        n = len(state)
        for k, j in self.pairs:
            a, b = state[k], state[j]
            if a == b:
                continue
            if isinstance(a, StridedShard) or isinstance(b, StridedShard):
                continue
            ok = True
            for p, at in ((a, k), (b, j)):
                if isinstance(p, Shard):
                    if any(_sdim(state[i]) == p.dim for i in range(k + 1, n) if i not in (k, j)):
                        ok = False
                    elif not self._even(state, at, p.dim, self.mesh.shape[at]):
                        ok = False
                if isinstance(p, Partial):
                    if any(
                        isinstance(state[i], Partial) and not _commute(p.reduce_op, state[i].reduce_op)
                        for i in range(n)
                        if i not in (k, j)
                    ):
                        ok = False
            if isinstance(a, Partial) and isinstance(b, Partial) and not _commute(a.reduce_op, b.reduce_op):
                ok = False
            if ok:
                new = list(state)
                new[k], new[j] = b, a
                out.append(self._edge("permute", (k, j), state, tuple(new)))
        return out

    # ------------------------------------------------------------ search

    def search(self, src: int, goal: int) -> dict[int, tuple[float, int, int, RedistributeStep | None]]:
        """Dijkstra from ``src`` until ``goal`` is settled; returns the search's
        table state -> (cost, steps, parent, step), exact for settled states.

        The search is kept per source and resumed by later queries, so planning
        every pair costs at most one full search per source, and a single query
        stops as soon as its target is settled.
        """
        search = self.searches.get(src)
        if search is None:
            search = self.searches[src] = _Search(best={src: (0.0, 0, -1, None)}, heap=[(0.0, 0, src)])
        best, done, heap = search.best, search.done, search.heap
        while goal not in done and heap:
            cost, nsteps, sid = heapq.heappop(heap)
            if sid in done:
                continue
            done.add(sid)
            for target, edge_cost, step in self.out_edges(sid):
                new = (cost + edge_cost, nsteps + 1)
                old = best.get(target)
                if old is None or new < old[:2]:
                    best[target] = (new[0], new[1], sid, step)
                    heapq.heappush(heap, (new[0], new[1], target))
        return best


@dataclass(slots=True)
class _Search:
    """A resumable Dijkstra from one source."""

    best: dict
    heap: list
    done: set = field(default_factory=set)


SHARED_OPS = ("avg", "max", "min", "sum")
"""Every Partial op, sorted: the ops one tensor's shared edges are priced with."""


@dataclass(slots=True)
class _SharedEdges:
    """One tensor's edges, priced once per state with every op of :data:`SHARED_OPS` allowed,
    each with the Partial ops its target holds (module docstring, shared pricing)."""

    pricer: SearchGraph
    """Prices the edges; its state ids are those of every signature's graph of the tensor."""
    edges: dict = field(default_factory=dict)

    def of(self, sid: int) -> list[tuple[frozenset, tuple[int, float, RedistributeStep]]]:
        out = self.edges.get(sid)
        if out is None:
            pricer = self.pricer
            out = self.edges[sid] = [
                (frozenset(p.reduce_op for p in e.state if isinstance(p, Partial)), (pricer.state_id(e.state), e.cost_s,
                                                                                     e.step))
                for e in pricer._build_edges(pricer.states[sid])
            ]
        return out


@lru_cache(maxsize=256)
def shared_edges(mesh: MeshSpec, shape: tuple[int, ...], itemsize: int, profile: HardwareProfile,
                  fuse: bool) -> _SharedEdges:
    return _SharedEdges(SearchGraph(mesh, shape, itemsize, profile, fuse, SHARED_OPS, ()))


@lru_cache(maxsize=2048)
def search_graph(
    mesh: MeshSpec,
    shape: tuple[int, ...],
    itemsize: int,
    profile: HardwareProfile,
    fuse: bool,
    partial_ops: tuple[str, ...],
    strided: tuple[StridedShard, ...],
) -> SearchGraph:
    graph = SearchGraph(mesh, shape, itemsize, profile, fuse, partial_ops, strided)
    if not strided and set(partial_ops) <= set(SHARED_OPS):  # else priced on its own (rare)
        graph.shared = shared_edges(mesh, shape, itemsize, profile, fuse)
        graph.ids, graph.states = graph.shared.pricer.ids, graph.shared.pricer.states  # one id per state
    return graph



def canonical(placements: tuple[Placement, ...], mesh: MeshSpec) -> tuple[Placement, ...]:
    """R on every mesh dim of size 1: there any placement holds the same local
    tensor (the whole piece; the value itself for Partial)."""
    if 1 not in mesh.shape and len(placements) == len(mesh.shape):  # nothing to replace (the common case, asked ~10^5 times a model)
        return tuple(placements)
    return tuple(_R if m == 1 else p for p, m in zip(placements, mesh.shape))

