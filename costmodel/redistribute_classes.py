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

Skeletons. Classes of one rank still differ in their small dims (a 3-D mesh: Mixtral's
80 classes, 1,502 states each for a 4-D tensor), and each built every state's edges again.
But ``SearchGraph._build_edges`` reads the shape only through three facts, each a function of
one tensor dim's size :math:`s_d` and of the splits :math:`c` the mesh dims before some mesh
dim :math:`k` make of it (``shard_shapes._dim_sizes_at``: the pairs ``(j, placement_j)``,
:math:`j < k`, that shard :math:`d`): *even* (every piece of :math:`d` at :math:`k` divides
by ``parts``), *flat* (every piece splits flat over a group as nested) and the local extent of
:math:`d` (:math:`k` = all mesh dims), which gives *leading* (every dim before :math:`d` has
extent 1). So the edges of one (mesh, fuse, strided set, rank) are built once, shape-free, as
a *skeleton*: every candidate edge with the facts it needs (as keys ``(d, c, parts | group)``)
and the tests its relayout flags read; a class decides each distinct fact once on its
representative (the same ``_even`` / ``_flat_ok`` / ``_dim_sizes_at`` calls on a state with
the same splits, so the same booleans and ints) and keeps, in numpy, the candidates whose
facts hold, with their flags. The skeleton is closed under every candidate, a superset of each
class's edges, so a class's reachable states are among its states and a state met later is
still unreachable from a memoised row's source. A tensor's weights are ``price_step`` once per
distinct (step, flags, bytes before, bytes after): the same call on the same Python ints.
Mixtral tiny on 2x2x2: states expanded 46,398 (once per class) -> 9,452 (once per skeleton),
``prepare``'s build 9.5 -> 4.6 s (tests/costmodel/test_redistribute_skeleton.py checks the decided
edges against ``_build_edges`` state by state, and the tables against Dijkstra).

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
from costmodel.placements import Partial, Placement, Shard, StridedShard
from costmodel.redistribute_search import _R, SHARED_OPS, SearchGraph, _commute, _sdim, _strided
from costmodel.shard_shapes import _dim_sizes_at
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


_NONE = -1
"""No fact / no leading-dim test on a skeleton edge (always true)."""


@dataclass(slots=True)
class _Skeleton:
    """The out-edges of every state on one (mesh, fuse, strided set, tensor rank), with the
    facts of the tensor's shape they read left as questions (module docstring, skeletons).

    Per candidate edge (parallel lists): head and target state ids, the ``(kind, group, size)``
    of its step (:attr:`bases`), the facts it needs (``c1``, ``c2``: ids in :attr:`facts`,
    :data:`_NONE` for none), and what its relayout flags read: ``rin_const`` (a strided source),
    a leading-dim test ``(rin_lead_sid, rin_lead_dim)`` and an evenness fact ``rin_even`` before the
    collective, a leading-dim test ``(rout_lead_sid, rout_lead_dim)`` after it."""

    template: SearchGraph
    """Groups, group sizes, mesh, strided set and Partial ops of the signature (its shape is unread)."""
    ndim: int
    ids: dict = field(default_factory=dict)
    states: list = field(default_factory=list)
    state_masks: list = field(default_factory=list)
    chains: list = field(default_factory=list)
    """Per state: for each tensor dim, the id (:attr:`chain_reps`) of the splits its local extent reads."""
    chain_ids: dict = field(default_factory=dict)
    chain_reps: list = field(default_factory=list)
    """Per chain id: ``(tensor dim, a state with those splits)``."""
    facts: list = field(default_factory=list)
    """Per fact id: ``("even", state, first mesh dim, tensor dim, parts)`` or ``("flat", state, group, tensor dim, 0)``
    with a representative state: the arguments of ``SearchGraph._even`` / ``_flat_ok``."""
    fact_ids: dict = field(default_factory=dict)
    bases: list = field(default_factory=list)
    base_ids: dict = field(default_factory=dict)
    expanded: int = 0
    cols: dict = field(default_factory=lambda: {k: [] for k in _COLUMNS})

    def state_id(self, state: tuple[Placement, ...]) -> int:
        sid = self.ids.get(state)
        if sid is None:
            sid = self.ids[state] = len(self.states)
            self.states.append(state)
        return sid

    def close(self) -> None:
        """Expand every state known, and every state a candidate edge leads to."""
        while self.expanded < len(self.states):
            self._expand(self.expanded)
            self.expanded += 1

    def _fact(self, key: tuple, rep: tuple) -> int:
        fid = self.fact_ids.get(key)
        if fid is None:
            fid = self.fact_ids[key] = len(self.facts)
            self.facts.append(rep)
        return fid

    def _expand(self, sid: int) -> None:
        """``SearchGraph._build_edges`` rule by rule, each shape fact recorded, not decided."""
        x = _Expansion(self, sid)
        for group in self.template.groups:
            x.group_edges(group)
        x.permute_edges()  # SearchGraph._permute_edges (E8)


