"""A ``partial`` pipeline section (some blocks of each stage checkpointed) on 4 gloo ranks, against one device.

One spawn of 4 ranks runs four jobs of the example LLaMA (tiny, fp32, four blocks) cut by
``build_pipeline_section`` with ``recompute="partial"``: 1F1B on ``pp 2 x dp 2`` with stages of two
blocks, the first stage checkpointing one of them and the last none; the same with selective
(op-level) blocks, stage 0 one checkpointed and one selective, stage 1 one selective and one kept;
the same with all-mm blocks (op-level, every matmul saved), stage 0 one selective and one all-mm,
stage 1 one all-mm and one kept; and ZBVZeroBubble (its split backward) with four one-block
stages, stages 0 and 2 checkpointed, stage 1 selective, stage 3 all-mm. Two AdamW steps each
(``test_pipeline_gloo.run_jobs``). After each step the loss and every parameter's gradient equal
the one-device model's, and each block runs its forward as often per step as the schedule and its
own stage's counts say: a checkpointed, selective or all-mm block (one of its stage's first
``recompute_blocks + recompute_selective_blocks + recompute_all_mm_blocks``) once per microbatch
plus once per backward call that reads it, any other once per microbatch; so the jobs cannot pass
with the whole stage recomputing, or none of it. (That an all-mm block recomputes no matmul, and a
selective one every second: ``test_pipeline_op_level_recompute.py``, one process.)
"""

from __future__ import annotations

from collections import Counter

import pytest
from equivalence import assert_pipeline_matches_one_device
from test_pipeline_gloo import FOUR, STEPS, _section, spawn_jobs

from autoshard.plan.pipeline_section import PipelineSection


def _partial(schedule: str, cuts: tuple[int, ...], counts: tuple[int, ...], v: int = 1,
             selective: tuple[int, ...] | None = None, all_mm: tuple[int, ...] | None = None) -> PipelineSection:
    import dataclasses

    whole = _section(schedule, 2, 4, cuts, FOUR, v=v)
    sel = selective or (None,) * len(counts)
    mm = all_mm or (None,) * len(counts)
    stages = tuple(dataclasses.replace(st, recompute_blocks=k, recompute_selective_blocks=s, recompute_all_mm_blocks=m)
                   for st, k, s, m in zip(whole.stages, counts, sel, mm))
    section = dataclasses.replace(whole, recompute="partial", stages=stages)
    return PipelineSection.from_dict(section.to_dict())  # validated, as a plan file is read


JOBS = {
    "1f1b-pp2-dp2-m4-partial": ((2, 2), ("pp", "dp"), _partial("1F1B", (2,), (1, 0)), FOUR),
    "1f1b-pp2-dp2-m4-selective": ((2, 2), ("pp", "dp"), _partial("1F1B", (2,), (1, 0), selective=(1, 1)), FOUR),
    "1f1b-pp2-dp2-m4-all-mm": ((2, 2), ("pp", "dp"), _partial("1F1B", (2,), (0, 0), selective=(1, 0),
                                                             all_mm=(1, 1)), FOUR),
    "zbv-pp2-dp2-m4-partial": ((2, 2), ("pp", "dp"), _partial("ZBVZeroBubble", (1, 2, 3), (1, 0, 1, 0), v=2,
                                                              selective=(0, 1, 0, 0), all_mm=(0, 0, 0, 1)), FOUR),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return spawn_jobs(4, JOBS, tmp_path_factory.mktemp("pipeline-partial") / "ranks", timeout=120)


@pytest.mark.parametrize("label", list(JOBS))
def test_partial_recompute_loss_and_every_gradient_equal_one_device(results, label):
    # pp 2 x dp 2: the last stage's loss on its 2 dp ranks
    assert_pipeline_matches_one_device([res[label] for res in results], holders=2, label=label)


def _forwards(section: PipelineSection, stage: int, checkpointed: bool) -> int:
    """A block's forwards per step (``test_pipeline_gloo._block_forwards``, per block): once per ``F``;
    checkpointed, once more per ``B``, ``W`` and (not on stage 0, whose backward runs whole in ``W``) ``I``."""
    from costmodel.pipeline_schedules import build_schedule

    schedule = build_schedule(section.schedule, n_ranks=section.n_ranks, n_microbatches=section.n_microbatches,
                              stages_per_rank=section.stages_per_rank)
    kinds = Counter(a.kind.value for order in schedule.orders for a in order if a.stage == stage)
    again = kinds["B"] + kinds["W"] + (kinds["I"] if stage > 0 else 0)
    return kinds["F"] + (again if checkpointed else 0)


@pytest.mark.parametrize("label", list(JOBS))
def test_only_each_stages_first_counted_blocks_recompute(results, label):
    section = JOBS[label][2]
    for rank, res in enumerate(results):
        entry = res[label][STEPS - 1]  # step 0 adds torch's metadata inference
        want = {}
        for stage in entry["stages"]:
            st = section.stages[stage]
            for block in range(st.first_block, st.end_block):
                again = section.checkpointed_blocks(stage) + section.selective_blocks(stage) \
                    + section.all_mm_blocks(stage)
                want[block] = _forwards(section, stage, block - st.first_block < again)
        assert entry["block_forwards"] == want, f"{label} rank {rank}"
    assert len({_forwards(section, 0, True), _forwards(section, 0, False)}) == 2  # the check tells them apart


def test_selective_job_runs_selective_blocks():
    # the jobs above run what they say: selective blocks after the checkpointed ones, kept ones after
    section = JOBS["1f1b-pp2-dp2-m4-selective"][2]
    assert [(section.checkpointed_blocks(k), section.selective_blocks(k)) for k in range(2)] == [(1, 1), (0, 1)]
    assert section.to_dict()["stages"][1]["recompute_selective_blocks"] == 1
    section = JOBS["1f1b-pp2-dp2-m4-all-mm"][2]
    assert [(section.selective_blocks(k), section.all_mm_blocks(k)) for k in range(2)] == [(1, 1), (0, 1)]
    assert [JOBS["zbv-pp2-dp2-m4-partial"][2].all_mm_blocks(k) for k in range(4)] == [0, 0, 0, 1]
