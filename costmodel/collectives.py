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

Published curves. A collective entry may carry ``bus_bandwidth`` curves
(nccl-tests' bus bandwidth ``B(S)`` over message size for a group of ``m``
ranks on the tier). A stage of ``n`` ranks on such a tier then takes

    t = f_kind(n) * S / B_n(S),  f = 2(n-1)/n (all_reduce), (n-1)/n (all_gather,
                                 reduce_scatter, all_to_all), 1 (permute)

with ``B_n(S)`` interpolated linearly in log-log between a curve's points,
its bandwidth held beyond the largest size and its time held below the
smallest (latency-bound); for ``n`` between two curves' ranks ``log B`` is
interpolated in ``log n``, outside them the nearest curve's busbw is used
(busbw is the figure that nccl-tests normalises to compare group sizes).
The curve's time includes the stage's latency: a collective priced only by
curves pays no separate ``alpha_s``, and an all_reduce priced by curves does
not take the tree alternative (the curve is already NCCL's best choice).

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

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

from costmodel.mesh import MeshSpec, TierFactor
from hw_profiles import HardwareProfile
from hw_profiles.profile import COLLECTIVE_KINDS, BusBandwidthCurve, CollectiveFit, Tier

__all__ = [
    "COLLECTIVE_KINDS",
    "CollectiveError",
    "Stage",
    "CollectiveCost",
    "tier_time_s",
    "latency_part_s",
    "curve_time_s",
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
    """``ring``, ``tree``, ``hierarchical``, ``pairwise``, ``p2p``, ``measured
    curve`` (a published bus-bandwidth curve) or ``none``."""
    latency_s: float
    """Call latency ``A``."""
    stages: tuple[Stage, ...]
    total_s: float


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor: bytes a rank moves per byte of ``S``.

    >>> bus_factor("all_reduce", 8), bus_factor("all_gather", 4)
    (1.75, 0.75)
    """
    if kind == "permute":
        return 1.0
    share = (n - 1) / n
    return 2.0 * share if kind == "all_reduce" else share


def _log_interp(points: Sequence[tuple[float, float]], x: float) -> float:
    """Linear in log-log between points; the end values beyond them."""
    if x <= points[0][0]:
        return points[0][1]
    if x >= points[-1][0]:
        return points[-1][1]
    lx = math.log(x)
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            w = (lx - math.log(x0)) / (math.log(x1) - math.log(x0))
            return math.exp(math.log(y0) + w * (math.log(y1) - math.log(y0)))
    return points[-1][1]  # unreachable


def _curve_seconds(curve: BusBandwidthCurve, kind: str, n: int, nbytes: float) -> float:
    """Seconds at ``nbytes`` on one curve used for ``n`` ranks (its time held
    below its smallest size)."""
    size = max(nbytes, curve.points[0][0])
    return bus_factor(kind, n) * size / _log_interp(curve.points, size)


def curve_time_s(kind: str, nbytes: float, n: int, fit: CollectiveFit) -> float | None:
    """Seconds of ``kind`` over ``n`` ranks from ``fit``'s published
    bus-bandwidth curves (module docstring), or None when it has none.

    >>> from hw_profiles import BusBandwidthCurve, CollectiveFit
    >>> fit = CollectiveFit(1e-5, 1e-12, bus_bandwidth=(BusBandwidthCurve(8, ((1e3, 1e8), (1e9, 4e11))),))
    >>> round(curve_time_s("all_reduce", 1e9, 8, fit) * 1e3, 3)  # ms: 1.75 * 1 GB / 400 GB/s
    4.375
    >>> curve_time_s("all_reduce", 0, 8, fit) == curve_time_s("all_reduce", 1e3, 8, fit)
    True
    """
    curves = fit.bus_bandwidth
    if not curves or n <= 1:
        return None
    below = [c for c in curves if c.ranks <= n]
    above = [c for c in curves if c.ranks >= n]
    lo = below[-1] if below else above[0]
    hi = above[0] if above else below[-1]
    if lo is hi:
        return _curve_seconds(lo, kind, n, nbytes)
    w = (math.log(n) - math.log(lo.ranks)) / (math.log(hi.ranks) - math.log(lo.ranks))
    t_lo, t_hi = _curve_seconds(lo, kind, n, nbytes), _curve_seconds(hi, kind, n, nbytes)
    return math.exp(math.log(t_lo) + w * (math.log(t_hi) - math.log(t_lo)))


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
    from_curve = curve_time_s(kind, nbytes, 2 if kind == "permute" else n, fit)
    if from_curve is not None:
        return from_curve
    if kind == "permute":
        return fit.alpha_s + fit.beta_s_per_byte * nbytes
    if kind == "all_reduce":
        ring = fit.alpha_s + _ring_stage(fit, n, nbytes, 2.0)
        tree = fit.alpha_s + 2 * fit.alpha_per_step_s * _tree_steps(n) + 2 * fit.beta_s_per_byte * nbytes
        return {"ring": ring, "tree": tree}.get(algorithm, min(ring, tree))
    return fit.alpha_s + _ring_stage(fit, n, nbytes)


def latency_part_s(kind: str, nbytes: float, n: int, tier: Tier) -> float:
    """The part of :func:`tier_time_s` its latency terms make: the same algorithm (ring or
    tree for all_reduce, as priced at ``nbytes``) with the bandwidth terms at 0. A profile
    correction fits latency and bandwidth ratios apart on it (``hw_profiles.correction``).

    >>> from hw_profiles import load
    >>> loop = load("cpu-gloo").interconnect[0]
    >>> 0 < latency_part_s("all_gather", 2**20, 4, loop) < tier_time_s("all_gather", 2**20, 4, loop)
    True
    """
    algorithm = "auto"
    if kind == "all_reduce":
        ring = tier_time_s(kind, nbytes, n, tier, algorithm="ring")
        algorithm = "ring" if ring <= tier_time_s(kind, nbytes, n, tier, algorithm="tree") else "tree"
    latency_only = dataclasses.replace(tier, collectives=tuple(
        (k, dataclasses.replace(f, beta_s_per_byte=0.0, bus_bandwidth=())) for k, f in tier.collectives))
    return tier_time_s(kind, nbytes, n, latency_only, algorithm=algorithm)


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
    curved = [bool(fit.bus_bandwidth) for fit in fits]
    # a stage priced by a curve carries its own latency (module docstring)
    latency = max((fit.alpha_s for fit, c in zip(fits, curved) if not c), default=0.0)
    stages: list[Stage] = []
    inner = 1

    def stage_s(fit: CollectiveFit, stage_kind: str, count: int, part: float, factor: float = 1.0) -> float:
        from_curve = curve_time_s(stage_kind, part, count, fit)
        return from_curve if from_curve is not None else _ring_stage(fit, count, part, factor)

    if kind == "permute":  # pairs cross the outermost tier of the group
        f, fit = factors[-1], fits[-1]
        from_curve = curve_time_s(kind, nbytes, 2, fit)
        if from_curve is not None:
            return CollectiveCost(kind, nbytes, n, "measured curve", 0.0, (Stage(f.tier, 2, nbytes, from_curve),),
                                  from_curve)
        seconds = fit.beta_s_per_byte * nbytes
        return CollectiveCost(kind, nbytes, n, "p2p", fit.alpha_s, (Stage(f.tier, 2, nbytes, seconds),), fit.alpha_s + seconds)
    if len(factors) == 1 and curved[0]:
        f = factors[0]
        seconds = curve_time_s(kind, nbytes, f.count, fits[0])
        return CollectiveCost(kind, nbytes, n, "measured curve", 0.0, (Stage(f.tier, f.count, nbytes, seconds),),
                              seconds)
    if kind in ("all_gather", "reduce_scatter"):
        for f, fit in zip(factors, fits):
            part = nbytes / inner
            stages.append(Stage(f.tier, f.count, part, stage_s(fit, kind, f.count, part)))
            inner *= f.count
        algorithm = "hierarchical"
    elif kind == "all_to_all":  # curves are per group; a flattened all_to_all stays alpha-beta
        latency = max(fit.alpha_s for fit in fits)
        for f, fit in zip(factors, fits):
            peers = inner * f.count - inner
            seconds = fit.alpha_per_step_s * peers + fit.beta_s_per_byte * nbytes * peers / n
            stages.append(Stage(f.tier, f.count, nbytes * peers / n, seconds))
            inner *= f.count
        algorithm = "pairwise"
    else:  # all_reduce
        for f, fit in zip(factors[:-1], fits[:-1]):
            part = nbytes / inner
            stages.append(Stage(f.tier, f.count, part, stage_s(fit, kind, f.count, part, 2.0)))
            inner *= f.count
        outer, outer_fit = factors[-1], fits[-1]
        part = nbytes / inner
        from_curve = curve_time_s(kind, part, outer.count, outer_fit)
        ring = _ring_stage(outer_fit, outer.count, part, 2.0)
        tree = 2 * outer_fit.alpha_per_step_s * _tree_steps(outer.count) + 2 * outer_fit.beta_s_per_byte * part
        stages.append(Stage(outer.tier, outer.count, part, from_curve if from_curve is not None else min(ring, tree)))
        hier_total = latency + sum(s.seconds for s in stages)
        if not any(curved):
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
    >>> round(t * 1e6)  # microseconds, 8 MiB over 8 NVLink GPUs (published: busbw 172 GB/s)
    85
    """
    return collective_cost(kind, nbytes, mesh_dims, mesh, profile).total_s
