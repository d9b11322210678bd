"""The profile correction's math (``hw_profiles.correction``): reference times
measured on a machine that is a known factor slower or faster per family give
back those factors, and the corrected profile prices other ops of each family
as that machine runs them. Torch-free: times are synthesized by the cost model."""

from __future__ import annotations

import dataclasses

import pytest

from costmodel.collectives import collective_time_s, latency_part_s
from costmodel.compute import op_time_s
from costmodel.mesh import MeshSpec
from hw_profiles import load
from hw_profiles.correction import ProfileCorrection, ReferenceTime, family_ratios

BASE = load("cpu-gloo")
MESH = MeshSpec((4,))

# the "other machine": launches 2x slower, GEMMs 1.5x, streams 3x, vector math 2.5x, collectives 2.2x
LAUNCH, MATMUL, MEMORY, VECTOR, COLL = 2.0, 1.5, 3.0, 2.5, 2.2


def _other_machine():
    dev = BASE.device
    eff = dataclasses.replace(dev.efficiency, vector=dev.efficiency.vector * MATMUL / VECTOR)
    dev = dataclasses.replace(dev, launch_s=dev.launch_s * LAUNCH, launch_scalar_s=dev.launch_scalar_s * LAUNCH,
                              peak_flops=tuple((k, v / MATMUL) for k, v in dev.peak_flops),
                              memory_bandwidth_Bps=dev.memory_bandwidth_Bps / MEMORY, efficiency=eff)
    tiers = tuple(dataclasses.replace(t, collectives=tuple(
        (k, dataclasses.replace(f, alpha_s=f.alpha_s * COLL, alpha_per_step_s=f.alpha_per_step_s * COLL,
                                beta_s_per_byte=f.beta_s_per_byte * COLL)) for k, f in t.collectives))
        for t in BASE.interconnect)
    return dataclasses.replace(BASE, device=dev, interconnect=tiers)


OTHER = _other_machine()

# (label, family, size, op kind, flops, bytes): bounded by the family's term in cpu-gloo
REFERENCE = [
    ("add 1", "launch", 1.0, "elementwise", 1.0, 12.0),
    ("mm 512", "matmul", 2 * 512.0**3, "matmul", 2 * 512.0**3, 12 * 512.0**2),
    ("mm 128", "matmul", 2 * 128.0**3, "matmul", 2 * 128.0**3, 12 * 128.0**2),
    ("add 4M", "memory", 48 * 2.0**20, "elementwise", 4 * 2.0**20, 48 * 2.0**20),
    ("clone 1M", "memory", 8 * 2.0**20, "copy", 0.0, 8 * 2.0**20),
    ("silu 1M", "vector", 4e6, "elementwise", 4e6, 8e5),
]


def _times(machine) -> list[ReferenceTime]:
    out = []
    for label, family, size, kind, flops, nbytes in REFERENCE:
        def price(profile):
            return op_time_s(kind, flops=flops, bytes_accessed=nbytes, dtype="fp32", profile=profile)
        out.append(ReferenceTime(label, family, size, price(BASE), price(machine)))
    for nbytes in (2.0**16, 2.0**22):
        out.append(ReferenceTime(f"all_reduce {nbytes}", "collective", nbytes,
                                 collective_time_s("all_reduce", nbytes, (0,), MESH, BASE),
                                 collective_time_s("all_reduce", nbytes, (0,), MESH, machine)))
    return out


def test_the_ratios_recover_the_known_scale_of_every_family() -> None:
    ratios = family_ratios(_times(OTHER))
    assert ratios["launch"] == pytest.approx(LAUNCH, rel=0.01)
    assert ratios["matmul"] == pytest.approx(MATMUL, rel=0.01)
    assert ratios["memory"] == pytest.approx(MEMORY, rel=0.01)
    assert ratios["vector"] == pytest.approx(VECTOR, rel=0.01)
    assert ratios["collective_alpha"] == pytest.approx(COLL, rel=1e-6)
    assert ratios["collective_beta"] == pytest.approx(COLL, rel=1e-6)


