"""costmodel.async_tp: collective matmuls of torch's async TP, hand-computed chunk pipelines."""

from __future__ import annotations

import pytest

from costmodel.async_tp import (
    CollectiveMatmul, all_gather_matmul_s, collective_matmul_s, fuse, matmul_reduce_scatter_s,
)
from costmodel.overlap import Transfer, simulate


@pytest.mark.parametrize("compute, comm, tp, expected", [
    (8.0, 6.0, 4, 8.0),    # b = 2, a = 2: every shard arrives as the previous chunk ends
    (4.0, 6.0, 4, 7.0),    # comm-bound: D + the last chunk (b = 1)
    (8.0, 0.0, 4, 8.0),    # nothing to gather: the matmul alone
    (0.0, 6.0, 4, 6.0),    # nothing to multiply: the gather alone
    (3.0, 9.0, 1, 3.0),    # tp = 1: no collective
    (6.0, 3.0, 2, 6.0),    # b = 3, a = 3: e = 3, 6
])
def test_all_gather_matmul_hand_computed(compute, comm, tp, expected):
    assert all_gather_matmul_s(compute, comm, tp) == pytest.approx(expected)


@pytest.mark.parametrize("compute, comm, tp, expected", [
    (4.0, 6.0, 4, 7.0),    # c = 1, 2, 3, 4; sends end 3, 5, 7
    (8.0, 3.0, 4, 8.0),    # compute-bound: sends (1 s each) end 3, 5, 7 within the 8 s
    (8.0, 30.0, 4, 32.0),  # comm-bound: first chunk (2 s) then three 10 s sends
])
def test_matmul_reduce_scatter_hand_computed(compute, comm, tp, expected):
    assert matmul_reduce_scatter_s(compute, comm, tp) == pytest.approx(expected)


def test_a_chunk_priced_on_its_own_replaces_the_even_split():
    # four 3 s chunks (a chunk GEMM slower than a quarter of the whole), a = 1: e = 3, 6, 9, 12
    assert all_gather_matmul_s(8.0, 3.0, 4, chunk_s=3.0) == pytest.approx(12.0)


def test_the_fused_time_lies_between_the_longer_part_and_the_sum():
    for compute, comm, tp in ((5.0, 7.0, 8), (7.0, 5.0, 8), (1.0, 1.0, 2)):
        for kind in ("all_gather", "reduce_scatter"):
            t = collective_matmul_s(kind, compute, comm, tp)
            assert max(compute, comm) <= t + 1e-12 <= compute + comm + 1e-12


def test_only_gathers_and_reduce_scatters_fuse():
    with pytest.raises(ValueError, match="not 'all_reduce'"):
        collective_matmul_s("all_reduce", 1.0, 1.0, 2)
    with pytest.raises(ValueError, match="tp"):
        all_gather_matmul_s(1.0, 1.0, 0)


def test_fuse_moves_the_collective_into_its_matmul():
    # op 0 (1 s) produces, an all-gather (6 s) waited before the matmul (op 1, 4 s), then op 2 (1 s)
    compute, transfers = [1.0, 4.0, 1.0], [Transfer(1, 1, (6.0,)), Transfer(0, 3, (2.0,))]
    exposed = simulate(compute, transfers).step_s
    ops, moves = fuse(compute, transfers, [CollectiveMatmul(0, 1, "all_gather", 4)])
    assert ops == [1.0, 7.0, 1.0] and moves == [transfers[1]]
    assert exposed == pytest.approx(2.0 + 6.0 + 4.0 + 1.0)  # the gather queues behind the 2 s transfer
    assert simulate(ops, moves).step_s == pytest.approx(9.0)


def test_fuse_refuses_a_multi_step_or_repeated_transfer():
    with pytest.raises(ValueError, match="2 collectives"):
        fuse([1.0], [Transfer(0, 0, (1.0, 1.0))], [CollectiveMatmul(0, 0, "all_gather", 2)])
    with pytest.raises(ValueError, match="fused twice"):
        fuse([1.0], [Transfer(0, 0, (1.0,))], [CollectiveMatmul(0, 0, "all_gather", 2)] * 2)
