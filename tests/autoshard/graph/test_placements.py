"""Leaf placements: every even layout of a whole tensor, all-replicate first."""

from __future__ import annotations

import itertools

from costmodel.shard_shapes import max_local_shape
from costmodel.placements import Partial, Replicate

from autoshard.graph.placements import leaf_placements


def test_leaf_placements_are_every_even_split_and_start_replicated() -> None:
    shape, mesh = (4, 6), (2, 3)
    found = leaf_placements(shape, mesh)
    assert found[0] == (Replicate(), Replicate())
    assert len(set(found)) == len(found)
    # brute force: every R / S(d) combination whose nested splits are even
    expected = set()
    for combo in itertools.product(["R", "S(0)", "S(1)"], repeat=2):
        sizes = list(shape)
        ok = True
        for text, m in zip(combo, mesh):
            if text != "R":
                d = int(text[2])
                ok &= sizes[d] % m == 0 and sizes[d] >= m
                sizes[d] //= m
        if ok:
            expected.add("".join(combo))
    assert {"".join(map(str, p)) for p in found} == expected


def test_leaf_placements_never_partial_and_size_one_mesh_dims_replicated() -> None:
    for placements in leaf_placements((8, 8), (1, 4)):
        assert not any(isinstance(p, Partial) for p in placements)
        assert placements[0] == Replicate()
        assert max_local_shape((8, 8), placements, (1, 4)) in {(8, 8), (2, 8), (8, 2)}
