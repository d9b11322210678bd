"""Virtual-mesh shard simulator: split a global tensor into the local tensors of
every rank, put them back together, and run redistribution steps on them.

Pure index logic (``costmodel.shard_shapes``) applied to real arrays: NumPy arrays or
torch tensors, by duck typing (torch is never imported here; when the caller
passes torch tensors, the already imported module is used). Semantics are
DTensor's:

* mesh dims apply left to right; uneven shards follow ``torch.chunk`` (ceil-sized
  chunks, trailing ones smaller or empty); ``_S(d,sf=k)`` is ``_StridedShard``;
* a Partial mesh dim holds per-rank contributions whose ``reduce_op`` is the
  value; :func:`unshard` undoes the mesh dims right to left, so with several
  Partial dims the innermost (rightmost) is reduced first.

Local tensors are kept in a dict ``{mesh coordinate: local tensor}``.

Partial contributions made by :func:`shard` (``partial="offsets"``, the default)
are distinct on every rank so that a wrong reduction shows: on a Partial mesh dim
``k`` of size ``m``, with ``L`` the sum of the rank's coordinates on the mesh
dims ``0..k-1`` that are not Replicate, ``c = (k + 1)(1 + L)`` and ``q = (r - L) mod m``, rank ``r`` holds

* ``sum``: ``x - c*(1 + 2 + ... + (m-1))`` at ``r = 0``, ``0*x + c*r`` elsewhere;
* ``avg``: ``x + c*(r - (m-1)/2)``; ``max``: ``x - c*q``; ``min``: ``x + c*q``.

Because the offsets depend on the coordinates to the left, reducing two Partial
mesh dims in the wrong order gives a wrong value; ranks that differ only on
Replicate mesh dims still hold identical tensors, as DTensor guarantees. They are small integers
(halves for ``avg``), so integer-valued float data stays exact. ``partial="first"`` instead gives rank 0 the value and the
others zeros (``sum``) or the value (other ops).

>>> import numpy as np
>>> x = np.arange(8.0).reshape(4, 2)
>>> locals_ = shard(x, "S(0)P(sum)", (2, 2))
>>> sorted(locals_)
[(0, 0), (0, 1), (1, 0), (1, 1)]
>>> bool((unshard(locals_, "S(0)P(sum)", (2, 2)) == x).all())
True
"""

from __future__ import annotations

import itertools
import sys
from functools import reduce
from typing import Any, Iterable, Mapping, Sequence

from costmodel.shard_shapes import (
    as_placements,
    check_placements,
    chunk_offsets,
    chunk_sizes,
    local_indices,
    strided_positions,
)
from costmodel.placements import Partial, Placement, Replicate, StridedShard
from costmodel.redistribute_steps import RedistributePlan, RedistributeStep

__all__ = [
    "SimulationError",
    "ReplicaMismatchError",
    "mesh_coords",
    "shard",
    "unshard",
    "apply_step",
    "apply_steps",
]

Coord = tuple[int, ...]


class SimulationError(ValueError):
    """Local tensors that do not fit the placements, mesh or step."""


class ReplicaMismatchError(SimulationError):
    """Ranks that should hold the same data (a Replicate mesh dim) differ."""


# --------------------------------------------------------------------------- backend


