"""hw_profiles.correction: a thin reference GEMM beside square ones splits a machine's GEMM
speed into a FLOP ratio and a cost per byte packed (``matmul_byte_s``)."""

from __future__ import annotations

import dataclasses

import pytest

from costmodel.compute import matmul_time_s
from hw_profiles import load
from hw_profiles.correction import ProfileCorrection, ReferenceTime, family_ratios

BASE = load("cpu-gloo")
MATMUL, PACK = 1.3, 4e-11  # the other machine: FLOPs 1.3x slower, 40 ps a byte packed


def _machine(matmul: float, pack: float):
    dev = BASE.device
    return dataclasses.replace(BASE, device=dataclasses.replace(
        dev, peak_flops=tuple((k, v / matmul) for k, v in dev.peak_flops), matmul_byte_s=pack))


def _gemms(machine) -> list[ReferenceTime]:
    out = [ReferenceTime("add 1", "launch", 1.0, BASE.device.launch_s, machine.device.launch_s)]
    for label, family, (m, k, n) in (("mm 128", "matmul", (128, 128, 128)), ("mm 512", "matmul", (512, 512, 512)),
                                     ("mm 16x512x2048", "matmul_thin", (16, 512, 2048))):
        out.append(ReferenceTime(label, family, 2.0 * m * k * n,
                                 matmul_time_s(m, n, k, dtype="fp32", profile=BASE, itemsize=4),
                                 matmul_time_s(m, n, k, dtype="fp32", profile=machine, itemsize=4),
                                 bytes_accessed=4.0 * (m * k + k * n + m * n)))
    return out


def test_the_fit_recovers_the_flop_ratio_and_the_cost_per_byte() -> None:
    ratios = family_ratios(_gemms(_machine(MATMUL, PACK)))
    assert ratios["matmul"] == pytest.approx(MATMUL, rel=1e-6)
    assert ratios["matmul_byte_s"] == pytest.approx(PACK, rel=1e-6)
    assert "matmul_thin" not in ratios


def test_the_corrected_profile_prices_a_held_out_thin_gemm_as_the_machine() -> None:
    machine = _machine(MATMUL, PACK)
    corrected = ProfileCorrection(profile="x", machine={}, times=tuple(_gemms(machine)), date="2026-12-06").apply(BASE)
    for m, k, n in ((8, 512, 2048), (32, 1024, 256), (256, 256, 768)):
        assert matmul_time_s(m, n, k, dtype="fp32", profile=corrected, itemsize=4) == pytest.approx(
            matmul_time_s(m, n, k, dtype="fp32", profile=machine, itemsize=4), rel=1e-6)


def test_a_machine_without_a_packing_cost_gets_none() -> None:
    ratios = family_ratios(_gemms(_machine(MATMUL, 0.0)))
    assert ratios["matmul"] == pytest.approx(MATMUL, rel=1e-6)
    assert ratios["matmul_byte_s"] == pytest.approx(0.0, abs=1e-15)


def test_thin_times_round_trip_with_their_bytes() -> None:
    t = _gemms(BASE)[-1]
    assert ReferenceTime.from_dict(t.to_dict()) == t and t.bytes_accessed == 4.0 * (16 * 512 + 512 * 2048 + 16 * 2048)
