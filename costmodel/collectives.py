"""Communication time of one collective on a group of mesh dims: alpha-beta per
collective kind and interconnect tier, hierarchical over tiers.

Buffer size ``S`` (the ``nbytes`` argument), per rank:

===============  =============================================
all_gather       output of one rank (the gathered tensor)
reduce_scatter   input of one rank (before scattering)
all_reduce       input (= output) of one rank
all_to_all       input of one rank (all chunks it sends, its own included)
permute          the buffer one rank sends (= receives)
===============  =============================================

For uneven shards pass the largest rank's buffer (collectives pad to it).

One tier, ``n`` ranks, figures ``a`` (``alpha_s``, per call), ``h``
(``alpha_per_step_s``, per algorithm step) and ``b`` (``beta_s_per_byte``, the
inverse bus bandwidth):

    all_gather, reduce_scatter (ring):  a + h (n-1)       + b S (n-1)/n
    all_reduce, ring:                   a + 2h (n-1)      + 2b S (n-1)/n
    all_reduce, tree:                   a + 2h ceil(log2 n) + 2b S
    all_to_all (pairwise):              a + h (n-1)       + b S (n-1)/n
    permute (one send, one receive):    a                 + b S

``all_reduce`` takes the cheaper of ring and tree (tree wins on small buffers
and many ranks, ring on large buffers). A group of one rank costs 0.

Hierarchy. A group over mesh dims spans tiers with factors ``n_0, n_1, ...``
(innermost first, ``costmodel.mesh``; ``n = prod n_i``). One collective on the
flattened group pays one call latency ``A = max_i a_i`` and, per tier, the steps
and bytes of the stage that runs on it (``S_i = S / (n_0 ... n_{i-1})``, what a
rank still moves once the inner tiers have done their part):

    all_gather:      A + sum_i [h_i (n_i - 1) + b_i S_i (n_i - 1)/n_i]
    reduce_scatter:  same stages, inner tier first
    all_reduce:      min of
                     (hierarchical) A + sum_{i<L} 2[h_i (n_i-1) + b_i S_i (n_i-1)/n_i]
                                      + ring-or-tree all_reduce of S_L on the outer tier L
                                      (reduce_scatter in, all_reduce across, all_gather out)
                     (tree)         A + sum_i 2 h_i ceil(log2 n_i) + 2 S max_i b_i
    all_to_all:      A + sum_i [h_i p_i + b_i S p_i / n],  p_i = n_0..n_i - n_0..n_{i-1}
                     peers reached through tier i
    permute:         a + b S of the outermost tier crossed

Only the outer tier carries ``S_L``, a fraction ``1/(n_0...)`` of the data: this is
why one all_gather over a flattened 8x8 group (``S(0)S(0) -> RR``) beats
gathering the inner dim and then the outer one, which sends all of ``S`` over the
network.

>>> from hw_profiles import load
>>> from costmodel.mesh import MeshSpec
>>> h100, mesh = load("h100-sxm-80gb"), MeshSpec((8, 8), ("dp", "tp"))
>>> fused = collective_time_s("all_gather", 2**30, (0, 1), mesh, h100)
>>> split = collective_time_s("all_gather", 2**27, (1,), mesh, h100) + collective_time_s("all_gather", 2**30, (0,), mesh, h100)
>>> fused < split
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from costmodel.mesh import MeshSpec, TierFactor
from hw_profiles import HardwareProfile
from hw_profiles.profile import COLLECTIVE_KINDS, CollectiveFit, Tier

__all__ = [
    "COLLECTIVE_KINDS",
    "CollectiveError",
    "Stage",
    "CollectiveCost",
    "tier_time_s",
    "collective_cost",
    "collective_time_s",
]


class CollectiveError(ValueError):
    """Bad arguments to a collective-cost function (names the argument)."""


@dataclass(frozen=True, slots=True)
class Stage:
    """The part of a collective that runs on one tier."""

    tier: str
    ranks: int
    """Group members reached through this tier (the tier factor)."""
    bytes: float
    """Per-rank buffer of this stage (``S_i``)."""
    seconds: float
    """Step latency plus bandwidth time of this stage (call latency excluded)."""


@dataclass(frozen=True, slots=True)
class CollectiveCost:
    """Time of one collective, with its call latency and per-tier stages."""

    kind: str
    bytes: float
    ranks: int
    algorithm: str
    """``ring``, ``tree``, ``hierarchical``, ``pairwise``, ``p2p`` or ``none``."""
    latency_s: float
    """Call latency ``A``."""
    stages: tuple[Stage, ...]
    total_s: float


def _ring_stage(fit: CollectiveFit, n: int, nbytes: float, factor: float = 1.0) -> float:
    """``factor`` times (n-1) steps moving ``(n-1)/n`` of the buffer."""
    return factor * (fit.alpha_per_step_s * (n - 1) + fit.beta_s_per_byte * nbytes * (n - 1) / n)


def _tree_steps(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


def tier_time_s(kind: str, nbytes: float, n: int, tier: Tier, *, algorithm: str = "auto") -> float:
    """Seconds for ``kind`` over ``n`` ranks that all sit on one ``tier``
    (module docstring formulas). ``algorithm`` for all_reduce: ring, tree or auto.

    >>> from hw_profiles import load
    >>> nvlink = load("h100-sxm-80gb").interconnect[0]
    >>> tier_time_s("all_reduce", 0, 1, nvlink)
    0.0
    """
    _check(kind, nbytes)
    if n <= 1:
        return 0.0
    fit = tier.collective(kind)
    if kind == "permute":
        return fit.alpha_s + fit.beta_s_per_byte * nbytes
    if kind == "all_reduce":
        ring = fit.alpha_s + _ring_stage(fit, n, nbytes, 2.0)
        tree = fit.alpha_s + 2 * fit.alpha_per_step_s * _tree_steps(n) + 2 * fit.beta_s_per_byte * nbytes
        return {"ring": ring, "tree": tree}.get(algorithm, min(ring, tree))
    return fit.alpha_s + _ring_stage(fit, n, nbytes)


def _check(kind: str, nbytes: float) -> None:
    if kind not in COLLECTIVE_KINDS:
        raise CollectiveError(f"kind: unknown collective {kind!r} (expected one of {', '.join(COLLECTIVE_KINDS)})")
    if nbytes < 0:
        raise CollectiveError(f"nbytes: must be >= 0, got {nbytes}")


def _hierarchical(
    kind: str, nbytes: float, factors: Sequence[TierFactor], profile: HardwareProfile
) -> CollectiveCost:
    tiers = [profile.interconnect[f.tier_index] for f in factors]
    fits = [t.collective(kind) for t in tiers]
    n = math.prod(f.count for f in factors)
    latency = max(fit.alpha_s for fit in fits)
    stages: list[Stage] = []
    inner = 1
    if kind in ("all_gather", "reduce_scatter"):
        for f, fit in zip(factors, fits):
            part = nbytes / inner
            stages.append(Stage(f.tier, f.count, part, _ring_stage(fit, f.count, part)))
            inner *= f.count
        algorithm = "hierarchical"
    elif kind == "all_to_all":
        for f, fit in zip(factors, fits):
            peers = inner * f.count - inner
            seconds = fit.alpha_per_step_s * peers + fit.beta_s_per_byte * nbytes * peers / n
            stages.append(Stage(f.tier, f.count, nbytes * peers / n, seconds))
            inner *= f.count
        algorithm = "pairwise"
    elif kind == "all_reduce":
        for f, fit in zip(factors[:-1], fits[:-1]):
            part = nbytes / inner
            stages.append(Stage(f.tier, f.count, part, _ring_stage(fit, f.count, part, 2.0)))
            inner *= f.count
        outer, outer_fit = factors[-1], fits[-1]
        part = nbytes / inner
        ring = _ring_stage(outer_fit, outer.count, part, 2.0)
        tree = 2 * outer_fit.alpha_per_step_s * _tree_steps(outer.count) + 2 * outer_fit.beta_s_per_byte * part
        stages.append(Stage(outer.tier, outer.count, part, min(ring, tree)))
        hier_total = latency + sum(s.seconds for s in stages)
        tree_stages = tuple(
            Stage(f.tier, f.count, nbytes, 2 * fit.alpha_per_step_s * _tree_steps(f.count))
            for f, fit in zip(factors, fits)
        )
        tree_total = (
            latency
            + sum(s.seconds for s in tree_stages)
            + 2 * nbytes * max(fit.beta_s_per_byte for fit in fits)
        )
        if tree_total < hier_total:
            return CollectiveCost(kind, nbytes, n, "tree", latency, tree_stages, tree_total)
        algorithm = "hierarchical" if len(factors) > 1 else ("ring" if ring <= tree else "tree")
    else:  # permute: pairs cross the outermost tier of the group
        f, fit = factors[-1], fits[-1]
        seconds = fit.beta_s_per_byte * nbytes
        return CollectiveCost(kind, nbytes, n, "p2p", fit.alpha_s, (Stage(f.tier, 2, nbytes, seconds),), fit.alpha_s + seconds)
    total = latency + sum(s.seconds for s in stages)
    return CollectiveCost(kind, nbytes, n, algorithm, latency, tuple(stages), total)


def collective_cost(
    kind: str,
    nbytes: float,
    mesh_dims: Sequence[int],
    mesh: MeshSpec,
    profile: HardwareProfile,
) -> CollectiveCost:
    """Breakdown of one collective over the (flattened) group of ``mesh_dims``."""
    _check(kind, nbytes)
    dims = tuple(mesh_dims)
    if not dims or any(not 0 <= d < mesh.ndim for d in dims):
        raise CollectiveError(f"mesh_dims: {dims} are not mesh dims of a {mesh.ndim}-D mesh")
    factors = mesh.tier_factors(dims, profile)
    if not factors:
        return CollectiveCost(kind, nbytes, 1, "none", 0.0, (), 0.0)
    return _hierarchical(kind, float(nbytes), factors, profile)


def collective_time_s(
    kind: str,
    nbytes: float,
    mesh_dims: Sequence[int],
    mesh: MeshSpec,
    profile: HardwareProfile,
) -> float:
    """Seconds for one ``kind`` collective with per-rank buffer ``nbytes`` (table
    in the module docstring) over the group of ``mesh_dims`` (several = one
    flattened process group), priced per tier from ``profile``.

    >>> from hw_profiles import load
    >>> from costmodel.mesh import MeshSpec
    >>> t = collective_time_s("all_reduce", 8 * 2**20, (1,), MeshSpec((8, 8)), load("h100-sxm-80gb"))
    >>> round(t * 1e6)  # microseconds, 8 MiB over 8 NVLink GPUs
    55
    """
    return collective_cost(kind, nbytes, mesh_dims, mesh, profile).total_s
