"""costmodel.compute: roofline per op kind, efficiency curves, launch floor,
dtype awareness; local re-layouts are never free."""

from __future__ import annotations

import pytest

from costmodel.compute import (
    ComputeError,
    cold_copy_time_s,
    efficiency,
    local_copy_time_s,
    local_fill_time_s,
    matmul_time_s,
    op_time_s,
    transpose_time_s,
)
from pathlib import Path

from hw_profiles import load

# the roofline's arithmetic checked on a datasheet profile: the H100 as shipped before it was
# rebuilt from measurements (datasheet peaks, one memory fraction, 5 us launch, no vector figure)
H100 = load(Path(__file__).with_name("h100_sxm_80gb_datasheet.json"))
A100 = load("a100-sxm-80gb")
H100_MEM = H100.device.efficiency.memory  # the published STREAM fraction (2.90 of 3.35 TB/s)
A100_MEM = A100.device.efficiency.memory


def test_large_matmul_is_compute_bound_at_the_curve_top():
    n = 8192
    flops, nbytes = 2.0 * n**3, 3.0 * n * n * 2
    top = efficiency(H100.device.efficiency.matmul_curve("bf16"), flops)  # 8192^3 is a point of the curve
    assert top == pytest.approx(H100.device.efficiency.matmul_curve("bf16")[3][1], rel=1e-3)
    expected = flops / (9.89e14 * top) + 5e-6
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
    assert t == pytest.approx(nbytes / (3.35e12 * H100_MEM) + 5e-6)
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
    assert local_copy_time_s(nbytes, A100) == pytest.approx(2 * nbytes / (2.039e12 * A100_MEM) + 5e-6)
    assert local_fill_time_s(nbytes, A100) == pytest.approx(nbytes / (2.039e12 * A100_MEM) + 5e-6)


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


def _with_memory_curve(curve):
    import dataclasses

    eff = dataclasses.replace(H100.device.efficiency, memory=curve)
    return dataclasses.replace(H100, device=dataclasses.replace(H100.device, efficiency=eff))


def test_memory_curve_prices_cache_resident_working_sets_faster():
    # 50 MB L2: working sets that fit stream at the full figure, larger ones at 40 %
    profile = _with_memory_curve(((1e6, 1.0), (5e7, 1.0), (5e8, 0.4)))
    small, large = 4e7, 4e9
    t_small = op_time_s("elementwise", flops=0, bytes_accessed=small, dtype="bf16", profile=profile)
    t_large = op_time_s("elementwise", flops=0, bytes_accessed=large, dtype="bf16", profile=profile)
    assert t_small == pytest.approx(small / 3.35e12 + 5e-6)
    assert t_large == pytest.approx(large / (3.35e12 * 0.4) + 5e-6)


def test_memory_curve_interpolates_in_log_bytes_and_prices_copies():
    from costmodel.compute import memory_efficiency

    profile = _with_memory_curve(((1e4, 0.2), (1e6, 0.6)))
    assert memory_efficiency(profile, 1e5) == pytest.approx(0.4)
    assert memory_efficiency(profile, 1.0) == 0.2 and memory_efficiency(profile, 1e12) == 0.6
    # a copy of n bytes moves 2n: the curve is read at its working set, 2n
    assert local_copy_time_s(5e4, profile) == pytest.approx(1e5 / (3.35e12 * 0.4) + 5e-6)


def test_a_cold_copy_moves_its_bytes_at_the_curves_rate_beyond_the_caches():
    # a cache-resident size streams at 1.0 warm; a bucket's copy of it is priced at the tail (0.4)
    profile = _with_memory_curve(((1e6, 1.0), (5e7, 1.0), (5e8, 0.4)))
    assert local_copy_time_s(1e7, profile) == pytest.approx(2e7 / 3.35e12 + 5e-6)
    assert cold_copy_time_s(1e7, profile) == pytest.approx(2e7 / (3.35e12 * 0.4) + 5e-6)
    # a curve lower at small sizes (launch-bound, as on GPUs) keeps its own value there: never faster
    rising = _with_memory_curve(((1e4, 0.2), (1e6, 0.6)))
    assert cold_copy_time_s(5e2, rising) == pytest.approx(local_copy_time_s(5e2, rising))
    # one memory fraction: no cache to fall out of
    assert cold_copy_time_s(1e6, H100) == pytest.approx(local_copy_time_s(1e6, H100))
    with pytest.raises(ComputeError, match="nbytes"):
        cold_copy_time_s(-1, H100)


