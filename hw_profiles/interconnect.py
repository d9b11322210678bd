"""The interconnect of a hardware profile: tiers of ranks, the alpha-beta figures of each
collective kind on a tier, and published bus-bandwidth curves (``hw_profiles.profile`` reads
and writes them; ``costmodel.collectives`` prices with them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from hw_profiles.fields import Citation, curve_points, put_source, source_of

__all__ = ["BusBandwidthCurve", "CollectiveFit", "Tier"]


@dataclass(frozen=True, slots=True)
class BusBandwidthCurve:
    """Bus bandwidth of one collective kind over message size, for a group
    of ``ranks`` ranks on one tier, as nccl-tests reports it (``busbw`` =
    ``S / t`` times 2(n-1)/n for all_reduce, (n-1)/n for all_gather,
    reduce_scatter and all_to_all, 1 for permute; ``S`` the per-rank buffer
    of ``costmodel.collectives``)."""

    ranks: int
    points: tuple[tuple[float, float], ...]
    """``(bytes, bus bandwidth in B/s)``, ascending bytes."""
    source: "str | Citation | None" = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "BusBandwidthCurve":
        return cls(ranks=int(data["ranks"]), points=curve_points(data["points"]), source=source_of(data))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ranks": self.ranks, "points": [list(p) for p in self.points]}
        put_source(out, self.source)
        return out


@dataclass(frozen=True, slots=True)
class CollectiveFit:
    """Alpha-beta figures of one collective kind on one tier."""

    alpha_s: float
    """Fixed latency of one call, seconds."""
    beta_s_per_byte: float
    """Seconds per byte of per-rank wire traffic (1 / bus bandwidth)."""
    alpha_per_step_s: float = 0.0
    """Latency of one algorithm step (ring hop, tree level), seconds."""
    source: "str | Citation | None" = None
    """Where the figures come from."""
    bus_bandwidth: tuple[BusBandwidthCurve, ...] = ()
    """Published bus bandwidth over size per group size (ascending ranks);
    where one applies it replaces the alpha-beta formula."""

    def curve_for(self, ranks: int) -> BusBandwidthCurve | None:
        """The bus-bandwidth curve measured with exactly ``ranks`` ranks."""
        for curve in self.bus_bandwidth:
            if curve.ranks == ranks:
                return curve
        return None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CollectiveFit":
        return cls(
            alpha_s=float(data["alpha_s"]),
            beta_s_per_byte=float(data["beta_s_per_byte"]),
            alpha_per_step_s=float(data.get("alpha_per_step_s", 0.0)),
            source=source_of(data),
            bus_bandwidth=tuple(BusBandwidthCurve.from_dict(c) for c in data.get("bus_bandwidth", ())),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"alpha_s": self.alpha_s, "beta_s_per_byte": self.beta_s_per_byte}
        if self.alpha_per_step_s:
            out["alpha_per_step_s"] = self.alpha_per_step_s
        put_source(out, self.source)
        if self.bus_bandwidth:
            out["bus_bandwidth"] = [c.to_dict() for c in self.bus_bandwidth]
        return out


@dataclass(frozen=True, slots=True)
class Tier:
    """One interconnect tier: which ranks share it and what collectives cost."""

    tier: str
    """Name (``nvlink``, ``xgmi``, ``network``, ``loopback``)."""
    ranks: int | None
    """Consecutive global ranks sharing this tier; None for the outermost."""
    collectives: tuple[tuple[str, CollectiveFit], ...]
    """Figures per collective kind (``COLLECTIVE_KINDS``)."""
    bandwidth_Bps: float | None = None
    """Per-rank, per-direction link bandwidth (datasheet), for reference."""
    source: "str | Citation | None" = None
    """Source of ``ranks`` and ``bandwidth_Bps``."""

    def collective(self, kind: str) -> CollectiveFit:
        """Figures for ``kind``; a kind the tier does not list uses all_reduce's
        (a measured profile may carry all_reduce only)."""
        for name, fit in self.collectives:
            if name == kind:
                return fit
        for name, fit in self.collectives:
            if name == "all_reduce":
                return fit
        return self.collectives[0][1]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Tier":
        return cls(
            tier=str(data["tier"]),
            ranks=None if data.get("ranks") is None else int(data["ranks"]),
            collectives=tuple(
                (k, CollectiveFit.from_dict(v)) for k, v in data["collectives"].items()
            ),
            bandwidth_Bps=None if data.get("bandwidth_Bps") is None else float(data["bandwidth_Bps"]),
            source=source_of(data),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tier": self.tier, "ranks": self.ranks}
        if self.bandwidth_Bps is not None:
            out["bandwidth_Bps"] = self.bandwidth_Bps
        out["collectives"] = {k: v.to_dict() for k, v in self.collectives}
        put_source(out, self.source)
        return out
