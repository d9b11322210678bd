r"""Gradient buckets: many gradient reductions issued as one collective.

Data parallelism makes every gradient leave the backward pass partial
(``P(sum)``) and need one reduction to its parameter's placement: an
all_reduce to ``R`` (DDP) or a reduce_scatter to ``S(d)`` (FSDP). Issued one
per gradient, a model with ``g`` gradients pays ``g`` call latencies; DDP and
FSDP put many gradients in one flat buffer and pay one. autoshard's runtime
does the same, and this module is where the two agree on it.

**Which redistributions join a bucket.** A gradient edge (op -> ``grad:<fqn>``
sink) whose redistribution is one ``all_reduce`` (possibly followed by local
slices: ``P -> S`` as all-reduce-then-slice, which the planner picks where a
reduce_scatter is dearer, as on gloo), or one ``reduce_scatter`` whose
destination is a plain shard (no strided shard).
Members of one bucket share the step's kind, mesh dims, reduce op and the
gradient's dtype (the flat buffer has one dtype).

**Buckets at run time.** Members in the order of the plan's gradient edges,
a new bucket whenever adding one would exceed the cap ``B`` (25 MiB by
default, DDP's figure) — a gradient larger than ``B`` is a bucket of its own.
A bucket issues one collective on its members' concatenated payload; its cost
is that collective's time at the summed bytes.

**The first bucket.** DDP caps its first bucket lower (``dist._DEFAULT_FIRST_BUCKET_BYTES``,
1 MiB) than the rest: the first gradients the backward makes then leave at once and their
reduction runs under the rest of the backward, where one large bucket would wait for the
last gradient. ``first_cap`` ``F`` does the same per reduction kind: that kind's buckets
close at ``F`` until the first one closes, at ``B`` after (a first gradient larger than
``F`` goes alone, issued as soon as it is made).

**Pricing in the solver.** A bucket's cost is not a sum over edges (the
latency ``L`` is paid once per bucket), but the solver prices edges
independently. The gradient edge is therefore priced with its latency
amortised over the bucket it would share:

    cost(e) = cost_alone(e) - (1 - share(e)) * L(e),
    share(e) = min(1, bytes(e) / min(B, total))

where ``bytes(e)`` is the unsharded gradient and ``total`` the sum over all
gradients of the model: when every gradient takes the same reduction, the
shares sum to the number of buckets, so the summed latency is what the
runtime pays. When gradients split over several kinds of reduction, the
shares under-count latency (each kind forms its own buckets); the plan's
estimate is then recomputed from the real buckets (:func:`group_buckets`),
so the plan reports what will run even where the solver's objective was an
approximation.

**The window of a gradient's bucket.** The memory model (``autoshard.graph.tied_memory``)
holds a gradient until its bucket's last member is made, before it knows the buckets; it
needs, for gradient ``j`` of a sequence with bytes ``s_0 .. s_{n-1}``, a range of positions
that contains every bucket :func:`group_buckets` can form with ``j`` in it.
:func:`bucket_window` gives ``[a_j, b_j]``, the widest range on each side of ``j`` alone:

    a_j = min { a <= j : s_a + ... + s_j <= B },   b_j = max { b >= j : s_j + ... + s_b <= B }

(``[j, j]`` where ``s_j > B`` or ``B <= 0``). Why it contains every bucket: a bucket of the
rule above is a run ``[a, b]`` of consecutive gradients and, having two members or more,
its bytes sum to at most ``B`` (a member joins only while the sum stays within ``B``; one
alone may pass it, and a bucket of one is left out). With ``a <= j <= b`` and bytes not
negative, ``s_a + ... + s_j <= B`` and ``s_j + ... + s_b <= B``, so ``a_j <= a`` and
``b <= b_j``. The window may be wider than any one bucket (each side is bounded alone,
not knowing where the rule starts ``j``'s bucket). With a first cap ``F`` the same holds
with ``max(B, F)`` for ``B``: a bucket of two or more sums to at most its own limit, ``F``
or ``B``. The containment holds for the
sequence the buckets form over: one reduction kind and the bytes its steps carry, or
bytes no larger than those (a smaller ``s`` only widens the window). Outside that, a
real bucket can reach past the window: one of one kind skips gradients of another, and
the strategy graph gives each gradient's unsharded bytes, of which a step on a mesh
that also shards the gradient carries a part. The plan's timeline counts the real
buckets (``autoshard.graph.copies``).

**The copies a bucket adds.** One flat buffer means copies a member's own
step does not make, on the compute stream (the rank's thread), each priced as
a local copy of bytes no cache holds (``costmodel.compute.cold_copy_time_s``:
read + write at the memory curve's rate beyond the caches, the new buffer's
fresh pages, a launch; timed inside a step they ran 2-7x the rate of the same
copy repeated warm) plus the step's per-op cost
(``device.step_op_s``): a gradient bucket packs its members into the buffer
before the issue (``pack_s``: ``torch.cat``, its bytes; a reduce_scatter
member on a dim other than 0 is moved to the front first, one more copy of
its bytes) and, for a reduce_scatter, moves such members' chunks back after the
wait (``unpack_s``: ``bytes / G`` each); an all_reduce's results are views. A
gather bucket packs the shards (``bytes / G``) and, after the wait, copies each
member's columns out of the ``[G, sum]`` result (``unpack_s``: each member's
gathered bytes; a strided slice cannot be viewed as the member). Measured
(``benchmarks/profile_step.py``, MLP on 4 gloo ranks): these copies are a
third of an FSDP layout's step and the DDP layout's one ``cat`` 8 % of its.

**FSDP2's reductions** (``units``): FSDP2 reduce-scatters a wrapped block's
gradients together once the block's backward is done, and the root's at the
end of the backward, whatever their size; with a ``reduce_dtype`` (FSDP2's
``MixedPrecisionPolicy.reduce_dtype``: torchtitan reduces bf16 gradients in
fp32) the block's gradients are cast into a flat buffer of that dtype, so the
payload and the collective carry ``bytes x itemsize(reduce) / itemsize(grad)``.
:func:`group_buckets` with ``units`` (gradient -> its block) makes one bucket
per block and reduction kind, its members in the order they are made, issued
with the last; used to price a plan as FSDP2 runs it (``gather="fsdp2"``).

**Gather buckets** (FSDP2's per-layer all-gather): a parameter (leaf) whose
redistribution to a reader is exactly one ``all_gather`` of plain shards is
gathered again at every step; such gathers on the same mesh dims and dtype,
taken in the order their readers run (the schedule's prefetch order), are
issued as ONE all_gather of their shards concatenated (each member's shard
moved and padded as its own step would, then flattened), a new bucket
whenever ``cap`` bytes of gathered output would be passed. Unlike a gradient bucket, a gather bucket holds
every member's gathered tensor from its issue until that member's reader:
the plan's memory counts it (``autoshard.program.schedule.prefetch_intervals``)
and the assembler picks the cap (:data:`GATHER_CAPS`) whose simulated step is
best within the memory limit.

>>> bucket_share(4 * 2**20, 16 * 2**20)   # one of four equal gradients: a quarter of the latency
0.25
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from costmodel.collectives import collective_time_s
from costmodel.compute import cold_copy_time_s
from costmodel.mesh import MeshSpec
from costmodel.placements import StridedShard
from costmodel.redistribute_steps import RedistributePlan, RedistributeStep
from hw_profiles import HardwareProfile

__all__ = ["DEFAULT_BUCKET_BYTES", "GATHER_CAPS", "Bucket", "GatherBucket", "bucket_share", "bucketable_step",
           "gatherable_step", "amortized_cost_s", "group_buckets", "bucket_window", "group_gathers",
           "bucket_copy_bytes", "gather_copy_bytes", "dtype_itemsize"]

DEFAULT_BUCKET_BYTES = 25 * 2**20
"""DDP's default bucket cap."""