def test_bucket_copies_are_priced_cold():
    from costmodel.buckets.grouping import _copies_s

    profile = _with_memory_curve(((1e6, 1.0), (5e7, 1.0), (5e8, 0.4)))
    assert _copies_s([1e7, 2e6], profile) == pytest.approx(cold_copy_time_s(1e7, profile)
                                                            + cold_copy_time_s(2e6, profile))


def test_scalar_memory_efficiency_is_the_same_at_every_size():
    for nbytes in (1e3, 1e6, 1e9):
        t = op_time_s("copy", flops=0, bytes_accessed=nbytes, dtype="bf16", profile=H100)
        assert t == pytest.approx(nbytes / (3.35e12 * H100_MEM) + 5e-6)


def test_vector_efficiency_prices_elementwise_flops_when_the_profile_has_one():
    import dataclasses

    eff = dataclasses.replace(H100.device.efficiency, vector=0.01)
    profile = dataclasses.replace(H100, device=dataclasses.replace(H100.device, efficiency=eff))
    flops, nbytes = 5e9, 8e9  # silu-like: 5 FLOPs per 8 bytes
    t = op_time_s("elementwise", flops=flops, bytes_accessed=nbytes, dtype="bf16", profile=profile)
    assert t == pytest.approx(flops / (6.7e13 * 0.01) + 5e-6)  # the fp32 (vector) peak, 1 % of it
    assert op_time_s("elementwise", flops=flops, bytes_accessed=nbytes, dtype="bf16", profile=H100) == pytest.approx(
        nbytes / (3.35e12 * H100_MEM) + 5e-6)  # without it: memory-bound, as before


# -- per-dtype curves, attention backward, scalar operands ---------------------------


def test_a_dtype_with_its_own_curve_uses_it_others_use_matmul():
    eff = H100.device.efficiency
    fp8 = op_time_s("matmul", flops=1e12, bytes_accessed=0, dtype="fp8", profile=H100) - 5e-6
    assert fp8 == pytest.approx(1e12 / (1.979e15 * efficiency(eff.matmul_curve("fp8"), 1e12)))
    assert eff.matmul_curve("fp8") != eff.matmul
    fp64 = op_time_s("matmul", flops=1e12, bytes_accessed=0, dtype="fp64", profile=H100) - 5e-6
    assert fp64 == pytest.approx(1e12 / (6.7e13 * efficiency(eff.matmul, 1e12)))  # no fp64 curve: the default


def test_attention_backward_has_its_own_curve_and_falls_back_to_attention():
    import dataclasses

    eff = H100.device.efficiency
    bwd = op_time_s("attention_backward", flops=1e12, bytes_accessed=0, dtype="bf16", profile=H100) - 5e-6
    assert bwd == pytest.approx(1e12 / (9.89e14 * efficiency(eff.attention_backward, 1e12)))
    plain = dataclasses.replace(H100, device=dataclasses.replace(
        H100.device, efficiency=dataclasses.replace(eff, attention_backward=())))
    assert op_time_s("attention_backward", flops=1e12, bytes_accessed=0, dtype="bf16", profile=plain) == \
        op_time_s("attention", flops=1e12, bytes_accessed=0, dtype="bf16", profile=plain)


