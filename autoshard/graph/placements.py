"""Placements a whole tensor may take on a mesh: the strategies of the graph's
leaves (parameters, buffers, user inputs, gradient sinks).

A leaf has no rule: any layout of it is a valid choice. On every mesh dim it is
``R`` or ``S(d)`` for a tensor dim ``d``; mesh dims apply left to right, so a
tensor dim split by two mesh dims is split again on each rank's piece
(``S(0)S(0)``). Only even splits are offered (the runtime never pads a leaf);
mesh dims of size 1 take ``R`` only (any placement there is the same layout).
``Partial`` is never a leaf placement: a parameter or an input is a value, not
a sum of values.

>>> [''.join(map(str, p)) for p in leaf_placements((4, 6), (2, 3))]
['RR', 'RS(1)', 'S(0)R', 'S(0)S(1)', 'S(1)R', 'S(1)S(1)']
"""

from __future__ import annotations

import itertools
from functools import lru_cache

from costmodel.placements import Placement, Replicate, Shard

__all__ = ["leaf_placements", "replicated"]

_R = Replicate()


def replicated(mesh_ndim: int) -> tuple[Placement, ...]:
    """``RR...R`` on a mesh of ``mesh_ndim`` dims."""
    return (_R,) * mesh_ndim


@lru_cache(maxsize=4096)
def leaf_placements(shape: tuple[int, ...], mesh_shape: tuple[int, ...]) -> tuple[tuple[Placement, ...], ...]:
    """Every even placement of a tensor of ``shape`` on a mesh of ``mesh_shape``,
    all-replicate first, then in lexicographic order of the placement text."""
    options_per_dim: list[list[Placement]] = []
    for m in mesh_shape:
        options_per_dim.append([_R] if m == 1 else [_R] + [Shard(d) for d in range(len(shape))])
    found: list[tuple[Placement, ...]] = []
    for combo in itertools.product(*options_per_dim):
        sizes = list(shape)
        ok = True
        for p, m in zip(combo, mesh_shape):
            if isinstance(p, Shard):
                if sizes[p.dim] % m or sizes[p.dim] < m:
                    ok = False
                    break
                sizes[p.dim] //= m
        if ok:
            found.append(combo)
    rep = replicated(len(mesh_shape))
    rest = sorted((c for c in found if c != rep), key=lambda c: "".join(map(str, c)))
    return (rep, *rest)