@pytest.mark.parametrize("kind,flops,nbytes", [
    ("matmul", 2 * 1024.0**3, 12 * 1024.0**2),          # a GEMM not in the reference set
    ("matmul", 2 * 64.0 * 4096 * 256, 4 * (64 * 4096 + 4096 * 256 + 64 * 256.0)),
    ("elementwise", 2.0**22, 12 * 2.0**22),             # a DRAM-sized add
    ("copy", 0.0, 2 * 4 * 2.0**18),                     # a cache-sized copy
    ("elementwise", 2e7, 4e5),                          # vector-bound
    ("reduction", 2.0**20, 4 * 2.0**20),
    ("elementwise", 1.0, 8.0),                          # launch-bound
])
def test_the_corrected_profile_prices_held_out_ops_as_the_other_machine(kind, flops, nbytes) -> None:
    corrected = ProfileCorrection(BASE.fingerprint, {"cpu": "synthetic"}, "2026-11-27T00:00:00Z",
                                  tuple(_times(OTHER))).apply(BASE)
    truth = op_time_s(kind, flops=flops, bytes_accessed=nbytes, dtype="fp32", profile=OTHER)
    base = op_time_s(kind, flops=flops, bytes_accessed=nbytes, dtype="fp32", profile=BASE)
    got = op_time_s(kind, flops=flops, bytes_accessed=nbytes, dtype="fp32", profile=corrected)
    assert got == pytest.approx(truth, rel=0.02)
    assert abs(base / truth - 1) > 0.3  # the uncorrected profile was far off: the check can fail


def test_collectives_are_corrected_at_every_size() -> None:
    corrected = ProfileCorrection(BASE.fingerprint, {}, "d", tuple(_times(OTHER))).apply(BASE)
    for nbytes in (2.0**12, 2.0**20, 2.0**26):
        for kind in ("all_gather", "reduce_scatter"):
            assert collective_time_s(kind, nbytes, (0,), MESH, corrected) == pytest.approx(
                collective_time_s(kind, nbytes, (0,), MESH, OTHER), rel=1e-6)


def test_a_machine_like_the_profile_changes_nothing_and_the_name_says_corrected() -> None:
    same = ProfileCorrection(BASE.fingerprint, {}, "d", tuple(_times(BASE))).apply(BASE)
    assert same.name == "cpu-gloo+corrected"
    assert same.device.launch_s == pytest.approx(BASE.device.launch_s)
    assert same.device.memory_bandwidth_Bps == pytest.approx(BASE.device.memory_bandwidth_Bps)
    assert same.device.peak_flops_for("fp32") == pytest.approx(BASE.device.peak_flops_for("fp32"))


def test_round_trip_and_bad_input() -> None:
    c = ProfileCorrection(BASE.fingerprint, {"cpu": "x", "ranks": 4}, "d", tuple(_times(OTHER)), {"before": [1, 1, 1]})
    again = ProfileCorrection.from_dict(c.to_dict())
    assert again == c
    with pytest.raises(ValueError, match="format"):
        ProfileCorrection.from_dict({"format": "nope"})
    with pytest.raises(ValueError, match="missing or malformed"):
        ProfileCorrection.from_dict({"format": "autoshard.profile_correction/1", "profile": "p"})
    with pytest.raises(ValueError, match="family"):
        ReferenceTime("x", "gpu", 1.0, 1.0, 1.0)


def test_the_reference_step_gives_the_per_op_cost_of_a_step() -> None:
    """A step of 40 ops that takes 20 ms more than its ops alone: 0.5 ms per op, a new figure
    of the corrected profile (not a scale of any curve: ops priced alone do not pay it)."""
    step = ReferenceTime("reference step (40 ops)", "step", 40.0, 0.030, 0.050)
    faster = ReferenceTime("reference step (40 ops)", "step", 40.0, 0.030, 0.020)
    assert family_ratios([step])["step_op_s"] == pytest.approx(5e-4)
    assert family_ratios([faster])["step_op_s"] == 0.0  # never negative
    corrected = ProfileCorrection(BASE.fingerprint, {}, "d", (step,)).apply(BASE)
    assert corrected.device.step_op_s == pytest.approx(5e-4)
    assert op_time_s("matmul", flops=1e9, bytes_accessed=1e6, dtype="fp32", profile=corrected) == \
        op_time_s("matmul", flops=1e9, bytes_accessed=1e6, dtype="fp32", profile=BASE)
    assert load("cpu-gloo").device.step_op_s == 0.0 and "step_op_s" not in BASE.to_dict()["device"]


