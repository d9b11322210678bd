r"""Gradient buckets: many gradient reductions issued as one collective.

Data parallelism makes every gradient leave the backward pass partial
(``P(sum)``) and need one reduction to its parameter's placement: an
all_reduce to ``R`` (DDP) or a reduce_scatter to ``S(d)`` (FSDP). Issued one
per gradient, a model with ``g`` gradients pays ``g`` call latencies; DDP and
FSDP put many gradients in one flat buffer and pay one. autoshard's runtime
does the same, and this module is where the two agree on it.

**Which redistributions join a bucket.** A gradient edge (op -> ``grad:<fqn>``
sink) whose redistribution is exactly one step, that step an ``all_reduce``,
or a ``reduce_scatter`` whose destination is a plain shard (no strided shard).
Members of one bucket share the step's kind, mesh dims, reduce op and the
gradient's dtype (the flat buffer has one dtype).

**Buckets at run time.** Members in the order of the plan's gradient edges,
a new bucket whenever adding one would exceed the cap ``B`` (25 MiB by
default, DDP's figure) — a gradient larger than ``B`` is a bucket of its own.
A bucket issues one collective on its members' concatenated payload; its cost
is that collective's time at the summed bytes.

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

>>> bucket_share(4 * 2**20, 16 * 2**20)   # one of four equal gradients: a quarter of the latency
0.25
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from costmodel.collectives import collective_time_s
from costmodel.mesh import MeshSpec
from costmodel.placements import StridedShard
from costmodel.steps import RedistributePlan, RedistributeStep
from hw_profiles import HardwareProfile

__all__ = ["DEFAULT_BUCKET_BYTES", "Bucket", "bucket_share", "bucketable_step", "amortized_cost_s", "group_buckets"]

DEFAULT_BUCKET_BYTES = 25 * 2**20
"""DDP's default bucket cap."""


def bucketable_step(steps: Sequence[RedistributeStep]) -> RedistributeStep | None:
    """The one step of a gradient redistribution that may join a bucket, or None."""
    if len(steps) != 1:
        return None
    step = steps[0]
    if step.collective == "all_reduce" and step.reduce_op is not None:
        return step
    if (step.collective == "reduce_scatter" and step.reduce_op is not None and step.tensor_dim is not None
            and not any(isinstance(p, StridedShard) for p in step.dst)):
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

    def to_dict(self) -> dict[str, Any]:
        return {"collective": self.collective, "mesh_dims": list(self.mesh_dims), "reduce_op": self.reduce_op,
                "dtype": self.dtype, "members": list(self.members), "bytes": self.bytes, "cost_s": self.cost_s}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Bucket":
        try:
            return cls(str(data["collective"]), tuple(int(d) for d in data["mesh_dims"]), str(data["reduce_op"]),
                       str(data["dtype"]), tuple(str(m) for m in data["members"]), int(data["bytes"]),
                       float(data.get("cost_s", 0.0)))
        except KeyError as exc:
            raise ValueError(f"bucket: missing field {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bucket: bad field ({exc})") from None


def group_buckets(
    items: Sequence[tuple[str, str, Sequence[RedistributeStep]]],
    mesh: MeshSpec,
    profile: HardwareProfile,
    cap: int = DEFAULT_BUCKET_BYTES,
) -> tuple[Bucket, ...]:
    """Buckets of gradient redistributions ``(sink name, dtype, steps)``, in order.

    Items that cannot join a bucket (module docstring) are left out, as are
    buckets of one member (nothing to fuse). ``cap <= 0`` turns bucketing off.

    >>> from costmodel.placements import parse_placements as pp
    >>> from hw_profiles import load
    >>> st = RedistributeStep("all_reduce", (0,), 4096, 1e-3, pp("P(sum)"), pp("R"), reduce_op="sum")
    >>> [b.members for b in group_buckets([("grad:a", "f32", [st]), ("grad:b", "f32", [st])], MeshSpec((2,)), load("cpu-gloo"))]
    [('grad:a', 'grad:b')]
    """
    if cap <= 0:
        return ()
    open_: dict[tuple, list[tuple[str, int]]] = {}
    closed: list[tuple[tuple, list[tuple[str, int]]]] = []
    for name, dtype, steps in items:
        step = bucketable_step(steps)
        if step is None:
            continue
        key = (step.collective, tuple(step.mesh_dims), step.reduce_op, dtype)
        members = open_.setdefault(key, [])
        if members and sum(b for _, b in members) + step.bytes > cap:
            closed.append((key, members))
            members = open_[key] = []
        members.append((name, int(step.bytes)))
    closed.extend(open_.items())
    buckets = []
    for (kind, dims, op, dtype), members in closed:
        if len(members) < 2:
            continue
        nbytes = sum(b for _, b in members)
        buckets.append(Bucket(kind, dims, op, dtype, tuple(n for n, _ in members), nbytes,
                              collective_time_s(kind, nbytes, dims, mesh, profile)))
    # issue order: by the position of the first member, the same on every rank
    order = {name: i for i, (name, _, _) in enumerate(items)}
    return tuple(sorted(buckets, key=lambda b: order[b.members[0]]))
