"""The ``autoshard.hw_profile/1`` data model: frozen dataclasses with
``from_dict`` / ``to_dict`` that round-trip the JSON files of ``data/``.

A profile describes ONE device kind and the interconnect tiers between devices
(the tiers' classes live in ``hw_profiles.interconnect``, the calibration record in
``hw_profiles.calibration_record``, curves and citations in ``hw_profiles.fields``;
this module holds the device and the whole profile, and re-exports the rest):

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

Figures come with their source: ``device.sources`` maps a device field (or a
dotted sub-field, ``efficiency.matmul_by_dtype.bf16``) to its source, every
tier and every collective entry carries a ``source``. A source is free text
or a citation: ``source`` one of ``published`` (a measurement someone
published), ``datasheet``, ``measured`` (``autoshard calibrate-hardware``) or
``estimate``, with ``reference`` (URL and which table or figure; required for
``published``) and ``note`` (assumptions, conversions).

Additive fields beyond the example in docs/formats.md (all optional, older profiles
load unchanged and price as before):

* ``efficiency.matmul_by_dtype``: a curve per dtype key (``bf16``, ``fp8``...),
  relative to that dtype's peak; dtypes without one use ``matmul``;
* ``efficiency.attention_backward``: the backward kernel's curve (default:
  ``attention``);
* ``efficiency.run``: points ``[inner run in elements, fraction]``: elementwise,
  reduction and copy kernels whose innermost contiguous run is short
  (transposed or strided operands, broadcasts inside the row, reductions over
  a middle dim) reach this fraction of their contiguous speed;
* ``device.launch_scalar_s``: the floor of an op with a Python-scalar operand
  (wrapped into a tensor on every call; default ``launch_s``);
* ``device.fresh_pages``: ``{"above_bytes", "Bps"}``: an op output of
  ``above_bytes`` or more lands in pages the operating system hands out
  anew on every call, which it faults in and zeroes at ``Bps`` (glibc's
  malloc serves allocations of 32 MiB and more with ``mmap`` and returns
  them on free, so a CPU step pays this for every such tensor; a GPU's
  caching allocator does not: absent there);
* per collective ``bus_bandwidth``: published bus bandwidth over message size
  for a group of ``ranks`` ranks on this tier (nccl-tests' ``busbw``), which
  ``costmodel.collectives`` prefers over alpha-beta where it applies;
* ``calibration.load``: the machine's load around a calibration, and whether
  it ran under foreign load (:class:`LoadRecord`);
* ``efficiency.optimizer``: optimizer implementation (``foreach``, ``fused``)
  -> the fraction of an ordinary elementwise kernel's speed its kernels reach
  (torch's multi-tensor kernels walk fixed chunks of many tensors per launch
  and stream slower than one large elementwise kernel; default 1);
* ``device.step_op_s``: what an op costs inside a training step beyond its
  time alone (seconds; a profile correction measures it on the machine at
  hand, ``hw_profiles.correction``); the strategy graph adds it to every op
  of a step (default 0);
* ``device.step_byte_s``: what a byte an op reads or writes costs inside a
  training step beyond its time alone (seconds per byte: a step's ops find
  their operands cold, an op timed again and again finds them in cache; a
  profile correction measures it); added to every op of a step with its
  bytes (default 0);
* ``device.matmul_byte_s``: what a byte a GEMM reads or writes costs beyond its
  FLOPs (seconds per byte: packing operands into the kernel's panels; thin
  GEMMs, ``16 x 512 x 2048``, run at 0.66-0.83 of a square one's FLOP rate on
  one CPU core); ``costmodel.compute`` adds it times the GEMM's bytes; a
  profile correction measures it (default 0);
* ``device.allocator_headroom``: what the framework's allocator reserves beyond
  the live tensors, as a fraction of them (PyTorch's caching allocator rounds
  and fragments: ``max_memory_reserved`` over ``max_memory_allocated``); the
  solve's default memory limit is :attr:`DeviceSpec.usable_memory_bytes`
  (default 0: the whole memory).

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

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping

from hw_profiles.calibration_record import Calibration, LoadRecord
from hw_profiles.fields import Citation, curve_points
from hw_profiles.interconnect import BusBandwidthCurve, CollectiveFit, Tier

__all__ = [
    "FORMAT",
    "COLLECTIVE_KINDS",
    "DTYPE_ALIASES",
    "Citation",
    "FreshPages",
    "BusBandwidthCurve",
    "CollectiveFit",
    "Tier",
    "Efficiency",
    "DeviceSpec",
    "LoadRecord",
    "Calibration",
    "Overlap",
    "HardwareProfile",
]

SOURCE_KINDS = ("published", "datasheet", "measured", "estimate")
"""What a citation's ``source`` may say (free-text sources are older profiles')."""

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
    >>> Efficiency(matmul=((1e9, 0.5),), memory=0.85, matmul_by_dtype=(("fp8", ((1e9, 0.3),)),)).matmul_curve("fp8")
    ((1000000000.0, 0.3),)
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
    matmul_by_dtype: tuple[tuple[str, tuple[tuple[float, float], ...]], ...] = ()
    """Curves per dtype key, relative to that dtype's peak; others use ``matmul``."""
    attention_backward: tuple[tuple[float, float], ...] = ()
    """Like ``attention`` for the backward kernel; empty = use ``attention``."""
    run: tuple[tuple[float, float], ...] = ()
    """Points ``(inner run in elements, fraction of the contiguous speed)``,
    ascending; empty = no penalty for short runs."""
    optimizer: tuple[tuple[str, float], ...] = ()
    """Optimizer implementation (``foreach``, ``fused``) -> fraction of an
    ordinary elementwise kernel's speed its kernels reach; absent = 1."""
    vector_by_op: tuple[tuple[str, float], ...] = ()
    """aten op (``aten.silu``, ``aten._softmax_backward_data``: the overload
    packet) -> its own ``vector`` fraction. Transcendental and normalisation
    kernels cost several times apart per FLOP as the rules count them (CPU:
    gelu 0.04-0.1 ns, softmax 0.2 ns per counted FLOP), which no single
    fraction prices within 25 %; ops not listed use ``vector``."""

    def vector_fraction(self, op: str | None = None) -> float | None:
        """``op``'s own vector fraction where given (``op``: ``aten.silu`` or
        ``aten.silu.default``), else ``vector``.

        >>> e = Efficiency(matmul=((1e9, 0.5),), memory=0.8, vector=0.1, vector_by_op=(("aten.silu", 0.05),))
        >>> e.vector_fraction("aten.silu.default"), e.vector_fraction("aten.exp.default"), e.vector_fraction()
        (0.05, 0.1, 0.1)
        """
        if op is not None and self.vector_by_op:
            packet = op if op.count(".") < 2 else op.rsplit(".", 1)[0]
            for key, value in self.vector_by_op:
                if key == packet:
                    return value
        return self.vector

    def optimizer_fraction(self, implementation: str) -> float:
        """Speed of ``implementation``'s kernels relative to ordinary elementwise ones (1 when not given)."""
        for key, value in self.optimizer:
            if key == implementation:
                return value
        return 1.0

    @property
    def memory_curve(self) -> tuple[tuple[float, float], ...]:
        """``memory`` as curve points (a single fraction is a one-point curve,
        i.e. the same fraction at every working-set size)."""
        if isinstance(self.memory, tuple):
            return self.memory
        return ((1.0, float(self.memory)),)

    def matmul_curve(self, dtype_key: str) -> tuple[tuple[float, float], ...]:
        """The GEMM curve of a dtype key (``bf16``...): its own, else ``matmul``."""
        for key, curve in self.matmul_by_dtype:
            if key == dtype_key:
                return curve
        return self.matmul

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Efficiency":
        memory = data["memory"]
        return cls(
            matmul=curve_points(data["matmul"]),
            memory=curve_points(memory) if isinstance(memory, (list, tuple)) else float(memory),
            attention=curve_points(data.get("attention", ())),
            vector=None if data.get("vector") is None else float(data["vector"]),
            matmul_by_dtype=tuple((str(k), curve_points(v)) for k, v in data.get("matmul_by_dtype", {}).items()),
            attention_backward=curve_points(data.get("attention_backward", ())),
            run=curve_points(data.get("run", ())),
            optimizer=tuple((str(k), float(v)) for k, v in data.get("optimizer", {}).items()),
            vector_by_op=tuple(sorted((str(k), float(v)) for k, v in data.get("vector_by_op", {}).items())),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"matmul": [list(p) for p in self.matmul]}
        if self.matmul_by_dtype:
            out["matmul_by_dtype"] = {k: [list(p) for p in v] for k, v in self.matmul_by_dtype}
        if self.attention:
            out["attention"] = [list(p) for p in self.attention]
        if self.attention_backward:
            out["attention_backward"] = [list(p) for p in self.attention_backward]
        out["memory"] = [list(p) for p in self.memory] if isinstance(self.memory, tuple) else self.memory
        if self.vector is not None:
            out["vector"] = self.vector
        if self.run:
            out["run"] = [list(p) for p in self.run]
        if self.optimizer:
            out["optimizer"] = dict(self.optimizer)
        if self.vector_by_op:
            out["vector_by_op"] = dict(self.vector_by_op)
        return out


