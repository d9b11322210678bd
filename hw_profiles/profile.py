"""The ``autoshard.hw_profile/1`` data model: frozen dataclasses with
``from_dict`` / ``to_dict`` that round-trip the JSON files of ``data/``.

A profile describes ONE device kind and the interconnect tiers between devices:

* ``device``: datasheet peak FLOP/s per dtype (matrix units; ``fp32`` is the
  non-tensor FP32 rate), HBM capacity and bandwidth, the kernel launch floor and
  efficiency curves (``matmul`` / ``attention``: points ``[flops, fraction of
  peak]`` interpolated in log(flops); ``memory``: fraction of HBM bandwidth,
  one number or points ``[working-set bytes, fraction]``; optional ``vector``:
  fraction of the fp32 peak reached by elementwise FLOPs);
* ``interconnect``: tiers from the innermost (``ranks`` = number of consecutive
  global ranks that share it, e.g. 8 on one NVLink domain) to the outermost
  (``ranks`` = null). Every tier has alpha-beta figures per collective kind
  (``costmodel.collectives`` gives the formulas): ``alpha_s`` (fixed latency per
  call), ``alpha_per_step_s`` (latency per algorithm step, optional, default 0)
  and ``beta_s_per_byte`` (inverse bus bandwidth per rank).

Figures come with their source: ``device.sources`` maps a device field to its
source, every tier and every collective entry carries a ``source`` string.

Optional ``overlap``: how well a collective in flight hides behind compute on
this hardware (``costmodel.overlap``): ``contention`` in ``[0, 1]``, 0 when
the collective runs on its own engines (GPUs: copy engines and NICs; the
default when the key is absent), 1 when it needs the same resource as compute
and overlap gains nothing (a CPU process group whose ranks share cores), with
its ``source``.

>>> p = HardwareProfile.from_dict(_EXAMPLE)
>>> p.device.peak_flops_for("bf16"), p.interconnect[0].collective("all_gather").alpha_s
(989000000000000.0, 1e-05)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = [
    "FORMAT",
    "COLLECTIVE_KINDS",
    "DTYPE_ALIASES",
    "CollectiveFit",
    "Tier",
    "Efficiency",
    "DeviceSpec",
    "Calibration",
    "Overlap",
    "HardwareProfile",
]

FORMAT = "autoshard.hw_profile/1"
COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "permute")

# torch dtype names and short names -> the keys used in ``peak_flops``.
DTYPE_ALIASES = {
    "bfloat16": "bf16", "torch.bfloat16": "bf16", "bf16": "bf16",
    "float16": "fp16", "torch.float16": "fp16", "half": "fp16", "fp16": "fp16",
    "float32": "fp32", "torch.float32": "fp32", "float": "fp32", "fp32": "fp32",
    "tf32": "tf32",
    "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "torch.float8_e4m3fn": "fp8", "fp8": "fp8",
    "float64": "fp64", "torch.float64": "fp64", "double": "fp64", "fp64": "fp64",
}


def _pairs(mapping: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple((str(k), v) for k, v in mapping.items())


@dataclass(frozen=True, slots=True)
class CollectiveFit:
    """Alpha-beta figures of one collective kind on one tier."""

    alpha_s: float
    """Fixed latency of one call, seconds."""
    beta_s_per_byte: float
    """Seconds per byte of per-rank wire traffic (1 / bus bandwidth)."""
    alpha_per_step_s: float = 0.0
    """Latency of one algorithm step (ring hop, tree level), seconds."""
    source: str | None = None
    """Where the figures come from."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CollectiveFit":
        return cls(
            alpha_s=float(data["alpha_s"]),
            beta_s_per_byte=float(data["beta_s_per_byte"]),
            alpha_per_step_s=float(data.get("alpha_per_step_s", 0.0)),
            source=data.get("source"),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"alpha_s": self.alpha_s, "beta_s_per_byte": self.beta_s_per_byte}
        if self.alpha_per_step_s:
            out["alpha_per_step_s"] = self.alpha_per_step_s
        if self.source is not None:
            out["source"] = self.source
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
    source: str | None = None
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
            source=data.get("source"),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tier": self.tier, "ranks": self.ranks}
        if self.bandwidth_Bps is not None:
            out["bandwidth_Bps"] = self.bandwidth_Bps
        out["collectives"] = {k: v.to_dict() for k, v in self.collectives}
        if self.source is not None:
            out["source"] = self.source
        return out


