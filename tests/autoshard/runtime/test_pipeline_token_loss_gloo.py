"""A token-mean loss across microbatches that count different numbers of label tokens.

Four gloo ranks, mesh (2, 2) named ("pp", "dp"): the tiny Hugging Face Llama of
``test_pipeline_hf_gloo.py`` with ``-100`` labels spread so that each dp rank's two
microbatches count different numbers of label tokens (and the two dp ranks too). The
model's loss is a mean over its microbatch's tokens, so the mean over microbatches (and dp
ranks) is not the batch's; with ``loss_weights`` = each row's label tokens and
``loss_weight_total`` = the whole batch's, the dp mean of the loss and every gradient
equal the one-device model's. The same step without weights misses the loss (the check
can fail).
"""

from __future__ import annotations

import pytest
import torch
from gloo_ranks import spawn, whole

from examples.models import hf

pytestmark = pytest.mark.slow

KW = {"batch_size": 8}


def _labels_with_ignored(labels: torch.Tensor) -> torch.Tensor:
    # row r keeps its first 2 + 2r labels (the model shifts them: labels[:, 1:] count)
    out = labels.clone()
    for row in range(out.shape[0]):
        out[row, 2 + 2 * row:] = -100
    return out


def run_weighted(rank: int, world: int) -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from autoshard.plan.pipeline_section import build_pipeline_section
    from autoshard.runtime.pipeline_stages import build_pipeline, model_parts

    reference, inputs = hf.hf_llama(**KW)
    inputs = {**inputs, "labels": _labels_with_ignored(inputs["labels"])}
    model, _ = hf.hf_llama(**KW)
    parts = model_parts(model)
    section = build_pipeline_section(schedule="1F1B", n_ranks=2, n_microbatches=2, batch_size=8,
                                     block_paths=parts.blocks, cuts=(1,), leading=parts.leading,
                                     trailing=parts.trailing)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
    run = build_pipeline(model, mesh, section)
    ref_loss = reference(**inputs).loss
    ref_loss.backward()
    dp = mesh["dp"]
    share = inputs["input_ids"].shape[0] // dp.size()
    mine = {k: v[dp.get_local_rank() * share:(dp.get_local_rank() + 1) * share] for k, v in inputs.items()}
    tokens = (inputs["labels"][:, 1:] != -100).sum(dim=1)
    rows = slice(dp.get_local_rank() * share, (dp.get_local_rank() + 1) * share)

    def dp_mean(loss: torch.Tensor | None) -> torch.Tensor | None:
        if loss is None:
            return None
        dist.all_reduce(loss, group=dp.get_group())
        return loss / dp.size()

    loss = dp_mean(run.step(loss_weights=tokens[rows], loss_weight_total=float(tokens.sum()), **mine))
    grads = {n: whole(p.grad).clone() for n, p in run.named_parameters() if p.grad is not None}
    for p in run.parameters():
        p.grad = None
    unweighted = dp_mean(run.step(**mine))
    return {"loss": loss, "unweighted": unweighted, "ref_loss": ref_loss.detach(), "grads": grads,
            "params": [n for n, _ in run.named_parameters()],
            "ref_grads": {n: p.grad.clone() for n, p in reference.named_parameters()}}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return spawn(4, run_weighted, (), tmp_path_factory.mktemp("pipeline-token-loss") / "ranks", timeout=300)


def test_token_weighted_microbatches_give_the_one_device_loss_and_gradients(results):
    holders = 0
    for rank, res in enumerate(results):
        if res["loss"] is not None:
            holders += 1
            torch.testing.assert_close(res["loss"], res["ref_loss"], rtol=1e-5, atol=1e-6)
        assert res["params"] and set(res["grads"]) == set(res["params"]), f"rank {rank}: a gradient is missing"
        for name, grad in res["grads"].items():
            torch.testing.assert_close(grad, res["ref_grads"][name], rtol=1e-4, atol=1e-6,
                                       msg=lambda m, n=name: f"rank {rank} {n}: {m}")
    assert holders == 2, "the loss is on the two dp ranks of the last stage"


def test_the_unweighted_mean_of_microbatch_means_misses_the_batch_loss(results):
    last = [res for res in results if res["unweighted"] is not None]
    assert last
    for res in last:
        assert abs(float(res["unweighted"]) - float(res["ref_loss"])) > 1e-3


def test_weights_that_leave_a_microbatch_empty_are_refused_in_one_line():
    from autoshard.plan.pipeline_section import build_pipeline_section
    from autoshard.runtime.pipeline_stages import PipelineRun

    section = build_pipeline_section(schedule="GPipe", n_ranks=2, n_microbatches=2, batch_size=4,
                                     block_paths=("a", "b"), cuts=(1,), leading=(), trailing=())
    run = PipelineRun(section, [], [], None, [])
    with pytest.raises(ValueError, match="a microbatch weighs nothing"):
        run.step(loss_weights=torch.tensor([1.0, 2.0, 0.0, 0.0]), tokens=torch.zeros(4, 3))
    with pytest.raises(ValueError, match="3 entries for a batch of 4 rows"):
        run.step(loss_weights=torch.tensor([1.0, 2.0, 3.0]), tokens=torch.zeros(4, 3))
