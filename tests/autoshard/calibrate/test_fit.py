"""autoshard.calibrate.fit: curves and alpha-beta fits recover known figures
through the cost model's own formulas; fit errors are those of the stored
(rounded) figures."""

from __future__ import annotations

import dataclasses
import math

import pytest

from autoshard.calibrate.fit import (FitError, curve_from_points, fit_collective, fit_device, fit_fresh_pages,
                                     fit_interconnect, predict_compute, significant)
from autoshard.calibrate.measure_collectives import CollectiveSample, default_mesh, mesh_groups
from autoshard.calibrate.measure_compute import ComputeSample
from costmodel.collectives import collective_time_s
from costmodel.mesh import MeshSpec
from hw_profiles import CollectiveFit, HardwareProfile, load
from hw_profiles.profile import FreshPages

CPU = load("cpu-gloo")


def _profile_with(tier_fits: dict[str, CollectiveFit], profile: HardwareProfile = CPU) -> HardwareProfile:
    tier = dataclasses.replace(profile.interconnect[0], collectives=tuple(tier_fits.items()))
    return dataclasses.replace(profile, interconnect=(tier,))


TRUE = {
    "all_reduce": CollectiveFit(alpha_s=3e-4, alpha_per_step_s=2e-4, beta_s_per_byte=2e-9),
    "all_gather": CollectiveFit(alpha_s=5e-4, alpha_per_step_s=1e-4, beta_s_per_byte=1e-9),
    "permute": CollectiveFit(alpha_s=8e-4, beta_s_per_byte=5e-10),
}


def _samples(mesh: MeshSpec, truth: HardwareProfile, noise: float = 0.0) -> list[CollectiveSample]:
    out = []
    for i, (kind, dims, nbytes) in enumerate(
        (k, d, 2**e) for k in TRUE for d in mesh_groups(mesh) for e in range(4, 28, 3)
    ):
        t = collective_time_s(kind, nbytes, dims, mesh, truth) * (1 + noise * math.sin(7 * i))
        out.append(CollectiveSample(kind, dims, mesh.group_size(dims), nbytes, t, 0.0))
    return out


def test_alpha_beta_fit_recovers_the_figures_that_made_the_times():
    mesh = default_mesh(4)
    truth = _profile_with(TRUE)
    fitted, errors = fit_interconnect(_samples(mesh, truth), mesh, CPU, 1)
    for kind, fit in TRUE.items():
        got = fitted.interconnect[0].collective(kind)
        assert got.alpha_s == pytest.approx(fit.alpha_s, rel=1e-3)
        assert got.alpha_per_step_s == pytest.approx(fit.alpha_per_step_s, rel=1e-3, abs=1e-9)
        assert got.beta_s_per_byte == pytest.approx(fit.beta_s_per_byte, rel=1e-3)
        assert errors[("loopback", kind)].max < 1e-3


def test_fit_error_bounds_every_point_with_the_stored_figures():
    mesh = default_mesh(4)
    samples = [s for s in _samples(mesh, _profile_with(TRUE), noise=0.2) if s.kind == "all_reduce"]
    fit, err = fit_collective(samples, "all_reduce", 0, mesh, CPU)
    assert all(v == significant(v) for v in (fit.alpha_s, fit.alpha_per_step_s, fit.beta_s_per_byte))
    prof = _profile_with({"all_reduce": fit})
    worst = max(abs(collective_time_s("all_reduce", s.nbytes, s.mesh_dims, mesh, prof) - s.seconds) / s.seconds
                for s in samples)
    assert worst == pytest.approx(err.max) and 0.05 < err.max < 0.4
    assert err.median <= err.p90 <= err.max and err.points == len(samples)