GATHER_CAPS = (0, 2**20, 4 * 2**20, 16 * 2**20)
"""Gather bucket caps (bytes of gathered output) the assembler tries; 0: none."""


def bucketable_step(steps: Sequence[RedistributeStep]) -> RedistributeStep | None:
    """The collective of a gradient redistribution that may join a bucket, or None:
    a single ``all_reduce``, an ``all_reduce`` followed only by local slices
    (``P -> S`` where the planner found all-reduce-then-slice cheaper than a
    reduce_scatter, as on gloo; each member slices after the bucket), or a single
    ``reduce_scatter`` to a plain shard."""
    if not steps:
        return None
    step = steps[0]
    if step.collective == "all_reduce" and step.reduce_op is not None and all(
            s.collective == "local_slice" for s in steps[1:]):
        return step
    if (len(steps) == 1 and step.collective == "reduce_scatter" and step.reduce_op is not None
            and step.tensor_dim is not None and not any(isinstance(p, StridedShard) for p in step.dst)):
        return step
    return None


def bucket_share(grad_bytes: float, total_grad_bytes: float, cap: float = DEFAULT_BUCKET_BYTES) -> float:
    """Share of one call latency a gradient of ``grad_bytes`` pays in a bucket
    (module docstring); 1 when bucketing is off (``cap <= 0``)."""
    if cap <= 0 or grad_bytes <= 0:
        return 1.0
    fill = min(float(cap), float(total_grad_bytes))
    return min(1.0, float(grad_bytes) / fill) if fill > 0 else 1.0


