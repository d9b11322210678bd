"""V-shaped pipeline schedules on gloo: no rank sends to itself, and two ranks train as one device.

torch 2.11's multi-stage schedules open their first step with a dummy send and receive to each
neighbouring stage's rank; on a V-shaped schedule the two stages at the turn share a rank, and gloo
cannot send to oneself ("Pair is not connected"), so every V-shaped plan failed on gloo before any
stage ran (``autoshard.runtime.pipeline_stages._skip_self_warmup_ops``). Two checks:

* on a fake process group as rank 1 of 2 (the rank of the turn: stages 1 and 2 of 4), the
  warm-up ops of the stages ``build_pipeline`` made go to rank 0 only, and all four that the
  stages exchange with rank 0 are kept;
* two gloo ranks (mesh ``pp`` 2) run ``ZBVZeroBubble`` and ``DualPipeV`` on the example LLaMA
  (tiny, fp32, four one-block stages), two AdamW steps each (``test_pipeline_gloo.run_jobs``):
  the loss and every gradient equal the one-device model's. On torch 2.11 this failed at the
  first step's warm-up; it is the pipeline test of CI's oldest-torch smoke (fast: one spawn of 2).
"""

from __future__ import annotations

import pytest
from equivalence import assert_pipeline_matches_one_device
from test_pipeline_gloo import FOUR, _section, spawn_jobs

JOBS = {
    "zbv-pp2-m4": ((2,), ("pp",), _section("ZBVZeroBubble", 2, 4, (1, 2, 3), FOUR, v=2, dp=1), FOUR),
    "dualpipev-pp2-m4": ((2,), ("pp",), _section("DualPipeV", 2, 4, (1, 2, 3), FOUR, v=2, dp=1), FOUR),
}


@pytest.fixture
def rank1_of_2():
    """This process as rank 1 of a fake 2-rank process group (its collectives move nothing)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=2)
    yield
    dist.destroy_process_group()


def test_warmup_ops_of_the_stages_at_a_v_turn_skip_the_own_rank(rank1_of_2):
    from torch.distributed.device_mesh import init_device_mesh

    from autoshard.runtime.pipeline_stages import build_pipeline
    from examples.models import llama3

    _, _, section, kwargs = JOBS["zbv-pp2-m4"]
    model, _ = llama3.tiny(**kwargs)
    run = build_pipeline(model, init_device_mesh("cpu", (2,), mesh_dim_names=("pp",)), section)
    assert sorted(s.stage_index for s in run.stages) == [1, 2]  # the turn: adjacent stages on this rank
    peers = [op.group_peer for stage in run.stages for op in stage._get_init_p2p_neighbors_ops()]
    # stage 1: receive from and send to stage 0; stage 2: send to and receive from stage 3 (both on rank 0)
    assert peers == [0, 0, 0, 0]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return spawn_jobs(2, JOBS, tmp_path_factory.mktemp("pipeline-v") / "ranks", timeout=120)


@pytest.mark.parametrize("label", list(JOBS))
def test_v_shaped_schedule_on_gloo_trains_as_one_device(results, label):
    # the last stage (3) is rank 0's: the loss on that one rank
    assert_pipeline_matches_one_device([res[label] for res in results], holders=1, label=label)
