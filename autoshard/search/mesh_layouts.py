r"""Which meshes to try for ``N`` devices in nodes of ``K``: the layouts a mesh search solves.

A *layout* is a device mesh for all ``N`` devices: a shape with up to three
mesh dims, each of size >= 2 (a dim of size 1 changes nothing), laid out
row-major over the global ranks as ``init_device_mesh`` lays them out (the last
mesh dim is innermost: its groups are consecutive ranks). The hardware profile
puts ranks ``[i*K, (i+1)*K)`` in node ``i`` (its innermost interconnect tier,
NVLink say, has ``ranks = K``), so the order of the mesh dims decides which
of them talk inside a node.

Enumeration. Every ordered factorization ``N = m_0 * ... * m_{n-1}`` with
``n <= 3`` and every ``m_i >= 2`` (for ``N = 1`` the single layout ``(1,)``),
kept when it is *consistent with the nodes*: reading the dims from the
innermost, every partial product ``P_j = m_{n-j} * ... * m_{n-1}`` either
divides ``K`` or is a multiple of it. Then every mesh dim's groups are whole
sub-blocks of one node or unions of whole nodes, never a group that straddles
a node boundary (``8x3`` on nodes of 8 would put ranks 6..8 in one group of
the inner dim: half NVLink, half network). With ``N <= K`` (one node) every
order is kept. For ``N = 64`` and ``K = 8`` that is 16 layouts: ``64``,
``2x32``, ``4x16``, ``8x8``, ``16x4``, ``32x2`` and the ten 3-D orders of
``2^6``. Orders are not merged: ``4x16`` (the inner 16 spans two nodes) and
``16x4`` (4 inside a node, 16 across eight nodes) price differently, and
even on one node mesh dims of different sizes do not give exactly the same
strategy lists in both orders (split order along a tensor dim).

Names. Dim names are labels: the solver decides per tensor what every mesh
dim carries (batch, weights, sequence, ...). They name the dims the way
torchtitan orders its parallelisms, outer to inner: ``dp`` for one dim;
``dp, tp`` for two; ``dp_replicate, dp_shard, tp`` for three. ``tp`` is
always the innermost dim (the fastest links), which is also where the expert
baselines (``autoshard.search.baselines``) put tensor parallelism; the runtime
builds the mesh with these names (``init_device_mesh(..., mesh_dim_names=...)``).

Nodes in the pricing. :func:`profile_for_nodes` returns the profile whose
innermost tier has ``ranks = K``, so ``costmodel.mesh`` prices every group
by how its members spread over nodes of ``K`` (the profile's fingerprint
changes with it, so a plan records the node size it was priced for).

>>> [layout.text for layout in enumerate_layouts(8, 8)]
['8', '2x4', '4x2', '2x2x2']
>>> [layout.text for layout in enumerate_layouts(24, 8)]
['24', '3x8', '6x4', '12x2', '3x2x4', '3x4x2', '6x2x2']
>>> layout_dim_names(3)
('dp_replicate', 'dp_shard', 'tp')
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from autoshard.sizes import MAX_DEVICES

if TYPE_CHECKING:
    from hw_profiles import HardwareProfile

__all__ = ["MAX_DIMS", "MeshLayout", "enumerate_layouts", "layout_dim_names", "check_devices", "profile_for_nodes",
           "devices_per_node_of"]

MAX_DIMS = 3
"""Mesh dims of a layout at most: data (replicate, shard) and tensor parallel."""

_NAMES = {1: ("dp",), 2: ("dp", "tp"), 3: ("dp_replicate", "dp_shard", "tp")}


@dataclass(frozen=True, slots=True)
class MeshLayout:
    """One mesh a search solves: shape and dim names, row-major over the ranks."""

    shape: tuple[int, ...]
    dim_names: tuple[str, ...]

    @property
    def text(self) -> str:
        """``8x8``, as ``--mesh`` takes it."""
        return "x".join(map(str, self.shape))

    @property
    def devices(self) -> int:
        out = 1
        for m in self.shape:
            out *= m
        return out

    def to_dict(self) -> dict[str, list]:
        return {"shape": list(self.shape), "dim_names": list(self.dim_names)}


def layout_dim_names(ndim: int) -> tuple[str, ...]:
    """The dim names of an ``ndim``-D layout (module docstring)."""
    if ndim not in _NAMES:
        raise ValueError(f"layouts have 1 to {MAX_DIMS} mesh dims, got {ndim}")
    return _NAMES[ndim]


def check_devices(devices: object, devices_per_node: object = None, *, flag: str = "devices",
                  node_flag: str = "devices_per_node") -> tuple[int, int | None]:
    """``(devices, devices_per_node)`` as ints, or ``ValueError`` naming the field:
    both positive integers, at most :data:`~autoshard.sizes.MAX_DEVICES`,
    the node size dividing the device count."""
    def as_count(value: object, name: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        if not 1 <= value <= MAX_DEVICES:
            raise ValueError(f"{name}: must be between 1 and {MAX_DEVICES}, got {value}")
        return value

    n = as_count(devices, flag)
    if devices_per_node is None:
        return n, None
    k = as_count(devices_per_node, node_flag)
    if n % k:
        raise ValueError(f"{node_flag}: {k} does not divide {flag} {n} (nodes must be full)")
    return n, k


def devices_per_node_of(profile: HardwareProfile, devices: int, devices_per_node: int | None = None, *,
                        flag: str = "devices", node_flag: str = "devices_per_node") -> int:
    """The node size a search prices: ``devices_per_node`` if given, else the
    profile's innermost tier (``min(ranks, devices)``; a one-tier profile puts
    every device in one node). ``ValueError`` when the profile's node size does
    not divide a device count larger than one node."""
    if devices_per_node is not None:
        return devices_per_node
    k = profile.ranks_per_node
    if k is None or devices <= k:
        return devices
    if devices % k:
        raise ValueError(f"{flag}: {devices} is not a multiple of profile {profile.name}'s {k} devices per node "
                         f"(give {node_flag})")
    return k


def profile_for_nodes(profile: HardwareProfile, devices_per_node: int | None, *,
                      flag: str = "devices_per_node") -> HardwareProfile:
    """``profile`` with its innermost tier shared by ``devices_per_node`` ranks
    (unchanged when None or already so). ``ValueError`` for a one-tier profile
    (it has no nodes to size) or a node size that does not divide the next
    tier's ranks.

    >>> from hw_profiles import load
    >>> profile_for_nodes(load("h100-sxm-80gb"), 4).ranks_per_node
    4
    """
    if devices_per_node is None or profile.ranks_per_node == devices_per_node:
        return profile
    if len(profile.interconnect) < 2:
        raise ValueError(f"{flag}: profile {profile.name} has one interconnect tier "
                         f"({profile.interconnect[0].tier}): there are no nodes to size")
    outer = profile.interconnect[1].ranks
    if outer is not None and (outer % devices_per_node or outer <= devices_per_node):
        raise ValueError(f"{flag}: {devices_per_node} must divide profile {profile.name}'s "
                         f"{profile.interconnect[1].tier} tier of {outer} ranks")
    tiers = (replace(profile.interconnect[0], ranks=devices_per_node), *profile.interconnect[1:])
    return replace(profile, interconnect=tiers)


def _factorizations(n: int, parts: int) -> list[tuple[int, ...]]:
    """Ordered factorizations of ``n`` into exactly ``parts`` factors >= 2."""
    if parts == 1:
        return [(n,)] if n >= 2 else []
    out = []
    for first in range(2, n + 1):
        if n % first == 0:
            out.extend((first, *rest) for rest in _factorizations(n // first, parts - 1))
    return out


def _fits_nodes(shape: tuple[int, ...], devices_per_node: int) -> bool:
    """Every inner partial product divides the node size or is a multiple of it."""
    product = 1
    for m in reversed(shape):
        product *= m
        if devices_per_node % product and product % devices_per_node:
            return False
    return True


def enumerate_layouts(devices: int, devices_per_node: int | None = None, *,
                      max_dims: int = MAX_DIMS) -> list[MeshLayout]:
    """The layouts of ``devices`` devices in nodes of ``devices_per_node``
    (default: one node), by number of dims, then in factorization order
    (module docstring).

    >>> [layout.text for layout in enumerate_layouts(64, 8)][:6]
    ['64', '2x32', '4x16', '8x8', '16x4', '32x2']
    >>> len(enumerate_layouts(64, 8))
    16
    """
    n, k = check_devices(devices, devices_per_node)
    if not 1 <= max_dims <= MAX_DIMS:
        raise ValueError(f"max_dims: must be between 1 and {MAX_DIMS}, got {max_dims}")
    node = n if k is None else k
    if n == 1:
        return [MeshLayout((1,), layout_dim_names(1))]
    out = []
    for parts in range(1, max_dims + 1):
        for shape in _factorizations(n, parts):
            if n <= node or _fits_nodes(shape, node):
                out.append(MeshLayout(shape, layout_dim_names(parts)))
    return out