def test_fitted_figures_are_never_negative():
    mesh = MeshSpec((4,))
    # time falls with size: the best non-negative fit has beta at its floor, not below 0
    samples = [CollectiveSample("all_gather", (0,), 4, n, 1e-3 / (1 + i), 0.0) for i, n in enumerate((64, 4096, 2**20))]
    fit, _ = fit_collective(samples, "all_gather", 0, mesh, CPU)
    assert fit.alpha_s >= 0 and fit.alpha_per_step_s >= 0 and fit.beta_s_per_byte > 0


def _compute_samples() -> list[ComputeSample]:
    launch = 2e-6
    out = [ComputeSample("launch", "add", "1", "fp32", 1, 12, launch, 0.0)]
    for n in (32, 64, 128, 256, 512, 1024):  # efficiency rises with size towards 1e11 FLOP/s
        flops = 2.0 * n**3
        eff = min(1.0, 0.1 + 0.9 * math.log10(flops / 6.5e4) / math.log10(2.1e9 / 6.5e4))
        out.append(ComputeSample("matmul", "mm", f"{n}x{n}x{n}", "fp32", flops, 12.0 * n * n,
                                 launch + flops / (1e11 * eff), 0.0))
    out.append(ComputeSample("matmul", "mm", "512x512x512", "bf16", 2.0 * 512**3, 6.0 * 512**2,
                             launch + 2.0 * 512**3 / (4e11 * 0.9), 0.0))
    for n in (2**10, 2**14, 2**18, 2**22):  # 80 GB/s in cache, 20 GB/s beyond
        nbytes = 12.0 * n
        out.append(ComputeSample("memory", "add", str(n), "fp32", n, nbytes,
                                 launch + nbytes / (8e10 if nbytes < 1e6 else 2e10), 0.0))
    return out


def test_device_fit_finds_peak_curve_and_cache_bandwidth():
    device = fit_device(_compute_samples(), primary="fp32")
    assert device["launch_s"] == 2e-6
    assert device["peak_flops"]["fp32"] == pytest.approx(1e11, rel=1e-3)
    assert device["peak_flops"]["bf16"] == pytest.approx(3.6e11, rel=1e-3)  # its own best rate, its own curve
    assert device["memory_bandwidth_Bps"] == pytest.approx(8e10, rel=1e-3)
    memory = device["efficiency"]["memory"]
    assert memory[0][1] == pytest.approx(1.0) and memory[-1][1] == pytest.approx(0.25, rel=1e-2)
    data = {**CPU.to_dict(), "device": {**CPU.to_dict()["device"], **device}}
    profile = HardwareProfile.from_dict(data)
    for s in _compute_samples()[1:]:
        if s.kind == "matmul" and s.dtype == "fp32":
            assert predict_compute(s, profile) == pytest.approx(s.seconds, rel=0.02)


def test_curve_bins_take_medians_and_clamp():
    curve = curve_from_points([1e3, 1.1e3, 1.2e3, 1e6], [0.1, 0.5, 0.2, 3.0], decades=0.5)
    assert curve[0][1] == 0.2 and curve[1] == (1e6, 1.0)
    assert FitError.of([0.1, -0.3, 0.2]).max == 0.3


def _truth_profile() -> HardwareProfile:
    """A CPU-like device with every figure the fit derives, to make samples from."""
    data = CPU.to_dict()
    device = data["device"]
    device.update(launch_s=4e-6, launch_scalar_s=9e-6, peak_flops={"fp32": 5e10, "bf16": 2e11, "tf32": 5e10},
                  memory_bandwidth_Bps=3e10)
    device["efficiency"] = {
        "matmul": [[1e5, 0.1], [1e8, 1.0]],
        "matmul_by_dtype": {"bf16": [[1e7, 0.05], [1e10, 1.0]]},  # saturates a thousand times later
        "attention": [[1e6, 0.2], [1e9, 1.0]],
        "attention_backward": [[1e6, 0.1], [1e9, 0.5]],
        "memory": 1.0,
        "run": [[1.0, 0.05], [16.0, 0.3], [256.0, 0.9]],
    }
    return HardwareProfile.from_dict(data)


