"""Redistribution steps and plans: what the planner prices and the runtime runs.

A :class:`RedistributePlan` is a sequence of :class:`RedistributeStep`. Each step
is ONE collective (or one local op) on one process group: a single mesh dim, or
the flattened group of several mesh dims (``mesh_dims`` has several entries).
The members of a flattened group are ordered lexicographically by their
coordinates on ``mesh_dims`` (ascending mesh dims, as DeviceMesh flattens them);
"member q" below is that flat index, ``G`` the group size.

Exact semantics (``costmodel.simulate`` executes them literally, the runtime with
functional collectives):

=================  ============================================================
collective         effect on the local tensors of one group
=================  ============================================================
all_gather         concatenate the members' locals along ``tensor_dim`` in
                   member order (padding uneven shards, then unpadding); if the
                   source placement of the gathered mesh dim is ``_S(d,sf)``,
                   reorder the result to natural order (an index_select)
all_reduce         every member gets the ``reduce_op`` of all locals
reduce_scatter     reduce, then member q keeps chunk q of ``G`` along
                   ``tensor_dim`` (``torch.chunk`` sizes)
all_to_all         member q splits its local into ``G`` chunks along
                   ``split_tensor_dim``, sends chunk p to member p; member p
                   concatenates what it receives along ``tensor_dim`` in
                   member order
permute            two mesh dims of equal size: the rank at coordinate c gets
                   the local of the rank whose coordinates on ``mesh_dims``
                   are c's swapped
local_slice        member q keeps chunk q of ``G`` along ``tensor_dim``; with
                   ``split_factor`` it keeps its ``_S(d,sf)`` positions instead
local_zero_fill    member 0 keeps its local, the others hold zeros (R -> P(sum))
local_copy         every member copies its local (R -> P(avg|max|min))
local_zero_pad     member q writes its local at its offset along ``tensor_dim``
                   into zeros of the gathered extent (S(d) -> P(sum))
=================  ============================================================

``bytes`` is the per-rank buffer the collective is priced on (see
``costmodel.collectives.collective_time_s``): the output of an all_gather, the
input of reduce_scatter / all_reduce / all_to_all / permute, the bytes written
by a local op; for uneven shards, the largest rank's.

>>> step = RedistributeStep("all_reduce", (1,), 8388608, 1.2e-4, reduce_op="sum")
>>> step.to_dict()["collective"], step.to_dict()["mesh_dims"]
('all_reduce', [1])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from costmodel.placements import Placement, format_placements, parse_placements

__all__ = [
    "COLLECTIVE_STEPS",
    "LOCAL_STEPS",
    "StepError",
    "RedistributeStep",
    "RedistributePlan",
]

COLLECTIVE_STEPS = ("all_gather", "all_reduce", "reduce_scatter", "all_to_all", "permute")
LOCAL_STEPS = ("local_slice", "local_zero_fill", "local_copy", "local_zero_pad")


class StepError(ValueError):
    """A step or plan dict that cannot be read (names the field)."""


@dataclass(frozen=True, slots=True)
class RedistributeStep:
    """One collective or local op of a redistribution (module docstring)."""

    collective: str
    """Kind: one of ``COLLECTIVE_STEPS`` or ``LOCAL_STEPS``."""
    mesh_dims: tuple[int, ...]
    """Mesh dims of the process group; several = one flattened group."""
    bytes: int
    """Per-rank buffer bytes the step is priced on (largest rank)."""
    cost_s: float
    """Estimated time of the step, re-layout copies included."""
    src: tuple[Placement, ...] = ()
    """Placements before the step."""
    dst: tuple[Placement, ...] = ()
    """Placements after the step."""
    tensor_dim: int | None = None
    """Tensor dim concatenated (gather, all_to_all) or split (scatter, slice, pad)."""
    split_tensor_dim: int | None = None
    """all_to_all only: the tensor dim each member splits and sends."""
    reduce_op: str | None = None
    """all_reduce / reduce_scatter: sum, avg, max or min."""
    split_factor: int | None = None
    """local_slice into a strided shard ``_S(d,sf)``."""
    relayout_s: float = 0.0
    """Part of ``cost_s`` spent on local copies around the collective (moving a
    tensor dim to the front for ``*_single`` collectives, padding uneven shards)."""

    def to_dict(self) -> dict[str, Any]:
        """The plan file's step form (docs/formats.md) plus the keys the runtime needs."""
        out: dict[str, Any] = {
            "collective": self.collective,
            "mesh_dims": list(self.mesh_dims),
            "bytes": int(self.bytes),
            "cost_s": self.cost_s,
        }
        if self.src:
            out["src"] = format_placements(self.src)
        if self.dst:
            out["dst"] = format_placements(self.dst)
        for key in ("tensor_dim", "split_tensor_dim", "reduce_op", "split_factor"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.relayout_s:
            out["relayout_s"] = self.relayout_s
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RedistributeStep":
        """Inverse of :meth:`to_dict`."""
        try:
            collective = data["collective"]
            mesh_dims = tuple(int(d) for d in data["mesh_dims"])
            nbytes = int(data["bytes"])
        except KeyError as exc:
            raise StepError(f"step: missing field {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise StepError(f"step: bad mesh_dims or bytes ({exc})") from None
        if collective not in COLLECTIVE_STEPS + LOCAL_STEPS:
            raise StepError(
                f"step.collective: unknown {collective!r} "
                f"(expected one of {', '.join(COLLECTIVE_STEPS + LOCAL_STEPS)})"
            )
        return cls(
            collective=collective,
            mesh_dims=mesh_dims,
            bytes=nbytes,
            cost_s=float(data.get("cost_s", 0.0)),
            src=parse_placements(data["src"]) if data.get("src") else (),
            dst=parse_placements(data["dst"]) if data.get("dst") else (),
            tensor_dim=data.get("tensor_dim"),
            split_tensor_dim=data.get("split_tensor_dim"),
            reduce_op=data.get("reduce_op"),
            split_factor=data.get("split_factor"),
            relayout_s=float(data.get("relayout_s", 0.0)),
        )

    def describe(self) -> str:
        """One line: ``all_gather[0,1](d0) S(0)S(0)->RR 8.0 MiB 1.2e-04 s``."""
        dims = ",".join(str(d) for d in self.mesh_dims)
        extra = []
        if self.tensor_dim is not None:
            extra.append(f"d{self.tensor_dim}")
        if self.split_tensor_dim is not None:
            extra.append(f"->d{self.split_tensor_dim}")
        if self.reduce_op is not None:
            extra.append(self.reduce_op)
        detail = f"({''.join(extra)})" if extra else ""
        return (
            f"{self.collective}[{dims}]{detail} "
            f"{format_placements(self.src)}->{format_placements(self.dst)}"
        )


@dataclass(frozen=True, slots=True)
class RedistributePlan:
    """Cheapest step sequence from ``src`` to ``dst`` placements and its cost."""

    steps: tuple[RedistributeStep, ...]
    cost_s: float
    src: tuple[Placement, ...] = ()
    dst: tuple[Placement, ...] = ()
    fused: bool = field(default=True)
    """Whether the planner was allowed to fuse steps over several mesh dims."""

    @property
    def comm_s(self) -> float:
        """Time of the collectives (their re-layout copies included)."""
        return sum(s.cost_s for s in self.steps if s.collective in COLLECTIVE_STEPS)

    @property
    def local_s(self) -> float:
        """Time of the purely local steps."""
        return sum(s.cost_s for s in self.steps if s.collective in LOCAL_STEPS)

    def to_dict(self) -> dict[str, Any]:
        """The ``from`` / ``to_placement`` / ``steps`` / ``cost_s`` part of a plan
        file's redistribution entry (docs/formats.md)."""
        return {
            "from": format_placements(self.src),
            "to_placement": format_placements(self.dst),
            "steps": [s.to_dict() for s in self.steps],
            "cost_s": self.cost_s,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RedistributePlan":
        """Inverse of :meth:`to_dict`."""
        if "steps" not in data:
            raise StepError("redistribution: missing field 'steps'")
        steps = tuple(RedistributeStep.from_dict(s) for s in data["steps"])
        return cls(
            steps=steps,
            cost_s=float(data.get("cost_s", sum(s.cost_s for s in steps))),
            src=parse_placements(data["from"]) if data.get("from") else (),
            dst=parse_placements(data["to_placement"]) if data.get("to_placement") else (),
        )

    def describe(self) -> str:
        """Steps joined by `` ; `` (``"noop"`` when there is none)."""
        return " ; ".join(s.describe() for s in self.steps) or "noop"
