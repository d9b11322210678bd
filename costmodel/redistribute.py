"""Redistribution planner: the cheapest sequence of collectives and local ops
that turns a tensor's placements ``src`` into ``dst`` on an N-D mesh.

The search graph, its edges (E1-E8, F) and their prices are in
``costmodel.redistribute_search``. Dijkstra from ``src`` (ties: fewer steps) stops once ``dst``
is settled and is kept to be resumed by the next query from the same source. The cost table
of many pairs (``redistribute_costs``, the strategy graph's edge matrices) runs one vectorised
Bellman-Ford per signature from all its sources at once (the same sums as Dijkstra, so the
same costs), its rows memoised per source, on the structure shared by every tensor shape that
splits alike (``costmodel.redistribute_classes``).

>>> from hw_profiles import load
>>> from costmodel.mesh import MeshSpec
>>> plan = plan_redistribute("S(0)S(0)", "RR", MeshSpec((8, 8)), (4096, 4096), 2, load("h100-sxm-80gb"))
>>> [(s.collective, s.mesh_dims) for s in plan.steps]
[('all_gather', (0, 1))]
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable, Sequence

import numpy as np

from costmodel.shard_shapes import ShardShapeError, as_placements, check_placements
from costmodel.mesh import MeshSpec
from costmodel.placements import Partial, Placement, StridedShard, format_placements
from costmodel import redistribute_classes, redistribute_disk
from costmodel.redistribute_classes import ops_mask, tensor_table
from costmodel.redistribute_search import PlannerError, canonical, search_graph, shared_edges
from costmodel.redistribute_steps import RedistributePlan, RedistributeStep
from hw_profiles import HardwareProfile

__all__ = [
    "PlannerError",
    "plan_redistribute",
    "redistribute_costs",
    "RedistributePlan",
    "RedistributeStep",
    "clear_cache",
    "on_clear",
]


def _normalize(
    src: str | Sequence[Placement],
    dst: str | Sequence[Placement],
    mesh: MeshSpec | Sequence[int],
    shape: Sequence[int],
    itemsize: int,
) -> tuple[tuple[Placement, ...], tuple[Placement, ...], MeshSpec, tuple[int, ...]]:
    mesh_spec = mesh if isinstance(mesh, MeshSpec) else MeshSpec(tuple(mesh))
    try:
        shape_t = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise PlannerError(f"shape: expected a tuple of ints, got {shape!r}") from None
    if any(s < 0 for s in shape_t):
        raise PlannerError(f"shape: sizes must be >= 0, got {shape_t}")
    if not isinstance(itemsize, int) or itemsize <= 0:
        raise PlannerError(f"itemsize: must be a positive int, got {itemsize!r}")
    src_t, dst_t = as_placements(src), as_placements(dst)
    for name, pl in (("src", src_t), ("dst", dst_t)):
        try:
            check_placements(pl, len(shape_t), mesh_spec.shape)
        except ShardShapeError as exc:
            raise PlannerError(f"{name}: {exc}") from None
    return src_t, dst_t, mesh_spec, shape_t


@lru_cache(maxsize=65536)
def _plan_cached(
    src: tuple[Placement, ...],
    dst: tuple[Placement, ...],
    mesh: MeshSpec,
    shape: tuple[int, ...],
    itemsize: int,
    profile: HardwareProfile,
    fuse: bool,
) -> RedistributePlan:
    start, goal = canonical(src, mesh), canonical(dst, mesh)
    if start == goal:
        return RedistributePlan((), 0.0, src, dst, fuse)
    both = src + dst
    partial_ops = tuple(sorted({p.reduce_op for p in both if isinstance(p, Partial)}))
    strided = tuple(sorted({p for p in both if isinstance(p, StridedShard)}, key=str))
    graph = search_graph(mesh, shape, itemsize, profile, fuse, partial_ops, strided)
    start_id, goal_id = graph.state_id(start), graph.state_id(goal)
    tree = graph.search(start_id, goal_id)
    if goal_id not in tree:
        raise PlannerError(
            f"dst: no sequence of steps reaches {format_placements(dst)} from {format_placements(src)} "
            f"on mesh {mesh.shape} for shape {shape}"
        )
    steps: list[RedistributeStep] = []
    sid = goal_id
    while sid != start_id:
        _, _, parent, step = tree[sid]
        steps.append(step)
        sid = parent
    steps.reverse()
    return RedistributePlan(tuple(steps), tree[goal_id][0], src, dst, fuse)



def plan_redistribute(
    src: str | Sequence[Placement],
    dst: str | Sequence[Placement],
    mesh: MeshSpec | Sequence[int],
    shape: Sequence[int],
    itemsize: int,
    profile: HardwareProfile,
    *,
    fuse: bool = True,
) -> RedistributePlan:
    """Cheapest steps from placements ``src`` to ``dst`` (strings such as
    ``"S(0)P(sum)"`` or placement tuples) for a tensor of global ``shape`` with
    ``itemsize`` bytes per element on ``mesh`` (a :class:`MeshSpec` or its shape),
    priced with ``profile``. ``fuse=False`` forbids steps on flattened groups of
    several mesh dims (the per-dim baseline). Results are cached by signature.

    >>> from hw_profiles import load
    >>> plan = plan_redistribute("P(sum)R", "RR", (2, 4), (1024, 1024), 4, load("h100-sxm-80gb"))
    >>> plan.steps[0].to_dict()["collective"], plan.steps[0].mesh_dims
    ('all_reduce', (0,))
    """
    src_t, dst_t, mesh_spec, shape_t = _normalize(src, dst, mesh, shape, itemsize)
    return _plan_cached(src_t, dst_t, mesh_spec, shape_t, itemsize, profile, fuse)


def redistribute_costs(
    srcs: Sequence[Sequence[Placement] | None],
    dsts: Sequence[Sequence[Placement] | None],
    mesh: MeshSpec,
    shape: Sequence[int],
    itemsize: int,
    profile: HardwareProfile,
    *,
    fuse: bool = True,
) -> list[list[float]]:
    """``cost_s`` of :func:`plan_redistribute` for every pair ``srcs[a] -> dsts[b]``
    (``inf`` where no plan exists, 0 where either side is None), without building
    the plans: each placement is checked once and each source searched once.
    The search graph of a pair is the one ``plan_redistribute`` uses, so the
    costs are the same numbers.

    >>> from hw_profiles import load
    >>> from costmodel.placements import parse_placements as pp
    >>> redistribute_costs([pp("S(0)")], [pp("R"), None], MeshSpec((4,)), (64, 64), 4, load("h100-sxm-80gb"))[0][1]
    0.0
    """
    store = redistribute_disk.active_store()  # tables of earlier processes (costmodel.redistribute_disk)
    if store is not None:
        cached = store.get(mesh, profile, fuse, shape, itemsize, srcs, dsts)
        if cached is not None:
            return cached
    shape_t = tuple(int(s) for s in shape)

    def prepared(items: Sequence[Sequence[Placement] | None], name: str) -> list[tuple | None]:
        out: list[tuple | None] = []
        for pl in items:
            if pl is None:
                out.append(None)
                continue
            try:
                out.append(_prepared(as_placements(pl), len(shape_t), mesh))
            except ShardShapeError as exc:
                raise PlannerError(f"{name}: {exc}") from None
        return out

    src_p, dst_p = prepared(srcs, "src"), prepared(dsts, "dst")
    table = np.zeros((len(src_p), len(dst_p)))  # 0 where either side is None
    # the placements by the extra placements they bring into a search graph's signature, and
    # the blocks of pairs by signature: one all-sources search per signature, no loop over pairs
    src_groups: dict[tuple, list[int]] = {}
    dst_groups: dict[tuple, list[int]] = {}
    for groups, items in ((src_groups, src_p), (dst_groups, dst_p)):
        for k, item in enumerate(items):
            if item is not None:
                groups.setdefault(item[1:], []).append(k)
    blocks: dict[tuple, list[tuple[list[int], list[int]]]] = {}
    for (s_ops, s_strided), rows in src_groups.items():
        for (d_ops, d_strided), cols in dst_groups.items():
            sig = (tuple(sorted(s_ops | d_ops)), tuple(sorted(s_strided | d_strided, key=str)))
            blocks.setdefault(sig, []).append((rows, cols))
    # state ids per structure (one per strided set; the signatures of one set differ by ops only)
    ids: dict[tuple, tuple[dict[int, int], dict[int, int]]] = {}
    for sig, parts in blocks.items():
        ops, strided = sig
        # the edges shared by the signatures of the tensor with the same strided placements (E5 may
        # slice into those), kept where the target holds only ``ops``; on the structure of the
        # tensor's shape class, with its own prices (costmodel.redistribute_classes)
        table_of = tensor_table(mesh, shape_t, itemsize, profile, fuse, strided)
        state_id, mask = table_of.edges.state_id, ops_mask(ops)
        src_ids, dst_ids = ids.setdefault(strided, ({}, {}))
        for part_rows, cols in parts:
            for a in part_rows:
                if a not in src_ids:
                    src_ids[a] = state_id(src_p[a][0])
            for b in cols:  # ids before the rows' width
                if b not in dst_ids:
                    dst_ids[b] = state_id(dst_p[b][0])
        rows = sorted({a for part_rows, _ in parts for a in part_rows})
        row_of = {a: i for i, a in enumerate(rows)}
        cols_all = sorted({b for _, cols in parts for b in cols})
        col_of = {b: j for j, b in enumerate(cols_all)}
        dist = table_of.distance_rows(mask, [src_ids[a] for a in rows], [dst_ids[b] for b in cols_all])
        for part_rows, cols in parts:
            at = np.asarray([row_of[a] for a in part_rows])
            to = np.asarray([col_of[b] for b in cols])
            table[np.asarray(part_rows)[:, None], np.asarray(cols)] = dist[at[:, None], to]
    if store is not None:
        store.put(mesh, profile, fuse, shape, itemsize, srcs, dsts, table)
    return table.tolist()


@lru_cache(maxsize=65536)
def _prepared(placements: tuple[Placement, ...], ndim: int, mesh: MeshSpec) -> tuple:
    """A checked placement's canonical state and what it brings into a signature: its Partial
    ops and strided placements (a model's edges ask the same few placements thousands of times)."""
    check_placements(placements, ndim, mesh.shape)
    return (
        canonical(placements, mesh),
        frozenset(p.reduce_op for p in placements if isinstance(p, Partial)),
        frozenset(p for p in placements if isinstance(p, StridedShard)),
    )


_DEPENDENT_CACHES: list[Callable[[], None]] = []
"""Clearers of caches built on plans of this module (``costmodel.buckets.routes``, which
imports this module, registers its own: :func:`on_clear`)."""


def on_clear(clear: Callable[[], None]) -> None:
    """Have :func:`clear_cache` call ``clear`` too."""
    _DEPENDENT_CACHES.append(clear)


def clear_cache() -> None:
    """Forget cached plans, search graphs and the caches built on them (e.g. before timing the planner)."""
    _plan_cached.cache_clear()
    _prepared.cache_clear()
    search_graph.cache_clear()
    redistribute_classes.clear_cache()
    shared_edges.cache_clear()
    for clear in _DEPENDENT_CACHES:
        clear()