class _Expansion:
    """One state's candidate edges in a :class:`_Skeleton`, each with the shape facts it needs
    (``SearchGraph._build_edges``' rules, the facts recorded as ids, not decided)."""

    def __init__(self, skel: "_Skeleton", sid: int) -> None:
        self.skel, self.sid, self.g = skel, sid, skel.template
        self.state = state = skel.states[sid]
        self.n = len(state)
        self.sd = [_sdim(p) for p in state]
        skel.state_masks.append(ops_mask([p.reduce_op for p in state if isinstance(p, Partial)]))
        # a piece's extents read the global size and the splits of mesh dims before it
        # (shard_shapes._dim_sizes_at): the key of a fact on every shape at once
        row = []
        for e in range(skel.ndim):
            key = (e, self.chain(self.n, e))
            cid = skel.chain_ids.get(key)
            if cid is None:
                cid = skel.chain_ids[key] = len(skel.chain_reps)
                skel.chain_reps.append((e, state))
            row.append(cid)
        skel.chains.append(tuple(row))

    def chain(self, upto: int, d: int) -> tuple:
        return tuple((j, self.state[j]) for j in range(upto) if self.sd[j] == d)

    def even(self, first: int, d: int, parts: int) -> int:
        return self.skel._fact(("even", d, self.chain(first, d), parts), ("even", self.state, first, d, parts))

    def flat(self, group: tuple[int, ...], d: int) -> int:
        if len(group) == 1:
            return _NONE
        return self.skel._fact(("flat", d, self.chain(group[0], d), group), ("flat", self.state, group, d, 0))

    def later(self, group: tuple[int, ...], d: int) -> list[int]:
        return [j for j in range(group[0] + 1, self.n) if j not in group and self.sd[j] == d]

    def on_group(self, group: tuple[int, ...], p: Placement) -> tuple:
        new = list(self.state)
        for k in group:
            new[k] = p
        return tuple(new)

    def add(self, target, kind, group, c1=_NONE, c2=_NONE, rin_const=False, rin_lead=None, rin_even=_NONE,
            rout_lead=None) -> None:
        if target == self.state:  # SearchGraph._edge: no step
            return
        skel, sid, g = self.skel, self.sid, self.g
        cols = skel.cols
        tid = skel.state_id(target)
        bid = skel.base_ids.get((kind, group))
        if bid is None:
            bid = skel.base_ids[kind, group] = len(skel.bases)
            skel.bases.append((kind, group, g.group_sizes.get(group) or g.mesh.group_size(group)))
        cols["heads"].append(sid)
        cols["targets"].append(tid)
        cols["base"].append(bid)
        cols["c1"].append(c1)
        cols["c2"].append(c2)
        cols["rin_const"].append(rin_const)
        cols["rin_even"].append(rin_even)
        rin_sid = sid if rin_lead is None or rin_lead[0] != "dst" else tid
        cols["rin_lead_sid"].append(rin_sid)
        cols["rin_lead_dim"].append(_NONE if rin_lead is None else rin_lead[1])
        rout_sid = sid if rout_lead is None or rout_lead[0] != "dst" else tid
        cols["rout_lead_sid"].append(rout_sid)
        cols["rout_lead_dim"].append(_NONE if rout_lead is None else rout_lead[1])

    def group_edges(self, group: tuple[int, ...]) -> None:
        """The steps on one mesh-dim group (``SearchGraph``'s shard, strided, partial and replicate edges)."""
        g, state, ndim, add = self.g, self.state, self.skel.ndim, self.add
        mesh_shape = g.mesh.shape
        head = state[group[0]]
        if any(state[k] != head for k in group):
            return
        k0 = group[0]
        size = g.group_sizes.get(group) or g.mesh.group_size(group)
        if isinstance(head, Shard):  # SearchGraph._shard_edges
            d = head.dim
            lat = self.later(group, d)
            if not lat:
                add(self.on_group(group, _R), "all_gather", group, rin_lead=("dst", d), rin_even=self.even(k0, d, size))
                for e in range(ndim):
                    if e != d and not self.later(group, e):
                        add(self.on_group(group, Shard(e)), "all_to_all", group, c1=self.flat(group, e),
                            rin_lead=("src", e), rin_even=self.even(k0, e, size), rout_lead=("dst", d))
                if "sum" in g.partial_ops:
                    add(self.on_group(group, Partial("sum")), "local_zero_pad", group)
            elif len(group) == 1 and len(lat) == 1 and state[lat[0]] == Shard(d):
                new = list(state)
                new[k0], new[lat[0]] = _R, _strided(d, mesh_shape[k0])
                add(tuple(new), "all_gather", group, rin_lead=("dst", d), rin_even=self.even(k0, d, size))
        elif isinstance(head, StridedShard):  # _strided_edges: the reorder always copies
            if len(group) == 1 and not self.later(group, head.dim):
                add(self.on_group(group, _R), "all_gather", group, rin_const=True)
        elif isinstance(head, Partial):  # _partial_edges
            op = head.reduce_op
            if not g._partial_ok(state, group, op):
                return
            add(self.on_group(group, _R), "all_reduce", group)
            if op in ("sum", "avg"):
                for d in range(ndim):
                    if not self.later(group, d):
                        add(self.on_group(group, Shard(d)), "reduce_scatter", group, c1=self.flat(group, d),
                            rin_lead=("src", d), rin_even=self.even(k0, d, size))
        else:  # _replicate_edges
            self._replicate_edges(group, k0)

    def _replicate_edges(self, group: tuple[int, ...], k0: int) -> None:
        g, state, add = self.g, self.state, self.add
        mesh_shape = g.mesh.shape
        for d in range(self.skel.ndim):
            lat = self.later(group, d)
            if not lat:
                # a flat group whose split does not match the nested one has no slice (nor the elif)
                add(self.on_group(group, Shard(d)), "local_slice", group, c1=self.flat(group, d))
                if len(group) == 1:
                    for sp in g.strided:
                        if sp.dim == d:
                            add(self.on_group(group, sp), "local_slice", group)
            elif len(group) == 1 and len(lat) == 1 and state[lat[0]] == _strided(d, mesh_shape[k0]):
                new = list(state)
                new[k0], new[lat[0]] = Shard(d), Shard(d)
                add(tuple(new), "local_slice", group, c1=self.even(k0, d, mesh_shape[k0]))
        for op in g.partial_ops:
            add(self.on_group(group, Partial(op)), "local_zero_fill" if op == "sum" else "local_copy", group)

    def permute_edges(self) -> None:
        g, state, sd, n = self.g, self.state, self.sd, self.n
        mesh_shape = g.mesh.shape
        for k, j in g.pairs:  # the mesh dims that may swap: equal sizes > 1 that flatten
            a, b = state[k], state[j]
            if a == b:
                continue
            if isinstance(a, StridedShard) or isinstance(b, StridedShard):
                continue
            ok, conds = True, []
            for p, at in ((a, k), (b, j)):
                if isinstance(p, Shard):
                    if any(sd[i] == p.dim for i in range(k + 1, n) if i not in (k, j)):
                        ok = False
                    else:
                        conds.append(self.even(at, p.dim, mesh_shape[at]))
                if isinstance(p, Partial):
                    if any(isinstance(state[i], Partial) and not _commute(p.reduce_op, state[i].reduce_op)
                           for i in range(n) if i not in (k, j)):
                        ok = False
            if isinstance(a, Partial) and isinstance(b, Partial) and not _commute(a.reduce_op, b.reduce_op):
                ok = False
            if ok:
                new = list(state)
                new[k], new[j] = b, a
                conds += [_NONE] * (2 - len(conds))
                self.add(tuple(new), "permute", (k, j), c1=conds[0], c2=conds[1])


