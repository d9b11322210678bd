"""``autoshard(model, mesh)`` on a ``pp`` x ``dp`` mesh returns a PipelineRun that trains as one device.

Four gloo ranks, mesh (2, 2) named ("pp", "dp"), the example LLaMA (tiny, fp32, batch 8):
rank 0 searches the pipeline (``autoshard.search.pipeline_model.choose_pipeline``: stage
cuts, microbatches, schedule), every rank builds its stages; two AdamW steps of each
rank's dp shard. The loss on the last stage's ranks (averaged over dp) equals the
one-device model's on the whole batch after each step; the other ranks get None.
"""

from __future__ import annotations

import pytest
import torch
from gloo_ranks import spawn

from examples.models import llama3

pytestmark = pytest.mark.slow

STEPS = 2


def run_autoshard(rank: int, world: int) -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from autoshard.runtime.api import autoshard
    from autoshard.runtime.pipeline_stages import PipelineRun

    reference, (tokens, labels) = llama3.tiny(batch_size=8)
    model, _ = llama3.tiny(batch_size=8)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
    run = autoshard(model, mesh, (tokens, labels), cache_dir=False, profile="cpu-gloo", time_limit=10)
    assert isinstance(run, PipelineRun)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    opt = torch.optim.AdamW(run.parameters(), lr=1e-2)
    dp = mesh["dp"]
    share = tokens.shape[0] // dp.size()
    rows = slice(dp.get_local_rank() * share, (dp.get_local_rank() + 1) * share)
    steps = []
    for _ in range(STEPS):
        ref_opt.zero_grad()
        ref_loss = reference(tokens, labels)
        ref_loss.backward()
        opt.zero_grad()
        loss = run.step(tokens=tokens[rows], labels=labels[rows])
        if loss is not None:
            dist.all_reduce(loss, group=dp.get_group())
            loss = loss / dp.size()
        steps.append((loss, ref_loss.detach()))
        ref_opt.step()
        opt.step()
    return {"steps": steps, "section": run.section.to_dict(), "pp": mesh["pp"].get_local_rank()}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return spawn(4, run_autoshard, (), tmp_path_factory.mktemp("pipeline-api") / "ranks", timeout=300)


def test_every_rank_runs_the_same_searched_section(results):
    sections = [res["section"] for res in results]
    assert all(s == sections[0] for s in sections)
    assert sections[0]["n_ranks"] == 2 and sections[0]["mesh_dim"] == "pp"


def test_loss_equals_one_device_after_each_step_on_the_last_stage_only(results):
    last_rank = results[0]["section"]["stages"][-1]["rank"]
    assert all((res["steps"][0][0] is not None) == (res["pp"] == last_rank) for res in results)
    holders = [res for res in results if res["steps"][0][0] is not None]
    assert len(holders) == 2, "the loss is on the two dp ranks of the last stage, None elsewhere"
    for res in holders:
        for step, (loss, ref_loss) in enumerate(res["steps"]):
            torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6,
                                       msg=lambda m, s=step, r=res: f"{r['section']['schedule']} "
                                       f"m={r['section']['n_microbatches']} step {s}: {m}")
