"""A profile corrected on the machine where it is used: reference times
measured there against what the profile predicts for the same ops, and the
profile's figures scaled by those ratios (no torch here: the math only;
``autoshard.calibrate.first_use`` measures, ``autoshard.calibrate.correction_cache``
keeps the result per machine).

Why: a CPU profile is measured on one machine; another machine "of the same
kind" (another VM size, another CPU generation, other tenants) runs the same
ops at other speeds, and by other amounts for GEMMs, cache-resident and
DRAM-bound streams, launches and collectives. A few reference ops per family,
timed where the plan will run, say by how much.

Math. Each reference time ``i`` of family ``f`` (``launch``, ``matmul``,
``memory``, ``vector``, ``collective``) gives a ratio
``r_i = (measured_i - L_m) / (predicted_i - L_p)``, where ``L`` is the launch
floor (measured on the machine, and the profile's; the launch and collective
families use ``measured / predicted``). A family's ratio ``r_f`` is the
median of its ratios (collectives: ``r_alpha`` from the smallest message,
``r_beta`` from the largest), except memory: streams slow down by working set
(on the shared 2-core VM of benchmarks/results/profile_correction.md, under
other users' load: an add over 786 KB 4.7x the profile, over 48 MB 16x), so
``r_memory(B)`` is a curve through the memory items' ``(working set, ratio)``
points, log-linear between them and flat beyond. Applied to the profile
(``apply``):

* ``launch_s``, ``launch_scalar_s`` times ``r_launch``;
* every ``peak_flops`` divided by ``r_matmul`` (GEMMs and attention: the
  same matrix units);
* each memory-curve point ``(B, e)`` becomes ``(B, e / r_memory(B))`` (renormalized
  into ``memory_bandwidth_Bps`` where that exceeds 1); ``fresh_pages.Bps``
  divided by the ratio of the largest working set;
* ``vector`` and each ``vector_by_op`` fraction times ``r_matmul / r_vector``
  (the vector term divides FLOPs by the fp32 peak, already divided by
  ``r_matmul``), at most 1;
* collectives, per kind (``all_reduce``, ``all_gather``, ``reduce_scatter``; a kind
  without references of its own takes all_reduce's): ``alpha_s`` and
  ``alpha_per_step_s`` times ``r_alpha``, ``beta_s_per_byte`` times ``r_beta``
  (bus-bandwidth curves divided by it), where ``(r_alpha, r_beta)`` is the
  least-squares fit, in relative error, of ``t_i ~ r_alpha L_i + r_beta (P_i - L_i)``
  over the kind's message sizes (``P_i`` its price, ``L_i`` the part of it the
  latency terms make): neither the smallest message is pure latency nor the
  largest pure bandwidth, and a size between them weighs in (without ``L_i``
  recorded: the smallest message's ratio and the largest's);
* ``overlap.skew_s`` (seconds, a new figure): the ``collective_step`` family times
  ``k`` pairs of a gap of compute (~10 ms of small ops) and an all_reduce run back to
  back against the gap and the all_reduce each timed alone; ``(t - sum) / k``, at
  least 0, is how late a collective starts in a step when the ranks computed
  unsynchronised before it (``costmodel.overlap``: the ranks' skew);
* ``step_op_s`` (a new figure, not a scale): the ``step`` family is a reference
  step (``autoshard.calibrate.reference_step``) against the sum of its ``n`` ops
  timed alone on the same machine; ``(step - sum) / n``, at least 0, is what an
  op costs inside a step beyond its own time (cold tensors, the allocator, the
  dispatch between different ops). The strategy graph adds it to every op of a
  step; an op priced alone (``costmodel.compute.op_time_s``) does not pay it;
* ``step_byte_s`` (seconds per byte, with ``step_op_s``): where the ``step`` family
  holds reference steps of different working sets, each with the bytes its ops
  access ``B_j`` and its ops ``n_j``, the excess is split into a part per op and a
  part per byte: ``t_j - sum_j = a n_j + b B_j`` solved on the steps of the fewest
  and the most bytes per op (``step_op_s = a``, ``step_byte_s = b``; ``a < 0``: ``a = 0``
  and ``b`` the cold step's excess per byte; ``b < 0``: the per-op figure alone). Why per byte: an op timed
  again and again finds its operands in cache, an op of a step finds them cold (the
  previous ops touched other tensors); measured on the 2-core VM, 4 ranks, the ops of
  a LLaMA and an MLP step cost 1.8x and 2.7x their CPU alone: about 95 us of CPU per
  MiB they touch on both models, while per op the two excesses differ 8x (39 and
  300 us). One step (or steps without bytes): ``step_op_s`` alone, as before.
* ``matmul_byte_s`` (seconds per byte, added to the profile's own) with ``r_matmul``:
  where the references hold thin GEMMs (family ``matmul_thin``, ``16 x 512 x 2048`` and
  ``16 x 2048 x 512``) beside the square ones, each GEMM with the bytes it accesses ``B_i``, the two are the
  least-squares fit, in relative error, of ``t_i - L_m ~ r_matmul (p_i - L_p) + c B_i``
  (``c = matmul_byte_s``, at least 0; else ``c = 0`` and the median ratio). A GEMM packs
  its operands into panels, a cost per byte (``costmodel.compute``:
  ``compute = F / (P e(F)) + matmul_byte_s * B``): a thin GEMM (arithmetic intensity 7.7
  FLOP/B in fp32) runs at 0.66-0.83 of a square one's FLOP rate, which the median ratio
  of square GEMMs alone cannot see, and which scaling the peak by would price square
  GEMMs slow.

If every op of a family is ``k`` times slower on the machine, the corrected
profile prices it ``k`` times slower: tests check that synthetic times from a
known scale recover it.

>>> t = [ReferenceTime("add 1", "launch", 1, 4e-6, 8e-6), ReferenceTime("mm", "matmul", 1e9, 0.02, 0.03)]
>>> {k: round(v, 3) for k, v in family_ratios(t).items()}
{'launch': 2.0, 'matmul': 1.5}
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from hw_profiles.profile import FreshPages, HardwareProfile, Overlap

__all__ = ["FAMILIES", "FORMAT", "ReferenceTime", "ProfileCorrection", "family_ratios", "memory_points", "ratio_curve"]

FORMAT = "autoshard.profile_correction/1"
FAMILIES = ("launch", "matmul", "matmul_thin", "memory", "vector", "collective", "step", "collective_step")


@dataclass(frozen=True, slots=True)
class ReferenceTime:
    """One reference op: what the profile predicts and what the machine measured."""

    label: str
    """What ran (``mm 512x512x512``, ``all_reduce 4 ranks 1 MiB``)."""
    family: str
    """One of :data:`FAMILIES`."""
    size: float
    """FLOPs (matmul, vector), working-set bytes (memory), message bytes
    (collective), 1 (launch), ops (step): where on the family's curve it sits."""
    predicted_s: float
    """What the profile prices it; for the ``step`` and ``collective_step`` families: the sum
    of their parts timed alone."""
    measured_s: float
    latency_s: float | None = None
    """Collectives: the part of :attr:`predicted_s` the profile's latency terms make (the rest
    is bandwidth); None where not recorded (then the smallest message gives the latency ratio,
    the largest the bandwidth ratio)."""
    bytes_accessed: float | None = None
    """The ``step`` family: the bytes the reference step's ops access (as the rules price
    them); None where not recorded (then the step gives ``step_op_s`` alone)."""

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family: unknown {self.family!r} (expected one of {', '.join(FAMILIES)})")
        if not (self.predicted_s > 0 and self.measured_s > 0 and self.size > 0):
            raise ValueError(f"{self.label}: predicted_s, measured_s and size must be > 0")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ReferenceTime":
        latency, nbytes = data.get("latency_s"), data.get("bytes_accessed")
        return cls(str(data["label"]), str(data["family"]), float(data["size"]), float(data["predicted_s"]),
                   float(data["measured_s"]), None if latency is None else float(latency),
                   None if nbytes is None else float(nbytes))

    def to_dict(self) -> dict[str, Any]:
        out = {"label": self.label, "family": self.family, "size": self.size, "predicted_s": self.predicted_s,
               "measured_s": self.measured_s}
        if self.latency_s is not None:
            out["latency_s"] = self.latency_s
        if self.bytes_accessed is not None:
            out["bytes_accessed"] = self.bytes_accessed
        return out


