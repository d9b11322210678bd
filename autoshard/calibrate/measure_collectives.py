"""Collective times on the job's own process groups, for the alpha-beta fit.

Why on the mesh's groups: a plan's collectives run on the process group of
one mesh dim, or on the flattened group of several (``costmodel.collectives``
prices exactly those), and every group of a mesh dim runs at once. So each
collective kind is timed on every mesh-dim group and every flattened group,
all groups of the same mesh dims together, through the runtime's own
:class:`autoshard.runtime.collectives.MeshComm` (the calls a plan issues),
with buffer sizes from a few bytes to hundreds of MiB (capped by free memory
and by the mode).

The buffer size ``nbytes`` of a sample follows ``costmodel.collectives``:
all_gather's output, reduce_scatter's and all_to_all's input, all_reduce's
and permute's buffer, per rank. Sizes are rounded up to a multiple of
``4 * group size`` bytes so that every rank's fp32 piece is whole.

>>> collective_sizes("tiny", 4, max_bytes=2**20)
[16, 64, 512, 4096, 32768]
>>> heldout_sizes("tiny", 4, max_bytes=2**20)
[48, 3072]
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from costmodel.mesh import MeshSpec
from hw_profiles.profile import COLLECTIVE_KINDS

from autoshard.calibrate.measure_compute import Item, available_bytes
from autoshard.calibrate.timing import Job, Settings, measure

__all__ = ["CollectiveSample", "default_mesh", "mesh_groups", "collective_sizes", "heldout_sizes",
           "Groups", "collective_items"]


@dataclass(frozen=True, slots=True)
class CollectiveSample:
    """One measured collective."""

    kind: str
    mesh_dims: tuple[int, ...]
    ranks: int
    """Group size."""
    nbytes: int
    """Buffer per rank (module docstring)."""
    seconds: float
    spread: float

    def with_seconds(self, seconds: float) -> "CollectiveSample":
        return dataclasses.replace(self, seconds=seconds)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "mesh_dims": list(self.mesh_dims), "ranks": self.ranks, "nbytes": self.nbytes,
                "seconds": self.seconds, "spread": self.spread}

    @classmethod
    def from_dict(cls, data: dict) -> "CollectiveSample":
        return cls(data["kind"], tuple(data["mesh_dims"]), data["ranks"], data["nbytes"], data["seconds"],
                   data["spread"])


def default_mesh(world: int) -> MeshSpec:
    """The mesh measured when none is given: ``2 x world/2`` for an even world
    of 4 or more (groups of 2, of world/2 and the flattened world: two group
    sizes at least, so that per-call and per-step latency separate), else
    one dim of ``world``.

    >>> default_mesh(4).shape, default_mesh(2).shape
    ((2, 2), (2,))
    """
    if world >= 4 and world % 2 == 0:
        return MeshSpec((2, world // 2), ("x", "y"))
    return MeshSpec((world,), ("x",))


def mesh_groups(mesh: MeshSpec) -> list[tuple[int, ...]]:
    """Mesh-dim sets measured: every mesh dim of size > 1, then every set of
    two or more of them that flattens into one group.

    >>> mesh_groups(MeshSpec((2, 4), ("dp", "tp")))
    [(0,), (1,), (0, 1)]
    """
    dims = [d for d in range(mesh.ndim) if mesh.shape[d] > 1]
    out = [(d,) for d in dims]
    for size in range(2, len(dims) + 1):
        out += [c for c in itertools.combinations(dims, size) if mesh.can_flatten(c)]
    return out


def _round(nbytes: int, ranks: int) -> int:
    unit = 4 * ranks
    return max(unit, -(-nbytes // unit) * unit)


def collective_sizes(mode: str, ranks: int, *, max_bytes: int) -> list[int]:
    """Buffer sizes fitted on: powers of two from 8 B (full: every 4x up to
    32 MiB, and 256 MiB; quick: every 8x up to 16 MiB; tiny: every 8x up to
    32 KiB), rounded for ``ranks`` and capped at ``max_bytes``."""
    exps = {"full": [*range(3, 26, 2), 28], "quick": range(3, 25, 3), "tiny": range(3, 16, 3)}[mode]
    sizes = sorted({_round(2**k, ranks) for k in exps})
    return [s for s in sizes if s <= max_bytes]


def heldout_sizes(mode: str, ranks: int, *, max_bytes: int) -> list[int]:
    """Sizes between the fitted ones (3 x a power of two), for the accuracy check."""
    exps = {"full": range(4, 27, 3), "quick": range(4, 22, 4), "tiny": range(4, 11, 6)}[mode]
    sizes = sorted({_round(3 * 2**k, ranks) for k in exps})
    return [s for s in sizes if s <= max_bytes]


class Groups:
    """The job's DeviceMesh and a :class:`MeshComm` on it, with every measured
    group created up front in the same order on every rank."""

    def __init__(self, job: Job, mesh: MeshSpec) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        from autoshard.runtime.collectives import MeshComm

        if mesh.size != job.world:
            raise ValueError(f"--mesh: {'x'.join(map(str, mesh.shape))} has {mesh.size} ranks, the job has {job.world}")
        self.job = job
        self.spec = mesh
        self.device_mesh = init_device_mesh(job.device.type, mesh.shape, mesh_dim_names=mesh.dim_names)
        self.comm = MeshComm(self.device_mesh)
        self.groups = mesh_groups(mesh)
        self.comm.prepare(self.groups)

    def max_bytes(self) -> int:
        """Largest buffer a rank may use (all_gather holds input + output)."""
        return available_bytes(self.job) // 2

    def call(self, kind: str, mesh_dims: tuple[int, ...], nbytes: int) -> Any:
        """A function issuing one ``kind`` collective with per-rank buffer
        ``nbytes`` on the group of ``mesh_dims`` and waiting for its result.

        ``MeshComm`` only issues (the runtime waits where the plan's schedule
        says); a timed call must also wait, or it times the issue alone and
        leaves every result in flight (gloo keeps their buffers: a full
        calibration ran out of memory that way)."""
        issue = self._issue(kind, mesh_dims, nbytes)
        comm = self.comm
        return lambda: comm.wait(issue())

    def _issue(self, kind: str, mesh_dims: tuple[int, ...], nbytes: int) -> Any:
        n = self.spec.group_size(mesh_dims)
        numel = nbytes // 4
        device = self.job.device
        comm = self.comm
        if kind == "all_gather":
            x = torch.ones(numel // n, device=device)
            return lambda: comm.all_gather(x, mesh_dims, nbytes)
        x = torch.ones(numel, device=device)
        if kind == "all_reduce":
            return lambda: comm.all_reduce(x, "sum", mesh_dims, nbytes)
        if kind == "reduce_scatter":
            return lambda: comm.reduce_scatter(x, "sum", mesh_dims, nbytes)
        if kind == "all_to_all":
            return lambda: comm.all_to_all(x, mesh_dims, nbytes)
        if kind == "permute":
            shift = [(i + 1) % n for i in range(n)]
            return lambda: comm.permute(x, shift, mesh_dims, nbytes)
        raise ValueError(f"kind: unknown collective {kind!r}")


def _item(groups: Groups, kind: str, dims: tuple[int, ...], nbytes: int) -> Item:
    ranks = groups.spec.group_size(dims)

    def run(job: Job, settings: Settings) -> list[CollectiveSample]:
        t = measure(job, groups.call(kind, dims, nbytes), settings)
        return [CollectiveSample(kind, dims, ranks, nbytes, t.seconds, t.spread)]

    label = f"{kind} dims {','.join(groups.spec.dim_names[d] for d in dims)} {nbytes} B"
    return Item(label, 0.05 + 4e-9 * nbytes * 8, run, repeat=nbytes < 2**25)


def collective_items(groups: Groups, mode: str, *, heldout: bool = False,
                     kinds: Sequence[str] = COLLECTIVE_KINDS) -> list[Item]:
    """Every (kind, group, size) measurement: the fitted sizes, or with
    ``heldout`` the sizes between them."""
    items = []
    cap = groups.max_bytes()
    for dims in groups.groups:
        ranks = groups.spec.group_size(dims)
        sizes = (heldout_sizes if heldout else collective_sizes)(mode, ranks, max_bytes=cap)
        for kind in kinds:
            items += [_item(groups, kind, dims, s) for s in sizes]
    return items
