"""costmodel.mesh: validation, flattening rules (DeviceMesh's _MeshLayout) and
the tier factors that decide which interconnect a group of mesh dims uses."""

from __future__ import annotations

import pytest

from costmodel.mesh import MeshError, MeshSpec
from hw_profiles import load

H100 = load("h100-sxm-80gb")


def test_defaults_are_row_major_with_generated_names():
    mesh = MeshSpec((2, 4, 8))
    assert mesh.strides == (32, 8, 1) and mesh.dim_names == ("d0", "d1", "d2") and mesh.size == 64


def test_group_ranks_follow_devicemesh_flatten_of_non_adjacent_dims():
    # docs/design.md ("What torch offers"): mesh["a", "c"]._flatten() on 2x2x2 gives [0, 1, 4, 5] for rank 0.
    assert MeshSpec((2, 2, 2)).group_ranks((0, 2)) == (0, 1, 4, 5)


def test_any_ascending_group_of_a_row_major_mesh_can_flatten():
    mesh = MeshSpec((2, 4, 8))
    for dims in [(0, 1), (0, 2), (1, 2), (0, 1, 2)]:
        assert mesh.can_flatten(dims)
    assert not mesh.can_flatten((2, 0))  # not ascending, as DeviceMesh requires
    assert not mesh.can_flatten(())


def test_layout_with_inner_dim_first_cannot_flatten_in_mesh_order():
    mesh = MeshSpec.from_rank_order((2, 4), ("dp", "tp"), ("dp", "tp"))
    assert mesh.strides == (1, 2)
    assert not mesh.can_flatten((0, 1))
    assert mesh.can_flatten((1,))


def test_invalid_specs_name_the_field():
    with pytest.raises(MeshError, match="shape"):
        MeshSpec((2, 0))
    with pytest.raises(MeshError, match="dim_names"):
        MeshSpec((2, 2), ("a", "a"))
    with pytest.raises(MeshError, match="strides"):
        MeshSpec((2, 2), ("a", "b"), strides=(1, 1))  # overlapping ranks
    with pytest.raises(MeshError, match="mesh"):
        MeshSpec.from_text("8xx8")


def test_from_text_parses_command_line_forms():
    assert MeshSpec.from_text("2x4x8", "pp,dp,tp") == MeshSpec((2, 4, 8), ("pp", "dp", "tp"))


def test_innermost_dims_ride_nvlink_outer_dims_the_network():
    mesh = MeshSpec((8, 8), ("dp", "tp"))
    assert mesh.dim_tier(1, H100) == "nvlink"
    assert mesh.dim_tier(0, H100) == "network"
    factors = mesh.tier_factors((0, 1), H100)
    assert [(f.tier, f.count) for f in factors] == [("nvlink", 8), ("network", 8)]


def test_user_rank_order_moves_a_dim_onto_nvlink():
    mesh = MeshSpec.from_rank_order((8, 8), ("dp", "tp"), ("dp", "tp"))  # dp innermost
    assert mesh.dim_tier(0, H100) == "nvlink" and mesh.dim_tier(1, H100) == "network"


def test_tier_factors_of_a_group_half_inside_a_node():
    mesh = MeshSpec((2, 4, 8))
    assert [(f.tier, f.count) for f in mesh.tier_factors((1, 2), H100)] == [("nvlink", 8), ("network", 4)]
    assert [(f.tier, f.count) for f in MeshSpec((4, 4)).tier_factors((0, 1), H100)] == [("nvlink", 8), ("network", 2)]
    assert MeshSpec((1, 4)).tier_factors((0,), H100) == ()


def test_to_dict_matches_plan_fingerprint_form():
    assert MeshSpec((8, 8), ("dp", "tp")).to_dict() == {"shape": [8, 8], "dim_names": ["dp", "tp"]}
