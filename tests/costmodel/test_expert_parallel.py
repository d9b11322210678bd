"""The price of expert parallelism's exchanges, checked against the collective model by hand."""

from __future__ import annotations

import pytest

from costmodel.collectives import collective_time_s
from costmodel.expert_parallel import (DEFAULT_IMBALANCE, ExchangeBytes, ExpertParallelError, exchange_bytes,
                                       expert_exchange_price, measured_imbalance)
from costmodel.mesh import MeshSpec
from hw_profiles import load


@pytest.fixture(scope="module")
def h100():
    return load("h100-sxm-80gb")


def test_each_all_to_all_of_the_runtime_at_the_busiest_load(h100):
    """Forward: counts, dispatch, combine; backward: counts, token-and-gradient rows (2d),
    routing weights, input gradients, weights' gradients: each priced on its own."""
    mesh = MeshSpec((8, 8))
    price = expert_exchange_price(tokens=8192, top_k=2, dim=4096, itemsize=2, num_experts=64, mesh_dims=(1,),
                                  mesh=mesh, profile=h100, imbalance=1.5, weight_itemsize=4)
    rows = 1.5 * 8192 * 2
    nbytes = int(rows * 4096 * 2)

    def t(b: float) -> float:
        return collective_time_s("all_to_all", int(b), (1,), mesh, h100)

    counts = t(64 * 8)
    assert price.ep_ranks == 8
    assert price.bytes_per_exchange == nbytes
    assert price.exchange_s == t(nbytes)
    assert price.forward_s == pytest.approx(counts + 2 * t(nbytes))
    assert price.backward_s == pytest.approx(counts + t(2 * nbytes) + t(rows * 4) + t(nbytes) + t(rows * 4))
    assert price.step_s == pytest.approx(price.forward_s + price.backward_s)
    assert price.backward_s > price.forward_s
    assert price.buffer_bytes == 2 * nbytes
    sent = 8192 * 2 * 4096 * 2
    assert price.forward_temp_bytes == 2 * nbytes + 2 * sent
    assert price.backward_temp_bytes == 4 * nbytes + 3 * sent
    assert exchange_bytes(tokens=8192, top_k=2, dim=4096, itemsize=2, num_experts=64, weight_itemsize=4,
                          imbalance=1.5) == ExchangeBytes((512, nbytes, nbytes),
                                                          (512, 2 * nbytes, int(rows * 4), nbytes, int(rows * 4)))


def test_more_imbalance_costs_more_and_across_nodes_more_than_inside(h100):
    mesh = MeshSpec((8, 8))
    args = dict(tokens=4096, top_k=8, dim=2048, itemsize=2, num_experts=128, mesh=mesh, profile=h100)
    even = expert_exchange_price(**args, mesh_dims=(1,), imbalance=1.0)
    skewed = expert_exchange_price(**args, mesh_dims=(1,), imbalance=2.0)
    across = expert_exchange_price(**args, mesh_dims=(0,), imbalance=1.0)
    assert skewed.exchange_s > even.exchange_s
    assert across.exchange_s > even.exchange_s  # mesh dim 0 crosses nodes (inner dims inside a node)
    assert expert_exchange_price(**args, mesh_dims=(1,)).bytes_per_exchange == int(
        DEFAULT_IMBALANCE * 4096 * 8 * 2048 * 2)


def test_one_rank_moves_nothing(h100):
    price = expert_exchange_price(tokens=16, top_k=2, dim=8, itemsize=4, num_experts=4, mesh_dims=(0,),
                                  mesh=MeshSpec((1, 4)), profile=h100)
    assert price.step_s == 0.0 and price.ep_ranks == 1


def test_bad_input_is_named(h100):
    mesh = MeshSpec((8, 8))
    with pytest.raises(ExpertParallelError, match="6 experts do not divide over 8"):
        expert_exchange_price(tokens=1, top_k=1, dim=1, itemsize=2, num_experts=6, mesh_dims=(1,), mesh=mesh,
                              profile=h100)
    with pytest.raises(ExpertParallelError, match="below 1"):
        expert_exchange_price(tokens=1, top_k=1, dim=1, itemsize=2, num_experts=8, mesh_dims=(1,), mesh=mesh,
                              profile=h100, imbalance=0.5)
    with pytest.raises(ExpertParallelError, match="mesh dim 2"):
        expert_exchange_price(tokens=1, top_k=1, dim=1, itemsize=2, num_experts=8, mesh_dims=(2,), mesh=mesh,
                              profile=h100)


def test_measured_imbalance_is_max_over_mean():
    assert measured_imbalance([10, 30, 20, 20]) == 1.5
    assert measured_imbalance([5, 5]) == 1.0
    assert measured_imbalance([0, 0]) == 1.0
