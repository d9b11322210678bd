"""costmodel.shard_shapes: torch.chunk sizes, strided positions, largest shard."""

from __future__ import annotations

import pytest

from costmodel.shard_shapes import (
    chunk_sizes,
    flat_matches_nested,
    local_indices,
    local_shape,
    max_local_shape,
    strided_positions,
)
from costmodel.placements import parse_placements


@pytest.mark.parametrize("n", range(0, 13))
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5])
def test_chunk_sizes_match_torch_chunk(n, m):
    torch = pytest.importorskip("torch")
    chunks = [len(c) for c in torch.arange(n).chunk(m)] if n else []
    assert chunk_sizes(n, m) == tuple(chunks + [0] * (m - len(chunks)))


def test_strided_positions_match_dtensor_docstring():
    # _StridedShard(0, split_factor=2) over 4 ranks of a 9-element tensor:
    # ranks hold [0,1,5], [2,3,6], [4,7], [8].
    assert [strided_positions(9, 4, 2, r) for r in range(4)] == [(0, 1, 5), (2, 3, 6), (4, 7), (8,)]


def test_local_indices_apply_mesh_dims_left_to_right():
    assert local_indices((8, 3), "S(0)S(0)", (2, 2), (1, 0)) == ((4, 5), (0, 1, 2))
    assert local_shape((5, 7), "S(1)S(0)", (2, 3), (1, 2)) == (1, 3)


def test_max_local_shape_is_the_largest_shard():
    assert max_local_shape((5, 7), parse_placements("S(0)S(1)"), (2, 3)) == (3, 3)
    assert max_local_shape((1, 8), parse_placements("S(0)R"), (4, 2)) == (1, 8)


def test_flat_split_equals_nested_split_only_when_it_should():
    assert flat_matches_nested(16, (2, 4))
    assert not flat_matches_nested(5, (2, 2))  # flat 2,2,1,0 vs nested 2,1,1,1
    assert flat_matches_nested(0, (2, 2))
