"""costmodel.simulate: shard / unshard / apply_step on NumPy arrays and torch
tensors, checked against hand-worked layouts and against DTensor itself."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from costmodel.shard_shapes import ShardShapeError
from costmodel.placements import parse_placements
from costmodel.simulate import (
    ReplicaMismatchError,
    SimulationError,
    apply_step,
    apply_steps,
    shard,
    unshard,
)
from costmodel.redistribute_steps import RedistributeStep

PLACEMENTS_2D = ["RR", "S(0)R", "RS(1)", "S(0)S(0)", "S(1)S(0)", "_S(0,sf=2)S(0)", "P(sum)S(0)", "S(1)P(max)", "P(avg)P(sum)", "P(min)R"]


def _x(shape):
    return np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)


@pytest.mark.parametrize("placements", PLACEMENTS_2D)
@pytest.mark.parametrize("shape", [(8, 6), (5, 7), (3, 1)])
def test_unshard_inverts_shard_even_and_uneven(placements, shape):
    x = _x(shape)
    for partial in ("offsets", "first"):
        locals_ = shard(x, placements, (2, 3), partial=partial)
        assert np.array_equal(unshard(locals_, placements, (2, 3)), x)


def test_shard_uneven_follows_torch_chunk_with_empty_trailing_chunks():
    locals_ = shard(np.arange(5), "S(0)", (4,))
    assert [locals_[(r,)].tolist() for r in range(4)] == [[0, 1], [2, 3], [4], []]


def test_mesh_dims_split_left_to_right():
    locals_ = shard(np.arange(8), "S(0)S(0)", (2, 2))
    assert locals_[(0, 1)].tolist() == [2, 3] and locals_[(1, 0)].tolist() == [4, 5]


def test_strided_shard_matches_dtensor_docstring_example():
    # DTensor's _StridedShard docstring: [_S(0,sf=2), S(0)] on a 2x2 mesh, 8 rows:
    # rank (0,1) holds rows 4-5, rank (1,0) rows 2-3.
    locals_ = shard(np.arange(8), "_S(0,sf=2)S(0)", (2, 2))
    assert locals_[(0, 1)].tolist() == [4, 5] and locals_[(1, 0)].tolist() == [2, 3]


def test_partial_offsets_differ_per_rank_and_reduce_to_value():
    x = _x((2, 2))
    locals_ = shard(x, "P(sum)", (3,))
    assert not np.array_equal(locals_[(0,)], locals_[(1,)])
    assert np.array_equal(locals_[(0,)] + locals_[(1,)] + locals_[(2,)], x)
    maxes = shard(x, "P(max)", (3,))
    assert np.array_equal(np.maximum.reduce([maxes[(r,)] for r in range(3)]), x)


def test_mixed_partials_reduce_innermost_first():
    x = _x((3, 2))
    locals_ = shard(x, "P(sum)P(max)", (2, 3))
    inner_first = sum(np.maximum.reduce([locals_[(a, b)] for b in range(3)]) for a in range(2))
    assert np.array_equal(inner_first, x)
    assert np.array_equal(unshard(locals_, "P(sum)P(max)", (2, 3)), x)


@pytest.mark.parametrize("placements", ["P(sum)P(max)", "P(max)P(sum)", "P(min)P(avg)"])
def test_partial_offsets_expose_a_wrong_reduction_order(placements):
    x = _x((3, 2))
    locals_ = shard(x, placements, (2, 3))
    ops = {"sum": np.add.reduce, "avg": lambda a: np.add.reduce(a) / len(a), "max": np.maximum.reduce, "min": np.minimum.reduce}
    outer, inner = (ops[p.reduce_op] for p in parse_placements(placements))
    right = outer([inner([locals_[(a, b)] for b in range(3)]) for a in range(2)])
    wrong = inner([outer([locals_[(a, b)] for a in range(2)]) for b in range(3)])
    assert np.array_equal(right, x) and not np.array_equal(wrong, x)


def test_partial_offsets_keep_replicate_dims_identical():
    locals_ = shard(_x((4, 2)), "RP(sum)S(0)", (2, 3, 2))
    for b, c in itertools.product(range(3), range(2)):
        assert np.array_equal(locals_[(0, b, c)], locals_[(1, b, c)])


def test_unshard_rejects_differing_replicas():
    locals_ = shard(_x((4,)), "R", (2,))
    locals_[(1,)] = locals_[(1,)] + 1
    with pytest.raises(ReplicaMismatchError, match="mesh dim 0"):
        unshard(locals_, "R", (2,))


def test_unshard_reports_missing_coordinate():
    locals_ = shard(_x((4,)), "S(0)", (2,))
    del locals_[(1,)]
    with pytest.raises(SimulationError, match=r"\(1,\)"):
        unshard(locals_, "S(0)", (2,))


def test_shard_rejects_bad_tensor_dim_and_placement_count():
    with pytest.raises(ShardShapeError, match="tensor dim 2"):
        shard(_x((4, 4)), "S(2)", (2,))
    with pytest.raises(ShardShapeError, match="2-D mesh"):
        shard(_x((4, 4)), "S(0)", (2, 2))


def test_torch_tensors_work_like_numpy():
    torch = pytest.importorskip("torch")
    x = torch.arange(30.0).reshape(5, 6)
    for placements in ("_S(0,sf=2)S(1)", "P(sum)S(0)", "S(1)P(max)"):
        locals_ = shard(x, placements, (2, 3))
        assert torch.equal(unshard(locals_, placements, (2, 3)), x)


def _dtensor_locals(x, placements, mesh_shape):
    """Every rank's local tensor as DTensor's distribute_tensor makes it."""
    import torch.distributed as dist
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard

    from costmodel import placements as cp

    def convert(p):
        if isinstance(p, cp.Shard):
            return Shard(p.dim)
        if isinstance(p, cp.StridedShard):
            return _StridedShard(p.dim, split_factor=p.split_factor)
        return Replicate()

    world = int(np.prod(mesh_shape))
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=world)
    try:
        with LocalTensorMode(world):
            mesh = init_device_mesh("cpu", mesh_shape)
            dt = distribute_tensor(x, mesh, [convert(p) for p in parse_placements(placements)], src_data_rank=None)
            per_rank = dict(dt.to_local()._local_tensors)
    finally:
        dist.destroy_process_group()
    coords = list(itertools.product(*(range(m) for m in mesh_shape)))
    return {c: per_rank[r] for r, c in enumerate(coords)}


@pytest.mark.parametrize(
    "placements,mesh_shape,shape",
    [
        ("S(0)S(0)", (2, 4), (9, 5)),
        ("_S(0,sf=2)S(0)", (2, 4), (9, 5)),
        ("S(1)_S(0,sf=3)", (2, 2), (7, 3)),
        ("RS(1)S(0)", (2, 2, 2), (5, 3)),
        ("_S(0,sf=4)RS(0)", (2, 2, 2), (11, 2)),
    ],
)
def test_shard_matches_dtensor_distribute_tensor(placements, mesh_shape, shape):
    torch = pytest.importorskip("torch")
    x = torch.arange(float(np.prod(shape))).reshape(shape)
    expected = _dtensor_locals(x, placements, mesh_shape)
    ours = shard(x, placements, mesh_shape)
    for coord, local in expected.items():
        assert torch.equal(ours[coord], local), coord


def test_all_gather_of_strided_shard_restores_natural_order():
    x = _x((9,))
    step = RedistributeStep(
        "all_gather", (0,), 0, 0.0, src=parse_placements("_S(0,sf=2)"), dst=parse_placements("R"), tensor_dim=0
    )
    out = apply_step(shard(x, "_S(0,sf=2)", (4,)), step, (4,))
    assert all(np.array_equal(v, x) for v in out.values())


def test_fused_all_gather_concatenates_in_flattened_group_order():
    x = _x((8, 2))
    step = RedistributeStep("all_gather", (0, 2), 0, 0.0, tensor_dim=0)
    out = apply_step(shard(x, "S(0)RS(0)", (2, 2, 2)), step, (2, 2, 2))
    assert all(np.array_equal(v, x) for v in out.values())


def test_permute_swaps_mesh_coordinates():
    x = _x((4,))
    step = RedistributeStep("permute", (0, 1), 0, 0.0)
    out = apply_step(shard(x, "S(0)R", (2, 2)), step, (2, 2))
    assert np.array_equal(out[(0, 1)], shard(x, "RS(0)", (2, 2))[(0, 1)])


def test_reduce_scatter_and_all_to_all_literal_semantics():
    x = _x((4, 6))
    rs = RedistributeStep("reduce_scatter", (0,), 0, 0.0, tensor_dim=1, reduce_op="sum")
    out = apply_step(shard(x, "P(sum)", (2,)), rs, (2,))
    assert np.array_equal(out[(1,)], x[:, 3:])
    a2a = RedistributeStep("all_to_all", (0,), 0, 0.0, tensor_dim=0, split_tensor_dim=1)
    out = apply_step(shard(x, "S(0)", (2,)), a2a, (2,))
    assert np.array_equal(out[(0,)], x[:, :3])


def test_local_zero_fill_and_pad_keep_the_sum():
    x = _x((4,))
    fill = RedistributeStep("local_zero_fill", (0,), 0, 0.0)
    out = apply_step(shard(x, "R", (2,)), fill, (2,))
    assert np.array_equal(out[(1,)], np.zeros(4)) and np.array_equal(out[(0,)] + out[(1,)], x)
    pad = RedistributeStep("local_zero_pad", (0,), 0, 0.0, tensor_dim=0)
    out = apply_steps(shard(x, "S(0)", (2,)), [pad], (2,))
    assert np.array_equal(out[(1,)], [0, 0, 2, 3])


def test_apply_step_rejects_unknown_kind_and_bad_mesh_dims():
    locals_ = shard(_x((4,)), "R", (2,))
    with pytest.raises(SimulationError, match="collective"):
        apply_step(locals_, RedistributeStep("broadcast", (0,), 0, 0.0), (2,))
    with pytest.raises(SimulationError, match="mesh_dims"):
        apply_step(locals_, RedistributeStep("all_reduce", (1,), 0, 0.0, reduce_op="sum"), (2,))