class _Backend:
    """The few array operations the simulator needs, for NumPy or torch."""

    def __init__(self, example: Any) -> None:
        module = type(example).__module__.split(".")[0]
        if module == "numpy":
            import numpy as np

            self.kind = "numpy"
            self.np = np
        elif module == "torch":
            self.kind = "torch"
            self.torch = sys.modules["torch"]
        else:
            raise SimulationError(
                f"local tensors must be numpy arrays or torch tensors, got {type(example).__name__}"
            )

    def take(self, x: Any, dim: int, positions: Sequence[int]) -> Any:
        positions = list(positions)
        start = positions[0] if positions else 0
        if positions == list(range(start, start + len(positions))):
            # A contiguous run (or nothing): a plain slice, as torch.chunk gives.
            index = [slice(None)] * x.ndim
            index[dim] = slice(start, start + len(positions))
            return x[tuple(index)]
        if self.kind == "numpy":
            return self.np.take(x, positions, axis=dim)
        idx = self.torch.as_tensor(positions, dtype=self.torch.long, device=x.device)
        return x.index_select(dim, idx)

    def cat(self, parts: Sequence[Any], dim: int) -> Any:
        if self.kind == "numpy":
            return self.np.concatenate(list(parts), axis=dim)
        return self.torch.cat(list(parts), dim=dim)

    def zeros(self, like: Any, shape: Sequence[int]) -> Any:
        if self.kind == "numpy":
            return self.np.zeros(tuple(shape), dtype=like.dtype)
        return like.new_zeros(tuple(shape))

    def reduce(self, parts: Sequence[Any], op: str) -> Any:
        if op == "sum":
            return reduce(lambda a, b: a + b, parts)
        if op == "avg":
            return reduce(lambda a, b: a + b, parts) / len(parts)
        lib = self.np if self.kind == "numpy" else self.torch
        fn = lib.maximum if op == "max" else lib.minimum
        return reduce(fn, parts)

    def equal(self, a: Any, b: Any) -> bool:
        if tuple(a.shape) != tuple(b.shape):
            return False
        if self.kind == "numpy":
            return bool(self.np.array_equal(a, b))
        return bool(self.torch.equal(a, b))


def _first(tensors: Mapping[Coord, Any]) -> Any:
    try:
        return next(iter(tensors.values()))
    except StopIteration:
        raise SimulationError("no local tensors given") from None


def _mesh_shape(mesh: Any) -> tuple[int, ...]:
    shape = getattr(mesh, "shape", mesh)
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise SimulationError(f"mesh_shape: expected a tuple of ints, got {mesh!r}") from None
    if not shape or any(s <= 0 for s in shape):
        raise SimulationError(f"mesh_shape: sizes must be positive, got {shape}")
    return shape


def mesh_coords(mesh_shape: Sequence[int]) -> list[Coord]:
    """All coordinates of the mesh, in rank (row-major) order."""
    return list(itertools.product(*(range(m) for m in mesh_shape)))


# --------------------------------------------------------------------------- shard / unshard


def _partial_value(
    x: Any, op: str, mesh_dim: int, m: int, coord: Coord, placements: tuple[Placement, ...], mode: str
) -> Any:
    r = coord[mesh_dim]
    if mode == "first":
        if op == "sum" and r != 0:
            return x * 0
        return x
    # Offsets scale with the coordinates on the mesh dims to the left, and the
    # rank holding the exact max/min rotates with them, so that reducing two
    # Partial mesh dims in the wrong order gives a wrong value. They only depend
    # on the left, so reducing right to left (unshard) is exact, and not on
    # Replicate dims, whose ranks hold identical tensors (DTensor's invariant).
    left = sum(c for c, p in zip(coord[:mesh_dim], placements) if not isinstance(p, Replicate))
    c = (mesh_dim + 1) * (1 + left)
    rot = (r - left) % m
    if op == "sum":
        return x - c * (m - 1) * m // 2 if r == 0 else x * 0 + c * r
    if op == "avg":
        return x + c * (r - (m - 1) / 2)
    if op == "max":
        return x - c * rot
    return x + c * rot


def shard(
    global_tensor: Any,
    placements: str | Sequence[Placement],
    mesh_shape: Sequence[int],
    *,
    partial: str = "offsets",
) -> dict[Coord, Any]:
    """Local tensor of every rank of the mesh for ``global_tensor``.

    ``partial`` picks the contributions on Partial mesh dims: ``"offsets"``
    (distinct per rank, module docstring) or ``"first"``.

    >>> import numpy as np
    >>> shard(np.arange(5), "S(0)", (4,))[(2,)].tolist()
    [4]
    """
    if partial not in ("offsets", "first"):
        raise SimulationError(f"partial: expected 'offsets' or 'first', got {partial!r}")
    shape = _mesh_shape(mesh_shape)
    pl = as_placements(placements)
    global_shape = tuple(global_tensor.shape)
    check_placements(pl, len(global_shape), shape)
    be = _Backend(global_tensor)
    out: dict[Coord, Any] = {}
    for coord in mesh_coords(shape):
        local = global_tensor
        for dim, idx in enumerate(local_indices(global_shape, pl, shape, coord)):
            local = be.take(local, dim, idx)
        for mesh_dim, p in enumerate(pl):
            if isinstance(p, Partial):
                local = _partial_value(local, p.reduce_op, mesh_dim, shape[mesh_dim], coord, pl, partial)
        out[coord] = local
    return out


