r"""Edge costs: what it takes to hand a tensor from its producer's strategy to
its reader's.

For an edge carrying tensor T (global shape, dtype) from output k of node u to
input i of node v, with strategy lists S_u and S_v:

    M[a, b] = cost_s( plan_redistribute(out_k(S_u[a]) -> in_i(S_v[b]), T) )

``inf`` (forbidden) where no sequence of steps exists; 0 where the reader does
not read the data (``None`` placement). The planner's cost is the time of the
collectives and local re-layouts it would issue, i.e. exactly what the runtime
executes.

Two levels of sharing keep this small. (1) Many strategies of a node share an
output (or input) placement, so M is gathered from the matrix C over the
*distinct* placements: ``M = C[ua][:, vb]`` with ``ua``/``vb`` the index of
each strategy's placement in the distinct lists. (2) C depends only on (T's
shape and itemsize, the distinct placement lists), and M on (C, the two
index vectors); repeated layers ask for the same matrices thousands of
times, so both are cached and M is one shared array (``matrices`` + ``matrix:
k`` in the problem file).

Gradient edges (op -> ``grad:<fqn>`` sink) pass ``share``: a reduction that
the runtime issues in a bucket with other gradients pays only ``share`` of its
call latency (``costmodel.buckets.grouping``, which also says why this is an
approximation and how the plan's estimate corrects it), on the route it would
take in the bucket (``costmodel.buckets.routes``: one flattened collective
where a per-dim chain, cheaper alone, could not join a bucket).

>>> from hw_profiles import load
>>> from costmodel.mesh import MeshSpec
>>> from costmodel.placements import parse_placements as pp
>>> pricer = EdgePricer(MeshSpec((2,)), load("h100-sxm-80gb"))
>>> m = pricer.matrix((1024, 1024), 4, [pp("R"), pp("S(0)")], [pp("R"), pp("S(0)"), pp("R")])
>>> m.shape, float(m[0, 0]), bool(m[1, 0] > 0)
((2, 3), 0.0, True)
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from costmodel.buckets.routes import bucketed_route
from costmodel.buckets.grouping import bucketable_step
from costmodel.mesh import MeshSpec
from costmodel.placements import Placement
from costmodel.redistribute import plan_redistribute, redistribute_costs
from costmodel.redistribute_steps import RedistributePlan
from hw_profiles import HardwareProfile

__all__ = ["EdgePricer", "distinct_values"]

Placements = tuple[Placement, ...]


def distinct_values(items: Sequence[Placements | None]) -> tuple[tuple[Placements | None, ...], np.ndarray]:
    """Distinct values in first-seen order and the index of every item among them."""
    seen: dict[Placements | None, int] = {}
    index = np.empty(len(items), dtype=np.int64)
    for j, item in enumerate(items):
        index[j] = seen.setdefault(item, len(seen))
    return tuple(seen), index


class EdgePricer:
    """Cost matrices of edges on one mesh and profile, cached by signature."""

    def __init__(self, mesh: MeshSpec, profile: HardwareProfile) -> None:
        self.mesh = mesh
        self.profile = profile
        self._distinct_cache: dict[tuple, np.ndarray] = {}
        self._matrix_cache: dict[tuple, int] = {}
        self.matrices: list[np.ndarray] = []
        """Every distinct edge matrix handed out by :meth:`matrix_index`."""
        self.pairs_planned = 0
        """Placement pairs priced by the planner (cache misses of C)."""

    def plan(self, shape: tuple[int, ...], itemsize: int, src: Placements, dst: Placements) -> RedistributePlan:
        """The planner's steps for one pair (raises PlannerError if none exists)."""
        return plan_redistribute(src, dst, self.mesh, shape, itemsize, self.profile)

    def _distinct_matrix(
        self, shape: tuple[int, ...], itemsize: int, srcs: tuple[Placements | None, ...], dsts: tuple[Placements | None, ...]
    ) -> np.ndarray:
        key = (shape, itemsize, srcs, dsts)
        cached = self._distinct_cache.get(key)
        if cached is None:
            cached = np.array(
                redistribute_costs(srcs, dsts, self.mesh, shape, itemsize, self.profile), dtype=np.float64
            ).reshape(len(srcs), len(dsts))
            self.pairs_planned += cached.size
            self._distinct_cache[key] = cached
        return cached

    def _bucketed_matrix(
        self, shape: tuple[int, ...], itemsize: int, srcs: tuple[Placements | None, ...],
        dsts: tuple[Placements | None, ...], share: float,
    ) -> np.ndarray:
        key = (shape, itemsize, srcs, dsts, share)
        cached = self._distinct_cache.get(key)
        if cached is None:
            cached = self._distinct_matrix(shape, itemsize, srcs, dsts).copy()
            for a, b in zip(*np.nonzero(np.isfinite(cached) & (cached > 0))):
                # the route the runtime buckets, one collective where that is cheaper in a bucket
                cached[a, b] = bucketed_route(srcs[a], dsts[b], self.mesh, shape, itemsize, self.profile,
                                              share=share, accept=bucketable_step).price_s
            self._distinct_cache[key] = cached
        return cached

    def matrix(
        self, shape: tuple[int, ...], itemsize: int, src: Sequence[Placements | None], dst: Sequence[Placements | None],
        *, share: float = 1.0,
    ) -> np.ndarray:
        """``M[a, b]`` for producer placements ``src[a]`` and reader placements ``dst[b]``;
        ``share < 1``: a gradient reduction's latency amortised over its bucket."""
        srcs, ua = distinct_values(src)
        dsts, vb = distinct_values(dst)
        if share < 1.0:
            return self._bucketed_matrix(shape, itemsize, srcs, dsts, share)[np.ix_(ua, vb)]
        return self._distinct_matrix(shape, itemsize, srcs, dsts)[np.ix_(ua, vb)]

    def matrix_index(
        self,
        key: tuple,
        shape: tuple[int, ...],
        itemsize: int,
        placements: Callable[[], tuple[Sequence[Placements | None], Sequence[Placements | None]]],
        *,
        share: float = 1.0,
        adjust: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> int:
        """Index in :attr:`matrices` of the edge matrix for ``key`` (a hashable
        identity of the two strategy lists and positions, and of ``adjust``),
        built once from the (producer, reader) placement lists that
        ``placements()`` returns; ``adjust`` rewrites it once built (the
        view and recomputation rules of ``autoshard.graph.copies`` and
        ``autoshard.graph.recompute``)."""
        full_key = (key, shape, itemsize, share)
        index = self._matrix_cache.get(full_key)
        if index is None:
            index = len(self.matrices)
            matrix = self.matrix(shape, itemsize, *placements(), share=share)
            self.matrices.append(matrix if adjust is None else adjust(matrix))
            self._matrix_cache[full_key] = index
        return index