@dataclass(frozen=True, slots=True)
class FreshPages:
    """Outputs of ``above_bytes`` or more get fresh pages from the operating
    system on every call, faulted in and zeroed at ``Bps`` bytes per second.

    >>> round(FreshPages.from_dict({"above_bytes": 2**25, "Bps": 3e9}).seconds((2**24, 2**26)), 4)
    0.0224
    """

    above_bytes: int
    Bps: float

    def seconds(self, output_bytes: "tuple[float, ...] | list[float]") -> float:
        """Time to fault in the outputs (of one op) that reach ``above_bytes``."""
        return sum(b for b in output_bytes if b >= self.above_bytes) / self.Bps

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "FreshPages":
        return cls(above_bytes=int(data["above_bytes"]), Bps=float(data["Bps"]))

    def to_dict(self) -> dict[str, Any]:
        return {"above_bytes": self.above_bytes, "Bps": self.Bps}


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
    sources: tuple[tuple[str, "str | Citation"], ...] = ()
    """Device field (or dotted sub-field) -> source of its figure."""
    launch_scalar_s: float | None = None
    """Floor of an op with a Python-scalar operand; None = ``launch_s``."""
    fresh_pages: "FreshPages | None" = None
    """Cost of outputs served by fresh pages (CPU allocators); None: no such cost."""
    allocator_headroom: float = 0.0
    """What the allocator reserves beyond the live tensors, as a fraction of them."""
    step_op_s: float = 0.0
    """What an op costs inside a training step beyond its time alone (seconds; a
    profile correction measures it, ``hw_profiles.correction``); 0: nothing."""
    step_byte_s: float = 0.0
    """What each byte an op accesses costs inside a training step beyond its time alone
    (seconds per byte: operands cold in a step, warm when timed alone; a profile
    correction measures it); 0: nothing."""
    matmul_byte_s: float = 0.0
    """What each byte a GEMM reads or writes costs beyond its FLOPs (seconds per byte:
    packing its operands into the kernel's panels, which thin GEMMs amortise over few
    FLOPs; ``costmodel.compute``; a profile correction measures it); 0: nothing."""

    def in_step_s(self, bytes_accessed: float = 0.0) -> float:
        """What an op accessing ``bytes_accessed`` bytes costs inside a training step beyond its
        time alone: :attr:`step_op_s` plus :attr:`step_byte_s` a byte (the strategy graph charges
        every op of a step this; views none).

        >>> import dataclasses
        >>> from hw_profiles import load
        >>> device = dataclasses.replace(load("cpu-gloo").device, step_op_s=1e-5, step_byte_s=1e-10)
        >>> round(device.in_step_s(1e6), 12)
        0.00011
        """
        return self.step_op_s + self.step_byte_s * bytes_accessed

    @property
    def usable_memory_bytes(self) -> float:
        """Live tensor bytes that fit the device once the allocator's headroom is
        added on top: ``memory_bytes / (1 + allocator_headroom)``, the default
        memory limit of a solve (a plan whose live peak fills ``memory_bytes``
        does not fit: the caching allocator reserves more than is live).

        >>> DeviceSpec("d", 120, (), 1.0, 0.0, Efficiency(matmul=((1.0, 1.0),), memory=1.0),
        ...            allocator_headroom=0.2).usable_memory_bytes
        100.0
        """
        return self.memory_bytes / (1.0 + self.allocator_headroom)

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
            sources=tuple((str(k), Citation.from_dict(v) if isinstance(v, Mapping) else str(v))
                          for k, v in data.get("sources", {}).items()),
            launch_scalar_s=None if data.get("launch_scalar_s") is None else float(data["launch_scalar_s"]),
            fresh_pages=None if data.get("fresh_pages") is None else FreshPages.from_dict(data["fresh_pages"]),
            allocator_headroom=float(data.get("allocator_headroom", 0.0)),
            step_op_s=float(data.get("step_op_s", 0.0)),
            step_byte_s=float(data.get("step_byte_s", 0.0)),
            matmul_byte_s=float(data.get("matmul_byte_s", 0.0)),
        )

    def source(self, field: str) -> "str | Citation | None":
        """The source of ``field`` (``peak_flops``, ``efficiency.attention``...)."""
        for key, value in self.sources:
            if key == field:
                return value
        return None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "memory_bytes": self.memory_bytes,
            "peak_flops": dict(self.peak_flops),
            "memory_bandwidth_Bps": self.memory_bandwidth_Bps,
            "launch_s": self.launch_s,
        }
        if self.launch_scalar_s is not None:
            out["launch_scalar_s"] = self.launch_scalar_s
        if self.fresh_pages is not None:
            out["fresh_pages"] = self.fresh_pages.to_dict()
        if self.allocator_headroom:
            out["allocator_headroom"] = self.allocator_headroom
        if self.step_op_s:  # written only when given: profiles without it keep their fingerprints
            out["step_op_s"] = self.step_op_s
        if self.step_byte_s:
            out["step_byte_s"] = self.step_byte_s
        if self.matmul_byte_s:
            out["matmul_byte_s"] = self.matmul_byte_s
        out["efficiency"] = self.efficiency.to_dict()
        if self.sources:
            out["sources"] = {k: v.to_dict() if isinstance(v, Citation) else v for k, v in self.sources}
        return out


