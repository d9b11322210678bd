"""costmodel.collectives: alpha-beta formulas per kind and tier checked by
hand, ring vs tree, hierarchical groups spanning tiers, trivial groups; the
published bus-bandwidth curves (interpolation in size and in ranks, their
place in hierarchical groups) checked against hand computations."""

from __future__ import annotations

import math

import pytest

from costmodel.collectives import CollectiveError, collective_cost, collective_time_s, curve_time_s, tier_time_s
from costmodel.mesh import MeshSpec
from hw_profiles import BusBandwidthCurve, CollectiveFit, load

PUBLISHED = load("h100-sxm-80gb")
H100 = PUBLISHED.without_bus_bandwidth()  # the alpha-beta formulas, checked by hand below
MESH = MeshSpec((8, 8), ("dp", "tp"))
NVL, NET = H100.tier("nvlink"), H100.tier("network")


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter", "all_to_all"])
def test_ring_like_kinds_on_one_tier(kind):
    fit, s = NVL.collective(kind), 64 * 2**20
    expected = fit.alpha_s + 7 * fit.alpha_per_step_s + fit.beta_s_per_byte * s * 7 / 8
    assert collective_time_s(kind, s, (1,), MESH, H100) == pytest.approx(expected)


def test_all_reduce_large_is_ring():
    fit, s = NVL.collective("all_reduce"), 2**30
    ring = fit.alpha_s + 2 * 7 * fit.alpha_per_step_s + 2 * fit.beta_s_per_byte * s * 7 / 8
    assert collective_time_s("all_reduce", s, (1,), MESH, H100) == pytest.approx(ring)


def test_all_reduce_small_over_many_ranks_is_tree():
    fit = NET.collective("all_reduce")
    s, n = 1024, 64
    mesh = MeshSpec((64,))  # 64 ranks, 8 nodes: hierarchical or tree
    tree = tier_time_s("all_reduce", s, n, NET, algorithm="tree")
    ring = tier_time_s("all_reduce", s, n, NET, algorithm="ring")
    assert tree < ring
    assert tree == pytest.approx(fit.alpha_s + 2 * math.ceil(math.log2(n)) * fit.alpha_per_step_s + 2 * s * fit.beta_s_per_byte)
    cost = collective_cost("all_reduce", s, (0,), mesh, H100)
    assert cost.algorithm in ("tree", "hierarchical") and cost.total_s <= ring


def test_hierarchical_all_gather_sends_one_eighth_over_the_network():
    s = 2**30
    cost = collective_cost("all_gather", s, (0, 1), MESH, H100)
    assert [(st.tier, st.ranks, st.bytes) for st in cost.stages] == [("nvlink", 8, s), ("network", 8, s / 8)]
    nvl, net = NVL.collective("all_gather"), NET.collective("all_gather")
    expected = max(nvl.alpha_s, net.alpha_s) + 7 * nvl.alpha_per_step_s + nvl.beta_s_per_byte * s * 7 / 8
    expected += 7 * net.alpha_per_step_s + net.beta_s_per_byte * s / 8 * 7 / 8
    assert cost.total_s == pytest.approx(expected)


def test_hierarchical_all_reduce_is_reduce_scatter_all_reduce_all_gather():
    s = 2**30
    cost = collective_cost("all_reduce", s, (0, 1), MESH, H100)
    assert cost.algorithm == "hierarchical"
    nvl, net = NVL.collective("all_reduce"), NET.collective("all_reduce")
    inner = 2 * (7 * nvl.alpha_per_step_s + nvl.beta_s_per_byte * s * 7 / 8)
    outer = 2 * (7 * net.alpha_per_step_s + net.beta_s_per_byte * s / 8 * 7 / 8)
    assert cost.total_s == pytest.approx(max(nvl.alpha_s, net.alpha_s) + inner + outer)


def test_network_group_costs_more_than_nvlink_group():
    s = 64 * 2**20
    assert collective_time_s("all_reduce", s, (0,), MESH, H100) > 5 * collective_time_s("all_reduce", s, (1,), MESH, H100)


def test_permute_crossing_nodes_pays_network_point_to_point():
    fit, s = NET.collective("permute"), 2**20
    assert collective_time_s("permute", s, (0, 1), MESH, H100) == pytest.approx(fit.alpha_s + fit.beta_s_per_byte * s)


def test_one_rank_group_is_free_and_time_grows_with_bytes():
    assert collective_time_s("all_reduce", 2**30, (0,), MeshSpec((1, 8)), H100) == 0.0
    sizes = [2**k for k in range(10, 31, 4)]
    times = [collective_time_s("all_gather", s, (0, 1), MESH, H100) for s in sizes]
    assert times == sorted(times)


def test_profile_without_a_kind_falls_back_to_all_reduce_figures():
    from hw_profiles.profile import _EXAMPLE
    from hw_profiles import load_dict

    profile = load_dict(_EXAMPLE)
    fit = profile.interconnect[0].collective("all_gather")
    assert fit == profile.interconnect[0].collective("all_reduce")
    assert collective_time_s("all_gather", 2**20, (1,), MESH, profile) > 0