def test_streams_slowed_by_working_set_are_corrected_along_the_memory_curve() -> None:
    """A machine whose cache-sized streams are 2x slower and DRAM-sized ones 8x: the
    corrected profile prices each at its own ratio (a single scale would miss both)."""
    small, large = 786432.0, 50331648.0

    def stream(nbytes, profile):
        return op_time_s("copy", flops=0.0, bytes_accessed=nbytes, dtype="fp32", profile=profile)

    launch = BASE.device.launch_s
    times = [ReferenceTime("add 1", "launch", 1.0, launch, launch)]
    for nbytes, ratio in ((small, 2.0), (large, 8.0)):
        base = stream(nbytes, BASE)
        times.append(ReferenceTime(f"copy {nbytes}", "memory", nbytes, base, launch + ratio * (base - launch)))
    corrected = ProfileCorrection(BASE.fingerprint, {}, "d", tuple(times)).apply(BASE)
    for nbytes, ratio in ((small, 2.0), (large, 8.0), (2 * large, 8.0)):
        kernel = stream(nbytes, corrected) - launch
        # exact at the curve's own points; between them the curve interpolates its scaled points
        assert kernel == pytest.approx(ratio * (stream(nbytes, BASE) - launch), rel=0.05)
    mid = (small * large) ** 0.5  # log-halfway: the ratio halfway too
    assert stream(mid, corrected) - launch == pytest.approx(5.0 * (stream(mid, BASE) - launch), rel=0.05)


def _scaled_collectives(profile, per_kind):
    """``profile`` with each collective kind's latency and bandwidth terms scaled: ``{kind: (alpha, beta)}``."""
    def scale(kind, f):
        a, b = per_kind.get(kind, (1.0, 1.0))
        return dataclasses.replace(f, alpha_s=f.alpha_s * a, alpha_per_step_s=f.alpha_per_step_s * a,
                                   beta_s_per_byte=f.beta_s_per_byte * b)
    return dataclasses.replace(profile, interconnect=tuple(
        dataclasses.replace(t, collectives=tuple((k, scale(k, f)) for k, f in t.collectives))
        for t in profile.interconnect))


def _collective_times(machine, sizes, latency=True):
    return [ReferenceTime(f"{kind} 4 ranks {int(n)} B", "collective", n,
                          collective_time_s(kind, n, (0,), MESH, BASE),
                          collective_time_s(kind, n, (0,), MESH, machine),
                          latency_part_s(kind, n, 4, BASE.interconnect[0]) if latency else None)
            for kind, ns in sizes.items() for n in ns]


def test_latency_and_bandwidth_are_fitted_apart_per_collective_kind() -> None:
    """A machine whose all_gather latency is 1.5x the profile's and bandwidth 1.3x, reduce_scatter
    2x / 0.8x, all_reduce 3x / 0.6x: with each reference's latency part recorded, the fit recovers
    the ring kinds' factors exactly and the corrected profile prices them at every size as that
    machine. all_reduce is priced as the cheaper of a ring and a tree: where the machine picks
    another algorithm than the profile at a reference size the fit is close, not exact, over
    the references' sizes (4 KiB-4 MiB here; beyond them it extrapolates). Reading latency off the
    smallest message and bandwidth off the largest (no latency parts) misses more, so the check can fail."""
    truth = {"all_reduce": (3.0, 0.6), "all_gather": (1.5, 1.3), "reduce_scatter": (2.0, 0.8)}
    other = _scaled_collectives(BASE, truth)
    sizes = {"all_reduce": (2.0**16, 2.0**19, 2.0**22), "all_gather": (2.0**19, 2.0**22),
             "reduce_scatter": (2.0**19, 2.0**22)}
    ratios = family_ratios(_collective_times(other, sizes))
    for kind in ("all_gather", "reduce_scatter"):
        assert (ratios[f"{kind}_alpha"], ratios[f"{kind}_beta"]) == pytest.approx(truth[kind], rel=1e-6)
    corrected = ProfileCorrection(BASE.fingerprint, {}, "d", tuple(_collective_times(other, sizes))).apply(BASE)
    endpoints = ProfileCorrection(BASE.fingerprint, {}, "d",
                                  tuple(_collective_times(other, sizes, latency=False))).apply(BASE)
    errors = {"fit": {}, "endpoints": {}}
    for kind in truth:
        for n in (2.0**12, 2.0**18, 2.0**21, 2.0**22):
            want = collective_time_s(kind, n, (0,), MESH, other)
            for name, profile in (("fit", corrected), ("endpoints", endpoints)):
                errors[name][kind, n] = abs(collective_time_s(kind, n, (0,), MESH, profile) / want - 1)
    assert max(e for (k, _), e in errors["fit"].items() if k != "all_reduce") < 1e-6
    assert max(errors["fit"].values()) < 0.15
    assert max(errors["endpoints"].values()) > 2 * max(errors["fit"].values())