@dataclass(frozen=True, slots=True)
class Overlap:
    """How a collective in flight slows the compute beside it (module docstring)."""

    contention: float = 0.0
    """0: full overlap; 1: overlap gains nothing (``costmodel.overlap``)."""
    source: str = ""
    skew_s: float = 0.0
    """How far apart the ranks reach a collective after computing unsynchronised, at most
    (``costmodel.overlap``: a collective issued after ``g`` seconds of compute since the last
    one starts ``min(g, skew_s)`` late). 0 on dedicated devices; ranks time-sliced on shared
    cores drift up to a scheduler slice apart. Measured by a profile correction."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Overlap":
        return cls(float(data["contention"]), str(data.get("source", "")), float(data.get("skew_s", 0.0)))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"contention": self.contention}
        if self.source:
            out["source"] = self.source
        if self.skew_s:
            out["skew_s"] = self.skew_s
        return out


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    """A whole ``autoshard.hw_profile/1`` file."""

    name: str
    source: str
    """``datasheet``, ``published`` (datasheet peaks, published measured
    efficiencies and collective curves) or ``measured``."""
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

    @property
    def skew_s(self) -> float:
        """The ranks' skew at a collective (:attr:`Overlap.skew_s`; 0 when the profile gives none)."""
        return 0.0 if self.overlap is None else self.overlap.skew_s

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
        """The JSON form, key for key as in docs/formats.md."""
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

    def without_bus_bandwidth(self) -> "HardwareProfile":
        """The same profile priced by alpha-beta alone (published
        bus-bandwidth curves dropped): to compare the two models.

        >>> p = HardwareProfile.from_dict(_EXAMPLE).without_bus_bandwidth()
        >>> p.interconnect[0].collective("all_reduce").bus_bandwidth
        ()
        """
        tiers = tuple(
            dataclasses.replace(t, collectives=tuple((k, dataclasses.replace(f, bus_bandwidth=())) for k, f in t.collectives))
            for t in self.interconnect
        )
        return dataclasses.replace(self, interconnect=tiers)

    @property
    def device_type(self) -> str:
        """The torch device type a plan priced with this profile runs on: ``cpu`` for a
        CPU profile (its device name says CPU), else ``cuda`` (ROCm GPUs are ``cuda``
        devices in torch too). It picks the per-device kernels a plan's graph holds
        (``autoshard.trace.device``).

        >>> HardwareProfile.from_dict(_EXAMPLE).device_type
        'cuda'
        """
        return "cpu" if "cpu" in self.device.name.lower() else "cuda"

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