def test_errors_name_the_argument():
    with pytest.raises(CollectiveError, match="kind"):
        collective_time_s("broadcast", 1, (0,), MESH, H100)
    with pytest.raises(CollectiveError, match="nbytes"):
        collective_time_s("all_reduce", -1, (0,), MESH, H100)
    with pytest.raises(CollectiveError, match="mesh_dims"):
        collective_time_s("all_reduce", 1, (2,), MESH, H100)


# -- published bus-bandwidth curves ------------------------------------------------


def _fit(*curves):
    return CollectiveFit(1e-5, 1e-12, bus_bandwidth=tuple(BusBandwidthCurve(n, tuple(p)) for n, p in curves))


def test_curve_time_is_bus_factor_times_size_over_interpolated_busbw():
    fit = _fit((8, [(1e3, 1e8), (1e7, 1e10), (1e9, 4e11)]))
    # a listed point: all_reduce on 8 ranks moves 2 * 7/8 of S per rank
    assert curve_time_s("all_reduce", 1e7, 8, fit) == pytest.approx(1.75 * 1e7 / 1e10)
    # halfway in log10(S) between 1e7 and 1e9: busbw is the geometric mean 2e10 * 10
    assert curve_time_s("all_gather", 1e8, 8, fit) == pytest.approx(0.875 * 1e8 / math.sqrt(1e10 * 4e11))
    # beyond the largest size the busbw holds; below the smallest the time holds (latency)
    assert curve_time_s("all_gather", 4e9, 8, fit) == pytest.approx(0.875 * 4e9 / 4e11)
    assert curve_time_s("all_gather", 10, 8, fit) == curve_time_s("all_gather", 0, 8, fit) == pytest.approx(0.875 * 1e3 / 1e8)


def test_curve_time_between_group_sizes_interpolates_in_log_ranks():
    fit = _fit((2, [(1e6, 1e11)]), (8, [(1e6, 4e11)]))
    t2, t8 = curve_time_s("all_gather", 1e6, 2, fit), curve_time_s("all_gather", 1e6, 8, fit)
    assert t2 == pytest.approx(0.5 * 1e6 / 1e11) and t8 == pytest.approx(0.875 * 1e6 / 4e11)
    t4 = curve_time_s("all_gather", 1e6, 4, fit)  # busbw at 4 ranks: half way in log(n), 2e11
    assert t4 == pytest.approx(math.exp((math.log(0.75 * 1e6 / 1e11) + math.log(0.75 * 1e6 / 4e11)) / 2))
    assert curve_time_s("all_gather", 1e6, 16, fit) == pytest.approx(15 / 16 * 1e6 / 4e11)  # nearest curve's busbw
    assert curve_time_s("all_gather", 1e6, 4, CollectiveFit(1e-5, 1e-12)) is None


def test_published_h100_all_reduce_reproduces_the_azure_table():
    # ND H100 v5, 8 GPUs, NVLS all_reduce busbw: 1 MiB 43.70 GB/s, 1 GiB 466.35 GB/s
    nvlink = PUBLISHED.tier("nvlink")
    for size, busbw in ((2**20, 43.70e9), (2**30, 466.35e9)):
        t = tier_time_s("all_reduce", size, 8, nvlink)
        assert 1.75 * size / t == pytest.approx(busbw, rel=1e-3)
    cost = collective_cost("all_reduce", 2**30, (1,), MESH, PUBLISHED)
    assert cost.algorithm == "measured curve" and cost.latency_s == 0.0


def test_curves_price_the_stages_of_a_flattened_group():
    s = 2**30
    cost = collective_cost("all_gather", s, (0, 1), MESH, PUBLISHED)
    nvl = PUBLISHED.tier("nvlink").collective("all_gather")
    net = PUBLISHED.tier("network").collective("all_gather")
    inner = curve_time_s("all_gather", s, 8, nvl)  # the nvlink stage from its curve, latency included
    outer = 7 * net.alpha_per_step_s + net.beta_s_per_byte * s / 8 * 7 / 8  # no curve across nodes: alpha-beta
    assert cost.latency_s == net.alpha_s  # only the tier without a curve adds a call latency
    assert cost.total_s == pytest.approx(net.alpha_s + inner + outer)


def test_without_bus_bandwidth_gives_back_the_alpha_beta_price():
    s = 64 * 2**20
    fit = NVL.collective("all_gather")
    assert collective_time_s("all_gather", s, (1,), MESH, H100) == pytest.approx(
        fit.alpha_s + 7 * fit.alpha_per_step_s + fit.beta_s_per_byte * s * 7 / 8)
    assert collective_time_s("all_gather", s, (1,), MESH, PUBLISHED) != collective_time_s("all_gather", s, (1,), MESH, H100)
