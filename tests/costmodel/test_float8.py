"""costmodel.float8: a float8 linear's matmul and casts, priced from the profile's fp8 entries."""

from __future__ import annotations

import math

import pytest

from costmodel.compute import efficiency, matmul_time_s, memory_efficiency
from costmodel.float8 import (
    Float8Error, cast_operands, cast_s, float8_gather_bytes, float8_matmul, float8_matmul_s, has_fp8,
)
from hw_profiles import load

H100 = load("h100-sxm-96gb-500w")


def test_large_fp8_gemm_runs_at_the_fp8_peak_times_its_curve():
    m = n = k = 16384
    flops = 2.0 * m * n * k
    fp8_peak = H100.device.peak_flops_for("fp8")
    expected = flops / (fp8_peak * efficiency(H100.device.efficiency.matmul_curve("fp8"), flops))
    got = float8_matmul(m, n, k, H100, cast_a=False, cast_b=False).matmul_s
    assert got == pytest.approx(expected + H100.device.launch_s, rel=1e-9)


def test_fp8_gemm_is_faster_than_bf16_by_the_ratio_of_peak_times_efficiency():
    m, n, k = 8192, 16384, 2048  # a tp-8 shard of a 405B projection, one sequence
    flops = 2.0 * m * n * k
    rate = lambda dt: H100.device.peak_flops_for(dt) * efficiency(H100.device.efficiency.matmul_curve(dt), flops)  # noqa: E731
    bf16 = matmul_time_s(m, n, k, dtype="bf16", profile=H100)
    fp8 = float8_matmul(m, n, k, H100, cast_a=False, cast_b=False).matmul_s
    assert fp8 < bf16
    assert (bf16 - H100.device.launch_s) / (fp8 - H100.device.launch_s) == pytest.approx(rate("fp8") / rate("bf16"),
                                                                                           rel=1e-6)


def test_a_cast_of_a_large_tensor_streams_five_bytes_an_element():
    numel = 2**28  # amax reads 2 bytes, the cast reads 2 and writes 1
    bandwidth = H100.device.memory_bandwidth_Bps
    expected = (2 * numel / memory_efficiency(H100, 2 * numel) + 3 * numel / memory_efficiency(H100, 3 * numel)) / bandwidth
    assert cast_s(numel, H100) == pytest.approx(expected + 2 * H100.device.launch_s, rel=1e-3)  # two kernels


def test_casts_are_priced_only_for_the_operands_that_pay_them():
    both = float8_matmul(4096, 4096, 4096, H100, cast_a=True, cast_b=True)
    only_a = float8_matmul(4096, 4096, 4096, H100, cast_a=True, cast_b=False)
    on_shard = float8_matmul(4096, 4096, 4096, H100, cast_a=True, cast_b=True, b_cast_numel=4096 * 4096 / 8)
    assert both.matmul_s == only_a.matmul_s
    assert both.casts_s == pytest.approx(2 * only_a.casts_s)
    assert only_a.casts_s < on_shard.casts_s < both.casts_s
    assert float8_matmul_s(4096, 4096, 4096, H100) == pytest.approx(both.total_s)


def test_a_weight_gathered_in_float8_is_not_cast_again_at_its_matmul():
    assert cast_operands(False, True, float8_all_gather=False) == (True, True)
    assert cast_operands(False, True, float8_all_gather=True) == (True, False)
    assert cast_operands(False, False, float8_all_gather=True) == (True, True)  # weight gradient: dy^T and x


def test_a_float8_gather_carries_one_byte_an_element():
    assert float8_gather_bytes(1000, 2) == 500
    assert float8_gather_bytes(1000, 4) == 250
    with pytest.raises(Float8Error, match="itemsize"):
        float8_gather_bytes(1000, 0)


def test_a_profile_without_an_fp8_peak_is_refused_by_name():
    cpu = load("cpu-gloo")
    assert not has_fp8(cpu) and has_fp8(H100)
    with pytest.raises(Float8Error, match="profile 'cpu-gloo'.*fp8"):
        float8_matmul(64, 64, 64, cpu)


def test_every_shipped_nvidia_h100_profile_has_an_fp8_curve():
    for name in ("h100-sxm-80gb", "h100-sxm-96gb-500w"):
        curve = load(name).device.efficiency.matmul_curve("fp8")
        assert curve and all(0 < frac <= 1 and math.isfinite(f) for f, frac in curve)
