"""Measurements -> ``autoshard.hw_profile/1`` figures, fitted to the very
formulas the cost model prices with.

Why fit through the cost model: a figure is only right if the solver, pricing
with it, reproduces the time that was measured. So every fit below predicts
its samples with ``costmodel.compute.op_time_s`` or
``costmodel.collectives.collective_time_s`` on the candidate profile, and
the errors stored in the profile (``calibration.fit_error``, and each
figure's ``source`` text) are those predictions against the measurements.

Device (``L`` = launch floor, ``t`` = measured seconds):

* ``launch_s`` = the median 1-element tensor op (add, neg, sum);
  ``launch_scalar_s`` = the median 1-element op with a Python-scalar operand
  (``measure_compute.LAUNCH_SCALAR_OPS``).
Stored figures have 4 significant digits (curve fractions 3), and every fit
error is computed with the figures as stored.

* matmul: rate ``r = F / (t - L)``, median per half decade of FLOPs (the
  curve's points sit at the median FLOPs of their bin), made unimodal (rises,
  then falls: :func:`unimodal`); ``peak[primary]`` = the best bin whose ops
  last ``2 L`` or more (shorter ones only say "launch-bound"); ``e(F)`` = bin
  / peak. Other dtypes the same way on their own samples: their own peak
  and curve (``efficiency.matmul_by_dtype``: a CPU's bf16 GEMMs, or a GPU's
  fp8 ones, saturate at other sizes than the primary dtype's).
* memory: bandwidth ``B / (t - L)`` per quarter decade of working set, the
  same way: ``memory_bandwidth_Bps`` = the best bin, ``e_mem(B)`` = bin / best,
  over the samples that allocate no fresh pages (below).
* fresh pages: for each size measured both as a clone and as a copy into a
  kept buffer, ``c = (t_clone - t_copy) / O`` seconds per output byte ``O``;
  where the clones of 32 MiB and more (glibc's largest mmap threshold) take
  at least 1.5x their copies, ``W_f = 1 / median(c)`` over them and
  ``A`` = the least output whose ``c`` reaches half that median
  (``device.fresh_pages``); otherwise the host has no such cost and the
  profile no such field.
* vector: ``e_vec`` minimising the squared log error of the roofline over
  the compute-heavy elementwise samples (1-D search), and the same per op
  over that op's own samples (``efficiency.vector_by_op``, keyed by the aten
  op): transcendental kernels cost several times apart per counted FLOP, so
  one fraction misses some op by ``sqrt(r) - 1`` for a spread ``r``; ``e_vec``
  (all of them) prices the ops not measured.
* attention: like matmul, against the peak of its dtype; the forward and
  the backward kernels each their own curve (``attention``,
  ``attention_backward``).
* run: ``e_run(r)`` = median, per bin of run lengths, of the bandwidth of
  each access sample over that of its contiguous twin (same op and size,
  measured right after it), both beyond their launch floor, clamped to
  ``(0, 1]``: a ratio of two neighbouring measurements, so neither the memory
  curve's error nor the host's load at that moment enters it.

Collectives, per tier and kind, figures ``theta = (alpha_s, alpha_per_step_s,
beta_s_per_byte) >= 0`` minimising the squared relative error
``sum_i ((T_i(theta) - t_i) / t_i)^2`` where ``T_i`` is
``collective_time_s`` of sample ``i``. ``T`` is piecewise linear in
``theta`` (ring or tree all_reduce, max of call latencies), so the fit
linearises ``T`` at the current ``theta`` (exact inside a piece), solves the
non-negative least squares exactly (all 8 subsets of free parameters), and
repeats until ``theta`` stops moving; several starts, best kept. Inner tiers
are fitted first and held fixed while groups that cross an outer tier fit it.

>>> [(round(x), e) for x, e in curve_from_points([1e3, 1.2e3, 1e6, 2e6], [0.1, 0.3, 0.8, 0.6], decades=0.5)]
[(1095, 0.2), (1414000, 0.7)]
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from costmodel.collectives import collective_time_s
from costmodel.compute import efficiency, op_time_s
from costmodel.mesh import MeshSpec
from hw_profiles import CollectiveFit, HardwareProfile
from hw_profiles.profile import FreshPages

from autoshard.calibrate.measure_collectives import CollectiveSample
from autoshard.calibrate.measure_compute import ComputeSample, vector_op_name

__all__ = ["FitError", "significant", "unimodal", "rate_curve", "curve_from_points", "fit_device", "fit_collective", "fit_interconnect",
           "predict_compute", "relative_errors"]

_MIN_EFF = 1e-4


@dataclass(frozen=True, slots=True)
class FitError:
    """Relative errors of a fit over the points it was fitted on.

    >>> FitError.of([0.1, -0.3, 0.02]).text()
    'relative error median 10.0%, p90 26.0%, max 30.0% over 3 points'
    """

    median: float
    p90: float
    max: float
    points: int

    @classmethod
    def of(cls, errors: Sequence[float]) -> "FitError":
        errs = sorted(abs(float(e)) for e in errors)
        if not errs:
            return cls(0.0, 0.0, 0.0, 0)
        return cls(statistics.median(errs), _quantile(errs, 0.9), errs[-1], len(errs))

    def text(self) -> str:
        return f"relative error median {self.median:.1%}, p90 {self.p90:.1%}, max {self.max:.1%} over {self.points} points"


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of sorted values."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def significant(value: float, digits: int = 4) -> float:
    """``value`` rounded to ``digits`` significant digits (profiles store
    these, and fit errors are computed with the stored figures).

    >>> significant(0.0123456), significant(98765.4, 3)
    (0.01235, 98800.0)
    """
    return float(f"{value:.{digits}g}")


def relative_errors(predicted: Sequence[float], measured: Sequence[float]) -> list[float]:
    """``(p - m) / m`` per pair.

    >>> relative_errors([1.1, 0.5], [1.0, 1.0])
    [0.10000000000000009, -0.5]
    """
    return [(p - m) / m for p, m in zip(predicted, measured)]


def _binned(xs: Sequence[float], values: Sequence[float], times: Sequence[float],
            decades: float) -> list[tuple[float, float, float, int]]:
    """``(x, median value, median time, count)`` per bin of ``decades`` in
    log10(x), x the bin's geometric median, ascending."""
    bins: dict[int, list[tuple[float, float, float]]] = {}
    for x, v, t in zip(xs, values, times):
        if x > 0 and v > 0 and math.isfinite(v):
            bins.setdefault(math.floor(math.log10(x) / decades), []).append((x, v, t))
    out = []
    for key in sorted(bins):
        members = bins[key]
        out.append((10 ** statistics.median(math.log10(m[0]) for m in members),
                    statistics.median(m[1] for m in members), statistics.median(m[2] for m in members),
                    len(members)))
    return out


