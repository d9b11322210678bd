"""Run one redistribution step (``costmodel.redistribute_steps``) on this rank's local tensor.

The semantics are those of ``costmodel.simulate.apply_step`` (the reference
the cost model and the tests use); here each rank runs its own part, and the
collective goes through a :class:`Comm` on the process group of the step's
mesh dims (one flattened group where the step names several).

Process-group collectives want equal sizes on every member (gloo's
reduce_scatter, ``all_gather_single``), while placements follow
``torch.chunk`` (uneven shards: ceil-sized chunks, trailing ones smaller or
empty). Every member's local shape is known from the global shape and the
step's source placements (``costmodel.shard_shapes.local_shape``), so buffers are
padded with zeros to the largest member's extent before the collective and
trimmed after it; with even shards nothing is padded and the bytes issued are
the bytes the cost model priced.

Members of a group over ``mesh_dims`` are numbered lexicographically by their
coordinates on those dims (ascending), as DeviceMesh flattens them.

Issue now, finish later: :func:`step_phases` is a step as a generator that
yields once, right after issuing its collective (the buffer prepared, the
result pending), and is resumed with the waited result to finish the step
(trim, reorder); a local step yields nothing. :func:`run_step` drives it at
once; the runtime resumes it where the plan's schedule waits
(:class:`PendingStep`). A gradient or gather bucket is not a generator: its
phases are the step program's own actions (``autoshard.program.actions``),
``Pack`` (:func:`pack_bucket`, :func:`pack_gather`: the flat buffer), ``Issue``
(:func:`issue_bucket`: its one collective), ``Wait`` (:func:`wait_collective`)
and ``Unpack`` (:func:`unpack_bucket`, :func:`unpack_gather`: each member's
value); :func:`run_bucket` and :func:`run_gather` run the four at once. A
:class:`Comm` may return results already complete (then it has no ``wait``) or
pending until ``comm.wait(result)``.

>>> # y = run_step(x, step, global_shape, mesh_shape, coord, comm)
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Generator, Protocol, Sequence

import torch

from costmodel.shard_shapes import chunk_offsets, chunk_sizes, local_shape, strided_positions
from costmodel.placements import Placement, StridedShard
from costmodel.redistribute_steps import COLLECTIVE_STEPS, LOCAL_STEPS, RedistributeStep

__all__ = ["Comm", "StepRuntimeError", "PendingStep", "member_index", "member_coords", "step_phases", "run_step",
           "run_bucket", "run_gather", "PackedBucket", "pack_bucket", "issue_bucket", "wait_collective",
           "unpack_bucket", "pack_gather", "unpack_gather", "check_step_runnable"]


class StepRuntimeError(ValueError):
    """A step the runtime cannot run (names the step)."""


class Comm(Protocol):
    """Collectives on the group of ``mesh_dims`` (dim 0 of equal-sized buffers).

    ``all_gather``: members' ``x`` concatenated along dim 0 in member order.
    ``all_reduce``: the ``op`` reduction of every member's ``x``.
    ``reduce_scatter``: member q gets chunk q (of G equal ones, dim 0) of the reduction.
    ``all_to_all``: ``x`` is ``[G, ...]``; member q gets ``out[p] = x_p[q]``.
    ``permute``: ``src_dst[p] = r``: member p's ``x`` goes to member r.

    A comm whose results are pending also has ``wait(result) -> tensor``
    (``MeshComm``); the all_to_all and permute results may come back flat.
    A comm may also have ``all_reduce_owned`` (same arguments as ``all_reduce``):
    the buffer is the caller's own, read only through the result, so the comm
    may reduce it in place (``MeshComm`` does; a gradient bucket uses it).
    """

    def all_gather(self, x: torch.Tensor, mesh_dims: tuple[int, ...], nbytes: int) -> torch.Tensor: ...

    def all_reduce(self, x: torch.Tensor, op: str, mesh_dims: tuple[int, ...], nbytes: int) -> torch.Tensor: ...

    def reduce_scatter(self, x: torch.Tensor, op: str, mesh_dims: tuple[int, ...], nbytes: int) -> torch.Tensor: ...

    def all_to_all(self, x: torch.Tensor, mesh_dims: tuple[int, ...], nbytes: int) -> torch.Tensor: ...

    def permute(self, x: torch.Tensor, src_dst: list[int], mesh_dims: tuple[int, ...], nbytes: int) -> torch.Tensor: ...


def member_index(coord: Sequence[int], mesh_shape: Sequence[int], mesh_dims: Sequence[int]) -> int:
    """Flat index of ``coord`` in its group over ``mesh_dims`` (lexicographic).

    >>> member_index((1, 0), (2, 2), (0, 1)), member_index((1, 0), (2, 2), (1,))
    (2, 0)
    """
    q = 0
    for d in mesh_dims:
        q = q * mesh_shape[d] + coord[d]
    return q


def member_coords(coord: Sequence[int], mesh_shape: Sequence[int], mesh_dims: Sequence[int]) -> list[tuple[int, ...]]:
    """Mesh coordinates of every member of ``coord``'s group over ``mesh_dims``, in member order."""
    out = []
    for sub in itertools.product(*(range(mesh_shape[d]) for d in mesh_dims)):
        c = list(coord)
        for d, v in zip(mesh_dims, sub):
            c[d] = v
        out.append(tuple(c))
    return out