def memory_points(times: Sequence[ReferenceTime]) -> tuple[tuple[float, float], ...]:
    """The memory family's ratios by working set, ``(bytes, ratio)`` ascending (module docstring)."""
    launches = [t for t in times if t.family == "launch"]
    launch_p = statistics.median(t.predicted_s for t in launches) if launches else 0.0
    launch_m = statistics.median(t.measured_s for t in launches) if launches else 0.0
    return tuple(sorted((t.size, max(t.measured_s - launch_m, 0.05 * t.measured_s) / max(t.predicted_s - launch_p, 1e-12))
                        for t in times if t.family == "memory"))


def ratio_curve(points: Sequence[tuple[float, float]], x: float) -> float:
    """The ratio at ``x``: log-linear between ``points`` (``(size, ratio)``, ascending), flat beyond.

    >>> round(ratio_curve([(1e3, 2.0), (1e5, 4.0)], 1e4), 6), ratio_curve([(1e3, 2.0), (1e5, 4.0)], 1e9)
    (3.0, 4.0)
    """
    if x <= points[0][0]:
        return points[0][1]
    for (x0, r0), (x1, r1) in zip(points, points[1:]):
        if x <= x1:
            t = 0.0 if x1 == x0 else (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return r0 + (r1 - r0) * t
    return points[-1][1]


def family_ratios(times: Sequence[ReferenceTime]) -> dict[str, float]:
    """Per family, measured over predicted (module docstring); collectives as
    ``collective_alpha`` (smallest message) and ``collective_beta`` (largest)."""
    launches = [t for t in times if t.family == "launch"]
    launch_p = statistics.median(t.predicted_s for t in launches) if launches else 0.0
    launch_m = statistics.median(t.measured_s for t in launches) if launches else 0.0
    ratios: dict[str, list[float]] = {}
    steps = [t for t in times if t.family == "step"]
    for t in times:
        if t.family == "step":
            continue
        if t.family in ("launch", "collective"):  # collectives are priced without a launch floor
            ratio = t.measured_s / t.predicted_s
        else:  # the floor is priced (and corrected) apart: what is left is the kernel's own time
            ratio = max(t.measured_s - launch_m, 0.05 * t.measured_s) / max(t.predicted_s - launch_p, 1e-12)
        ratios.setdefault(t.family, []).append(ratio)
    out = {f: statistics.median(r) for f, r in ratios.items() if f not in ("collective", "collective_step")}
    by_kind: dict[str, list[ReferenceTime]] = {}
    for t in times:
        if t.family == "collective":
            by_kind.setdefault(t.label.split()[0], []).append(t)
    for kind, items in sorted(by_kind.items()):
        out[f"{kind}_alpha"], out[f"{kind}_beta"] = _latency_bandwidth_ratios(items)
    if by_kind:  # the figures every collective kind without references of its own takes: all_reduce's
        kind = "all_reduce" if "all_reduce" in by_kind else next(iter(by_kind))
        out["collective_alpha"], out["collective_beta"] = out[f"{kind}_alpha"], out[f"{kind}_beta"]
    if steps:  # seconds, not ratios: what an op, and a byte it touches, cost in a step beyond the op alone
        out.update(_step_figures(steps))
    out.pop("matmul_thin", None)
    gemms = [(t.predicted_s - launch_p, t.bytes_accessed, t.measured_s - launch_m) for t in times
             if t.family in ("matmul", "matmul_thin") and t.bytes_accessed]
    if any(t.family == "matmul_thin" for t in times) and len(gemms) >= 2:
        out["matmul"], out["matmul_byte_s"] = _gemm_fit(gemms, out.get("matmul", 1.0))
    in_step = [t for t in times if t.family == "collective_step"]
    if in_step:  # seconds per collective: what a gap of compute then a collective take beyond the two alone
        out["skew_s"] = statistics.median(max(0.0, (t.measured_s - t.predicted_s) / t.size) for t in in_step)
    return out


def _gemm_fit(gemms: Sequence[tuple[float, float, float]], fallback: float) -> tuple[float, float]:
    """``(r_matmul, matmul_byte_s)``: the least-squares fit, in relative error, of
    ``t_i ~ r p_i + c B_i`` over the GEMM references ``(p_i, B_i, t_i)`` (price of the FLOP
    term, bytes, measured time; launch floors off both), ``c >= 0`` (else ``c = 0`` and
    ``r`` = ``fallback``, the median ratio).

    >>> g = [(1e-4, 2e5, 1.2e-4 + 4e-6), (5e-3, 3e6, 6e-3 + 6e-5), (6e-4, 4.4e6, 7.2e-4 + 8.8e-5)]
    >>> tuple(round(v, 14) for v in _gemm_fit(g, 1.0))
    (1.2, 2e-11)
    """
    w = [1.0 / t**2 for _, _, t in gemms]
    spp = sum(wi * p * p for wi, (p, _, _) in zip(w, gemms))
    spb = sum(wi * p * b for wi, (p, b, _) in zip(w, gemms))
    sbb = sum(wi * b * b for wi, (_, b, _) in zip(w, gemms))
    spt = sum(wi * p * t for wi, (p, _, t) in zip(w, gemms))
    sbt = sum(wi * b * t for wi, (_, b, t) in zip(w, gemms))
    det = spp * sbb - spb * spb
    if det <= 0:
        return fallback, 0.0
    r, c = (spt * sbb - sbt * spb) / det, (spp * sbt - spb * spt) / det
    if c < 0 or r <= 0:  # no cost per byte shows: the FLOP term alone, as before
        return fallback, 0.0
    return r, c


def _step_figures(steps: Sequence[ReferenceTime]) -> dict[str, float]:
    """``step_op_s`` and, from reference steps of different bytes per op, ``step_byte_s``
    (module docstring): ``excess_j = a n_j + b B_j`` solved on the steps of the fewest and the
    most bytes per op. Where that gives ``a < 0`` (the excess grows faster than the bytes: the
    cache-resident step's bytes are partly warm) ``b`` is the coldest step's excess per byte, the
    regime of a real step, whose working set is far beyond the caches, and ``a = 0``.

    >>> s = [ReferenceTime("small", "step", 40, 1e-3, 1e-3 + 40 * 1e-5 + 1e6 * 1e-10, bytes_accessed=1e6),
    ...      ReferenceTime("cold", "step", 40, 5e-3, 5e-3 + 40 * 1e-5 + 6e7 * 1e-10, bytes_accessed=6e7)]
    >>> {k: round(v, 12) for k, v in _step_figures(s).items()}
    {'step_op_s': 1e-05, 'step_byte_s': 1e-10}
    """
    per_op = [max(0.0, (t.measured_s - t.predicted_s) / t.size) for t in steps]
    sized = sorted((t for t in steps if t.bytes_accessed), key=lambda t: t.bytes_accessed / t.size)
    if len(sized) < 2 or sized[0].bytes_accessed / sized[0].size == sized[-1].bytes_accessed / sized[-1].size:
        return {"step_op_s": statistics.median(per_op)}
    warm, cold = sized[0], sized[-1]
    excess = [max(0.0, t.measured_s - t.predicted_s) for t in (warm, cold)]
    det = warm.size * cold.bytes_accessed - cold.size * warm.bytes_accessed
    a = (excess[0] * cold.bytes_accessed - excess[1] * warm.bytes_accessed) / det
    b = (warm.size * excess[1] - cold.size * excess[0]) / det
    if a < 0:  # the per-byte part alone, as the cold step measures it
        a, b = 0.0, excess[1] / cold.bytes_accessed
    elif b < 0:  # the per-op part alone
        a, b = statistics.median(per_op), 0.0
    return {"step_op_s": a, "step_byte_s": b}


def _latency_bandwidth_ratios(items: Sequence[ReferenceTime]) -> tuple[float, float]:
    """``(r_alpha, r_beta)`` of one collective kind: with the latency part of each
    prediction known, the least-squares fit of ``measured_i ~ r_alpha L_i + r_beta (P_i - L_i)``
    in relative error (both >= 0); else the smallest message's ratio and the largest's."""
    ordered = sorted(items, key=lambda t: t.size)
    if len(ordered) < 2 or any(t.latency_s is None for t in ordered):
        return ordered[0].measured_s / ordered[0].predicted_s, ordered[-1].measured_s / ordered[-1].predicted_s
    rows = [(t.latency_s / t.measured_s, (t.predicted_s - t.latency_s) / t.measured_s) for t in ordered]
    saa = sum(a * a for a, _ in rows)
    sbb = sum(b * b for _, b in rows)
    sab = sum(a * b for a, b in rows)
    sa, sb = sum(a for a, _ in rows), sum(b for _, b in rows)
    det = saa * sbb - sab * sab
    if det > 1e-12 * max(saa * sbb, 1e-300):
        r_alpha, r_beta = (sa * sbb - sb * sab) / det, (sb * saa - sa * sab) / det
        if r_alpha >= 0 and r_beta >= 0:
            return r_alpha, r_beta
    # one term alone (the other at 0 would price it free: keep the one scale on both)
    scale = sum(a + b for a, b in rows) / sum((a + b) ** 2 for a, b in rows)
    return scale, scale


@dataclass(frozen=True, slots=True)
class ProfileCorrection:
    """Reference times measured on one machine for one profile, and the
    ratios they give (module docstring).

    >>> from hw_profiles import load
    >>> base = load("cpu-gloo")
    >>> c = ProfileCorrection(base.fingerprint, {"cpu": "x"}, "2026-11-27T21:00:00Z",
    ...                       (ReferenceTime("add 1", "launch", 1, 4e-6, 8e-6),))
    >>> c.apply(base).device.launch_s == 2 * base.device.launch_s
    True
    """

    profile: str
    """Fingerprint of the profile the times were predicted with (``name@sha256:...``)."""
    machine: Mapping[str, Any]
    """What identifies the machine (CPU model, cores, torch, ranks): the cache key."""
    date: str
    times: tuple[ReferenceTime, ...]
    load: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """The host's load average before and after the measurement."""
    seconds: float = 0.0
    """How long the measurement took."""

    @property
    def ratios(self) -> dict[str, float]:
        """:func:`family_ratios` of :attr:`times`."""
        return family_ratios(self.times)

    def step_figures_only(self) -> "ProfileCorrection":
        """This correction with its ``step`` and ``collective_step`` times only: it then adds
        ``step_op_s`` and ``skew_s`` and scales nothing (for a profile calibrated on this machine,
        whose op figures a few seconds of references would only move by the minute's noise)."""
        keep = tuple(t for t in self.times if t.family in ("step", "collective_step"))
        return dataclasses.replace(self, times=keep)

    def summary(self) -> dict[str, float]:
        """The ratios, rounded (what ``plan.options["profile_correction"]`` shows)."""
        return {f: (round(r, 4) if f not in ("step_op_s", "step_byte_s", "matmul_byte_s") else float(f"{r:.4g}"))
                for f, r in sorted(self.ratios.items())}

    def apply(self, profile: HardwareProfile) -> HardwareProfile:
        """``profile`` with its figures scaled by the ratios (module docstring);
        its name says it was corrected, its fingerprint changes."""
        r = self.ratios
        dev, eff = profile.device, profile.device.efficiency
        launch, matmul = r.get("launch", 1.0), r.get("matmul", 1.0)
        points = memory_points(self.times)
        vector, by_op = eff.vector, eff.vector_by_op
        if "vector" in r:  # one ratio for every vector fraction: the references time silu and softmax only
            vector = None if vector is None else min(1.0, vector * matmul / r["vector"])
            by_op = tuple((k, min(1.0, v * matmul / r["vector"])) for k, v in by_op)
        fresh, memory_eff, bandwidth = dev.fresh_pages, eff.memory, dev.memory_bandwidth_Bps
        if points:
            # the curve scaled point by point by the ratio at its working set; renormalized into the
            # bandwidth where a point would exceed 1 (an efficiency stays a fraction)
            curve = [(b, e / ratio_curve(points, b)) for b, e in eff.memory_curve]
            top = max(1.0, max(e for _, e in curve))
            curve = tuple((b, e / top) for b, e in curve)
            memory_eff = curve if isinstance(eff.memory, tuple) else curve[0][1]
            bandwidth = dev.memory_bandwidth_Bps * top
            if fresh is not None:  # faults stream like the largest working sets
                fresh = FreshPages(fresh.above_bytes, fresh.Bps / points[-1][1])
        new_dev = dataclasses.replace(
            dev, launch_s=dev.launch_s * launch,
            launch_scalar_s=None if dev.launch_scalar_s is None else dev.launch_scalar_s * launch,
            peak_flops=tuple((k, v / matmul) for k, v in dev.peak_flops),
            memory_bandwidth_Bps=bandwidth, fresh_pages=fresh,
            efficiency=dataclasses.replace(eff, vector=vector, vector_by_op=by_op, memory=memory_eff))
        new_dev = dataclasses.replace(new_dev, step_op_s=r.get("step_op_s", dev.step_op_s),
                                      step_byte_s=r.get("step_byte_s", dev.step_byte_s),
                                      matmul_byte_s=dev.matmul_byte_s + r.get("matmul_byte_s", 0.0))
        def scaled(kind: str, f: Any) -> Any:
            alpha = r.get(f"{kind}_alpha", r.get("collective_alpha", 1.0))
            beta = r.get(f"{kind}_beta", r.get("collective_beta", 1.0))
            return dataclasses.replace(
                f, alpha_s=f.alpha_s * alpha, alpha_per_step_s=f.alpha_per_step_s * alpha,
                beta_s_per_byte=f.beta_s_per_byte * beta,
                bus_bandwidth=tuple(dataclasses.replace(c, points=tuple((x, bw / beta) for x, bw in c.points))
                                    for c in f.bus_bandwidth))
        tiers = tuple(dataclasses.replace(t, collectives=tuple((k, scaled(k, f)) for k, f in t.collectives))
                      for t in profile.interconnect)
        overlap = profile.overlap
        if "skew_s" in r:
            overlap = dataclasses.replace(overlap or Overlap(), skew_s=r["skew_s"])
        return dataclasses.replace(profile, name=f"{profile.name}+corrected", device=new_dev, interconnect=tiers,
                                   overlap=overlap)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ProfileCorrection":
        """Read the JSON form; ``ValueError`` naming what is wrong."""
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            raise ValueError(f"format: expected {FORMAT!r}")
        try:
            return cls(profile=str(data["profile"]), machine=dict(data["machine"]), date=str(data["date"]),
                       times=tuple(ReferenceTime.from_dict(t) for t in data["times"]),
                       load=dict(data.get("load", {})), seconds=float(data.get("seconds", 0.0)))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"profile correction: missing or malformed field {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "profile": self.profile, "machine": dict(self.machine), "date": self.date,
                "load": dict(self.load), "seconds": self.seconds, "ratios": self.summary(),
                "times": [t.to_dict() for t in self.times]}
