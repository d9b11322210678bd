"""Device mesh description: sizes, names and rank layout of every mesh dim.

A mesh dim ``k`` of size ``m_k`` has a stride ``s_k`` in the global rank space:
the rank at coordinate ``c`` is ``sum_k c_k * s_k``. The default strides are
row-major (the last mesh dim is innermost, stride 1), which is what
``init_device_mesh`` builds. Custom strides describe a mesh whose ranks are laid
out differently (DeviceMesh's ``_MeshLayout``), e.g. ``(2, 4)`` with strides
``(1, 2)`` puts mesh dim 0 innermost.

Flattening (DeviceMesh's ``mesh["a", "c"]._flatten()``). A group of mesh dims
``k_1 < ... < k_n`` is flattened into one process group whose member index is
the lexicographic index of their coordinates. DeviceMesh accepts the group when
the concatenated layout ``(m_k1, ..., m_kn) : (s_k1, ..., s_kn)`` has strides in
non-increasing order (after dropping size-1 dims) and does not overlap
(``s_i`` a multiple of ``s_j * m_j`` for consecutive ``i``, ``j``). Dims need not
be adjacent: dims 0 and 2 of a 2x2x2 mesh give groups ``[0, 1, 4, 5]`` and
``[2, 3, 6, 7]``.

Tiers. A hardware profile lists interconnect tiers from the innermost
(``ranks`` = ranks sharing it, e.g. 8 GPUs on NVLink) to the outermost
(``ranks`` = null, the network). Global ranks ``[i*R, (i+1)*R)`` share a tier of
``R`` ranks. For a group, let ``b_t`` be the number of tier-``t`` blocks its
members span (``b = 1`` for the outermost). Its *tier factors* are
``n_0 = n / b_0`` members per innermost block, ``n_t = b_{t-1} / b_t`` above:
a group with factors ``[(nvlink, 8), (network, 8)]`` has 8 members per node
on 8 nodes. ``costmodel.collectives`` prices a collective over such a group
hierarchically.

>>> mesh = MeshSpec((8, 8), ("dp", "tp"))
>>> mesh.can_flatten((0, 1)), mesh.size
(True, 64)
>>> MeshSpec((2, 4), ("a", "b"), strides=(1, 2)).can_flatten((0, 1))
False
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # only for type hints: costmodel.mesh works without a profile
    from hw_profiles import HardwareProfile

__all__ = ["MeshError", "MeshSpec", "TierFactor"]


class MeshError(ValueError):
    """A mesh spec or a mesh-dim group that is not valid (names the field)."""


@dataclass(frozen=True, slots=True)
class TierFactor:
    """``count`` members of a group that talk over interconnect tier ``tier``."""

    tier: str
    """Tier name from the profile (``nvlink``, ``network``, ...)."""
    tier_index: int
    """Position of the tier in the profile's list (0 = innermost)."""
    count: int
    """Group members per block of this tier, per block of the tier inside it."""