def amortized_cost_s(plan: RedistributePlan, share: float, mesh: MeshSpec, profile: HardwareProfile) -> float:
    """``plan.cost_s`` with the call latency of its bucketable step scaled by ``share``."""
    step = bucketable_step(plan.steps)
    if step is None or share >= 1.0:
        return plan.cost_s
    latency = collective_time_s(step.collective, 0, step.mesh_dims, mesh, profile)
    return max(0.0, plan.cost_s - (1.0 - share) * latency)


@dataclass(frozen=True, slots=True)
class Bucket:
    """Gradient reductions issued as one collective (module docstring)."""

    collective: str
    """``all_reduce`` or ``reduce_scatter``."""
    mesh_dims: tuple[int, ...]
    reduce_op: str
    dtype: str
    """The gradients' dtype (``torch.float32``): the flat buffer has one."""
    members: tuple[str, ...]
    """The gradient sinks (``grad:<fqn>``), in the order of the buffer."""
    bytes: int
    """Per-rank payload: the members' step bytes summed."""
    cost_s: float
    """The one collective's time at ``bytes``."""
    pack_s: float = 0.0
    """Copies into the flat buffer before the issue, on the compute stream (module docstring)."""
    unpack_s: float = 0.0
    """Copies out of the reduced buffer after the wait, on the compute stream."""

    def to_dict(self) -> dict[str, Any]:
        return {"collective": self.collective, "mesh_dims": list(self.mesh_dims), "reduce_op": self.reduce_op,
                "dtype": self.dtype, "members": list(self.members), "bytes": self.bytes, "cost_s": self.cost_s,
                "pack_s": self.pack_s, "unpack_s": self.unpack_s}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Bucket":
        try:
            return cls(str(data["collective"]), tuple(int(d) for d in data["mesh_dims"]), str(data["reduce_op"]),
                       str(data["dtype"]), tuple(str(m) for m in data["members"]), int(data["bytes"]),
                       float(data.get("cost_s", 0.0)), float(data.get("pack_s", 0.0)),
                       float(data.get("unpack_s", 0.0)))
        except KeyError as exc:
            raise ValueError(f"bucket: missing field {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bucket: bad field ({exc})") from None