def _isotonic(ys: Sequence[float], ws: Sequence[float]) -> list[float]:
    """Weighted least-squares non-decreasing fit (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, size]
    for y, w in zip(ys, ws):
        blocks.append([y, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return [m for m, _, n in blocks for _ in range(n)]


def unimodal(ys: Sequence[float], ws: Sequence[float] | None = None) -> list[float]:
    """Weighted least-squares fit that rises then falls: the shape of a rate
    over size (launch-bound when small, best where the work fits a cache or
    fills the units, lower beyond). Alpa forces measured bandwidths monotone in
    size for the same reason: single noisy points must not make the curve
    zig-zag.

    >>> unimodal([1.0, 3.0, 2.0, 4.0, 2.0, 2.5])
    [1.0, 2.5, 2.5, 4.0, 2.25, 2.25]
    """
    ys, ws = list(ys), list(ws) if ws is not None else [1.0] * len(ys)
    best, best_sse = list(ys), math.inf
    for mode in range(len(ys)):
        left = _isotonic(ys[: mode + 1], ws[: mode + 1])
        right = _isotonic(ys[:mode:-1], ws[:mode:-1])[::-1]
        fitted = left + right
        sse = sum(w * (f - y) ** 2 for f, y, w in zip(fitted, ys, ws))
        if sse < best_sse - 1e-15:
            best, best_sse = fitted, sse
    return best


def rate_curve(xs: Sequence[float], rates: Sequence[float], times: Sequence[float], launch_s: float, *,
               decades: float) -> tuple[float, tuple[tuple[float, float], ...]]:
    """``(best rate, curve of rate / best)`` from samples: median rate per bin
    of ``decades`` in log10(x), made unimodal in log(rate); the best rate is
    that of the best bin whose ops last at least 2 launch floors (shorter
    ones only say "launch-bound": their rate is the noisy difference of two
    tiny times); fractions clamped to ``(0, 1]``.

    >>> rate_curve([1e3, 1e4, 1e5, 1e6], [1.0, 4.0, 2.0, 3.0], [1, 1, 1, 1], 0.1, decades=1)
    (4.0, ((1000.0, 0.25), (10000.0, 1.0), (100000.0, 0.612), (1000000.0, 0.612)))
    """
    bins = _binned(xs, rates, times, decades)
    if not bins:
        raise ValueError("calibration: no usable sample for a curve")
    smooth = [math.exp(v) for v in unimodal([math.log(b[1]) for b in bins], [b[3] for b in bins])]
    long = [v for v, b in zip(smooth, bins) if b[2] >= 2 * launch_s]
    best = max(long or smooth)
    curve: list[tuple[float, float]] = []
    for (x, *_), v in zip(bins, smooth):
        x, v = significant(x), significant(min(1.0, max(_MIN_EFF, v / best)), 3)
        if not curve or x > curve[-1][0]:
            curve.append((x, v))
    return best, tuple(curve)


def curve_from_points(xs: Sequence[float], values: Sequence[float], *, decades: float) -> tuple[tuple[float, float], ...]:
    """Median value per bin of ``decades`` in log10(x), placed at the median x
    of the bin (geometric), ascending x; values clamped to ``(0, 1]`` (no
    smoothing: for values that are already fractions)."""
    curve: list[tuple[float, float]] = []
    for x, v, _, _ in _binned(xs, values, [0.0] * len(xs), decades):
        x, v = significant(x), significant(min(1.0, max(_MIN_EFF, v)), 3)
        if not curve or x > curve[-1][0]:
            curve.append((x, v))
    return tuple(curve)


def _busy_s(sample: ComputeSample, launch_s: float) -> float:
    """Time beyond the launch floor (never below 5 % of the sample: a tiny op
    measured under the floor is noise, not infinite speed)."""
    return max(sample.seconds - launch_s, 0.05 * sample.seconds)


def fit_device(samples: Sequence[ComputeSample], *, primary: str) -> dict:
    """``device`` figures from compute samples: ``launch_s``,
    ``launch_scalar_s``, ``peak_flops``, ``memory_bandwidth_Bps`` and
    ``efficiency`` (module docstring), as a dict in the profile's JSON form
    (no name, memory size or sources)."""
    from autoshard.calibrate.measure_compute import LAUNCH_SCALAR_OPS

    launch = [s.seconds for s in samples if s.kind == "launch" and s.op not in LAUNCH_SCALAR_OPS]
    if not launch:
        raise ValueError("calibration: no launch measurement")
    launch_s = statistics.median(launch)
    scalar = [s.seconds for s in samples if s.kind == "launch" and s.op in LAUNCH_SCALAR_OPS]
    mm = [s for s in samples if s.kind == "matmul" and s.dtype == primary]
    if not mm:
        raise ValueError(f"calibration: no {primary} matmul measurement")
    peak, matmul = rate_curve([s.flops for s in mm], [s.flops / _busy_s(s, launch_s) for s in mm],
                              [s.seconds for s in mm], launch_s, decades=0.5)
    peaks = {primary: peak}
    by_dtype: dict[str, list] = {}
    for dtype in sorted({s.dtype for s in samples if s.kind == "matmul"} - {primary}):
        own = [s for s in samples if s.kind == "matmul" and s.dtype == dtype]
        peaks[dtype], curve = rate_curve([s.flops for s in own], [s.flops / _busy_s(s, launch_s) for s in own],
                                         [s.seconds for s in own], launch_s, decades=0.5)
        by_dtype[dtype] = [list(p) for p in curve]
    fresh = fit_fresh_pages([s for s in samples if s.kind == "memory"])
    mem = [s for s in samples if s.kind == "memory" and (fresh is None or s.out_bytes < fresh["above_bytes"])]
    if not mem:
        raise ValueError("calibration: no memory measurement")
    best, memory = rate_curve([s.bytes_accessed for s in mem], [s.bytes_accessed / _busy_s(s, launch_s) for s in mem],
                              [s.seconds for s in mem], launch_s, decades=0.25)
    vec = [s for s in samples if s.kind == "vector"]

    def fit_vector(chosen: list[ComputeSample]) -> float | None:
        return _fit_vector(chosen, launch_s, peaks.get("fp32", peak), best, memory, fresh)

    vector = fit_vector(vec)
    by_op = {}
    for op in sorted({s.op for s in vec}):
        name = vector_op_name(op)
        if name is not None:  # keyed by the overload packet, as costmodel.compute looks it up
            by_op[name.rsplit(".", 1)[0]] = fit_vector([s for s in vec if s.op == op])
    efficiency_dict: dict = {"matmul": [list(p) for p in matmul]}
    if by_dtype:
        efficiency_dict["matmul_by_dtype"] = by_dtype
    for key, ops in (("attention", ("sdpa_fwd",)), ("attention_backward", ("sdpa_bwd",))):
        attn = [s for s in samples if s.kind == "attention" and s.dtype in peaks and s.op in ops]
        if attn:
            effs = [s.flops / _busy_s(s, launch_s) / peaks[s.dtype] for s in attn]
            top, curve = rate_curve([s.flops for s in attn], effs, [s.seconds for s in attn], launch_s, decades=0.5)
            efficiency_dict[key] = [[x, significant(min(1.0, e * top), 3)] for x, e in curve]
    efficiency_dict["memory"] = [list(p) for p in memory]
    if vector is not None:
        efficiency_dict["vector"] = vector
    if by_op:
        efficiency_dict["vector_by_op"] = by_op
    out = {
        "peak_flops": {k: significant(v) for k, v in peaks.items()},
        "memory_bandwidth_Bps": significant(best),
        "launch_s": significant(launch_s),
        "efficiency": efficiency_dict,
    }
    if scalar:
        out["launch_scalar_s"] = significant(statistics.median(scalar))
    if fresh is not None:
        out["fresh_pages"] = fresh
    run = _fit_run(samples, out)
    if run:
        efficiency_dict["run"] = run
    return out


def _draft_profile(device: dict) -> HardwareProfile:
    """A profile around fitted device figures, to price samples with the cost model."""
    from hw_profiles.profile import _EXAMPLE

    return HardwareProfile.from_dict({**_EXAMPLE, "device": {"name": "draft", "memory_bytes": 2**30, **device}})


def _fit_run(samples: Sequence[ComputeSample], device: dict) -> list[list[float]]:
    """The run curve (module docstring) from the access samples and their
    twins; [] without any."""
    twins = {(s.op, s.shape): s for s in samples if s.kind == "access_twin"}
    pairs = [(s, twins[(s.op, s.shape)]) for s in samples if s.kind == "access" and (s.op, s.shape) in twins]
    if not pairs:
        return []
    profile = _draft_profile(device)
    ratios = []
    for strided, twin in pairs:
        launch = _launch_of(strided, profile)
        bw = strided.bytes_accessed / max(strided.seconds - launch, 0.05 * strided.seconds)
        bw_twin = twin.bytes_accessed / max(twin.seconds - launch, 0.05 * twin.seconds)
        ratios.append(bw / bw_twin)
    return [list(p) for p in curve_from_points([s.run for s, _ in pairs], ratios, decades=0.25)]


def _launch_of(sample: ComputeSample, profile: HardwareProfile) -> float:
    device = profile.device
    return device.launch_scalar_s if _scalar_operand(sample) and device.launch_scalar_s is not None else device.launch_s


def _scalar_operand(sample: ComputeSample) -> bool:
    from autoshard.calibrate.measure_compute import LAUNCH_SCALAR_OPS

    return ((sample.kind == "launch" and sample.op in LAUNCH_SCALAR_OPS)
            or (sample.kind in ("access", "access_twin") and sample.op == "div_expanded"))


MMAP_THRESHOLD_MAX_BYTES = 32 * 2**20
"""glibc's largest mmap threshold on 64-bit hosts (``DEFAULT_MMAP_THRESHOLD_MAX``,
mallopt(3)): malloc maps every allocation of this size or more afresh."""


def fit_fresh_pages(memory: Sequence[ComputeSample]) -> dict | None:
    """``{"above_bytes", "Bps"}`` of fresh pages from the memory samples (module
    docstring), or None where clones of 32 MiB and more cost no more than
    1.5x a copy into a kept buffer.

    >>> def s(op, n, t): return ComputeSample("memory", op, str(n), "fp32", 0.0, 8.0 * n, t, 0.0,
    ...                                        out_bytes=0.0 if op == "copy_" else 4.0 * n)
    >>> fit_fresh_pages([s("clone", 2**22, 1e-3), s("copy_", 2**22, 1e-3),
    ...                  s("clone", 2**23, 12e-3), s("copy_", 2**23, 2e-3)])
    {'above_bytes': 33554432, 'Bps': 3355000000.0}
    """
    kept = {s.shape: s for s in memory if s.op == "copy_"}
    pairs = [(c, kept[c.shape]) for c in memory if c.op == "clone" and c.shape in kept and c.out_bytes > 0]
    big = [(c, k) for c, k in pairs if c.out_bytes >= MMAP_THRESHOLD_MAX_BYTES]
    if not big or statistics.median(c.seconds / k.seconds for c, k in big) < 1.5:
        return None
    per_byte = {c.out_bytes: max(c.seconds - k.seconds, 0.0) / c.out_bytes for c, k in pairs}
    cost = statistics.median(per_byte[c.out_bytes] for c, _ in big)
    above = min(b for b, v in per_byte.items() if v >= cost / 2)
    return {"above_bytes": int(above), "Bps": significant(1.0 / cost)}


def _fit_vector(vec: Sequence[ComputeSample], launch_s: float, fp32_peak: float, bandwidth: float,
                memory: tuple[tuple[float, float], ...], fresh: dict | None = None) -> float | None:
    """The vector efficiency ``e_vec`` minimising the squared log error of
    ``max(F / (P_fp32 e_vec), B / (W e_mem(B))) + L`` over the vector samples
    ``vec`` (1-D search); None without any."""
    if not vec:
        return None
    pages = FreshPages.from_dict(fresh) if fresh else None

    def cost(e_vec: float) -> float:
        total = 0.0
        for s in vec:
            memory_s = s.bytes_accessed / (bandwidth * efficiency(memory, s.bytes_accessed))
            fresh_s = pages.seconds((s.out_bytes,)) if pages is not None else 0.0
            predicted = max(s.flops / (fp32_peak * e_vec), memory_s) + fresh_s + launch_s
            total += math.log(predicted / s.seconds) ** 2
        return total

    candidates = [10 ** (k / 40) for k in range(-160, 1)]
    candidates += [min(1.0, s.flops / _busy_s(s, launch_s) / fp32_peak) for s in vec]
    return significant(min(candidates, key=cost), 3)


def predict_compute(sample: ComputeSample, profile: HardwareProfile) -> float:
    """What the cost model says a compute sample takes on ``profile``: the
    sample priced by ``costmodel.compute.op_time_s`` as the op kind the rules
    give it (add: elementwise, clone: copy, sdpa backward: attention_backward,
    an access sample with its run), with the launch floor of its operands.

    >>> from hw_profiles import load
    >>> s = ComputeSample("matmul", "mm", "512x512x512", "fp32", 2 * 512.0**3, 3 * 4 * 512.0**2, 0.0, 0.0)
    >>> predict_compute(s, load("cpu-gloo")) > 0
    True
    """
    if sample.kind in ("access", "access_twin"):
        from autoshard.calibrate.measure_compute import ACCESS_PATTERNS

        kind = ACCESS_PATTERNS[sample.op][0] if sample.op in ACCESS_PATTERNS else "elementwise"
    elif sample.kind == "attention":
        kind = "attention_backward" if sample.op == "sdpa_bwd" else "attention"
    else:
        kind = {"launch": "elementwise", "vector": "elementwise",
                "memory": "copy" if sample.op == "clone" else "elementwise"}.get(sample.kind, sample.kind)
    return op_time_s(kind, flops=sample.flops, bytes_accessed=sample.bytes_accessed, dtype=sample.dtype,
                     profile=profile, run_elems=sample.run, scalar_operand=_scalar_operand(sample),
                     output_bytes=(sample.out_bytes,) if sample.out_bytes else (),
                     op=vector_op_name(sample.op) if sample.kind == "vector" else None)


# -- collectives ----------------------------------------------------------------

_PARAMS = ("alpha_s", "alpha_per_step_s", "beta_s_per_byte")


def _with_fit(profile: HardwareProfile, tier_index: int, kind: str, theta: Sequence[float]) -> HardwareProfile:
    fit = CollectiveFit(alpha_s=float(theta[0]), alpha_per_step_s=float(theta[1]), beta_s_per_byte=float(theta[2]))
    tiers = list(profile.interconnect)
    tier = tiers[tier_index]
    others = tuple((k, f) for k, f in tier.collectives if k != kind)
    tiers[tier_index] = dataclasses.replace(tier, collectives=((kind, fit), *others))
    return dataclasses.replace(profile, interconnect=tuple(tiers))


def _nnls_relative(jac: np.ndarray, offset: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """argmin over theta >= 0 of ||(J theta + c - t) / t||^2, exactly: the best
    of the least-squares solutions on every subset of free parameters whose
    solution is non-negative."""
    a = jac / measured[:, None]
    y = (measured - offset) / measured
    best, best_cost = np.zeros(jac.shape[1]), float(np.sum(y**2))
    for size in range(1, jac.shape[1] + 1):
        for subset in itertools.combinations(range(jac.shape[1]), size):
            cols = list(subset)
            sol, *_ = np.linalg.lstsq(a[:, cols], y, rcond=None)
            if np.any(sol < 0):
                continue
            theta = np.zeros(jac.shape[1])
            theta[cols] = sol
            cost = float(np.sum((a @ theta - y) ** 2))
            if cost < best_cost:
                best, best_cost = theta, cost
    return best


def _fit_theta(predict: Callable[[np.ndarray], np.ndarray], measured: np.ndarray, starts: list[np.ndarray]) -> np.ndarray:
    def cost(theta: np.ndarray) -> float:
        return float(np.sum(((predict(theta) - measured) / measured) ** 2))

    best, best_cost = starts[0], cost(starts[0])
    for theta in starts:
        for _ in range(25):
            base = predict(theta)
            steps = np.maximum(np.abs(theta), np.array([1e-6, 1e-6, 1e-12])) * 1e-3
            jac = np.stack([(predict(theta + np.eye(3)[j] * steps[j]) - base) / steps[j] for j in range(3)], axis=1)
            new = _nnls_relative(jac, base - jac @ theta, measured)
            converged = np.allclose(new, theta, rtol=1e-6, atol=1e-15)
            theta = new
            if converged:
                break
        c = cost(theta)
        if c < best_cost:
            best, best_cost = theta, c
    return best


def fit_collective(samples: Sequence[CollectiveSample], kind: str, tier_index: int, mesh: MeshSpec,
                   profile: HardwareProfile) -> tuple[CollectiveFit, FitError]:
    """Alpha-beta figures of ``kind`` on tier ``tier_index`` of ``profile``
    (the other tiers' figures held fixed) that best reproduce ``samples``
    through ``collective_time_s`` (module docstring), with the fit's error.

    >>> from hw_profiles import load
    >>> prof, mesh = load("cpu-gloo"), MeshSpec((2, 2))
    >>> true_prof = _with_fit(prof, 0, "all_gather", (1e-4, 2e-5, 1e-9))
    >>> pts = [CollectiveSample("all_gather", d, 2 * len(d), s,
    ...        collective_time_s("all_gather", s, d, mesh, true_prof), 0.0)
    ...        for d in [(0,), (0, 1)] for s in (64, 2**16, 2**22)]
    >>> fit, err = fit_collective(pts, "all_gather", 0, mesh, prof)
    >>> round(fit.alpha_s, 6), round(fit.alpha_per_step_s, 6), round(fit.beta_s_per_byte * 1e9, 3), err.max < 1e-6
    (0.0001, 2e-05, 1.0, True)
    """
    pts = [s for s in samples if s.kind == kind]
    if not pts:
        raise ValueError(f"calibration: no {kind} measurement on tier {profile.interconnect[tier_index].tier}")
    measured = np.array([s.seconds for s in pts])

    def predict(theta: np.ndarray) -> np.ndarray:
        prof = _with_fit(profile, tier_index, kind, np.maximum(theta, 0.0))
        return np.array([collective_time_s(kind, s.nbytes, s.mesh_dims, mesh, prof) for s in pts])

    t_min = float(measured.min())
    big = max(pts, key=lambda s: s.nbytes)
    beta0 = max(big.seconds / max(big.nbytes, 1), 1e-15)
    starts = [np.array([t_min, 0.0, beta0]), np.array([t_min / 2, t_min / 4, beta0 / 2]),
              np.array([0.0, t_min / 2, beta0 * 2])]
    theta = np.maximum(_fit_theta(predict, measured, starts), 0.0)
    theta[2] = max(theta[2], 1e-16)  # the schema wants a positive beta (a bus faster than 10 PB/s is not real)
    theta = np.array([significant(v) for v in theta])  # the error is that of the figures stored
    error = FitError.of(relative_errors(predict(theta), measured))
    return CollectiveFit(alpha_s=float(theta[0]), alpha_per_step_s=float(theta[1]),
                         beta_s_per_byte=float(theta[2])), error


def fit_interconnect(samples: Sequence[CollectiveSample], mesh: MeshSpec, profile: HardwareProfile,
                     measured_tiers: int) -> tuple[HardwareProfile, dict[tuple[str, str], FitError]]:
    """Fit every (tier, kind) of the first ``measured_tiers`` tiers of
    ``profile`` (innermost first, each with the inner ones fixed) to the
    samples whose group's outermost tier it is; tiers beyond are kept as
    they are (copied from a base profile). Returns the profile with the
    fitted figures and the fit error of each (tier, kind)."""
    errors: dict[tuple[str, str], FitError] = {}
    for index in range(measured_tiers):
        tier = profile.interconnect[index]
        mine = [s for s in samples if s.ranks > 1 and max(f.tier_index for f in mesh.tier_factors(s.mesh_dims, profile)) == index]
        for kind in sorted({s.kind for s in mine}):
            fit, err = fit_collective(mine, kind, index, mesh, profile)
            profile = _with_fit(profile, index, kind, (fit.alpha_s, fit.alpha_per_step_s, fit.beta_s_per_byte))
            errors[(tier.tier, kind)] = err
    return profile, errors