def _combine(
    be: _Backend, parts: list[Any], p: Placement, m: int, check_replicas: bool, where: str
) -> Any:
    if isinstance(p, Replicate):
        if check_replicas:
            for r, part in enumerate(parts[1:], start=1):
                if not be.equal(parts[0], part):
                    raise ReplicaMismatchError(
                        f"{where}: replica {r} differs from replica 0 on a Replicate mesh dim"
                    )
        return parts[0]
    if isinstance(p, Partial):
        shapes = {tuple(t.shape) for t in parts}
        if len(shapes) != 1:
            raise SimulationError(f"{where}: Partial contributions have shapes {sorted(shapes)}")
        return be.reduce(parts, p.reduce_op)
    joined = be.cat(parts, p.dim)
    if isinstance(p, StridedShard):
        extent = joined.shape[p.dim]
        order = [i for r in range(m) for i in strided_positions(extent, m, p.split_factor, r)]
        if len(order) != extent:
            raise SimulationError(f"{where}: strided shards do not add up to {extent} elements")
        inverse = [0] * extent
        for i, position in enumerate(order):
            inverse[position] = i
        joined = be.take(joined, p.dim, inverse)
    return joined


def unshard(
    local_tensors: Mapping[Coord, Any],
    placements: str | Sequence[Placement],
    mesh_shape: Sequence[int],
    *,
    check_replicas: bool = True,
) -> Any:
    """Global tensor from every rank's local tensor: mesh dims are undone right
    to left (concatenate shards, reduce partials with their op, take replica 0).

    With ``check_replicas`` (default), ranks of a Replicate mesh dim must hold
    equal tensors, else :class:`ReplicaMismatchError`.
    """
    shape = _mesh_shape(mesh_shape)
    pl = as_placements(placements)
    if len(pl) != len(shape):
        raise SimulationError(f"placements: {len(pl)} given for a {len(shape)}-D mesh")
    coords = mesh_coords(shape)
    missing = [c for c in coords if c not in local_tensors]
    if missing:
        raise SimulationError(f"local_tensors: no tensor for coordinate {missing[0]}")
    be = _Backend(_first(local_tensors))
    current: dict[Coord, Any] = {c: local_tensors[c] for c in coords}
    for mesh_dim in range(len(shape) - 1, -1, -1):
        merged: dict[Coord, Any] = {}
        for prefix in itertools.product(*(range(m) for m in shape[:mesh_dim])):
            parts = [current[prefix + (r,)] for r in range(shape[mesh_dim])]
            merged[prefix] = _combine(
                be, parts, pl[mesh_dim], shape[mesh_dim], check_replicas, f"mesh dim {mesh_dim} at {prefix}"
            )
        current = merged
    return current[()]


# --------------------------------------------------------------------------- steps


def _groups(shape: tuple[int, ...], mesh_dims: tuple[int, ...]) -> Iterable[list[Coord]]:
    """Members of every group over ``mesh_dims``, each list in flat-index order."""
    others = [d for d in range(len(shape)) if d not in mesh_dims]
    for rest in itertools.product(*(range(shape[d]) for d in others)):
        members = []
        for sub in itertools.product(*(range(shape[d]) for d in mesh_dims)):
            coord = [0] * len(shape)
            for d, c in zip(others, rest):
                coord[d] = c
            for d, c in zip(mesh_dims, sub):
                coord[d] = c
            members.append(tuple(coord))
        yield members


def _chunk(be: _Backend, x: Any, dim: int, parts: int, index: int) -> Any:
    n = x.shape[dim]
    off, size = chunk_offsets(n, parts)[index], chunk_sizes(n, parts)[index]
    return be.take(x, dim, range(off, off + size))


