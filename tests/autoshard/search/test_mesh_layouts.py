"""Mesh layouts of N devices in nodes of K: which are enumerated, how they are
named, and how the node size reaches the collective pricing."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest

from costmodel.collectives import collective_time_s
from costmodel.mesh import MeshSpec
from hw_profiles import load

from autoshard.search.mesh_layouts import (check_devices, devices_per_node_of, enumerate_layouts, layout_dim_names,
                                    profile_for_nodes)


def _groups_spread_evenly(shape: tuple[int, ...], node: int) -> bool:
    """Every group of every mesh dim has the same number of members in each node it touches."""
    mesh = MeshSpec(shape)
    for dim in range(mesh.ndim):
        others = [range(m) if d != dim else range(1) for d, m in enumerate(shape)]
        for coord in itertools.product(*others):
            start = mesh.rank(coord)
            members = [start + c * mesh.strides[dim] for c in range(shape[dim])]
            if len(set(Counter(r // node for r in members).values())) > 1:
                return False
    return True


def test_64_devices_in_nodes_of_8_give_every_factorization_in_every_order() -> None:
    texts = [layout.text for layout in enumerate_layouts(64, 8)]
    assert texts[:6] == ["64", "2x32", "4x16", "8x8", "16x4", "32x2"]
    three = {"x".join(map(str, p)) for p in itertools.product([2, 4, 8, 16], repeat=3) if math.prod(p) == 64}
    assert set(texts[6:]) == three and len(texts) == 16


@pytest.mark.parametrize("devices,node", [(24, 8), (48, 8), (12, 4), (36, 6), (16, 8), (72, 8)])
def test_a_layout_is_kept_exactly_when_no_group_straddles_a_node(devices: int, node: int) -> None:
    kept = {layout.shape for layout in enumerate_layouts(devices, node)}
    for parts in (1, 2, 3):
        for shape in itertools.product(range(2, devices + 1), repeat=parts):
            if math.prod(shape) == devices:
                assert (shape in kept) == _groups_spread_evenly(shape, node), shape


def test_one_node_keeps_every_order_and_one_device_is_one_layout() -> None:
    assert [layout.text for layout in enumerate_layouts(8, 8)] == ["8", "2x4", "4x2", "2x2x2"]
    assert [layout.text for layout in enumerate_layouts(6)] == ["6", "2x3", "3x2"]
    assert [layout.shape for layout in enumerate_layouts(1)] == [(1,)]
    assert [layout.text for layout in enumerate_layouts(8, 8, max_dims=1)] == ["8"]


def test_dim_names_follow_torchtitan_order_with_tp_innermost() -> None:
    assert layout_dim_names(1) == ("dp",)
    assert layout_dim_names(2) == ("dp", "tp")
    assert layout_dim_names(3) == ("dp_replicate", "dp_shard", "tp")
    for layout in enumerate_layouts(64, 8):
        assert layout.dim_names == layout_dim_names(len(layout.shape))
        MeshSpec(layout.shape, layout.dim_names)  # valid names for a mesh


@pytest.mark.parametrize("devices,node,message", [
    (0, None, "devices: must be between 1"), (-8, None, "devices: must be between 1"),
    (2.5, None, "devices: expected a positive integer"), (True, None, "devices: expected a positive integer"),
    ("8", None, "devices: expected a positive integer"), (8, 3, "devices_per_node: 3 does not divide devices 8"),
    (8, 0, "devices_per_node: must be between 1"), (2**30, None, "devices: must be between 1"),
])
def test_bad_device_counts_name_the_field(devices, node, message) -> None:
    with pytest.raises(ValueError, match=message):
        check_devices(devices, node)


def test_node_size_comes_from_the_profile_unless_given() -> None:
    h100 = load("h100-sxm-80gb")
    assert devices_per_node_of(h100, 64) == 8
    assert devices_per_node_of(h100, 4) == 4  # one node, partly used
    assert devices_per_node_of(h100, 64, 4) == 4
    assert devices_per_node_of(load("cpu-gloo"), 8) == 8  # one tier: one node
    with pytest.raises(ValueError, match="12 is not a multiple of profile h100-sxm-80gb's 8 devices per node"):
        devices_per_node_of(h100, 12)


def test_node_size_reaches_the_collective_pricing_and_the_fingerprint() -> None:
    h100 = load("h100-sxm-80gb")
    assert profile_for_nodes(h100, 8) is h100 and profile_for_nodes(h100, None) is h100
    four = profile_for_nodes(h100, 4)
    assert four.ranks_per_node == 4 and four.fingerprint != h100.fingerprint
    assert four.interconnect[1:] == h100.interconnect[1:] and four.device == h100.device
    mesh = MeshSpec((8, 8), ("dp", "tp"))
    # dim tp (8 consecutive ranks): one NVLink node of 8, or two nodes of 4 joined by the network
    assert [(f.tier, f.count) for f in mesh.tier_factors((1,), h100)] == [("nvlink", 8)]
    assert [(f.tier, f.count) for f in mesh.tier_factors((1,), four)] == [("nvlink", 4), ("network", 2)]
    assert collective_time_s("all_gather", 2**26, (1,), mesh, four) > collective_time_s("all_gather", 2**26, (1,),
                                                                                        mesh, h100)
    with pytest.raises(ValueError, match="profile cpu-gloo has one interconnect tier"):
        profile_for_nodes(load("cpu-gloo"), 4)