def _samples_of(truth: HardwareProfile) -> list[ComputeSample]:
    def sample(kind, op, dtype, flops, nbytes, run=math.inf):
        s = ComputeSample(kind, op, "-", dtype, flops, nbytes, 0.0, 0.0, run)
        return dataclasses.replace(s, seconds=predict_compute(s, truth))

    out = [sample("launch", op, "fp32", 1.0, 8.0) for op in ("add", "neg", "sum", "mul_scalar", "mul_Scalar", "add_Scalar")]
    out += [sample("matmul", "mm", "fp32", 2.0 * n**3, 12.0 * n * n) for n in (16, 32, 64, 128, 256, 512)]
    out += [sample("matmul", "mm", "bf16", 2.0 * n**3, 6.0 * n * n) for n in (64, 128, 256, 512, 1024, 2048)]
    out += [sample("memory", "add", "fp32", n, 12.0 * n) for n in (2**12, 2**16, 2**20)]
    for flops in (1e6, 1e7, 1e8, 1e9):
        out += [sample("attention", "sdpa_fwd", "fp32", flops, 1e3), sample("attention", "sdpa_bwd", "fp32", 2.5 * flops, 1e3)]
    for run in (1, 16, 256):
        for op, flops, nbytes in (("copy_slice", 0.0, 2**20), ("mul_bcast", 2**17, 3 * 2**19)):
            strided = sample("access", op, "fp32", flops, nbytes, run)
            twin = sample("access_twin", op, "fp32", flops, nbytes)
            # a loaded host: the pair runs 1.7x slower than the profile says, the ratio holds
            out += [dataclasses.replace(s, shape=f"{op} {run}", seconds=1.7 * s.seconds) for s in (strided, twin)]
    return out


def test_device_fit_recovers_scalar_floor_dtype_curves_attention_backward_and_run_curve():
    truth = _truth_profile()
    samples = _samples_of(truth)
    device = fit_device(samples, primary="fp32")
    assert device["launch_s"] == pytest.approx(4e-6) and device["launch_scalar_s"] == pytest.approx(9e-6)
    eff = device["efficiency"]
    assert set(eff["matmul_by_dtype"]) == {"bf16"} and eff["attention_backward"] and eff["run"]
    # the run curve: the truth's fractions at the measured run lengths
    assert [round(x) for x, _ in eff["run"]] == [1, 16, 256]
    assert [e for _, e in eff["run"]] == pytest.approx([0.05, 0.3, 0.9], rel=0.05)  # the launch part did not scale
    data = {**truth.to_dict(), "device": {**truth.to_dict()["device"], **device}}
    fitted = HardwareProfile.from_dict(data)
    for s in samples:  # every family is reproduced through the cost model's own formulas
        if s.kind not in ("memory", "access", "access_twin"):
            assert predict_compute(s, fitted) == pytest.approx(s.seconds, rel=0.03), s
    # one curve for both dtypes would misprice the small bf16 GEMMs by far
    one_curve = dataclasses.replace(fitted, device=dataclasses.replace(
        fitted.device, efficiency=dataclasses.replace(fitted.device.efficiency, matmul_by_dtype=())))
    small_bf16 = next(s for s in samples if s.kind == "matmul" and s.dtype == "bf16")
    assert predict_compute(small_bf16, one_curve) < 0.5 * small_bf16.seconds


