"""Mean losses traced as sums over global counts, so that a batch split is exact."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autoshard.search.solve import prepare, solve_prepared
from autoshard.trace import run_joint, trace_joint
from examples.models import mlp

aten = torch.ops.aten


class _Regression(nn.Module):
    def __init__(self, reduction: str) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 3)
        self.reduction = reduction

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = F.mse_loss(self.lin(x), y, reduction=self.reduction)
        return out if out.ndim == 0 else out.sum()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss_runs_the_sum_kernels_and_matches_eager(reduction):
    torch.manual_seed(0)
    model, x, y = _Regression(reduction), torch.randn(8, 6), torch.randn(8, 3)
    traced = trace_joint(model, (x, y))
    reductions = {info.op: info.args[-1] for info in traced.nodes.values()
                  if info.op in (aten.mse_loss.default, aten.mse_loss_backward.default)}
    expected = {"mean": 2, "sum": 2, "none": 0}[reduction]  # mean: rewritten as sum / count
    assert set(reductions.values()) == {expected}, reductions
    result = run_joint(traced, {k: v.detach().clone() for k, v in model.named_parameters()}, (x, y))
    loss = model(x, y)
    loss.backward()
    torch.testing.assert_close(result.loss, loss.detach())
    for fqn, p in model.named_parameters():
        torch.testing.assert_close(result.grads[fqn], p.grad, msg=fqn)


@pytest.mark.parametrize("mesh", [(4,), (2, 2)])
def test_a_ddp_plan_of_the_mlp_gathers_nothing_at_the_loss(mesh):
    # before, mse_loss_backward(mean) had no batch split: the DDP plan all-gathered output and target
    model, inputs = mlp.tiny(device="meta")
    prep = prepare(model, inputs, mesh, ("dp", "tp")[: len(mesh)], profile="cpu-gloo")
    plan = solve_prepared(prep, baseline="ddp", time_limit=10)
    kinds = {s.collective for r in plan.redistributions for s in r.steps}
    assert "all_gather" not in kinds, kinds
    loss_nodes = [n for n in plan.nodes if n.op in ("aten.mse_loss.default", "aten.mse_loss_backward.default")]
    # both the forward and the backward read the prediction and the target split over the batch
    assert loss_nodes and all(n.inputs[-2].startswith("S(0)") and n.inputs[-1].startswith("S(0)")
                              for n in loss_nodes), [(n.op, n.inputs) for n in loss_nodes]
