"""autoshard.calibrate.fit: curves and alpha-beta fits recover known figures
through the cost model's own formulas; fit errors are those of the stored
(rounded) figures."""

from __future__ import annotations

import dataclasses
import math

import pytest

from autoshard.calibrate.fit import (FitError, curve_from_points, fit_collective, fit_device, fit_interconnect,
                                     predict_compute, significant)
from autoshard.calibrate.measure_collectives import CollectiveSample, default_mesh, mesh_groups
from autoshard.calibrate.measure_compute import ComputeSample
from costmodel.collectives import collective_time_s
from costmodel.mesh import MeshSpec
from hw_profiles import CollectiveFit, HardwareProfile, load

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
    assert device["peak_flops"]["bf16"] == pytest.approx(4e11, rel=0.1)
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
