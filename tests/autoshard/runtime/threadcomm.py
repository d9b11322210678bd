"""A threaded stand-in for process groups: every rank of a simulated mesh runs
in its own thread and the collectives exchange tensors through shared memory,
with the semantics of ``autoshard.runtime.steps.Comm``. For fast unit tests of
the runtime's step and graph execution without processes."""

from __future__ import annotations

import math
import threading
from typing import Any, Callable, Sequence

import numpy as np
import torch

from autoshard.runtime.steps import member_coords, member_index


class ThreadComm:
    """One rank's view of a shared board (make them with :func:`run_threads`)."""

    def __init__(self, board: dict, barrier: threading.Barrier, mesh_shape: tuple[int, ...], coord: tuple[int, ...]):
        self.board, self.barrier, self.mesh_shape, self.coord = board, barrier, mesh_shape, coord
        self.rank = int(np.ravel_multi_index(coord, mesh_shape))
        self.seq = 0
        self.records: list[tuple[str, tuple[int, ...], int]] = []
        self.edge: tuple[str, str, int] | None = None
        self.positions: tuple[int, int] | None = None
        """(issue, wait) schedule positions of what is issued next (set by the runner, as on ``MeshComm``)."""
        self.trace: list[tuple] = []
        """(edge, kind, mesh dims, bytes, issue, wait) per collective, as ``MeshComm``'s records name them."""

    def _record(self, kind: str, mesh_dims: tuple[int, ...], nbytes: int) -> None:
        self.records.append((kind, mesh_dims, nbytes))
        issue, wait = self.positions if self.positions is not None else (None, None)
        self.trace.append((self.edge, kind, tuple(mesh_dims), int(nbytes), issue, wait))

    def _exchange(self, x: torch.Tensor, dims: tuple[int, ...]) -> list[torch.Tensor]:
        key = self.seq
        self.seq += 1
        self.board[(key, self.rank)] = x.clone()
        self.barrier.wait()
        members = [int(np.ravel_multi_index(c, self.mesh_shape)) for c in member_coords(self.coord, self.mesh_shape, dims)]
        got = [self.board[(key, r)] for r in members]
        self.barrier.wait()
        return got

    @staticmethod
    def _reduce(parts: list[torch.Tensor], op: str) -> torch.Tensor:
        if op in ("sum", "avg"):
            out = parts[0].clone()
            for p in parts[1:]:
                out = out + p
            return out / len(parts) if op == "avg" else out
        fn = torch.maximum if op == "max" else torch.minimum
        out = parts[0]
        for p in parts[1:]:
            out = fn(out, p)
        return out

    def all_gather(self, x, mesh_dims, nbytes):
        self._record("all_gather", mesh_dims, nbytes)
        return torch.cat(self._exchange(x, mesh_dims), 0)

    def all_reduce(self, x, op, mesh_dims, nbytes):
        self._record("all_reduce", mesh_dims, nbytes)
        return self._reduce(self._exchange(x, mesh_dims), op)

    def reduce_scatter(self, x, op, mesh_dims, nbytes):
        self._record("reduce_scatter", mesh_dims, nbytes)
        total = self._reduce(self._exchange(x, mesh_dims), op)
        g = math.prod(self.mesh_shape[d] for d in mesh_dims)
        return total.chunk(g, 0)[member_index(self.coord, self.mesh_shape, mesh_dims)]

    def all_to_all(self, x, mesh_dims, nbytes):
        self._record("all_to_all", mesh_dims, nbytes)
        q = member_index(self.coord, self.mesh_shape, mesh_dims)
        return torch.stack([p[q] for p in self._exchange(x, mesh_dims)])

    def permute(self, x, src_dst, mesh_dims, nbytes):
        self._record("permute", mesh_dims, nbytes)
        q = member_index(self.coord, self.mesh_shape, mesh_dims)
        parts = self._exchange(x, mesh_dims)
        return parts[src_dst.index(q)]


def run_threads(mesh_shape: Sequence[int], fn: Callable[[tuple[int, ...], ThreadComm], Any]) -> dict[tuple[int, ...], Any]:
    """``fn(coord, comm)`` on every coordinate of the mesh, one thread each; the results by coordinate.
    An exception in any thread is raised here (the barrier is aborted so no thread hangs)."""
    mesh_shape = tuple(mesh_shape)
    coords = [tuple(int(i) for i in c) for c in np.ndindex(*mesh_shape)]
    barrier = threading.Barrier(len(coords), timeout=60)
    board: dict = {}
    results: dict = {}
    errors: list[BaseException] = []

    def target(coord):
        try:
            results[coord] = fn(coord, ThreadComm(board, barrier, mesh_shape, coord))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=target, args=(c,)) for c in coords]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
    if real or errors:
        raise (real or errors)[0]
    return results