def _check_step(step: RedistributeStep, shape: tuple[int, ...]) -> tuple[int, ...]:
    dims = tuple(step.mesh_dims)
    if not dims or any(not 0 <= d < len(shape) for d in dims) or list(dims) != sorted(set(dims)):
        raise SimulationError(f"step.mesh_dims: {dims} is not an ascending set of mesh dims of {shape}")
    return dims


def apply_step(
    local_tensors: Mapping[Coord, Any], step: RedistributeStep, mesh_shape: Sequence[int]
) -> dict[Coord, Any]:
    """Execute one step literally (semantics in ``costmodel.redistribute_steps``)."""
    shape = _mesh_shape(mesh_shape)
    dims = _check_step(step, shape)
    be = _Backend(_first(local_tensors))
    out = dict(local_tensors)
    kind = step.collective
    for members in _groups(shape, dims):
        g = len(members)
        locals_ = [local_tensors[c] for c in members]
        if kind == "all_gather":
            src = step.src[dims[0]] if step.src else None
            if isinstance(src, StridedShard) and len(dims) == 1:
                joined = _combine(be, locals_, src, g, False, "all_gather")
            else:
                joined = be.cat(locals_, step.tensor_dim)
            for c in members:
                out[c] = joined
        elif kind == "all_reduce":
            value = be.reduce(locals_, step.reduce_op)
            for c in members:
                out[c] = value
        elif kind == "reduce_scatter":
            value = be.reduce(locals_, step.reduce_op)
            for q, c in enumerate(members):
                out[c] = _chunk(be, value, step.tensor_dim, g, q)
        elif kind == "all_to_all":
            for p, c in enumerate(members):
                received = [_chunk(be, x, step.split_tensor_dim, g, p) for x in locals_]
                out[c] = be.cat(received, step.tensor_dim)
        elif kind == "permute":
            if len(dims) != 2 or shape[dims[0]] != shape[dims[1]]:
                raise SimulationError(f"step.mesh_dims: permute needs two mesh dims of equal size, got {dims}")
            for c in members:
                source = list(c)
                source[dims[0]], source[dims[1]] = c[dims[1]], c[dims[0]]
                out[c] = local_tensors[tuple(source)]
        elif kind == "local_slice":
            for q, c in enumerate(members):
                x = local_tensors[c]
                if step.split_factor:
                    positions = strided_positions(x.shape[step.tensor_dim], g, step.split_factor, q)
                    out[c] = be.take(x, step.tensor_dim, positions)
                else:
                    out[c] = _chunk(be, x, step.tensor_dim, g, q)
        elif kind == "local_zero_fill":
            for q, c in enumerate(members):
                out[c] = local_tensors[c] if q == 0 else local_tensors[c] * 0
        elif kind == "local_copy":
            for c in members:
                out[c] = local_tensors[c] + 0
        elif kind == "local_zero_pad":
            d = step.tensor_dim
            sizes = [x.shape[d] for x in locals_]
            for q, c in enumerate(members):
                x = local_tensors[c]
                before = list(x.shape)
                before[d] = sum(sizes[:q])
                after = list(x.shape)
                after[d] = sum(sizes[q + 1 :])
                out[c] = be.cat([be.zeros(x, before), x, be.zeros(x, after)], d)
        else:
            raise SimulationError(f"step.collective: unknown {kind!r}")
    return out


def apply_steps(
    local_tensors: Mapping[Coord, Any],
    steps: RedistributePlan | Sequence[RedistributeStep],
    mesh_shape: Sequence[int],
) -> dict[Coord, Any]:
    """Execute every step of a plan (or a list of steps) in order.

    >>> import numpy as np
    >>> from costmodel.redistribute_steps import RedistributeStep
    >>> x = np.arange(4.0)
    >>> gather = RedistributeStep("all_gather", (0,), 32, 0.0, tensor_dim=0)
    >>> out = apply_steps(shard(x, "S(0)", (2,)), [gather], (2,))
    >>> out[(1,)].tolist()
    [0.0, 1.0, 2.0, 3.0]
    """
    seq = steps.steps if isinstance(steps, RedistributePlan) else steps
    current = dict(local_tensors)
    for step in seq:
        current = apply_step(current, step, mesh_shape)
    return current