@dataclass(frozen=True, slots=True)
class MeshSpec:
    """Shape, names and rank layout of an N-D device mesh.

    >>> MeshSpec((2, 4, 8)).dim_names
    ('d0', 'd1', 'd2')
    >>> MeshSpec.from_text("8x8", "dp,tp").shape
    (8, 8)
    """

    shape: tuple[int, ...]
    """Size of every mesh dim."""
    dim_names: tuple[str, ...] = ()
    """Name of every mesh dim; default ``d0, d1, ...``."""
    strides: tuple[int, ...] = ()
    """Stride of every mesh dim in the global rank space; default row-major."""

    def __post_init__(self) -> None:
        try:
            shape = tuple(int(s) for s in self.shape)
        except (TypeError, ValueError):
            raise MeshError(f"shape: expected a tuple of ints, got {self.shape!r}") from None
        if not shape or any(s <= 0 for s in shape):
            raise MeshError(f"shape: mesh dim sizes must be positive, got {shape}")
        object.__setattr__(self, "shape", shape)
        names = tuple(self.dim_names) or tuple(f"d{i}" for i in range(len(shape)))
        if len(names) != len(shape):
            raise MeshError(f"dim_names: {len(names)} names for a {len(shape)}-D mesh")
        if len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
            raise MeshError(f"dim_names: must be distinct non-empty strings, got {names}")
        object.__setattr__(self, "dim_names", names)
        strides = tuple(self.strides) or _row_major(shape)
        if len(strides) != len(shape) or any(int(s) <= 0 for s in strides):
            raise MeshError(f"strides: need {len(shape)} positive strides, got {strides}")
        strides = tuple(int(s) for s in strides)
        ranks = _group_ranks(shape, strides, tuple(range(len(shape))))
        if sorted(ranks) != list(range(math.prod(shape))):
            raise MeshError(
                f"strides: {strides} do not number the ranks of a {shape} mesh 0..{math.prod(shape) - 1} once each"
            )
        object.__setattr__(self, "strides", strides)

    @classmethod
    def from_text(cls, shape: str, dim_names: str | None = None) -> "MeshSpec":
        """Parse the command-line forms ``8x8`` and ``dp,tp``."""
        try:
            sizes = tuple(int(s) for s in shape.lower().split("x"))
        except ValueError:
            raise MeshError(f"mesh: expected sizes like 8x8, got {shape!r}") from None
        names = tuple(n.strip() for n in dim_names.split(",")) if dim_names else ()
        return cls(sizes, names)

    @classmethod
    def from_rank_order(
        cls, shape: Sequence[int], dim_names: Sequence[str], inner_to_outer: Sequence[str]
    ) -> "MeshSpec":
        """Mesh whose rank layout puts ``inner_to_outer[0]`` innermost (stride 1):
        the user's mapping of mesh dims onto tiers.

        >>> MeshSpec.from_rank_order((2, 4), ("dp", "tp"), ("dp", "tp")).strides
        (1, 2)
        """
        names = tuple(dim_names)
        if sorted(inner_to_outer) != sorted(names):
            raise MeshError(f"inner_to_outer: must list every mesh dim once, got {tuple(inner_to_outer)}")
        strides = [0] * len(names)
        stride = 1
        for name in inner_to_outer:
            k = names.index(name)
            strides[k] = stride
            stride *= shape[k]
        return cls(tuple(shape), names, tuple(strides))

    @property
    def ndim(self) -> int:
        """Number of mesh dims."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of ranks."""
        return math.prod(self.shape)

    def dim_index(self, dim: int | str) -> int:
        """Mesh dim index from an index or a name."""
        if isinstance(dim, str):
            if dim not in self.dim_names:
                raise MeshError(f"mesh dim {dim!r} not in {self.dim_names}")
            return self.dim_names.index(dim)
        if not 0 <= dim < self.ndim:
            raise MeshError(f"mesh dim {dim} out of range for a {self.ndim}-D mesh")
        return dim

    def group_size(self, mesh_dims: Sequence[int]) -> int:
        """Number of members of the group over ``mesh_dims``."""
        return math.prod(self.shape[d] for d in mesh_dims)

    def rank(self, coord: Sequence[int]) -> int:
        """Global rank of a mesh coordinate."""
        return sum(c * s for c, s in zip(coord, self.strides))

    def group_ranks(self, mesh_dims: Sequence[int]) -> tuple[int, ...]:
        """Global ranks of the group over ``mesh_dims`` that contains rank 0, in
        flat (lexicographic) member order."""
        return _group_ranks(self.shape, self.strides, tuple(mesh_dims))

    def can_flatten(self, mesh_dims: Sequence[int]) -> bool:
        """Whether DeviceMesh can flatten these mesh dims into one process group
        (module docstring). A single mesh dim always can."""
        dims = tuple(mesh_dims)
        if not dims or list(dims) != sorted(set(dims)) or not all(0 <= d < self.ndim for d in dims):
            return False
        return _can_flatten(self.shape, self.strides, dims)

    def tier_factors(self, mesh_dims: Sequence[int], profile: "HardwareProfile") -> tuple[TierFactor, ...]:
        """How the members of a group spread over the profile's tiers, innermost
        first, counts > 1 only (module docstring). Empty for a 1-member group.

        >>> from hw_profiles import load
        >>> [(f.tier, f.count) for f in MeshSpec((8, 8)).tier_factors((0, 1), load("h100-sxm-80gb"))]
        [('nvlink', 8), ('network', 8)]
        """
        block_ranks = tuple(t.ranks for t in profile.interconnect)
        names = tuple(t.tier for t in profile.interconnect)
        counts = _tier_counts(self.shape, self.strides, tuple(mesh_dims), block_ranks)
        return tuple(
            TierFactor(names[i], i, c) for i, c in enumerate(counts) if c > 1
        )

    def dim_tier(self, mesh_dim: int, profile: "HardwareProfile") -> str:
        """Name of the outermost tier a single mesh dim's groups cross."""
        factors = self.tier_factors((mesh_dim,), profile)
        return factors[-1].tier if factors else profile.interconnect[0].tier

    def to_dict(self) -> dict[str, list]:
        """``{"shape": [...], "dim_names": [...]}`` (plus ``strides`` when not row-major)."""
        out: dict[str, list] = {"shape": list(self.shape), "dim_names": list(self.dim_names)}
        if self.strides != _row_major(self.shape):
            out["strides"] = list(self.strides)
        return out


def _row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    acc = 1
    for m in reversed(shape):
        strides.append(acc)
        acc *= m
    return tuple(reversed(strides))


@lru_cache(maxsize=4096)
def _group_ranks(shape: tuple[int, ...], strides: tuple[int, ...], dims: tuple[int, ...]) -> tuple[int, ...]:
    ranks = [0]
    for d in dims:
        ranks = [r + c * strides[d] for r in ranks for c in range(shape[d])]
    return tuple(ranks)


@lru_cache(maxsize=4096)
def _can_flatten(shape: tuple[int, ...], strides: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    modes = [(shape[d], strides[d]) for d in dims if shape[d] > 1]
    # Strides must not increase left to right (DeviceMesh: "ascending order").
    if any(a[1] < b[1] for a, b in zip(modes, modes[1:])):
        return False
    # No overlap: each stride is a multiple of the next one's span.
    return all(a[1] % (b[1] * b[0]) == 0 for a, b in zip(modes, modes[1:]))


@lru_cache(maxsize=4096)
def _tier_counts(
    shape: tuple[int, ...], strides: tuple[int, ...], dims: tuple[int, ...], block_ranks: tuple[int | None, ...]
) -> tuple[int, ...]:
    ranks = _group_ranks(shape, strides, dims)
    n = len(ranks)
    blocks = [len({r // b for r in ranks}) if b else 1 for b in block_ranks]
    counts = []
    inner = 1  # members per block of the previous (inner) tier
    for b in blocks:
        per_block = max(1, n // b)
        counts.append(max(1, per_block // inner))
        inner = per_block
    return tuple(counts)