_COLUMNS = ("heads", "targets", "base", "c1", "c2", "rin_const", "rin_lead_sid", "rin_lead_dim", "rin_even",
            "rout_lead_sid", "rout_lead_dim")

_SKELETONS: dict[tuple, _Skeleton] = {}


def _skeleton(mesh: MeshSpec, ndim: int, profile: HardwareProfile, fuse: bool,
              strided: tuple[StridedShard, ...]) -> _Skeleton:
    key = (mesh, ndim, fuse, strided)
    skel = _SKELETONS.get(key)
    if skel is None:
        if len(_SKELETONS) >= _MAX_CLASSES:
            _SKELETONS.clear()  # classes hold their own skeleton: those in use live on
        # the template's shape is never read (only its rank, through ``ndim``); the profile only
        # builds its unread prices
        template = SearchGraph(mesh, (1,) * ndim, 1, profile, fuse, SHARED_OPS, strided, structure_only=True)
        skel = _SKELETONS[key] = _Skeleton(template, ndim)
    return skel


@dataclass(slots=True)
class ClassEdges:
    """States and edges of one shape class on one mesh: its skeleton's candidate edges whose
    facts hold on the representative's shape (state ids are the skeleton's, shared by every
    class of the same rank, fuse and strided set); every state known and every state they lead
    to, so a row of distances covers everything reachable from its source."""

    graph: SearchGraph
    """The representative's graph: decides the facts (``_even``, ``_flat_ok``) and local extents."""
    class_dims: tuple[bool, ...]
    skeleton: _Skeleton
    fact_values: list = field(default_factory=list)
    extents: list = field(default_factory=list)
    """Per chain id of the skeleton: the representative's local extent of that dim."""
    local: np.ndarray | None = None
    """``(states, dims)``: the representative's largest local shard per state."""
    evaluated: int = 0
    """Skeleton candidates ``0 .. evaluated - 1`` are decided."""
    heads: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    targets: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    bases: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    relayout_in: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    relayout_out: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    by_mask: dict = field(default_factory=dict)
    """Ops mask -> (edge count when built, the Bellman-Ford arrays of the edges it keeps)."""
    order: np.ndarray | None = None

    @property
    def states(self) -> list:
        return self.skeleton.states

    def state_id(self, state: tuple[Placement, ...]) -> int:
        return self.skeleton.state_id(state)

    def specs(self, e: int) -> tuple:
        """``(kind, group, size, relayout_in, relayout_out)`` of edge ``e``."""
        return (*self.skeleton.bases[int(self.bases[e])], bool(self.relayout_in[e]), bool(self.relayout_out[e]))

    def close(self) -> None:
        """Decide the edges of every state known, and of every state they reach."""
        skel, graph = self.skeleton, self.graph
        skel.close()
        for kind, state, a, d, parts in skel.facts[len(self.fact_values):]:
            self.fact_values.append(graph._even(state, a, d, parts) if kind == "even" else graph._flat_ok(state, a, d))
        mesh_shape = graph.mesh.shape
        for d, state in skel.chain_reps[len(self.extents):]:  # shard_shapes._max_local_shape, dim by dim
            self.extents.append(max(_dim_sizes_at(graph.shape[d], state, mesh_shape, d, len(mesh_shape))))
        done = 0 if self.local is None else len(self.local)
        if done < len(skel.states):
            ext = np.asarray(self.extents, dtype=np.int64)
            new = ext[np.asarray(skel.chains[done:], dtype=np.int64).reshape(len(skel.states) - done, skel.ndim)]
            self.local = new if self.local is None else np.concatenate([self.local, new])
        total = len(skel.cols["heads"])
        if self.evaluated == total:
            return
        cols = {k: np.asarray(v[self.evaluated:total]) for k, v in skel.cols.items()}
        facts = np.asarray(self.fact_values + [True], dtype=bool)  # index -1 (_NONE): true
        ones = self.local != 1
        # dims < lead have local extent 1 (SearchGraph._leading: d <= lead)
        lead = np.where(ones.any(axis=1), np.argmax(ones, axis=1), skel.ndim) if skel.ndim else np.zeros(len(ones), np.int64)
        keep = facts[cols["c1"]] & facts[cols["c2"]]
        # SearchGraph._relayouts: not leading / not even / from a strided shard
        r_in = (cols["rin_const"].astype(bool) | (lead[cols["rin_lead_sid"]] < cols["rin_lead_dim"])
                | ~facts[cols["rin_even"]])
        r_out = lead[cols["rout_lead_sid"]] < cols["rout_lead_dim"]
        self.heads = np.concatenate([self.heads, cols["heads"][keep]])
        self.targets = np.concatenate([self.targets, cols["targets"][keep]])
        self.bases = np.concatenate([self.bases, cols["base"][keep]])
        self.relayout_in = np.concatenate([self.relayout_in, r_in[keep]])
        self.relayout_out = np.concatenate([self.relayout_out, r_out[keep]])
        self.evaluated = total

    def divisors(self) -> np.ndarray:
        """``(states, dims)``: ``q`` of a class dim (local extent ``s / q``) or the local extent itself."""
        rep = np.asarray(self.graph.shape, dtype=np.int64)
        return np.where(np.asarray(self.class_dims, dtype=bool), rep // self.local, self.local)

    def arrays(self, mask: int) -> tuple[np.ndarray, ...]:
        """``(heads, edge ids, targets, starts)``: the edges whose target holds only ``mask``'s
        ops (the shared-edges filter; their heads too, as every state a source of ``mask``
        reaches), sorted by target for ``np.minimum.reduceat``."""
        cached = self.by_mask.get(mask)
        if cached is not None and cached[0] == len(self.targets):
            return cached[1]
        state_masks = np.asarray(self.skeleton.state_masks, dtype=np.int64)
        heads, tails = self.heads, self.targets
        # every target is expanded (close), so its ops are the state's
        keep = ((state_masks[tails] & ~mask) == 0) & ((state_masks[heads] & ~mask) == 0)
        if self.order is None or len(self.order) != len(tails):  # edge ids by (target, id), once per masks
            self.order = np.argsort(tails, kind="stable")
        ids = self.order[keep[self.order]]  # the kept ids by target, as a stable sort of them would give
        targets, starts = np.unique(tails[ids], return_index=True)
        out = (heads[ids], ids, targets, starts)
        self.by_mask[mask] = (len(self.targets), out)
        return out


_CLASSES: dict[tuple, ClassEdges] = {}
_MAX_CLASSES = 1024


def class_edges(mesh: MeshSpec, shape: tuple[int, ...], profile: HardwareProfile, fuse: bool,
                strided: tuple[StridedShard, ...] = ()) -> ClassEdges:
    """The structure of ``shape``'s class, decided on the first shape of the class met (the
    representative; its graph is built with that call's profile and a unit itemsize, of
    which only the shape facts and the local shapes are read): the edges with every
    Partial op, and local slices into ``strided`` (the strided placements of a signature)."""
    cls = shape_class(shape, mesh, strided)
    key = (mesh, cls, fuse, strided)
    edges = _CLASSES.get(key)
    if edges is None:
        if len(_CLASSES) >= _MAX_CLASSES:
            _CLASSES.clear()
        graph = SearchGraph(mesh, shape, 1, profile, fuse, SHARED_OPS, strided, structure_only=True)
        skel = _skeleton(mesh, len(shape), profile, fuse, strided)
        edges = _CLASSES[key] = ClassEdges(graph, tuple(c == ANY for c in cls), skel)
    return edges


_INT64_SAFE = 2 ** 62
"""Bytes below this are exact in int64 arithmetic (else the tensor's bytes are summed as Python ints)."""


@dataclass(slots=True)
class TensorTable:
    """Distances between placements of one tensor (shape, itemsize) on one mesh and profile,
    over its class's structure with its own prices; rows memoised per (ops mask, source)."""

    edges: ClassEdges
    shape: tuple[int, ...]
    itemsize: int
    prices: StepPrices
    weight_array: np.ndarray = field(default_factory=lambda: np.zeros(0))
    rows: dict = field(default_factory=dict)

    def _state_bytes(self) -> np.ndarray:
        """Per state: bytes of this tensor's largest local shard (the class's divisors scaled)."""
        cls = self.edges
        div = cls.divisors()
        class_dims = np.asarray(cls.class_dims, dtype=bool)
        if math.prod(self.shape) * self.itemsize < _INT64_SAFE:
            local = np.where(class_dims, np.asarray(self.shape, dtype=np.int64) // div, div)
            return np.prod(local, axis=1, dtype=np.int64) * self.itemsize
        return np.asarray([  # huge tensors: exact Python ints
            math.prod(s // int(q) if c else int(q) for s, q, c in zip(self.shape, row, cls.class_dims)) * self.itemsize
            for row in div], dtype=object)

    def _weights(self) -> np.ndarray:
        """``price_step`` of every edge on this tensor's bytes: evaluated once per distinct
        (step, flags, bytes before, bytes after), the same call on the same ints as edge by edge."""
        cls = self.edges
        done = len(self.weight_array)
        if done < len(cls.targets):
            nbytes = self._state_bytes()
            heads, targets = cls.heads[done:], cls.targets[done:]
            if nbytes.dtype == object:  # huge tensors: edge by edge on Python ints
                new = [price_step(self.prices, *cls.specs(e)[:3], nbytes[h], nbytes[t], *cls.specs(e)[3:])[0]
                       for e, h, t in zip(range(done, len(cls.targets)), heads.tolist(), targets.tolist())]
                self.weight_array = np.concatenate([self.weight_array, np.asarray(new, dtype=np.float64)])
                return self.weight_array
            keys = np.stack([cls.bases[done:], cls.relayout_in[done:], cls.relayout_out[done:],
                             nbytes[heads], nbytes[targets]], axis=1)
            uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
            bases = cls.skeleton.bases
            prices = np.asarray([
                price_step(self.prices, *bases[b], int(b_in), int(b_out), bool(r_in), bool(r_out))[0]
                for b, r_in, r_out, b_in, b_out in uniq.tolist()], dtype=np.float64)
            self.weight_array = np.concatenate([self.weight_array, prices[np.ravel(inverse)]])
        return self.weight_array

    def distance_rows(self, mask: int, sources: Sequence[int], goals: Sequence[int] | None = None) -> np.ndarray:
        """``dist[i, t]``: the cost of the cheapest steps from state id ``sources[i]`` to state
        id ``t`` under ``mask``'s Partial ops (``inf`` where unreachable), over every state id
        known now (``goals``: over those ids only, ``dist[i, j]`` for ``goals[j]``). A row is
        memoised per (mask, source):
        the class's states were closed under its edges when it was computed, so a state
        met later is unreachable from its source."""
        cls = self.edges
        missing = [s for s in dict.fromkeys(sources) if (mask, s) not in self.rows]
        if missing:
            cls.close()
            heads, edge_ids, targets, starts = cls.arrays(mask)
            weight = self._weights()[edge_ids]
            n = len(cls.states)
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
        if goals is None:
            goals = range(len(cls.states))
        goals = np.asarray(goals, dtype=np.int64)
        rows = [self.rows[mask, sid] for sid in sources]
        width = min((len(row) for row in rows), default=0)
        if rows and (not len(goals) or int(goals.max()) < width):  # every goal known to every row
            return np.vstack([row[:width] for row in rows])[:, goals]
        out = np.full((len(sources), len(goals)), np.inf)
        for i, row in enumerate(rows):
            seen = goals < len(row)  # a state met after the row: unreachable from its source
            out[i] = np.where(seen, row[np.where(seen, goals, 0)], np.inf)
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
    _SKELETONS.clear()
    tensor_table.cache_clear()
