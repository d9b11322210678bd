"""costmodel.compute: roofline per op kind, efficiency curves, launch floor,
dtype awareness; local re-layouts are never free."""

from __future__ import annotations

import pytest

from costmodel.compute import (
    ComputeError,
    efficiency,
    local_copy_time_s,
    local_fill_time_s,
    matmul_time_s,
    op_time_s,
    transpose_time_s,
)
from hw_profiles import load

H100 = load("h100-sxm-80gb")
A100 = load("a100-sxm-80gb")


def test_large_matmul_is_compute_bound_at_the_curve_top():
    n = 8192
    flops, nbytes = 2.0 * n**3, 3.0 * n * n * 2
    expected = flops / (9.89e14 * 0.75) + 5e-6  # curve top for >= 1e12 FLOPs
    assert op_time_s("matmul", flops=flops, bytes_accessed=nbytes, dtype="bf16", profile=H100) == pytest.approx(expected)


def test_efficiency_interpolates_in_log_flops_and_clamps():
    curve = ((1e9, 0.2), (1e11, 0.6))
    assert efficiency(curve, 1e10) == pytest.approx(0.4)
    assert efficiency(curve, 1e3) == 0.2 and efficiency(curve, 1e15) == 0.6


def test_small_matmul_reaches_a_smaller_fraction_of_peak():
    small = op_time_s("matmul", flops=1e9, bytes_accessed=0, dtype="bf16", profile=H100) - 5e-6
    large = op_time_s("matmul", flops=1e12, bytes_accessed=0, dtype="bf16", profile=H100) - 5e-6
    assert (1e9 / small) < 0.5 * (1e12 / large)


def test_dtype_changes_the_peak():
    fp32 = op_time_s("matmul", flops=1e12, bytes_accessed=0, dtype="float32", profile=H100)
    bf16 = op_time_s("matmul", flops=1e12, bytes_accessed=0, dtype="torch.bfloat16", profile=H100)
    assert fp32 > 10 * bf16


def test_elementwise_is_memory_bound_with_launch_floor():
    nbytes = 3 * 2**30
    t = op_time_s("elementwise", flops=2**30, bytes_accessed=nbytes, dtype="bf16", profile=H100)
    assert t == pytest.approx(nbytes / (3.35e12 * 0.85) + 5e-6)
    tiny = op_time_s("reduction", flops=10, bytes_accessed=40, dtype="bf16", profile=H100)
    assert tiny == pytest.approx(5e-6, rel=1e-3)


def test_attention_uses_its_own_curve():
    mm = op_time_s("matmul", flops=1e12, bytes_accessed=0, dtype="bf16", profile=H100)
    attn = op_time_s("attention", flops=1e12, bytes_accessed=0, dtype="bf16", profile=H100)
    assert attn > mm


def test_only_views_are_free():
    assert op_time_s("view", flops=0, bytes_accessed=2**30, dtype="bf16", profile=H100) == 0.0
    assert op_time_s("copy", flops=0, bytes_accessed=0, dtype="bf16", profile=H100) > 0.0
    for fn in (local_copy_time_s, local_fill_time_s, transpose_time_s):
        assert fn(0, H100) > 0.0


def test_copy_reads_and_writes_fill_only_writes():
    nbytes = 2**30
    assert local_copy_time_s(nbytes, A100) == pytest.approx(2 * nbytes / (2.039e12 * 0.88) + 5e-6)
    assert local_fill_time_s(nbytes, A100) == pytest.approx(nbytes / (2.039e12 * 0.88) + 5e-6)


def test_matmul_helper_counts_two_mnk_flops():
    assert matmul_time_s(4096, 4096, 4096, dtype="bf16", profile=H100) == pytest.approx(
        op_time_s("matmul", flops=2 * 4096**3, bytes_accessed=2 * 3 * 4096**2, dtype="bf16", profile=H100)
    )


def test_errors_name_the_argument():
    with pytest.raises(ComputeError, match="kind"):
        op_time_s("conv", flops=1, bytes_accessed=1, dtype="bf16", profile=H100)
    with pytest.raises(ComputeError, match="dtype"):
        op_time_s("matmul", flops=1, bytes_accessed=1, dtype="int4", profile=H100)
    with pytest.raises(ComputeError, match="nbytes"):
        local_copy_time_s(-1, H100)