def group_buckets(
    items: Sequence[tuple[str, str, Sequence[RedistributeStep]]],
    mesh: MeshSpec,
    profile: HardwareProfile,
    cap: int = DEFAULT_BUCKET_BYTES,
    *,
    first_cap: int | None = None,
    units: Mapping[str, str] | None = None,
    reduce_dtype: str | None = None,
) -> tuple[Bucket, ...]:
    """Buckets of gradient redistributions ``(sink name, dtype, steps)``, in order.

    Items that cannot join a bucket (module docstring) are left out, as are
    buckets of one member (nothing to fuse). ``cap <= 0`` turns bucketing off.
    ``first_cap`` (module docstring: the first bucket) caps the first bucket of
    each reduction kind instead of ``cap``; None: ``cap``.
    ``units`` (sink -> FSDP2 unit) groups by unit instead of by ``cap``, one
    member included, and ``reduce_dtype`` casts the payload (module docstring:
    FSDP2's reductions).

    >>> from costmodel.placements import parse_placements as pp
    >>> from hw_profiles import load
    >>> st = RedistributeStep("all_reduce", (0,), 4096, 1e-3, pp("P(sum)"), pp("R"), reduce_op="sum")
    >>> items = [(f"grad:{n}", "f32", [st]) for n in "abc"]
    >>> [b.members for b in group_buckets(items, MeshSpec((2,)), load("cpu-gloo"))]
    [('grad:a', 'grad:b', 'grad:c')]
    >>> [b.members for b in group_buckets(items, MeshSpec((2,)), load("cpu-gloo"), first_cap=4096)]  # a alone, early
    [('grad:b', 'grad:c')]
    """
    if cap <= 0 and units is None:
        return ()
    open_: dict[tuple, list[tuple[str, int, bool]]] = {}
    closed: list[tuple[tuple, list[tuple[str, int, bool]]]] = []
    past_first: set[tuple] = set()  # kinds whose first bucket is closed: ``cap`` from then on
    for name, dtype, steps in items:
        step = bucketable_step(steps)
        if step is None:
            continue
        key = (step.collective, tuple(step.mesh_dims), step.reduce_op, dtype,
               None if units is None else units.get(name, ""))
        members = open_.setdefault(key, [])
        limit = cap if first_cap is None or key in past_first else first_cap
        if units is None and members and sum(b for _, b, _ in members) + step.bytes > limit:
            closed.append((key, members))
            past_first.add(key)
            members = open_[key] = []
        # a reduce_scatter member scattered on a dim other than 0 is moved to the front (runtime.steps)
        members.append((name, int(step.bytes), step.collective == "reduce_scatter" and bool(step.tensor_dim)))
    closed.extend(open_.items())
    buckets = []
    for (kind, dims, op, dtype, _), members in closed:
        if len(members) < (1 if units is not None else 2):
            continue
        ratio = 1.0
        if reduce_dtype is not None and reduce_dtype != dtype:
            ratio = dtype_itemsize(reduce_dtype) / dtype_itemsize(dtype)
            dtype = reduce_dtype
        sizes = [(round(b * ratio), m) for _, b, m in members]
        nbytes = sum(b for b, _ in sizes)
        pack, unpack = bucket_copy_bytes(kind, sizes, mesh.group_size(dims))
        buckets.append(Bucket(kind, dims, op, dtype, tuple(n for n, _, _ in members), nbytes,
                              collective_time_s(kind, nbytes, dims, mesh, profile),
                              pack_s=_copies_s(pack, profile), unpack_s=_copies_s(unpack, profile)))
    # issue order: by the time the last member is made (the first, with a cap: a run of
    # consecutive gradients), the same on every rank
    order = {name: i for i, (name, _, _) in enumerate(items)}
    if units is not None:
        return tuple(sorted(buckets, key=lambda b: max(order[m] for m in b.members)))
    return tuple(sorted(buckets, key=lambda b: order[b.members[0]]))


