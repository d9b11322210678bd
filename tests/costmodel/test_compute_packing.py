"""costmodel.compute: a GEMM pays ``device.matmul_byte_s`` per byte it accesses on top of
its FLOP term (operand packing), so thin GEMMs run at a lower FLOP rate than square ones."""

from __future__ import annotations

import dataclasses

import pytest

from costmodel.compute import efficiency, matmul_time_s, op_time_s
from hw_profiles import load, load_dict, validate

CPU = load("cpu-gloo")
C = 5e-11  # s/B: the figure a `here` correction fitted on a 2-core Xeon VM (2026-12-06)


def _with(c: float):
    return dataclasses.replace(CPU, device=dataclasses.replace(CPU.device, matmul_byte_s=c))


def test_a_gemm_pays_its_flop_term_plus_its_bytes_times_matmul_byte_s() -> None:
    m, k, n = 16, 512, 2048
    flops, nbytes = 2.0 * m * k * n, 4.0 * (m * k + k * n + m * n)
    peak = CPU.device.peak_flops_for("fp32")
    expected = flops / (peak * efficiency(CPU.device.efficiency.matmul_curve("fp32"), flops)) + C * nbytes
    got = matmul_time_s(m, n, k, dtype="fp32", profile=_with(C), itemsize=4)
    assert got == pytest.approx(expected + CPU.device.launch_s, rel=1e-9)


def test_thin_gemms_lose_more_of_their_flop_rate_than_square_ones() -> None:
    # rate relative to the FLOP term alone: 1 / (1 + c B / flop term); measured on one core of the
    # Xeon VM, relative to 512^3: 16x512x2048 0.66-0.83, 512^3 1 (benchmarks/results/calibration.md)
    def slowdown(m: int, k: int, n: int) -> float:
        return (matmul_time_s(m, n, k, dtype="fp32", profile=_with(C), itemsize=4)
                / matmul_time_s(m, n, k, dtype="fp32", profile=CPU, itemsize=4))
    thin, square = slowdown(16, 512, 2048), slowdown(512, 512, 512)
    assert 1.2 < thin < 1.6 and 1.0 < square < 1.05


def test_attention_and_elementwise_ops_do_not_pay_the_packing_cost() -> None:
    for kind in ("attention", "elementwise", "copy"):
        args = dict(flops=1e8, bytes_accessed=4e6, dtype="fp32")
        assert op_time_s(kind, profile=_with(C), **args) == op_time_s(kind, profile=CPU, **args)


def test_the_field_round_trips_and_a_profile_without_it_keeps_its_dict() -> None:
    data = _with(C).to_dict()
    assert data["device"]["matmul_byte_s"] == C
    validate(data)
    assert load_dict(data).device.matmul_byte_s == C
    assert "matmul_byte_s" not in CPU.to_dict()["device"]  # shipped profiles keep their fingerprints