@dataclass(frozen=True, slots=True)
class Efficiency:
    """Achievable fraction of peak: curves over FLOPs for matrix work; for
    memory-bound work one fraction of ``memory_bandwidth_Bps`` or a curve over
    the working set (bytes read plus written), since a working set that fits
    a cache (CPU caches, a GPU's L2) streams faster than one that does not.

    >>> Efficiency(matmul=((1e9, 0.5),), memory=((4096.0, 0.4), (1e9, 0.1))).memory_curve[-1]
    (1000000000.0, 0.1)
    >>> Efficiency(matmul=((1e9, 0.5),), memory=0.85).memory_curve
    ((1.0, 0.85),)
    """

    matmul: tuple[tuple[float, float], ...]
    """Points ``(flops, fraction)``, ascending flops."""
    memory: float | tuple[tuple[float, float], ...]
    """Fraction of ``memory_bandwidth_Bps`` reached by streaming kernels: one
    number, or points ``(working-set bytes, fraction)``, ascending bytes."""
    attention: tuple[tuple[float, float], ...] = ()
    """Like ``matmul`` for fused attention; empty = use ``matmul``."""
    vector: float | None = None
    """Fraction of the fp32 peak reached by elementwise and reduction FLOPs
    (exp, tanh, normalisations: vector units, not matrix units); None = the
    memory efficiency, as datasheet profiles price them."""

    @property
    def memory_curve(self) -> tuple[tuple[float, float], ...]:
        """``memory`` as curve points (a single fraction is a one-point curve,
        i.e. the same fraction at every working-set size)."""
        if isinstance(self.memory, tuple):
            return self.memory
        return ((1.0, float(self.memory)),)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Efficiency":
        memory = data["memory"]
        return cls(
            matmul=tuple((float(f), float(e)) for f, e in data["matmul"]),
            memory=tuple((float(b), float(e)) for b, e in memory) if isinstance(memory, (list, tuple)) else float(memory),
            attention=tuple((float(f), float(e)) for f, e in data.get("attention", ())),
            vector=None if data.get("vector") is None else float(data["vector"]),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"matmul": [list(p) for p in self.matmul]}
        if self.attention:
            out["attention"] = [list(p) for p in self.attention]
        out["memory"] = [list(p) for p in self.memory] if isinstance(self.memory, tuple) else self.memory
        if self.vector is not None:
            out["vector"] = self.vector
        return out


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """One accelerator (or CPU process, for ``cpu-gloo``)."""

    name: str
    memory_bytes: int
    peak_flops: tuple[tuple[str, float], ...]
    """Peak FLOP/s per dtype key (``bf16``, ``fp16``, ``fp32``, ``tf32``, ``fp8``...)."""
    memory_bandwidth_Bps: float
    launch_s: float
    """Floor on the time of any kernel (launch and framework overhead)."""
    efficiency: Efficiency
    sources: tuple[tuple[str, str], ...] = ()
    """Device field -> source of its figure."""

    def peak_flops_for(self, dtype: str) -> float:
        """Peak FLOP/s for a dtype (torch or short name); unknown dtypes raise
        ``KeyError`` naming the dtypes the profile has."""
        key = DTYPE_ALIASES.get(str(dtype), str(dtype))
        for name, value in self.peak_flops:
            if name == key:
                return value
        raise KeyError(
            f"device.peak_flops: no figure for dtype {dtype!r} "
            f"(profile has {', '.join(n for n, _ in self.peak_flops)})"
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "DeviceSpec":
        return cls(
            name=str(data["name"]),
            memory_bytes=int(data["memory_bytes"]),
            peak_flops=tuple((k, float(v)) for k, v in data["peak_flops"].items()),
            memory_bandwidth_Bps=float(data["memory_bandwidth_Bps"]),
            launch_s=float(data["launch_s"]),
            efficiency=Efficiency.from_dict(data["efficiency"]),
            sources=_pairs(data.get("sources", {})),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "memory_bytes": self.memory_bytes,
            "peak_flops": dict(self.peak_flops),
            "memory_bandwidth_Bps": self.memory_bandwidth_Bps,
            "launch_s": self.launch_s,
            "efficiency": self.efficiency.to_dict(),
        }
        if self.sources:
            out["sources"] = dict(self.sources)
        return out


@dataclass(frozen=True, slots=True)
class Calibration:
    """How and where a profile's figures were obtained."""

    date: str | None = None
    host: str | None = None
    torch: str | None = None
    method: str | None = None
    fit_error: tuple[tuple[str, float], ...] = ()
    """Relative error of each fit over the points it was fitted on (e.g.
    ``loopback.all_reduce``: 0.08; measured profiles store the largest)."""
    ranks: int | None = None
    """Ranks of the job the figures were measured in (a measured device is
    one rank of such a job: ranks sharing a host share its cores)."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Calibration":
        return cls(
            date=data.get("date"),
            host=data.get("host"),
            torch=data.get("torch"),
            method=data.get("method"),
            fit_error=tuple((k, float(v)) for k, v in data.get("fit_error", {}).items()),
            ranks=None if data.get("ranks") is None else int(data["ranks"]),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"date": self.date, "host": self.host, "torch": self.torch}
        if self.method is not None:
            out["method"] = self.method
        if self.ranks is not None:
            out["ranks"] = self.ranks
        out["fit_error"] = dict(self.fit_error)
        return out


@dataclass(frozen=True, slots=True)
class Overlap:
    """How a collective in flight slows the compute beside it (module docstring)."""

    contention: float = 0.0
    """0: full overlap; 1: overlap gains nothing (``costmodel.overlap``)."""
    source: str = ""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Overlap":
        return cls(float(data["contention"]), str(data.get("source", "")))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"contention": self.contention}
        if self.source:
            out["source"] = self.source
        return out


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    """A whole ``autoshard.hw_profile/1`` file."""

    name: str
    source: str
    """``datasheet`` or ``measured``."""
    device: DeviceSpec
    interconnect: tuple[Tier, ...]
    """Innermost tier first; the last one has ``ranks`` None."""
    calibration: Calibration = Calibration()
    format: str = FORMAT
    overlap: Overlap | None = None
    """None: the file has no ``overlap`` key (full overlap, :attr:`contention` 0)."""

    @property
    def contention(self) -> float:
        """The overlap contention factor (0 when the profile gives none)."""
        return 0.0 if self.overlap is None else self.overlap.contention

    def __hash__(self) -> int:
        # Profiles key the planner's caches; hashing the whole tree on every
        # lookup is slow. Equal profiles have equal headline figures, so this
        # hash agrees with the generated __eq__.
        return hash((self.name, self.device.memory_bandwidth_Bps, self.device.launch_s, len(self.interconnect)))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "HardwareProfile":
        """Build from a dict already checked by ``hw_profiles.validate``."""
        return cls(
            name=str(data["name"]),
            source=str(data["source"]),
            device=DeviceSpec.from_dict(data["device"]),
            interconnect=tuple(Tier.from_dict(t) for t in data["interconnect"]),
            calibration=Calibration.from_dict(data.get("calibration", {})),
            format=str(data["format"]),
            overlap=None if data.get("overlap") is None else Overlap.from_dict(data["overlap"]),
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, key for key as in DESIGN.md."""
        return {
            "format": self.format,
            "name": self.name,
            "source": self.source,
            "device": self.device.to_dict(),
            "interconnect": [t.to_dict() for t in self.interconnect],
            "calibration": self.calibration.to_dict(),
            # written only when given, so that profiles without it keep their fingerprints
            **({"overlap": self.overlap.to_dict()} if self.overlap is not None else {}),
        }

    def tier(self, name: str) -> Tier:
        """The tier called ``name``."""
        for t in self.interconnect:
            if t.tier == name:
                return t
        raise KeyError(f"interconnect: no tier {name!r} (profile has {[t.tier for t in self.interconnect]})")

    @property
    def ranks_per_node(self) -> int | None:
        """Ranks of the innermost tier (GPUs per NVLink / xGMI domain)."""
        return self.interconnect[0].ranks

    @property
    def fingerprint(self) -> str:
        """``name@sha256:<hex>`` of the canonical JSON, for plan fingerprints."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return f"{self.name}@sha256:{hashlib.sha256(text.encode()).hexdigest()}"


_EXAMPLE: dict[str, Any] = {
    "format": FORMAT,
    "name": "example",
    "source": "datasheet",
    "device": {
        "name": "example", "memory_bytes": 85899345920, "peak_flops": {"bf16": 9.89e14},
        "memory_bandwidth_Bps": 3.35e12, "launch_s": 5e-6,
        "efficiency": {"matmul": [[1e9, 0.35], [1e12, 0.75]], "memory": 0.85},
    },
    "interconnect": [
        {"tier": "nvlink", "ranks": 8, "collectives": {"all_reduce": {"alpha_s": 1e-5, "beta_s_per_byte": 3.3e-12}}},
        {"tier": "network", "ranks": None, "collectives": {"all_reduce": {"alpha_s": 3e-5, "beta_s_per_byte": 2.5e-11}}},
    ],
}
