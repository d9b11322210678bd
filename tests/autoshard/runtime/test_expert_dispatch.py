"""Expert-parallel dispatch and combine on gloo ranks: loss and every gradient equal one device.

A mixture of 8 linear experts, top-2 routing with gates; the routing leaves one expert with no
token anywhere and sends no copy from some ranks to some others. On ``G`` ranks each holds
``8 / G`` experts and its own tokens; the single-device reference runs every rank's tokens
through all experts.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from autoshard.runtime.expert_dispatch import ExpertDispatchError, combine, dispatch
from costmodel.expert_parallel import measured_imbalance
from tests.autoshard.runtime.gloo_ranks import spawn

EXPERTS, TOKENS, TOP_K, DIM = 8, 6, 2, 4
UNUSED = 5  # no token picks this expert


def _problem(world: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(world, TOKENS, DIM, generator=g, dtype=torch.float64)
    choices = torch.tensor([e for e in range(EXPERTS) if e != UNUSED])
    picks = torch.stack([choices[torch.randperm(len(choices), generator=g)[:TOP_K]]
                         for _ in range(world * TOKENS)]).view(world, TOKENS, TOP_K)
    # rank 0 routes only to experts 0 and 1: it sends nothing to the other ranks
    picks[0] = torch.tensor([0, 1])
    gates = torch.rand(world, TOKENS, TOP_K, generator=g, dtype=torch.float64)
    weights = torch.randn(EXPERTS, DIM, DIM, generator=g, dtype=torch.float64)
    probe = torch.randn(world, TOKENS, DIM, generator=g, dtype=torch.float64)
    return {"x": x, "picks": picks, "gates": gates, "weights": weights, "probe": probe}


def _one_device(p: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    x = p["x"].clone().requires_grad_()
    w = p["weights"].clone().requires_grad_()
    per_copy = torch.einsum("rtd,rtkde->rtke", x, w[p["picks"]])
    out = (per_copy * p["gates"].unsqueeze(-1)).sum(2)
    loss = (out * p["probe"]).sum()
    loss.backward()
    return {"loss": loss.detach(), "dx": x.grad, "dw": w.grad}


def _rank(rank: int, world: int, p: dict[str, torch.Tensor]) -> dict[str, object]:
    local = EXPERTS // world
    x = p["x"][rank].clone().requires_grad_()
    w = p["weights"][rank * local:(rank + 1) * local].clone().requires_grad_()
    copies = x.repeat_interleave(TOP_K, dim=0)  # copy i: token i // k, its (i % k)-th expert
    rows, layout = dispatch(copies, p["picks"][rank].reshape(-1), num_experts=EXPERTS, group=dist.group.WORLD)
    sizes = list(layout.expert_rows)  # read on the host with the split sizes
    assert layout.tokens_per_expert.tolist() == sizes
    outs = [chunk @ w[j] for j, chunk in enumerate(torch.split(rows, sizes))]
    back = combine(torch.cat(outs), layout).view(TOKENS, TOP_K, DIM)
    out = (back * p["gates"][rank].unsqueeze(-1)).sum(1)
    loss = (out * p["probe"][rank]).sum()
    loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total)
    received = torch.tensor([layout.received_rows])
    gathered = [torch.zeros_like(received) for _ in range(world)]
    dist.all_gather(gathered, received)
    return {"loss": total, "dx": x.grad, "dw": w.grad, "sizes": sizes,
            "received": [int(t) for t in gathered]}


@pytest.mark.parametrize("world", [2, 4])
def test_dispatch_and_combine_equal_one_device(world, tmp_path):
    p = _problem(world)
    want = _one_device(p)
    results = spawn(world, _rank, (p,), tmp_path / "ranks")
    local = EXPERTS // world
    for rank, got in enumerate(results):
        torch.testing.assert_close(got["loss"], want["loss"])
        torch.testing.assert_close(got["dx"], want["dx"][rank])
        torch.testing.assert_close(got["dw"], want["dw"][rank * local:(rank + 1) * local])
    owner, j = divmod(UNUSED, local)
    assert results[owner]["sizes"][j] == 0  # the expert no token picked got no row, and a zero gradient
    assert torch.count_nonzero(results[owner]["dw"][j]) == 0
    received = results[0]["received"]
    assert sum(received) == world * TOKENS * TOP_K
    assert measured_imbalance(received) >= 1.0


def _bad_rank(rank: int, world: int) -> list[str]:
    messages = []
    # an expert count the group does not divide (refused before any exchange), then an index out of
    # range on every rank (found in the counts' one host read, after their exchange)
    for experts, index in ((3, torch.zeros(4, dtype=torch.int64)), (4, torch.tensor([0, 1, 7, -1]))):
        try:
            dispatch(torch.zeros(4, 2), index, num_experts=experts, group=dist.group.WORLD)
            messages.append("no error")
        except ExpertDispatchError as exc:
            messages.append(str(exc))
    return messages


def test_bad_expert_counts_and_indices_are_named_in_one_line(tmp_path):
    messages = spawn(2, _bad_rank, (), tmp_path / "ranks")
    for divide, index in messages:
        assert divide == "num_experts: 3 experts do not divide over 2 expert-parallel ranks"
        assert index == "expert_of_copy: 2 expert indices outside [0, 4)"
