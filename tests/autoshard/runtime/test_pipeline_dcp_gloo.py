"""Checkpoints across stage counts: saved by a pp 2 x dp 2 pipeline, resumed by pp 4 and by no pipeline.

Four gloo ranks, the example LLaMA (tiny, fp32, 4 blocks, batch 8). The one-device model
runs three AdamW steps uninterrupted (losses ``L0, L1, L2``). A pipeline of 2 stages
(1F1B, 2 microbatches, FSDP over dp 2) takes step 0 and saves its parameters and AdamW
state with ``dcp.save`` (``autoshard.runtime.pipeline_checkpoint.pipeline_state_dict``).
Two fresh models with other weights load that checkpoint: a pipeline of 4 stages on a
``pp`` mesh of 4 (one block each, 4 microbatches, recomputing each block's forward: the
section's ``recompute`` "full", saved without it) and the plain model on every rank (torch's
``get_state_dict`` with the flattened optimizer layout). Each then takes steps 1 and 2:
their losses equal ``L1, L2`` (only the right weights and optimizer moments give them).
"""

from __future__ import annotations

import pytest
import torch
from gloo_ranks import spawn

from examples.models import llama3

pytestmark = pytest.mark.slow

KW = {"batch_size": 8, "n_layers": 4}
LR = 1e-2


def _pipeline(mesh_shape, names, cuts, seed, m, recompute="none"):
    from torch.distributed.device_mesh import init_device_mesh

    from autoshard.plan.pipeline_section import build_pipeline_section
    from autoshard.runtime.pipeline_stages import build_pipeline, model_parts

    model, _ = llama3.tiny(seed=seed, **KW)
    parts = model_parts(model)
    section = build_pipeline_section(schedule="1F1B", n_ranks=mesh_shape[0], n_microbatches=m, batch_size=8,
                                     block_paths=parts.blocks, cuts=cuts, leading=parts.leading,
                                     trailing=parts.trailing, recompute=recompute)
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    run = build_pipeline(model, mesh, section)
    return run, torch.optim.AdamW(run.parameters(), lr=LR), mesh


def _pipeline_loss(run, mesh, tokens, labels) -> float | None:
    """One step of this rank's dp shard; the loss averaged over dp on the last stage, else None."""
    import torch.distributed as dist

    dp = mesh["dp"] if "dp" in mesh.mesh_dim_names else None
    size, coord = (dp.size(), dp.get_local_rank()) if dp is not None else (1, 0)
    rows = slice(coord * 8 // size, (coord + 1) * 8 // size)
    loss = run.step(tokens=tokens[rows], labels=labels[rows])
    if loss is not None and dp is not None:
        dist.all_reduce(loss, group=dp.get_group())
        loss = loss / size
    return None if loss is None else float(loss)


def _step(run, opt, mesh, tokens, labels) -> float | None:
    opt.zero_grad()
    loss = _pipeline_loss(run, mesh, tokens, labels)
    opt.step()
    return loss


def dcp_pipeline(rank: int, world: int, ckpt: str) -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    from autoshard.runtime.pipeline_checkpoint import load_pipeline_state_dict, pipeline_state_dict

    reference, (tokens, labels) = llama3.tiny(**KW)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=LR)
    uninterrupted = []
    for _ in range(3):
        ref_opt.zero_grad()
        loss = reference(tokens, labels)
        loss.backward()
        ref_opt.step()
        uninterrupted.append(float(loss.detach()))

    run, opt, mesh = _pipeline((2, 2), ("pp", "dp"), (2,), seed=0, m=2)
    saved_loss = _step(run, opt, mesh, tokens, labels)
    dcp.save(pipeline_state_dict(run, opt), checkpoint_id=ckpt)

    run4, opt4, mesh4 = _pipeline((4,), ("pp",), (1, 2, 3), seed=1, m=4, recompute="full")  # other weights
    state = pipeline_state_dict(run4, opt4)
    dcp.load(state, checkpoint_id=ckpt)
    load_pipeline_state_dict(run4, opt4, state)
    pp4 = [_step(run4, opt4, mesh4, tokens, labels) for _ in range(2)]

    plain, _ = llama3.tiny(seed=2, **KW)
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=LR)
    options = StateDictOptions(flatten_optimizer_state_dict=True)
    msd, osd = get_state_dict(plain, plain_opt, options=options)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=ckpt)
    set_state_dict(plain, plain_opt, model_state_dict=state["model"], optim_state_dict=state["optim"], options=options)
    no_pipeline = []
    for _ in range(2):
        plain_opt.zero_grad()
        loss = plain(tokens, labels)
        loss.backward()
        plain_opt.step()
        no_pipeline.append(float(loss.detach()))
    return {"uninterrupted": uninterrupted, "saved": saved_loss, "pp4": pp4, "no_pipeline": no_pipeline,
            "pp2_stage": mesh["pp"].get_local_rank(), "pp4_stage": mesh4["pp"].get_local_rank()}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pipeline-dcp")
    return spawn(4, dcp_pipeline, (str(tmp / "ckpt"),), tmp / "ranks", timeout=300)


def test_the_saving_pipeline_took_the_uninterrupted_first_step(results):
    for res in results:
        if res["pp2_stage"] == 1:
            assert res["saved"] == pytest.approx(res["uninterrupted"][0], rel=1e-5)
        else:
            assert res["saved"] is None


def test_four_stages_resume_the_two_stage_checkpoint_with_the_uninterrupted_losses(results):
    last = [res for res in results if res["pp4_stage"] == 3]
    assert len(last) == 1
    assert last[0]["pp4"] == pytest.approx(last[0]["uninterrupted"][1:], rel=1e-5)
    assert last[0]["uninterrupted"][1] != pytest.approx(last[0]["uninterrupted"][2], rel=1e-3)


def test_the_model_without_a_pipeline_resumes_it_with_the_uninterrupted_losses(results):
    for res in results:
        assert res["no_pipeline"] == pytest.approx(res["uninterrupted"][1:], rel=1e-5)