def dense(x: torch.Tensor) -> torch.Tensor:
    """``x.contiguous()``, the same tensor or copy: written as a clone because ``contiguous()`` of a
    non-contiguous CUDA fake tensor on a CPU-only torch asks for a CUDA device guard and fails,
    where the clone it stands for does not (the CUDA-fake runtime checks run that way)."""
    return x if x.is_contiguous() else x.clone(memory_format=torch.contiguous_format)


def _take(x: torch.Tensor, dim: int, index: Sequence[int]) -> torch.Tensor:
    """``x.index_select(dim, index)`` as a cat of the runs of consecutive indices (a strided shard's
    positions are a few runs): no index tensor built from a Python list, which would be a host to
    device copy every step on a GPU.

    >>> _take(torch.arange(6), 0, [3, 4, 0, 1, 5]).tolist()
    [3, 4, 0, 1, 5]
    """
    runs: list[tuple[int, int]] = []  # (first index, length)
    for i in index:
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    if not runs:
        return x.narrow(dim, 0, 0).clone()
    return torch.cat([x.narrow(dim, start, length) for start, length in runs], dim=dim)


def _pad_dim(x: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """``x`` with zeros appended along ``dim`` up to ``size``."""
    extra = size - x.shape[dim]
    if extra <= 0:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    return torch.cat([x, x.new_zeros(shape)], dim=dim)


def _pad_to(x: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """``x`` zero-padded at the end of every dim up to ``shape``."""
    if tuple(x.shape) == tuple(shape):
        return x
    for d, size in enumerate(shape):  # cats, not a copy into a strided view (CUDA fake tensors: dense)
        x = _pad_dim(x, d, size)
    return x


def _trim(x: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    if tuple(x.shape) == tuple(shape):
        return x
    for d, size in enumerate(shape):
        x = x.narrow(d, 0, size)
    return x


def _nbytes(x: torch.Tensor) -> int:
    return x.numel() * x.element_size()


def _gather_buffer(x: torch.Tensor, step: RedistributeStep, member_shapes: Sequence[tuple[int, ...]]
                   ) -> tuple[torch.Tensor, list[int], int]:
    """An all_gather's send buffer: the gathered tensor dim moved to the front,
    padded to the largest member's extent ``c``; and every member's extent."""
    d = step.tensor_dim
    extents = [sh[d] for sh in member_shapes]
    c = max(extents)
    return dense(_pad_dim(x, d, c).movedim(d, 0)), extents, c


def _gather_finish(gathered: torch.Tensor, step: RedistributeStep, extents: Sequence[int], c: int,
                   group: int) -> torch.Tensor:
    """The gathered tensor from an all_gather's result (``[G * c, ...]``): padding
    trimmed, the tensor dim moved back, a strided shard put in natural order."""
    d, dims, src = step.tensor_dim, tuple(step.mesh_dims), tuple(step.src)
    if c * group != sum(extents):
        gathered = torch.cat([gathered.narrow(0, p * c, e) for p, e in enumerate(extents)], dim=0)
    out = gathered.movedim(0, d)
    placement = src[dims[0]] if src else None
    if isinstance(placement, StridedShard) and len(dims) == 1:
        extent = out.shape[d]
        order = [i for r in range(group) for i in strided_positions(extent, group, placement.split_factor, r)]
        inverse = [0] * extent
        for i, position in enumerate(order):
            inverse[position] = i
        out = _take(out, d, inverse)
    # Left strided where the gathered dim is not the first (a linear layer's weight gathered as its
    # transposed view t(w): the result is t(gathered w)): its readers take strides as they come
    # (matmuls read a transposed operand as it is; views of it become reshapes), and a contiguous
    # copy would be one more copy of every gathered weight, at every gather, that FSDP2 does not make.
    return out


def check_step_runnable(step: RedistributeStep, mesh_shape: Sequence[int]) -> None:
    """Raise :class:`StepRuntimeError` for a step this module cannot run."""
    dims = tuple(step.mesh_dims)
    if not dims or list(dims) != sorted(set(dims)) or any(not 0 <= d < len(mesh_shape) for d in dims):
        raise StepRuntimeError(f"{step.describe()}: mesh_dims {dims} are not ascending dims of mesh {tuple(mesh_shape)}")
    if step.collective not in COLLECTIVE_STEPS + LOCAL_STEPS:
        raise StepRuntimeError(f"{step.describe()}: unknown step kind")
    need = {"all_gather": ("tensor_dim",), "reduce_scatter": ("tensor_dim", "reduce_op"), "all_reduce": ("reduce_op",),
            "all_to_all": ("tensor_dim", "split_tensor_dim"), "local_slice": ("tensor_dim",),
            "local_zero_pad": ("tensor_dim",)}.get(step.collective, ())
    for key in need:
        if getattr(step, key) is None:
            raise StepRuntimeError(f"{step.describe()}: missing {key}")
    if step.collective == "permute" and (len(dims) != 2 or mesh_shape[dims[0]] != mesh_shape[dims[1]]):
        raise StepRuntimeError(f"{step.describe()}: permute needs two mesh dims of equal size")
    if step.collective == "all_gather" and step.src and len(dims) > 1 and any(
            isinstance(step.src[d], StridedShard) for d in dims):
        raise StepRuntimeError(f"{step.describe()}: a fused all_gather of strided shards is not supported")
    if not step.src and step.collective in ("all_gather", "all_to_all", "permute", "local_zero_pad"):
        raise StepRuntimeError(f"{step.describe()}: the step has no source placements")


Phases = Generator[torch.Tensor, torch.Tensor, Any]
"""Yields the pending result of the collective it issued; resumed with the
waited result; returns the finished value (module docstring)."""


def wait_collective(pending: torch.Tensor, comm: Any) -> torch.Tensor:
    """The result of a collective ``comm`` issued (``pending``), waited: a comm without ``wait``
    returns complete results.

    >>> wait_collective(torch.ones(2), object()).tolist()
    [1.0, 1.0]
    """
    wait = getattr(comm, "wait", None)
    return wait(pending) if wait is not None else pending


def _finish(gen: Phases, comm: Any, pending: torch.Tensor) -> Any:
    try:
        gen.send(wait_collective(pending, comm))
    except StopIteration as done:
        return done.value
    raise StepRuntimeError("a step issued two collectives")  # pragma: no cover - every step yields once


def _drive(gen: Phases, comm: Any) -> Any:
    try:
        pending = next(gen)
    except StopIteration as done:  # a local step: nothing issued
        return done.value
    return _finish(gen, comm, pending)


class PendingStep:
    """A step whose collective is issued and not yet waited: :meth:`finish` waits and finishes it."""

    __slots__ = ("_gen", "_comm", "_pending", "_value", "_done")

    def __init__(self, gen: Phases, comm: Any) -> None:
        self._gen, self._comm = gen, comm
        try:
            self._pending, self._done = next(gen), False
        except StopIteration as done:
            self._value, self._done = done.value, True

    def finish(self) -> Any:
        """The finished value (waits for the collective)."""
        if not self._done:
            self._value, self._done = _finish(self._gen, self._comm, self._pending), True
            self._gen = self._pending = None
        return self._value


def run_step(
    x: torch.Tensor,
    step: RedistributeStep,
    global_shape: Sequence[int],
    mesh_shape: Sequence[int],
    coord: Sequence[int],
    comm: Comm | None,
) -> torch.Tensor:
    """This rank's local tensor after ``step`` (module docstring), its collective waited at once.

    ``global_shape`` is the shape of the whole tensor; the step's ``src``
    placements give every member's local shape.
    """
    return _drive(step_phases(x, step, global_shape, mesh_shape, coord, comm), comm)


def step_phases(
    x: torch.Tensor,
    step: RedistributeStep,
    global_shape: Sequence[int],
    mesh_shape: Sequence[int],
    coord: Sequence[int],
    comm: Comm | None,
) -> Phases:
    """:func:`run_step` as a generator that yields after issuing its collective (module docstring)."""
    dims = tuple(step.mesh_dims)
    kind = step.collective
    group = math.prod(mesh_shape[d] for d in dims)
    q = member_index(coord, mesh_shape, dims)
    src: tuple[Placement, ...] = tuple(step.src)

    def shapes() -> list[tuple[int, ...]]:
        return [local_shape(tuple(global_shape), src, tuple(mesh_shape), c) for c in member_coords(coord, mesh_shape, dims)]

    if kind in COLLECTIVE_STEPS and comm is None:
        raise StepRuntimeError(f"{step.describe()}: no process group to run a collective on")

    if kind == "all_gather":
        buf, extents, c = _gather_buffer(x, step, shapes())
        gathered = yield comm.all_gather(buf, dims, _nbytes(buf) * group)
        return _gather_finish(gathered, step, extents, c, group)

    if kind == "all_reduce":
        buf = dense(x)
        return (yield comm.all_reduce(buf, step.reduce_op, dims, _nbytes(buf)))

    if kind == "reduce_scatter":
        d = step.tensor_dim
        n = x.shape[d]
        c = -(-n // group) if n else 0
        buf = dense(_pad_dim(x, d, c * group).movedim(d, 0))
        if c == 0:  # nothing to scatter: every member keeps an empty chunk
            return dense(x.narrow(d, 0, 0))
        piece = yield comm.reduce_scatter(buf, step.reduce_op, dims, _nbytes(buf))
        size = chunk_sizes(n, group)[q]
        return dense(piece.narrow(0, 0, size).movedim(0, d))

    if kind == "all_to_all":
        s, d = step.split_tensor_dim, step.tensor_dim
        member_shapes = shapes()

        def piece_shape(shape: tuple[int, ...], receiver: int) -> tuple[int, ...]:
            out = list(shape)
            out[s] = chunk_sizes(shape[s], group)[receiver]
            return tuple(out)

        block = [max(piece_shape(sh, r)[k] for sh in member_shapes for r in range(group)) for k in range(x.ndim)]
        n = x.shape[s]
        sizes, offsets = chunk_sizes(n, group), chunk_offsets(n, group)
        send = torch.stack([_pad_to(x.narrow(s, offsets[p], sizes[p]), block) for p in range(group)])
        received = (yield comm.all_to_all(send, dims, _nbytes(send))).view(send.shape)
        parts = [_trim(received[p], piece_shape(member_shapes[p], q)) for p in range(group)]
        return torch.cat(parts, dim=d)

    if kind == "permute":
        a, b = dims
        m = mesh_shape[a]
        member_shapes = shapes()
        biggest = [max(sh[k] for sh in member_shapes) for k in range(x.ndim)]
        # member (i, j) -> index i*m + j; its local goes to the rank at (j, i)
        src_dst = [(p % m) * m + p // m for p in range(group)]
        sender = src_dst[q]  # the swap is its own inverse
        buf = dense(_pad_to(x, biggest))
        received = yield comm.permute(buf, src_dst, dims, _nbytes(buf))
        return dense(_trim(received.view(biggest), member_shapes[sender]))

    if kind == "local_slice":
        d = step.tensor_dim
        n = x.shape[d]
        if step.split_factor:
            positions = strided_positions(n, group, step.split_factor, q)
            return _take(x, d, positions)
        return dense(x.narrow(d, chunk_offsets(n, group)[q], chunk_sizes(n, group)[q]))

    if kind == "local_zero_fill":
        return x.clone() if q == 0 else torch.zeros_like(x)

    if kind == "local_copy":
        return x.clone()

    if kind == "local_zero_pad":
        d = step.tensor_dim
        extents = [sh[d] for sh in shapes()]
        before, after = list(x.shape), list(x.shape)
        before[d], after[d] = sum(extents[:q]), sum(extents[q + 1:])
        # one cat rather than a copy into a strided view of zeros: the same values, and a CUDA fake
        # tensor on a CPU-only torch cannot copy into a strided view (the CUDA checks run that way)
        return torch.cat([x.new_zeros(before), x, x.new_zeros(after)], dim=d)

    raise StepRuntimeError(f"{step.describe()}: unknown step kind {kind!r}")


def run_bucket(
    xs: Sequence[torch.Tensor],
    steps: Sequence[RedistributeStep],
    mesh_shape: Sequence[int],
    coord: Sequence[int],
    comm: Comm,
) -> list[torch.Tensor]:
    """Several gradients' one-step reductions (``costmodel.buckets.grouping``) as ONE
    collective on a flat buffer, waited at once; returns what :func:`run_step` returns for
    each: :func:`pack_bucket`, :func:`issue_bucket`, :func:`wait_collective`, :func:`unpack_bucket`.
    """
    packed = pack_bucket(xs, steps, mesh_shape, coord)
    return unpack_bucket(packed, wait_collective(issue_bucket(packed, comm), comm), mesh_shape, coord)


@dataclass(frozen=True, slots=True)
class PackedBucket:
    """A bucket's flat buffer and what unpacking it needs (:func:`pack_bucket`, :func:`pack_gather`)."""

    kind: str  # "all_reduce", "reduce_scatter" or "all_gather"
    dims: tuple[int, ...]
    op: str | None
    group: int
    buffer: torch.Tensor
    layouts: tuple[Any, ...]  # per member: its shape (all_reduce), (d, n, c, rest) or (buf, extents, c)


def pack_bucket(xs: Sequence[torch.Tensor], steps: Sequence[RedistributeStep], mesh_shape: Sequence[int],
                coord: Sequence[int]) -> PackedBucket:
    """A gradient bucket's flat buffer.

    all_reduce: the members flattened and concatenated. reduce_scatter: each
    member padded on its scattered dim as :func:`run_step` pads it, that dim
    moved to the front and viewed as ``[G, chunk]`` rows, the members
    concatenated along the rows, so that member q's row of the reduced buffer
    holds its chunk of every member.
    """
    first = steps[0]
    dims, kind, op = tuple(first.mesh_dims), first.collective, first.reduce_op
    for st in steps:
        if (st.collective, tuple(st.mesh_dims), st.reduce_op) != (kind, dims, op):
            raise StepRuntimeError(f"bucket: {st.describe()} differs from {first.describe()}")
    group = math.prod(mesh_shape[d] for d in dims)
    if kind == "all_reduce":
        flat = torch.cat([x.reshape(-1) for x in xs])  # DDP's one copy into its bucket
        return PackedBucket(kind, dims, op, group, flat, tuple(tuple(x.shape) for x in xs))
    if kind != "reduce_scatter":
        raise StepRuntimeError(f"bucket: {kind} steps are not bucketed")
    rows, layouts = [], []
    for x, st in zip(xs, steps):
        d = st.tensor_dim
        n = x.shape[d]
        c = -(-n // group) if n else 0
        moved = dense(_pad_dim(x, d, c * group).movedim(d, 0))
        layouts.append((d, n, c, tuple(moved.shape[1:])))
        rows.append(moved.reshape(group, -1) if c else moved.new_zeros(group, 0))
    return PackedBucket(kind, dims, op, group, torch.cat(rows, dim=1), tuple(layouts))


def issue_bucket(packed: PackedBucket, comm: Comm) -> torch.Tensor:
    """The packed buffer's one collective, issued (its pending result)."""
    buf = packed.buffer
    if packed.kind == "all_reduce":
        reduce = getattr(comm, "all_reduce_owned", comm.all_reduce)  # buf is ours: in place where the comm can
        return reduce(buf, packed.op, packed.dims, _nbytes(buf))
    if packed.kind == "reduce_scatter":
        return comm.reduce_scatter(buf, packed.op, packed.dims, _nbytes(buf))
    return comm.all_gather(buf, packed.dims, _nbytes(buf) * packed.group)


def unpack_bucket(packed: PackedBucket, reduced: torch.Tensor, mesh_shape: Sequence[int],
                  coord: Sequence[int]) -> list[torch.Tensor]:
    """Each member's result from its gradient bucket's waited collective."""
    out, offset = [], 0
    if packed.kind == "all_reduce":
        for shape in packed.layouts:
            numel = math.prod(shape)
            out.append(reduced.narrow(0, offset, numel).view(shape))
            offset += numel
        return out
    piece = reduced.reshape(-1)
    q = member_index(coord, mesh_shape, packed.dims)
    for d, n, c, rest in packed.layouts:
        numel = c * math.prod(rest)
        chunk = piece.narrow(0, offset, numel).view(c, *rest)
        offset += numel
        size = chunk_sizes(n, packed.group)[q] if n else 0
        out.append(dense(chunk.narrow(0, 0, size).movedim(0, d)))
    return out


def run_gather(
    xs: Sequence[torch.Tensor],
    steps: Sequence[RedistributeStep],
    global_shapes: Sequence[Sequence[int]],
    mesh_shape: Sequence[int],
    coord: Sequence[int],
    comm: Comm,
) -> list[torch.Tensor]:
    """Several leaves' one-step all_gathers (``costmodel.buckets.grouping`` gather
    buckets) as ONE all_gather on a flat buffer, waited at once; returns what
    :func:`run_step` returns for each: :func:`pack_gather`, :func:`issue_bucket`,
    :func:`wait_collective`, :func:`unpack_gather`.
    """
    packed = pack_gather(xs, steps, global_shapes, mesh_shape, coord)
    return unpack_gather(packed, wait_collective(issue_bucket(packed, comm), comm), steps)


def pack_gather(xs: Sequence[torch.Tensor], steps: Sequence[RedistributeStep],
                global_shapes: Sequence[Sequence[int]], mesh_shape: Sequence[int],
                coord: Sequence[int]) -> PackedBucket:
    """A gather bucket's flat buffer: each member's buffer is what its own step
    would send (``[c_m, ...]``), flattened; the buffers are concatenated.
    """
    first = steps[0]
    dims = tuple(first.mesh_dims)
    for st in steps:
        if st.collective != "all_gather" or tuple(st.mesh_dims) != dims:
            raise StepRuntimeError(f"gather bucket: {st.describe()} is not an all_gather over {list(dims)}")
    group = math.prod(mesh_shape[d] for d in dims)
    prepared = []
    for x, st, shape in zip(xs, steps, global_shapes):
        shapes = [local_shape(tuple(shape), tuple(st.src), tuple(mesh_shape), c)
                  for c in member_coords(coord, mesh_shape, dims)]
        prepared.append(_gather_buffer(x, st, shapes))
    flat = torch.cat([buf.reshape(-1) for buf, _, _ in prepared])
    return PackedBucket("all_gather", dims, None, group, flat, tuple(prepared))


def unpack_gather(packed: PackedBucket, gathered: torch.Tensor,
                  steps: Sequence[RedistributeStep]) -> list[torch.Tensor]:
    """Each member's all_gather result from the waited flat one: the result holds
    every member's concatenation in member order, ``[G, sum]``; member m's
    columns, viewed as ``[G * c_m, ...]``, are what its own all_gather returns.
    """
    group = packed.group
    rows = gathered.view(group, -1)
    out, offset = [], 0
    for (buf, extents, c), st in zip(packed.layouts, steps):
        n = buf.numel()
        piece = rows.narrow(1, offset, n).reshape(group * c, *buf.shape[1:])
        offset += n
        out.append(_gather_finish(piece, st, extents, c, group))
    return out