def test_a_single_scale_is_kept_when_the_fit_would_price_a_term_free() -> None:
    """A small message 3x its price and a large one (which pays the same latency) at half
    of its: only a negative bandwidth factor fits both; one scale on both terms instead."""
    base = _collective_times(BASE, {"all_reduce": (2.0**16, 2.0**22)})
    times = [dataclasses.replace(base[0], measured_s=base[0].predicted_s * 3.0),
             dataclasses.replace(base[1], measured_s=base[1].predicted_s * 0.5)]
    alpha, beta = family_ratios(times)["all_reduce_alpha"], family_ratios(times)["all_reduce_beta"]
    assert alpha == beta > 0


def test_the_back_to_back_pairs_give_the_ranks_skew_at_a_collective() -> None:
    """Eight (gap of compute, all_reduce) pairs 16 ms slower than the gap and the all_reduce
    timed alone: the ranks reach a collective 2 ms apart, a figure of the corrected profile's
    overlap (collectives themselves are priced as before: the skew is paid in the simulated
    step, once per synchronisation, costmodel.overlap)."""
    pairs = ReferenceTime("8 x (gap + all_reduce)", "collective_step", 8.0, 0.040, 0.056)
    assert family_ratios([pairs])["skew_s"] == pytest.approx(2e-3)
    corrected = ProfileCorrection(BASE.fingerprint, {}, "d", (pairs,)).apply(BASE)
    assert corrected.skew_s == pytest.approx(2e-3) and BASE.skew_s == 0.0
    assert corrected.contention == BASE.contention
    for kind in ("all_reduce", "all_gather", "permute"):
        for n in (0.0, 2.0**20):
            assert collective_time_s(kind, n, (0,), MESH, corrected) == collective_time_s(kind, n, (0,), MESH, BASE)
    faster = dataclasses.replace(pairs, measured_s=0.030)
    assert family_ratios([faster])["skew_s"] == 0.0
    assert "skew_s" in corrected.to_dict()["overlap"] and load("cpu-gloo").to_dict()["overlap"].get("skew_s") is None


def test_latency_parts_round_trip() -> None:
    times = tuple(_collective_times(BASE, {"all_gather": (2.0**19, 2.0**22)}))
    c = ProfileCorrection(BASE.fingerprint, {"cpu": "x"}, "d", times)
    assert ProfileCorrection.from_dict(c.to_dict()) == c
    assert all(t.latency_s is not None for t in ProfileCorrection.from_dict(c.to_dict()).times)


def test_every_vector_fraction_is_scaled_by_the_vector_ratio() -> None:
    eff = dataclasses.replace(BASE.device.efficiency, vector_by_op=(("aten.gelu", 0.2), ("aten.silu", 0.9)))
    base = dataclasses.replace(BASE, device=dataclasses.replace(BASE.device, efficiency=eff))
    corrected = ProfileCorrection(base.fingerprint, {}, "d", tuple(_times(OTHER))).apply(base)
    scale = MATMUL / VECTOR
    assert dict(corrected.device.efficiency.vector_by_op) == pytest.approx(
        {"aten.gelu": 0.2 * scale, "aten.silu": min(1.0, 0.9 * scale)}, rel=1e-4)  # the ratio is fitted
    assert corrected.device.efficiency.vector == pytest.approx(BASE.device.efficiency.vector * scale, rel=1e-4)
