"""Shape arithmetic of placements: which global indices each rank holds.

Pure integer logic shared by the shard simulator (``costmodel.simulate``) and
the redistribution planner (sizes of the largest shard). Semantics follow
DTensor exactly:

* ``torch.chunk`` sizes: ``n`` split into ``m`` chunks has chunk size
  ``c = ceil(n / m)``; chunk ``i`` covers ``[i*c, min((i+1)*c, n))`` and may be
  empty (``chunk_sizes(5, 4) == (2, 2, 1, 0)``).
* Mesh dims apply left to right: mesh dim 0 splits the global tensor, mesh dim 1
  splits each rank's piece again, and so on.
* ``_S(d,sf=k)`` on a mesh dim of size ``m``: the piece is first chunked into
  ``k`` parts, each part is chunked into ``m``, and rank ``r`` holds chunk ``r``
  of every part, concatenated in part order (DTensor's ``_StridedShard``).

Because a mesh dim splits one tensor dim only, the index set of a rank is a
product over tensor dims; each tensor dim is handled independently.

>>> chunk_sizes(5, 4)
(2, 2, 1, 0)
>>> local_shape((8, 6), "S(0)S(1)", (2, 3), (1, 2))
(4, 2)
"""

from __future__ import annotations

import itertools
import math
from functools import lru_cache
from typing import Sequence

from costmodel.placements import (
    Partial,
    Placement,
    Replicate,
    Shard,
    StridedShard,
    parse_placements,
)

__all__ = [
    "ShardShapeError",
    "as_placements",
    "chunk_sizes",
    "chunk_offsets",
    "strided_positions",
    "local_indices",
    "local_shape",
    "max_local_shape",
    "max_local_numel",
    "piece_extents",
    "flat_matches_nested",
    "check_placements",
]


class ShardShapeError(ValueError):
    """Placements that do not fit the tensor or the mesh (names the field)."""


def as_placements(placements: str | Sequence[Placement]) -> tuple[Placement, ...]:
    """Placements from their text form or a sequence of placement objects.

    >>> as_placements("S(0)R")
    (Shard(dim=0), Replicate())
    """
    if isinstance(placements, str):
        return parse_placements(placements)
    result = tuple(placements)
    for p in result:
        if not isinstance(p, (Replicate, Shard, StridedShard, Partial)):
            raise ShardShapeError(f"placements: {p!r} is not a placement")
    return result


def check_placements(
    placements: Sequence[Placement], tensor_ndim: int, mesh_shape: Sequence[int]
) -> None:
    """Raise :class:`ShardShapeError` unless there is one placement per mesh dim and
    every shard names an existing tensor dim (negative dims are not allowed)."""
    if len(placements) != len(mesh_shape):
        raise ShardShapeError(
            f"placements: {len(placements)} given for a {len(mesh_shape)}-D mesh "
            f"({''.join(str(p) for p in placements)})"
        )
    for mesh_dim, p in enumerate(placements):
        if isinstance(p, (Shard, StridedShard)) and not 0 <= p.dim < tensor_ndim:
            raise ShardShapeError(
                f"placements[{mesh_dim}]: {p} shards tensor dim {p.dim} of a "
                f"{tensor_ndim}-D tensor"
            )


