"""Functional collectives on a DeviceMesh's process groups, and the collective trace.

Every collective autoshard's runtime issues goes through :class:`MeshComm`
(the one module that touches ``torch.distributed._functional_collectives``
and ``DeviceMesh._flatten``, both private APIs). A step over one mesh dim
runs on that dim's process group; a step over several mesh dims runs as ONE
collective on the flattened group of those dims (``mesh[names]._flatten()``),
created once, on every rank in the same order (:meth:`MeshComm.prepare`,
sorted), and cached by DeviceMesh under the joined dim names.

Failures: a collective that fails (a peer rank raised and left, or never
arrived within the process group's timeout) raises :class:`CollectiveFailure`
naming the collective, the mesh dims, the group's ranks and the plan edge,
instead of gloo's bare "Connection closed by peer" or timeout text. Every
group the runtime uses gets the default process group's timeout (mesh-dim and
flattened groups are otherwise created with torch's 30-minute default), so a
rank that fails mid-step fails the others within the timeout the user chose.

Asynchronous: every collective is issued as a ``_c10d_functional`` op (the
ops under ``torch.distributed._functional_collectives``), which returns at
once while gloo runs it on its own thread (NCCL on its own stream); the
result may be read only after :meth:`MeshComm.wait` (``wait_tensor``).
On CUDA with NCCL this is the two-stream schedule the plan prices: the
process group records an event on the compute stream and runs the
collective on its own communication stream after it (the collective starts
when its input is made, not when the host gets there), and ``wait_tensor``
makes the compute stream wait on the collective's end event without
blocking the host (unless ``TORCH_NCCL_BLOCKING_WAIT`` is set), so the
compute issued between the issue and the wait overlaps the transfer. With
gloo on CUDA tensors (several ranks sharing one GPU) the wait blocks the host. The
runtime issues and waits where the plan's schedule says
(``autoshard.program.schedule``). The raw ops are called rather than the
``funcol`` wrappers because those wait at once under tracing (``make_fx``,
``torch.compile``), which would put every wait next to its collective in a
traced per-rank program.

The trace: with ``trace=True`` (or ``AUTOSHARD_TRACE_COLLECTIVES=1``) every
collective issued is appended to :attr:`MeshComm.records` as a
:class:`CollectiveRecord` (kind, mesh dims, bytes of the buffer issued,
global ranks of the group, the plan edge it belongs to, and the schedule
positions where it was issued and waited).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives  # noqa: F401 - registers the _c10d_functional ops

__all__ = ["TRACE_ENV", "CollectiveFailure", "CollectiveRecord", "MeshComm", "trace_enabled"]

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
    issue: int | None = None
    """Schedule position where it was issued (``autoshard.program.schedule``), when known."""
    wait: int | None = None
    """Schedule position where it was waited (equal to ``issue`` for a collective
    waited at once: all but the last of a redistribution's collectives)."""


class CollectiveFailure(RuntimeError):
    """A collective of the plan failed on this rank (names it; module docstring)."""


def default_timeout() -> timedelta | None:
    """The default process group's timeout (None when it cannot be read)."""
    try:
        pg = dist.distributed_c10d._get_default_group()
        return pg._get_backend(torch.device("cpu")).options._timeout
    except Exception:  # noqa: BLE001 - another backend or torch version: keep torch's defaults
        return None


_REDUCE = {"sum": "sum", "avg": "avg", "max": "max", "min": "min"}
_OPS = torch.ops._c10d_functional


class MeshComm:
    """Collectives over mesh dims of ``mesh`` (module docstring)."""

    def __init__(self, mesh: Any, *, trace: bool | None = None, timeout: timedelta | None = None) -> None:
        self.mesh = mesh
        self.trace = trace_enabled(trace)
        self.timeout = timeout if timeout is not None else (default_timeout() if dist.is_initialized() else None)
        self.records: list[CollectiveRecord] = []
        self.edge: tuple[str, str, int] | None = None
        self.positions: tuple[int, int] | None = None
        """(issue, wait) schedule positions of what is issued next (set by the runner)."""
        self._groups: dict[tuple[int, ...], Any] = {}
        self._in_flight: dict[int, str] = {}  # id of a pending result -> what it is (for errors at the wait)

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
        if self.timeout is not None:
            try:
                dist.distributed_c10d._set_pg_timeout(self.timeout, pg)
            except Exception:  # noqa: BLE001 - a backend without per-group timeouts keeps its own
                pass
        self._groups[dims] = pg
        return pg

    def _record(self, kind: str, dims: tuple[int, ...], nbytes: int) -> None:
        if self.trace:
            ranks = tuple(dist.get_process_group_ranks(self.group(dims)))
            issue, wait = self.positions if self.positions is not None else (None, None)
            self.records.append(CollectiveRecord(kind, dims, int(nbytes), ranks, self.edge, issue, wait))

    def _describe(self, kind: str, dims: tuple[int, ...], pg: Any) -> str:
        ranks = ",".join(str(r) for r in dist.get_process_group_ranks(pg))
        where = "" if self.edge is None else f" for {self.edge[0]} -> {self.edge[1]}"
        return f"{kind} over mesh dims {list(dims)} (ranks {ranks}){where}"

    def _failure(self, what: str, exc: BaseException) -> CollectiveFailure:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return CollectiveFailure(f"{what} failed on rank {dist.get_rank()}: another rank of the group probably "
                                 f"stopped or is stuck (look for its error); gloo said: {first}")

    def _issue(self, kind: str, dims: tuple[int, ...], nbytes: int, call: Callable[[str, int], torch.Tensor]
               ) -> torch.Tensor:
        """Issue a collective (``call(group_name, group_size)``); the result is
        pending until :meth:`wait`."""
        pg = self.group(dims)
        self._record(kind, dims, nbytes)
        try:
            out = call(pg.group_name, pg.size())
        except RuntimeError as exc:
            raise self._failure(self._describe(kind, dims, pg), exc) from exc
        if len(self._in_flight) > 4096:  # results never waited (an aborted step): forget them
            self._in_flight.clear()
        self._in_flight[id(out)] = self._describe(kind, dims, pg)
        return out

    def wait(self, x: torch.Tensor) -> torch.Tensor:
        """The result of an issued collective, once it has arrived."""
        what = self._in_flight.pop(id(x), "a collective")
        try:
            return _OPS.wait_tensor(x)
        except RuntimeError as exc:
            raise self._failure(what, exc) from exc

    # -- collectives (dim 0, equal sizes; see autoshard.runtime.steps.Comm); results pending until wait()
    def all_gather(self, x: torch.Tensor, mesh_dims: tuple[int, ...], nbytes: int) -> torch.Tensor:
        return self._issue("all_gather", mesh_dims, nbytes,
                           lambda name, size: _OPS.all_gather_into_tensor(x, size, name))

    def all_reduce(self, x: torch.Tensor, op: str, mesh_dims: tuple[int, ...], nbytes: int) -> torch.Tensor:
        return self._issue("all_reduce", mesh_dims, nbytes, lambda name, size: _OPS.all_reduce(x, _REDUCE[op], name))

    def all_reduce_owned(self, x: torch.Tensor, op: str, mesh_dims: tuple[int, ...], nbytes: int) -> torch.Tensor:
        """``all_reduce`` of a buffer the caller made for it and reads only through the
        result (a gradient bucket's flat buffer): reduced in place, as DDP reduces its
        buckets. The functional ``all_reduce`` copies its input first, a copy of every
        bucket per step that DDP does not make."""
        return self._issue("all_reduce", mesh_dims, nbytes, lambda name, size: _OPS.all_reduce_(x, _REDUCE[op], name))

    def reduce_scatter(self, x: torch.Tensor, op: str, mesh_dims: tuple[int, ...], nbytes: int) -> torch.Tensor:
        return self._issue("reduce_scatter", mesh_dims, nbytes,
                           lambda name, size: _OPS.reduce_scatter_tensor(x, _REDUCE[op], size, name))

    def all_to_all(self, x: torch.Tensor, mesh_dims: tuple[int, ...], nbytes: int) -> torch.Tensor:
        """``x`` is ``[G, ...]``; the result (pending) is flat: view it as ``x.shape`` after the wait."""
        def call(name: str, size: int) -> torch.Tensor:
            flat = x.reshape(-1)
            splits = [flat.numel() // size] * size
            return _OPS.all_to_all_single(flat, splits, splits, name)

        return self._issue("all_to_all", mesh_dims, nbytes, call)

    def permute(self, x: torch.Tensor, src_dst: list[int], mesh_dims: tuple[int, ...], nbytes: int) -> torch.Tensor:
        """Member p's ``x`` goes to member ``src_dst[p]``; the result (pending) is flat."""
        def call(name: str, size: int) -> torch.Tensor:
            flat = x.reshape(-1)
            me = dist.get_rank(self.group(mesh_dims))
            send, receive = [0] * size, [0] * size
            for src, dst in enumerate(src_dst):
                if src == me:
                    send[dst] = flat.numel()
                if dst == me:
                    receive[src] = flat.numel()
            return _OPS.all_to_all_single(flat, receive, send, name)

        return self._issue("permute", mesh_dims, nbytes, call)