def test_fresh_pages_are_fitted_from_clones_against_copies_and_kept_out_of_the_memory_curve():
    """Clones of 32 MiB and more pay fresh pages (glibc maps them afresh); the fit
    recovers the cost and the threshold, and the memory curve stays the
    streaming rate (the clones above the threshold would pull it down 4x)."""
    truth = dataclasses.replace(_truth_profile(), device=dataclasses.replace(
        _truth_profile().device, fresh_pages=FreshPages(above_bytes=2**25, Bps=4e9)))
    samples = [s for s in _samples_of(_truth_profile()) if s.kind != "memory"]

    def memory(op, n):
        tensors = 3 if op == "add" else 2
        s = ComputeSample("memory", op, str(n), "fp32", float(n) if op == "add" else 0.0, tensors * 4.0 * n, 0.0, 0.0,
                          out_bytes=0.0 if op == "copy_" else 4.0 * n)
        return dataclasses.replace(s, seconds=predict_compute(s, truth))

    samples += [memory(op, 2**k) for k in range(10, 27, 2) for op in ("add", "clone")]
    samples += [memory(op, n) for n in (2**22, 2**23 - 2**10, 2**23, 2**24, 2**25) for op in ("clone", "copy_")]
    device = fit_device(samples, primary="fp32")
    assert device["fresh_pages"]["above_bytes"] == 2**25
    assert device["fresh_pages"]["Bps"] == pytest.approx(4e9, rel=1e-3)
    assert device["memory_bandwidth_Bps"] == pytest.approx(3e10, rel=1e-3)
    assert min(e for _, e in device["efficiency"]["memory"]) == pytest.approx(1.0, abs=1e-3)
    fitted = HardwareProfile.from_dict({**CPU.to_dict(), "device": {**CPU.to_dict()["device"], **device}})
    for s in samples:
        if s.kind == "memory":
            assert predict_compute(s, fitted) == pytest.approx(s.seconds, rel=1e-2), s


def test_no_fresh_pages_where_large_clones_cost_what_copies_cost():
    def memory(op, n, seconds):
        return ComputeSample("memory", op, str(n), "fp32", 0.0, 8.0 * n, seconds, 0.0,
                             out_bytes=0.0 if op == "copy_" else 4.0 * n)

    flat = [memory(op, n, n * 1e-10 * (1.2 if op == "clone" else 1.0)) for n in (2**22, 2**23, 2**24)
            for op in ("clone", "copy_")]
    assert fit_fresh_pages(flat) is None
    assert fit_fresh_pages([memory("clone", 2**24, 1.0)]) is None  # no copy to compare with


def test_each_vector_op_gets_its_own_fraction_where_one_fraction_misses_by_far():
    """Samples made by a profile whose gelu runs 4x the silu rate per counted FLOP (the CPU
    measurements spread 5x): the fit recovers both fractions; the single ``vector`` it also
    fits (for ops not measured) misprices one of them by more than 25 %."""
    base = fit_device(_compute_samples(), primary="fp32")
    truth_eff = {**base["efficiency"], "vector": 0.05,
                 "vector_by_op": {"aten.silu": 0.02, "aten.gelu": 0.08}}
    truth = HardwareProfile.from_dict({**CPU.to_dict(), "device": {**CPU.to_dict()["device"], **base,
                                                                  "efficiency": truth_eff}})
    samples = _compute_samples()
    for op, per_elem in (("silu", 5.0), ("gelu", 12.0)):
        for n in (2**14, 2**18, 2**22):
            s = ComputeSample("vector", op, f"{n // 256}x256", "fp32", per_elem * n, 8.0 * n, 0.0, 0.0)
            samples.append(s.with_seconds(predict_compute(s, truth)))
    device = fit_device(samples, primary="fp32")
    by_op = device["efficiency"]["vector_by_op"]
    assert by_op["aten.silu"] == pytest.approx(0.02, rel=0.03) and by_op["aten.gelu"] == pytest.approx(0.08, rel=0.03)
    fitted = HardwareProfile.from_dict({**CPU.to_dict(), "device": {**CPU.to_dict()["device"], **device}})
    vector = [s for s in samples if s.kind == "vector"]
    assert all(predict_compute(s, fitted) == pytest.approx(s.seconds, rel=0.03) for s in vector)
    one = dataclasses.replace(fitted, device=dataclasses.replace(
        fitted.device, efficiency=dataclasses.replace(fitted.device.efficiency, vector_by_op=())))
    assert max(abs(predict_compute(s, one) / s.seconds - 1) for s in vector) > 0.25