def bucket_window(sizes: Sequence[float], j: int, cap: float = DEFAULT_BUCKET_BYTES, *,
                  first_cap: float | None = None) -> tuple[int, int]:
    """``(a, b)``: no bucket :func:`group_buckets` can form with gradient ``j`` in it starts
    before ``a`` or ends after ``b`` (with the same ``cap`` and ``first_cap``), ``sizes`` the
    gradients' bytes in the order buckets form (module docstring: the window of a gradient's
    bucket); ``(j, j)`` with ``cap <= 0``.

    >>> bucket_window([10, 10, 30, 10], 1, cap=40)   # 10 + 10 <= 40 on the left, 10 + 30 on the right
    (0, 2)
    >>> bucket_window([10, 10, 30, 10], 1, cap=20, first_cap=40)   # the first bucket may hold 40
    (0, 2)
    """
    if cap <= 0:
        return j, j
    if first_cap is not None:  # a bucket of two or more holds at most its own limit, the larger of the two
        cap = max(cap, first_cap)
    ends = []
    for step in (-1, 1):
        total, k = sizes[j], j
        while 0 <= k + step < len(sizes) and total + sizes[k + step] <= cap:
            k += step
            total += sizes[k]
        ends.append(k)
    return ends[0], ends[1]


_ITEMSIZE = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}


def dtype_itemsize(dtype: str) -> int:
    """Bytes per element of a floating dtype named as torch prints it (``torch.bfloat16``) or bare.

    >>> dtype_itemsize("torch.bfloat16"), dtype_itemsize("float32")
    (2, 4)
    """
    name = dtype.removeprefix("torch.")
    if name not in _ITEMSIZE:
        raise ValueError(f"dtype: expected one of {', '.join(_ITEMSIZE)}, got {dtype!r}")
    return _ITEMSIZE[name]


def gatherable_step(steps: Sequence[RedistributeStep]) -> RedistributeStep | None:
    """The one step of a leaf redistribution that may join a gather bucket: a
    single ``all_gather`` whose source is a plain shard on its mesh dims."""
    if len(steps) != 1 or steps[0].collective != "all_gather" or steps[0].tensor_dim is None:
        return None
    step = steps[0]
    if not step.src or any(isinstance(step.src[d], StridedShard) for d in step.mesh_dims):
        return None
    return step