@lru_cache(maxsize=65536)
def chunk_sizes(n: int, m: int) -> tuple[int, ...]:
    """Sizes of ``torch.chunk(range(n), m)``, padded with empty chunks to ``m``."""
    if m <= 0:
        raise ShardShapeError(f"mesh dim size must be positive, got {m}")
    if n <= 0:
        return (0,) * m
    c = -(-n // m)
    return tuple(max(0, min(c, n - i * c)) for i in range(m))


@lru_cache(maxsize=65536)
def chunk_offsets(n: int, m: int) -> tuple[int, ...]:
    """Start offset of each ``torch.chunk`` chunk (``m`` entries)."""
    sizes = chunk_sizes(n, m)
    return tuple(itertools.accumulate((0,) + sizes[:-1]))


@lru_cache(maxsize=65536)
def strided_positions(n: int, m: int, split_factor: int, rank: int) -> tuple[int, ...]:
    """Positions in ``range(n)`` held by ``rank`` under ``_S(.,sf=split_factor)``
    on a mesh dim of size ``m``, in local order.

    >>> strided_positions(9, 4, 2, 0)
    (0, 1, 5)
    """
    positions: list[int] = []
    part_sizes = chunk_sizes(n, split_factor)
    part_offsets = chunk_offsets(n, split_factor)
    for size, offset in zip(part_sizes, part_offsets):
        sub_size = chunk_sizes(size, m)[rank]
        sub_offset = chunk_offsets(size, m)[rank]
        start = offset + sub_offset
        positions.extend(range(start, start + sub_size))
    return tuple(positions)


def _split_size(size: int, placement: Placement, m: int, rank: int) -> int:
    if isinstance(placement, Shard):
        return chunk_sizes(size, m)[rank]
    if isinstance(placement, StridedShard):
        return sum(chunk_sizes(part, m)[rank] for part in chunk_sizes(size, placement.split_factor))
    return size


def local_indices(
    global_shape: Sequence[int],
    placements: str | Sequence[Placement],
    mesh_shape: Sequence[int],
    coord: Sequence[int],
) -> tuple[tuple[int, ...], ...]:
    """Global indices held by the rank at ``coord``, one tuple per tensor dim, in
    local order (the local tensor is ``global[np.ix_(*local_indices(...))]``).

    >>> local_indices((4,), "S(0)", (2,), (1,))
    ((2, 3),)
    """
    pl = as_placements(placements)
    check_placements(pl, len(global_shape), mesh_shape)
    indices = [tuple(range(n)) for n in global_shape]
    for mesh_dim, p in enumerate(pl):
        if not isinstance(p, (Shard, StridedShard)):
            continue
        m, r = mesh_shape[mesh_dim], coord[mesh_dim]
        current = indices[p.dim]
        if isinstance(p, Shard):
            off, size = chunk_offsets(len(current), m)[r], chunk_sizes(len(current), m)[r]
            indices[p.dim] = current[off : off + size]
        else:
            pos = strided_positions(len(current), m, p.split_factor, r)
            indices[p.dim] = tuple(current[i] for i in pos)
    return tuple(indices)


def local_shape(
    global_shape: Sequence[int],
    placements: str | Sequence[Placement],
    mesh_shape: Sequence[int],
    coord: Sequence[int],
) -> tuple[int, ...]:
    """Shape of the local tensor of the rank at ``coord``."""
    pl = as_placements(placements)
    check_placements(pl, len(global_shape), mesh_shape)
    sizes = list(global_shape)
    for mesh_dim, p in enumerate(pl):
        if isinstance(p, (Shard, StridedShard)):
            sizes[p.dim] = _split_size(sizes[p.dim], p, mesh_shape[mesh_dim], coord[mesh_dim])
    return tuple(sizes)


def _dim_sizes_at(
    size: int, placements: tuple[Placement, ...], mesh_shape: tuple[int, ...], tensor_dim: int, upto: int
) -> set[int]:
    """Sizes tensor dim ``tensor_dim`` can have after mesh dims ``0..upto-1``
    (over every coordinate of the mesh dims that shard it)."""
    sizes = {size}
    for mesh_dim in range(upto):
        p = placements[mesh_dim]
        if isinstance(p, (Shard, StridedShard)) and p.dim == tensor_dim:
            m = mesh_shape[mesh_dim]
            sizes = {_split_size(s, p, m, r) for s in sizes for r in range(m)}
    return sizes


@lru_cache(maxsize=65536)
def _piece_extents(
    global_shape: tuple[int, ...],
    placements: tuple[Placement, ...],
    mesh_shape: tuple[int, ...],
    mesh_dim: int,
    tensor_dim: int,
) -> frozenset[int]:
    return frozenset(
        _dim_sizes_at(global_shape[tensor_dim], placements, mesh_shape, tensor_dim, mesh_dim)
    )


def piece_extents(
    global_shape: Sequence[int],
    placements: Sequence[Placement],
    mesh_shape: Sequence[int],
    mesh_dim: int,
    tensor_dim: int,
) -> frozenset[int]:
    """Every size tensor dim ``tensor_dim`` can have when it reaches mesh dim
    ``mesh_dim`` (i.e. after the mesh dims to its left have split it)."""
    return _piece_extents(
        tuple(global_shape), tuple(placements), tuple(mesh_shape), mesh_dim, tensor_dim
    )


@lru_cache(maxsize=65536)
def _max_local_shape(
    global_shape: tuple[int, ...],
    placements: tuple[Placement, ...],
    mesh_shape: tuple[int, ...],
) -> tuple[int, ...]:
    return tuple(
        max(_dim_sizes_at(n, placements, mesh_shape, d, len(mesh_shape)))
        for d, n in enumerate(global_shape)
    )


def max_local_shape(
    global_shape: Sequence[int],
    placements: str | Sequence[Placement],
    mesh_shape: Sequence[int],
) -> tuple[int, ...]:
    """Largest size of every tensor dim over all ranks; since tensor dims are split
    by disjoint mesh dims, their product is the largest local shard.

    >>> max_local_shape((5, 7), "S(0)S(1)", (2, 3))
    (3, 3)
    """
    pl = as_placements(placements)
    shape = tuple(int(n) for n in global_shape)
    mesh = tuple(int(m) for m in mesh_shape)
    check_placements(pl, len(shape), mesh)
    return _max_local_shape(shape, pl, mesh)


def max_local_numel(
    global_shape: Sequence[int], placements: str | Sequence[Placement], mesh_shape: Sequence[int]
) -> int:
    """Number of elements of the largest local shard."""
    return math.prod(max_local_shape(global_shape, placements, mesh_shape))


@lru_cache(maxsize=65536)
def flat_matches_nested(extent: int, group_sizes: tuple[int, ...]) -> bool:
    """True when chunking ``extent`` into ``prod(group_sizes)`` flat chunks gives
    the same ranges as chunking it by each size in turn (nested, lexicographic).

    A fused collective on a flattened group splits flat; placements split nested.
    They agree whenever the division is even, and in some uneven cases.

    >>> flat_matches_nested(8, (2, 2)), flat_matches_nested(5, (2, 2))
    (True, False)
    """
    total = math.prod(group_sizes)
    flat = [(o, s) for o, s in zip(chunk_offsets(extent, total), chunk_sizes(extent, total))]
    nested = [(0, extent)]
    for m in group_sizes:
        nested = [
            (off + o, s)
            for off, size in nested
            for o, s in zip(chunk_offsets(size, m), chunk_sizes(size, m))
        ]
    # Empty chunks have no position; compare sizes and the offsets of non-empty ones.
    return all(
        fs == ns and (fs == 0 or fo == no) for (fo, fs), (no, ns) in zip(flat, nested)
    )
