"""Functional collectives on a DeviceMesh's process groups, and the collective trace.

Every collective autoshard's runtime issues goes through :class:`MeshComm`
(the one module that touches ``torch.distributed._functional_collectives``
and ``DeviceMesh._flatten``, both private APIs). A step over one mesh dim
runs on that dim's process group; a step over several mesh dims runs as ONE
collective on the flattened group of those dims (``mesh[names]._flatten()``),
created once, on every rank in the same order (:meth:`MeshComm.prepare`,
sorted), and cached by DeviceMesh under the joined dim names.

The trace: with ``trace=True`` (or ``AUTOSHARD_TRACE_COLLECTIVES=1``) every
collective issued is appended to :attr:`MeshComm.records` as a
:class:`CollectiveRecord` (kind, mesh dims, bytes of the buffer issued,
global ranks of the group, and the plan edge it belongs to).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

__all__ = ["TRACE_ENV", "CollectiveRecord", "MeshComm", "trace_enabled"]

TRACE_ENV = "AUTOSHARD_TRACE_COLLECTIVES"


def trace_enabled(flag: bool | None = None) -> bool:
    """``flag`` if given, else whether ``AUTOSHARD_TRACE_COLLECTIVES`` is set to a true value."""
    if flag is not None:
        return bool(flag)
    return os.environ.get(TRACE_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


@dataclass(frozen=True, slots=True)
class CollectiveRecord:
    """One collective issued by the runtime."""

    kind: str
    """all_gather, all_reduce, reduce_scatter, all_to_all or permute."""
    mesh_dims: tuple[int, ...]
    nbytes: int
    """Bytes of the buffer issued (all_gather: its output), padding included."""
    group_ranks: tuple[int, ...]
    """Global ranks of the process group it ran on, in group order."""
    edge: tuple[str, str, int] | None
    """(producer, reader, reader input) of the plan's redistribution, when known."""


def _wait(t: torch.Tensor) -> torch.Tensor:
    return funcol.wait_tensor(t) if isinstance(t, funcol.AsyncCollectiveTensor) else t


_REDUCE = {"sum": "sum", "avg": "avg", "max": "max", "min": "min"}


class MeshComm:
    """Collectives over mesh dims of ``mesh`` (module docstring)."""

    def __init__(self, mesh: Any, *, trace: bool | None = None) -> None:
        self.mesh = mesh
        self.trace = trace_enabled(trace)
        self.records: list[CollectiveRecord] = []
        self.edge: tuple[str, str, int] | None = None
        self._groups: dict[tuple[int, ...], Any] = {}

    # -- groups ---------------------------------------------------------------
    def prepare(self, all_mesh_dims: Iterable[Sequence[int]]) -> None:
        """Create the process group of every mesh-dim set now, in sorted order
        (the same order on every rank: flattening is a collective operation)."""
        for dims in sorted({tuple(d) for d in all_mesh_dims}, key=lambda t: (len(t), t)):
            self.group(dims)

    def group(self, mesh_dims: Sequence[int]) -> Any:
        """The ProcessGroup of ``mesh_dims`` (flattened for several dims), cached."""
        dims = tuple(mesh_dims)
        pg = self._groups.get(dims)
        if pg is not None:
            return pg
        if len(dims) == 1:
            pg = self.mesh.get_group(dims[0])
        else:
            names = self.mesh.mesh_dim_names
            if not names:
                raise ValueError(
                    f"the plan fuses mesh dims {list(dims)} into one collective, which needs a flattened process "
                    "group: give the DeviceMesh mesh_dim_names (init_device_mesh(..., mesh_dim_names=...))"
                )
            sub = self.mesh[tuple(names[d] for d in dims)]
            pg = sub._flatten().get_group()
        self._groups[dims] = pg
        return pg

    def _record(self, kind: str, dims: tuple[int, ...], nbytes: int) -> None:
        if self.trace:
            ranks = tuple(dist.get_process_group_ranks(self.group(dims)))
            self.records.append(CollectiveRecord(kind, dims, int(nbytes), ranks, self.edge))

    # -- collectives (dim 0, equal sizes; see autoshard.runtime.steps.Comm) ----
    def all_gather(self, x: torch.Tensor, mesh_dims: tuple[int, ...], nbytes: int) -> torch.Tensor:
        pg = self.group(mesh_dims)
        self._record("all_gather", mesh_dims, nbytes)
        return _wait(funcol.all_gather_single(x, 0, pg))

    def all_reduce(self, x: torch.Tensor, op: str, mesh_dims: tuple[int, ...], nbytes: int) -> torch.Tensor:
        pg = self.group(mesh_dims)
        self._record("all_reduce", mesh_dims, nbytes)
        return _wait(funcol.all_reduce(x, _REDUCE[op], pg))

    def reduce_scatter(self, x: torch.Tensor, op: str, mesh_dims: tuple[int, ...], nbytes: int) -> torch.Tensor:
        pg = self.group(mesh_dims)
        self._record("reduce_scatter", mesh_dims, nbytes)
        return _wait(funcol.reduce_scatter_single(x, _REDUCE[op], 0, pg))

    def all_to_all(self, x: torch.Tensor, mesh_dims: tuple[int, ...], nbytes: int) -> torch.Tensor:
        pg = self.group(mesh_dims)
        self._record("all_to_all", mesh_dims, nbytes)
        out = _wait(funcol.all_to_all_single(x.reshape(-1), None, None, pg))
        return out.view(x.shape)

    def permute(self, x: torch.Tensor, src_dst: list[int], mesh_dims: tuple[int, ...], nbytes: int) -> torch.Tensor:
        pg = self.group(mesh_dims)
        self._record("permute", mesh_dims, nbytes)
        return _wait(funcol.permute_tensor(x.reshape(-1), src_dst, pg))