def test_fp32_attention_on_an_nvidia_gpu_runs_against_a_third_of_the_tf32_peak():
    # CUDA's memory-efficient kernel multiplies fp32 as 3xTF32 on tensor cores (sm80+), not on the fp32 units
    from costmodel.compute import FP32_ATTENTION_TF32_PASSES

    eff = H100.device.efficiency
    for kind, curve in (("attention", eff.attention), ("attention_backward", eff.attention_backward)):
        t = op_time_s(kind, flops=1e12, bytes_accessed=0, dtype="torch.float32", profile=H100) - H100.device.launch_s
        tf32 = H100.device.peak_flops_for("tf32")
        assert t == pytest.approx(1e12 / (tf32 / FP32_ATTENTION_TF32_PASSES * efficiency(curve, 1e12)))
        assert t < 1e12 / (H100.device.peak_flops_for("fp32") * efficiency(curve, 1e12))  # not the SIMT units
    # an fp32 matmul keeps the fp32 peak; a CPU's fp32 attention keeps its fp32 peak
    mm = op_time_s("matmul", flops=1e12, bytes_accessed=0, dtype="fp32", profile=H100) - H100.device.launch_s
    assert mm == pytest.approx(1e12 / (H100.device.peak_flops_for("fp32") * efficiency(eff.matmul_curve("fp32"), 1e12)))
    cpu = load("cpu-gloo")
    t = op_time_s("attention", flops=1e9, bytes_accessed=0, dtype="fp32", profile=cpu) - cpu.device.launch_s
    assert t == pytest.approx(1e9 / (cpu.device.peak_flops_for("fp32") * efficiency(cpu.device.efficiency.attention, 1e9)))


def test_scalar_operand_pays_the_scalar_floor_where_the_profile_has_one():
    import dataclasses

    tiny = dict(flops=4, bytes_accessed=16, dtype="fp32")
    assert op_time_s("elementwise", **tiny, profile=H100, scalar_operand=True) == \
        op_time_s("elementwise", **tiny, profile=H100)  # no launch_scalar_s: the launch floor
    with_floor = dataclasses.replace(H100, device=dataclasses.replace(H100.device, launch_scalar_s=9e-6))
    assert op_time_s("elementwise", **tiny, profile=with_floor, scalar_operand=True) == pytest.approx(9e-6, rel=1e-3)
    with pytest.raises(ComputeError, match="run_elems"):
        op_time_s("copy", flops=0, bytes_accessed=1, dtype="fp32", profile=H100, run_elems=0)


def test_outputs_at_or_above_the_fresh_page_threshold_pay_their_pages_and_smaller_ones_do_not():
    import dataclasses

    from hw_profiles.profile import FreshPages

    fresh = dataclasses.replace(H100, device=dataclasses.replace(H100.device,
                                                                 fresh_pages=FreshPages(above_bytes=2**25, Bps=4e9)))
    big = dict(flops=0, bytes_accessed=2 * 2**26, dtype="fp32")
    base = op_time_s("copy", **big, profile=fresh)
    assert op_time_s("copy", **big, profile=fresh, output_bytes=(2**25 - 1,)) == base
    assert op_time_s("copy", **big, profile=fresh, output_bytes=(2**26,)) == pytest.approx(base + 2**26 / 4e9)
    assert op_time_s("matmul", flops=1e9, bytes_accessed=3 * 2**26, dtype="fp32", profile=fresh,
                     output_bytes=(2**24, 2**26)) == pytest.approx(
        op_time_s("matmul", flops=1e9, bytes_accessed=3 * 2**26, dtype="fp32", profile=fresh) + 2**26 / 4e9)
    assert op_time_s("view", **big, profile=fresh, output_bytes=(2**26,)) == 0.0
    assert op_time_s("copy", **big, profile=H100, output_bytes=(2**26,)) == op_time_s("copy", **big, profile=H100)
    assert local_copy_time_s(2**26, fresh) == pytest.approx(local_copy_time_s(2**26, H100) + 2**26 / 4e9)


def test_an_op_with_its_own_vector_fraction_is_priced_by_it_others_by_vector():
    import dataclasses

    eff = dataclasses.replace(H100.device.efficiency, vector=0.01, vector_by_op=(("aten.gelu", 0.04),))
    profile = dataclasses.replace(H100, device=dataclasses.replace(H100.device, efficiency=eff))
    flops, nbytes = 5e9, 1e9  # compute-bound at both fractions
    gelu = op_time_s("elementwise", flops=flops, bytes_accessed=nbytes, dtype="bf16", profile=profile,
                     op="aten.gelu.default")
    silu = op_time_s("elementwise", flops=flops, bytes_accessed=nbytes, dtype="bf16", profile=profile,
                     op="aten.silu.default")
    assert gelu == pytest.approx(flops / (6.7e13 * 0.04) + 5e-6)
    assert silu == pytest.approx(flops / (6.7e13 * 0.01) + 5e-6)  # not listed: the profile's vector
    assert op_time_s("elementwise", flops=flops, bytes_accessed=nbytes, dtype="bf16", profile=profile) == silu