@dataclass(frozen=True, slots=True)
class GatherBucket:
    """Leaf all-gathers issued as one collective (module docstring)."""

    mesh_dims: tuple[int, ...]
    dtype: str
    members: tuple[tuple[str, str, int], ...]
    """The gathers' edges (producer, reader, reader input), in buffer order."""
    bytes: int
    """Gathered output bytes, the members' step bytes summed."""
    cost_s: float
    """The one all_gather at ``bytes`` plus the members' re-layout copies."""
    pack_s: float = 0.0
    """The shards' copy into the flat buffer before the issue, on the compute stream (module docstring)."""
    unpack_s: float = 0.0
    """Each member's copy out of the gathered buffer after the wait, on the compute stream."""

    def to_dict(self) -> dict[str, Any]:
        return {"collective": "all_gather", "mesh_dims": list(self.mesh_dims), "dtype": self.dtype,
                "members": [list(m) for m in self.members], "bytes": self.bytes, "cost_s": self.cost_s,
                "pack_s": self.pack_s, "unpack_s": self.unpack_s}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "GatherBucket":
        try:
            if data.get("collective", "all_gather") != "all_gather":
                raise ValueError(f"collective {data['collective']!r} (a gather bucket is an all_gather)")
            members = []
            for m in data["members"]:
                if not (isinstance(m, (list, tuple)) and len(m) == 3 and isinstance(m[2], int)):
                    raise ValueError(f"member {m!r} is not [producer, reader, reader input]")
                members.append((str(m[0]), str(m[1]), int(m[2])))
            return cls(tuple(int(d) for d in data["mesh_dims"]), str(data["dtype"]), tuple(members),
                       int(data["bytes"]), float(data.get("cost_s", 0.0)), float(data.get("pack_s", 0.0)),
                       float(data.get("unpack_s", 0.0)))
        except KeyError as exc:
            raise ValueError(f"gather bucket: missing field {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise ValueError(f"gather bucket: bad field ({exc})") from None


def group_gathers(
    items: Sequence[tuple[tuple[str, str, int], str, Sequence[RedistributeStep]]],
    mesh: MeshSpec,
    profile: HardwareProfile,
    cap: int,
    blocks: Mapping[tuple[str, str, int], str] | None = None,
) -> tuple[GatherBucket, ...]:
    """Gather buckets of leaf redistributions ``(edge, dtype, steps)`` given in
    reader order: the gatherable items of one mesh-dim set and dtype, in that
    order, a new bucket whenever adding one would pass ``cap`` gathered bytes
    or, with ``blocks`` (edge -> the module block its leaf belongs to), whenever
    the block changes (FSDP2's one gather per wrapped block); buckets of one
    member are left out.

    >>> from costmodel.placements import parse_placements as pp
    >>> from hw_profiles import load
    >>> st = RedistributeStep("all_gather", (0,), 4096, 1e-3, pp("S(0)"), pp("R"), tensor_dim=0)
    >>> items = [(("param:a", "t", 0), "f32", [st]), (("param:b", "t_1", 0), "f32", [st])]
    >>> [b.members for b in group_gathers(items, MeshSpec((2,)), load("cpu-gloo"), 2**20)]
    [(('param:a', 't', 0), ('param:b', 't_1', 0))]
    """
    if cap <= 0:
        return ()
    runs: list[list[tuple[tuple[str, str, int], RedistributeStep]]] = []
    open_: dict[tuple, list[tuple[tuple[str, str, int], RedistributeStep]]] = {}
    for edge, dtype, steps in items:
        step = gatherable_step(steps)
        if step is None:
            continue
        key = (tuple(step.mesh_dims), dtype)
        run = open_.get(key)
        if run is None or sum(int(s.bytes) for _, s in run) + step.bytes > cap or (
                blocks is not None and blocks.get(edge) != blocks.get(run[0][0])):
            run = open_[key] = []
            runs.append(run)
        run.append((edge, step))
    dtypes = {edge: dtype for edge, dtype, _ in items}
    out = []
    for run in runs:
        if len(run) < 2:
            continue
        dims = tuple(run[0][1].mesh_dims)
        nbytes = sum(int(s.bytes) for _, s in run)
        cost = collective_time_s("all_gather", nbytes, dims, mesh, profile) + sum(s.relayout_s for _, s in run)
        pack, unpack = gather_copy_bytes([int(s.bytes) for _, s in run], mesh.group_size(dims))
        out.append(GatherBucket(dims, dtypes[run[0][0]], tuple(e for e, _ in run), nbytes, cost,
                                pack_s=_copies_s(pack, profile), unpack_s=_copies_s(unpack, profile)))
    return tuple(out)


def bucket_copy_bytes(kind: str, members: Sequence[tuple[float, bool]], group: int
                      ) -> tuple[list[float], list[float]]:
    """(packing, unpacking) copies of a gradient bucket, bytes each: ``members`` are
    ``(step bytes, moved)``, ``moved`` for a reduce_scatter member on a dim other than 0
    (module docstring; ``autoshard.runtime.steps.pack_bucket`` and ``unpack_bucket`` make them).

    >>> bucket_copy_bytes("reduce_scatter", [(64, False), (32, True)], 2)
    ([96, 32], [16.0])
    """
    moved = [b for b, m in members if m] if kind == "reduce_scatter" else []
    return [sum(b for b, _ in members), *moved], [b / group for b in moved]


def gather_copy_bytes(members: Sequence[float], group: int) -> tuple[list[float], list[float]]:
    """(packing, unpacking) copies of a gather bucket of members gathering ``members`` bytes
    each (module docstring; ``autoshard.runtime.steps.pack_gather`` and ``unpack_gather`` make them).

    >>> gather_copy_bytes([64, 32], 4)
    ([24.0], [64, 32])
    """
    return [sum(members) / group], list(members)


def _copies_s(sizes: Sequence[float], profile: HardwareProfile) -> float:
    """Local copies of ``sizes`` bytes each, as ops of a step, of bytes no cache holds
    (module docstring; ``costmodel.compute.cold_copy_time_s``)."""
    return sum(cold_copy_time_s(float(b), profile) + profile.device.step_op_s for b in sizes)
