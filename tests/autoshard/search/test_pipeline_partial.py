"""Stages checkpointing some of their blocks (``autoshard.search.pipeline_partial``), priced and chosen.

Hand-made pricings of the two policies: checkpointing a block keeps a tenth of its activations and
recomputes its forward. No count checkpointed prices as ``none``, every block as ``full`` (same
cut); more blocks cost time and save memory; the search chooses the fewest that fit, per stage.
"""

from __future__ import annotations

import math

import pytest

from costmodel.pipeline_schedules import build_schedule

from autoshard.search.pipeline import (PipelineLayout, _stage_costs, pipeline_section, price_pipeline,
                                       search_pipeline)
from autoshard.search.pipeline_partial import choose_counts, mixed_stage_costs, price_counts
from tests.autoshard.search.pipeline_pricings import FULL, NONE, PROFILE, balanced_cut


@pytest.mark.parametrize("schedule,v", [("1F1B", 1), ("ZBVZeroBubble", 2), ("Interleaved1F1B", 2)])
def test_no_block_checkpointed_prices_as_none_and_every_block_as_full(schedule, v):
    sched = build_schedule(schedule, n_ranks=2, n_microbatches=4, stages_per_rank=v)
    for pricing, every in ((NONE, False), (FULL, True)):
        cand, cut, sim = price_pipeline(pricing, n_blocks=8, batch=8, pp=2, schedule=schedule, n_microbatches=4,
                                        stages_per_rank=v, send_s=0.05)
        counts = [st.end_block - st.first_block if every else 0 for st in cut.stages]
        assert mixed_stage_costs(NONE, FULL, cut, counts, 0.05) == _stage_costs(pricing, cut, 0.05)
        priced = price_counts(NONE, FULL, sched, cut, counts, 0.05)
        assert priced.simulation.step_s == cand.step_s
        assert priced.rank_memory_bytes == pytest.approx(cand.rank_memory_bytes, abs=2)  # the cut's int bytes


def test_more_checkpointed_blocks_cost_time_and_save_memory():
    sched = build_schedule("1F1B", n_ranks=2, n_microbatches=4)
    cut = balanced_cut(8, sched)
    priced = [price_counts(NONE, FULL, sched, cut, (c, c), 0.05) for c in range(5)]
    steps = [p.simulation.step_s for p in priced]
    peaks = [max(p.rank_memory_bytes) for p in priced]
    assert all(a < b for a, b in zip(steps, steps[1:])), steps
    assert all(a > b for a, b in zip(peaks, peaks[1:])), peaks
    # one block checkpointed on the first stage (two microbatches in flight on 1F1B's rank 0) saves twice
    # the activations one block on the last stage saves on its rank
    base = price_counts(NONE, FULL, sched, cut, (0, 0), 0.05).rank_memory_bytes
    first = price_counts(NONE, FULL, sched, cut, (1, 0), 0.05).rank_memory_bytes
    last = price_counts(NONE, FULL, sched, cut, (0, 1), 0.05).rank_memory_bytes
    saved = NONE.block.activation_bytes - FULL.block.activation_bytes
    # on rank 0 the first checkpointed block also brings the larger block transient (FULL's 400 over NONE's
    # 300); rank 1 holds the head, whose transient (NONE's 300 + 200) stays above both
    assert base[0] - first[0] == 2 * saved - 100 and base[1] - last[1] == saved


def test_the_fewest_blocks_that_fit_are_chosen_per_stage():
    sched = build_schedule("1F1B", n_ranks=4, n_microbatches=8)
    cut = balanced_cut(16, sched)
    none_peak = max(price_counts(NONE, FULL, sched, cut, (0,) * 4, 0.05).rank_memory_bytes)
    full_peak = max(price_counts(NONE, FULL, sched, cut, (4,) * 4, 0.05).rank_memory_bytes)
    limit = (none_peak + full_peak) / 2
    priced, why = choose_counts(NONE, FULL, sched, cut, 0.05, limit)
    assert why == "" and max(priced.rank_memory_bytes) <= limit
    counts = priced.counts
    assert list(counts) == sorted(counts, reverse=True) and counts[0] > counts[-1]  # the first stage holds the most
    for k, c in enumerate(counts):  # one fewer on any stage does not fit
        if c:
            fewer = list(counts)
            fewer[k] -= 1
            assert max(price_counts(NONE, FULL, sched, cut, fewer, 0.05).rank_memory_bytes) > limit, (k, counts)
    refused, why = choose_counts(NONE, FULL, sched, cut, 0.05, full_peak - 1)
    assert refused is None and "with every block checkpointed" in why


def test_the_search_chooses_partial_between_the_policies_and_the_section_records_the_counts():
    args = dict(n_blocks=16, batch=16, seq_len=8, dim=8, layout=PipelineLayout(4, 1, 1), profile=PROFILE,
                flops_per_token=0.0, schedules=("1F1B",), microbatches=(8,))
    none = search_pipeline(lambda mb: NONE, **args, memory_limit_bytes=math.inf)
    full = search_pipeline(lambda mb: FULL, **args, recompute="full", memory_limit_bytes=math.inf)
    limit = (max(none.rank_memory_bytes) + max(full.rank_memory_bytes)) / 2
    chosen = search_pipeline(lambda mb: NONE, **args, price_full=lambda mb: FULL, memory_limit_bytes=limit)
    assert chosen.recompute == "partial" and none.step_s < chosen.step_s < full.step_s
    assert max(chosen.rank_memory_bytes) <= limit and len(chosen.recompute_blocks) == 4
    section = pipeline_section(chosen, batch=16, seq_len=8, dim=8, block_paths=[f"layers.{i}" for i in range(16)])
    assert section.recompute == "partial"
    assert tuple(section.checkpointed_blocks(k) for k in range(4)) == chosen.recompute_blocks
    assert [st.forward_s + st.backward_s for st in section.stages] == pytest.approx(list(chosen.stage_step_s))


def test_the_cut_chosen_with_the_counts_moves_blocks_off_the_stages_that_recompute_and_is_no_slower():
    from autoshard.search.pipeline_partial import best_counts, cut_with_counts

    sched = build_schedule("1F1B", n_ranks=4, n_microbatches=8)
    cut = balanced_cut(32, sched)
    ends = [price_counts(NONE, FULL, sched, cut, [c * (st.end_block - st.first_block) for st in cut.stages], 0.05)
            for c in (0, 1)]
    limit = (max(ends[0].rank_memory_bytes) + max(ends[1].rank_memory_bytes)) / 2
    greedy, _ = choose_counts(NONE, FULL, sched, cut, 0.05, limit)
    joint, counts = cut_with_counts(NONE, FULL, sched, 32, limit)
    sizes = [st.end_block - st.first_block for st in joint.stages]
    assert sum(sizes) == 32 and all(0 <= c <= n for c, n in zip(counts, sizes))
    assert sizes[0] < sizes[1]  # the first stage holds the most microbatches: fewer blocks there
    best, why = best_counts(NONE, FULL, sched, cut, 32, 0.05, limit)
    assert why == "" and max(best.rank_memory_bytes) <= limit
    # here the joint cut (7, 8, 9, 8 blocks) beats the balanced one with greedy counts, and is the one chosen
    assert [st.end_block - st.first_block for st in best.cut.stages] == sizes
    assert best.simulation.step_s < greedy.simulation.step_s
    assert cut_with_counts(NONE, FULL, sched, 32, max(ends[1].rank_memory_bytes) / 10) is None  # nothing fits
