"""The experts ops run expert-parallel on gloo ranks equal one device.

The experts are a tiny Hugging Face Mixtral's (4 experts, d 64, h 128, SwiGLU), in float64;
each rank has its own tokens and a routing that sends rank 0's copies only to experts 0 and 1
and no copy anywhere to expert 3 (so on the ranks holding it, an expert receives nothing,
and some rank pairs exchange no row). The reference is ``autoshard::experts`` and its
backward run on one device over every rank's tokens.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("transformers")

from autoshard.runtime.expert_ops import (  # noqa: E402
    ExpertOpError, expert_parallel_backward, expert_parallel_forward, gathered_imbalance, measure_imbalance, run_expert_op)
from autoshard.trace.experts import EXPERTS_BACKWARD_OP, EXPERTS_OP  # noqa: E402
from examples.models import hf  # noqa: E402
from tests.autoshard.runtime.gloo_ranks import spawn  # noqa: E402

TOKENS, TOP_K, UNUSED = 5, 2, 3


def _problem(world: int) -> dict[str, torch.Tensor]:
    model, _ = hf.hf_mixtral(num_hidden_layers=1)
    experts = model.model.layers[0].mlp.experts
    g = torch.Generator().manual_seed(3)
    num_experts = experts.gate_up_proj.shape[0]
    dim = experts.down_proj.shape[1]
    allowed = torch.tensor([e for e in range(num_experts) if e != UNUSED])
    index = torch.stack([allowed[torch.randperm(len(allowed), generator=g)[:TOP_K]]
                         for _ in range(world * TOKENS)]).view(world, TOKENS, TOP_K)
    index[0] = torch.tensor([0, 1])  # rank 0 sends only to the first experts' rank
    return {
        "hidden": torch.randn(world, TOKENS, dim, generator=g, dtype=torch.float64),
        "index": index,
        "weights": torch.rand(world, TOKENS, TOP_K, generator=g, dtype=torch.float64),
        "gate_up": experts.gate_up_proj.detach().double(),
        "down": experts.down_proj.detach().double(),
        "grad_out": torch.randn(world, TOKENS, dim, generator=g, dtype=torch.float64),
    }


def _one_device(p: dict[str, torch.Tensor], world: int) -> dict[str, torch.Tensor]:
    flat = [p[name].reshape(world * TOKENS, -1) for name in ("hidden", "index", "weights")]
    out = EXPERTS_OP(*flat, p["gate_up"], p["down"], "silu")
    grads = EXPERTS_BACKWARD_OP(p["grad_out"].reshape(world * TOKENS, -1), *flat, p["gate_up"], p["down"], "silu")
    return {"out": out.view(world, TOKENS, -1), "grad_hidden": grads[0].view(world, TOKENS, -1),
            "grad_weights": grads[1].view(world, TOKENS, TOP_K), "grad_gate_up": grads[2], "grad_down": grads[3]}


def _rank(rank: int, world: int, p: dict[str, torch.Tensor]) -> dict[str, object]:
    local = p["gate_up"].shape[0] // world
    mine = slice(rank * local, (rank + 1) * local)
    args = (p["hidden"][rank], p["index"][rank], p["weights"][rank], p["gate_up"][mine], p["down"][mine])
    group = dist.group.WORLD
    received: list[int] = []
    out = run_expert_op(EXPERTS_OP, (*args, "silu"), group=group, received=received)
    grads = run_expert_op(EXPERTS_BACKWARD_OP, (p["grad_out"][rank], *args, "silu"), group=group)
    # the differentiable forward's autograd agrees with the backward op
    leaves = [t.clone().requires_grad_() for t in (args[0], args[2], args[3], args[4])]
    auto = expert_parallel_forward(leaves[0], args[1], leaves[1], leaves[2], leaves[3], activation="silu", group=group)
    auto.backward(p["grad_out"][rank])
    return {"out": out, "grads": grads, "autograd": [leaf.grad for leaf in leaves],
            "imbalance": measure_imbalance(args[1], p["gate_up"].shape[0], group), "bad": _bad_input(group),
            "recorded": gathered_imbalance(sum(received), group), "received": received}


def _bad_input(group) -> str:
    """Checked in the same ranks: starting gloo ranks is most of this test's time."""
    try:
        expert_parallel_forward(torch.zeros(2, 4), torch.zeros(2, 1, dtype=torch.int64), torch.ones(2, 1),
                                torch.zeros(1, 6, 4), torch.zeros(1, 4, 3), activation="tanh", group=group)
    except ExpertOpError as exc:
        return str(exc)
    return "no error"


@pytest.mark.parametrize("world", [2, 4])
def test_expert_parallel_ops_equal_one_device(world, tmp_path):
    p = _problem(world)
    want = _one_device(p, world)
    results = spawn(world, _rank, (p,), tmp_path / "ranks")
    local = p["gate_up"].shape[0] // world
    counts = torch.bincount(p["index"].reshape(-1), minlength=4).tolist()
    assert counts[UNUSED] == 0
    for rank, got in enumerate(results):
        mine = slice(rank * local, (rank + 1) * local)
        expected = (want["grad_hidden"][rank], want["grad_weights"][rank], want["grad_gate_up"][mine],
                    want["grad_down"][mine])
        torch.testing.assert_close(got["out"], want["out"][rank])
        for name, g, w in zip(("hidden", "weights", "gate_up", "down"), got["grads"], expected):
            torch.testing.assert_close(g, w, msg=name)
        for name, g, w in zip(("hidden", "weights", "gate_up", "down"), got["autograd"], expected):
            torch.testing.assert_close(g, w, msg=f"autograd {name}")
    owner, j = divmod(UNUSED, local)
    assert torch.count_nonzero(results[owner]["grads"][2][j]) == 0  # no copy reached it: zero gradient
    per_rank = [sum(counts[r * local:(r + 1) * local]) for r in range(world)]
    assert results[0]["imbalance"] == pytest.approx(max(per_rank) * world / sum(per_rank))
    # what the runtime records while it runs (the split sizes it already read) gives the same number
    assert [r["received"] for r in results] == [[n] for n in per_rank]
    assert all(r["recorded"] == pytest.approx(results[0]["imbalance"]) for r in results)
    assert all(r["bad"].startswith("activation: 'tanh'") and "\n" not in r["bad"] for r in results)


def test_an_op_that_is_not_an_experts_op_is_named():
    with pytest.raises(ExpertOpError, match=r"^aten.mm.default: not an experts op"):
        run_expert_op(torch.ops.aten.mm.default, (), group=None)
