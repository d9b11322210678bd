"""The bytes the price gives each expert-parallel all-to-all are the bytes the runtime's carry.

4 gloo ranks run ``autoshard::experts`` and its backward expert-parallel
(``autoshard.runtime.expert_ops``) on a tiny Mixtral's experts, hidden states in float64 and
routing weights in float32 (so the two itemsizes of the price are told apart), with a skewed
routing (rank 0's tokens all go to expert 0). Every all-to-all the runtime issues is recorded
with the bytes this rank sends and receives. For each of them, in issue order, the largest
buffer any rank sends or receives equals ``costmodel.expert_parallel.exchange_bytes`` at the
routing's measured imbalance (the busiest rank's received copies over the mean), and what
each rank sends in the forward's dispatch equals it at imbalance 1: the backward's rows are
the token and its output gradient side by side, ``2 d`` wide.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from autoshard.runtime.expert_ops import ALL_TO_ALLS, run_expert_op  # noqa: E402
from autoshard.trace.experts import EXPERTS_BACKWARD_OP, EXPERTS_OP  # noqa: E402
from costmodel.expert_parallel import exchange_bytes, measured_imbalance  # noqa: E402
from examples.models import hf  # noqa: E402
from tests.autoshard.runtime.gloo_ranks import spawn  # noqa: E402

WORLD, TOKENS, TOP_K = 4, 6, 2


def _problem() -> dict[str, torch.Tensor]:
    model, _ = hf.hf_mixtral(num_hidden_layers=1, num_local_experts=8)
    experts = model.model.layers[0].mlp.experts
    g = torch.Generator().manual_seed(5)
    num_experts, dim = experts.gate_up_proj.shape[0], experts.down_proj.shape[1]
    index = torch.stack([torch.randperm(num_experts, generator=g)[:TOP_K]
                         for _ in range(WORLD * TOKENS)]).view(WORLD, TOKENS, TOP_K)
    index[0, :, 0] = 0  # rank 0 routes every token to expert 0 first: rank 0's experts are busier
    index[0, :, 1] = 1
    return {"hidden": torch.randn(WORLD, TOKENS, dim, generator=g, dtype=torch.float64),
            "index": index,
            "weights": torch.rand(WORLD, TOKENS, TOP_K, generator=g, dtype=torch.float32),
            "gate_up": experts.gate_up_proj.detach().double(), "down": experts.down_proj.detach().double(),
            "grad_out": torch.randn(WORLD, TOKENS, dim, generator=g, dtype=torch.float64)}


def _rank(rank: int, world: int, p: dict[str, torch.Tensor]) -> list[list[tuple[int, int]]]:
    """(bytes sent, bytes received) of each all-to-all of the forward, then of the backward."""
    import torch.distributed as dist

    from autoshard.runtime import expert_dispatch

    issued: list[tuple[int, int]] = []
    exchange = expert_dispatch._all_to_all

    def counting(rows, out_splits, in_splits, group):
        row_bytes = rows[:1].numel() * rows.element_size() if rows.ndim > 1 else rows.element_size()
        issued.append((sum(in_splits) * row_bytes, sum(out_splits) * row_bytes))
        return exchange(rows, out_splits, in_splits, group)

    expert_dispatch._all_to_all = counting
    local = p["gate_up"].shape[0] // world
    mine = slice(rank * local, (rank + 1) * local)
    args = (p["hidden"][rank], p["index"][rank], p["weights"][rank], p["gate_up"][mine], p["down"][mine], "silu")
    run_expert_op(EXPERTS_OP, args, group=dist.group.WORLD)
    forward = list(issued)
    issued.clear()
    run_expert_op(EXPERTS_BACKWARD_OP, (p["grad_out"][rank], *args), group=dist.group.WORLD)
    return [forward, list(issued)]


def test_priced_bytes_are_the_bytes_each_all_to_all_carries(tmp_path) -> None:
    p = _problem()
    results = spawn(WORLD, _rank, (p,), tmp_path / "ranks")
    num_experts, dim = p["gate_up"].shape[0], p["hidden"].shape[-1]
    local = num_experts // WORLD
    counts = torch.bincount(p["index"].reshape(-1), minlength=num_experts)
    received = [int(counts[r * local:(r + 1) * local].sum()) for r in range(WORLD)]
    imbalance = measured_imbalance(received)
    assert imbalance > 1.2  # the test prices a skewed routing, not the mean
    args = dict(tokens=TOKENS, top_k=TOP_K, dim=dim, itemsize=8, num_experts=num_experts, weight_itemsize=4)
    busiest, mean = exchange_bytes(**args, imbalance=imbalance), exchange_bytes(**args)
    for direction, op in enumerate(("autoshard.experts.default", "autoshard.experts_backward.default")):
        want = (busiest.forward, busiest.backward)[direction]
        assert all(len(r[direction]) == ALL_TO_ALLS[op] == len(want) for r in results)
        for i, priced in enumerate(want):
            carried = max(max(r[direction][i]) for r in results)
            assert carried == pytest.approx(priced, abs=1), (op, i)
    assert {r[0][1][0] for r in results} == {mean.forward[1]}  # every rank sends all its copies
    assert busiest.backward[1] == 2 * busiest.forward[1]  # the token and its gradient, one row
