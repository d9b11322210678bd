"""A fourth block kind, ``M`` (op-level, every matmul's output saved: ``selective_all_mm``), beside kept,
checkpointed and selective blocks (``autoshard.search.pipeline_selective``).

A real tiny stage priced under the policy puts it between kept and selective; hand-made pricings
(``M`` keeps 60 % of a block's activations for a third of selective's recomputation) check that no
``M`` block prices bit for bit as the three-kind mix, that the counts chosen fit, are never slower
than the three-kind choice, and, against a brute force over every count triple per stage, are the
fastest that fit (or within 1 %).
"""

from __future__ import annotations

import itertools
import random

import pytest

from costmodel.pipeline_schedules import build_schedule

from autoshard.plan.pipeline_section import PipelineError, PipelineSection
from autoshard.search.pipeline_partial import mixed_stage_costs, price_counts
from autoshard.search.pipeline_selective import best_counts3, fastest_counts
from tests.autoshard.search.pipeline_pricings import (
    FULL, NONE, SEL, balanced_cut, kept_peak_two_ranks, recompute_line, pricing, search_two_ranks, tiny_stage_pricing,
    two_ranks_section,
)

MM = pricing(1.0, 2.12, 1200, recompute_s=0.12, transient=320.0, head=150.0)


@pytest.fixture(scope="module")
def tiny_pricings():
    return {policy: tiny_stage_pricing(policy) for policy in ("none", "selective_all_mm", "selective")}


def test_an_all_mm_block_of_a_real_tiny_stage_lies_between_kept_and_selective(tiny_pricings):
    n, m, s = (tiny_pricings[p] for p in ("none", "selective_all_mm", "selective"))
    assert s.block.activation_bytes < m.block.activation_bytes < n.block.activation_bytes
    t = lambda q: q.block.forward_s + q.block.backward_s  # noqa: E731
    assert t(n) < t(m) < t(s)
    assert 0 < m.block_recompute_s < s.block_recompute_s
    assert m.block.state_bytes == n.block.state_bytes


@pytest.mark.parametrize("schedule,v", [("1F1B", 1), ("InterleavedZeroBubble", 2)])
def test_no_all_mm_block_prices_bit_for_bit_as_the_three_kind_mix(schedule, v):
    sched = build_schedule(schedule, n_ranks=2, n_microbatches=4, stages_per_rank=v)
    cut = balanced_cut(8, sched)
    sizes = [st.end_block - st.first_block for st in cut.stages]
    zeros = [0] * len(sizes)
    for c0, s0, s1 in itertools.product(range(sizes[0] + 1), range(sizes[0] + 1), range(sizes[1] + 1)):
        if c0 + s0 > sizes[0]:
            continue
        counts, sels = [c0, *zeros[1:]], [s0, s1, *zeros[2:]]
        three = price_counts(NONE, FULL, sched, cut, counts, 0.05, SEL, sels)
        four = price_counts(NONE, FULL, sched, cut, counts, 0.05, SEL, sels, MM, zeros)
        assert four.costs == three.costs and four.simulation.step_s == three.simulation.step_s
        assert four.rank_memory_bytes == three.rank_memory_bytes and four.all_mm == ()
        assert mixed_stage_costs(NONE, FULL, cut, counts, 0.05, SEL, sels, MM, zeros) == \
            mixed_stage_costs(NONE, FULL, cut, counts, 0.05, SEL, sels)


def test_a_stage_all_all_mm_takes_its_extras_from_the_all_mm_pricing_and_its_transient_counts():
    sched = build_schedule("1F1B", n_ranks=2, n_microbatches=4)
    cut = balanced_cut(8, sched)
    mixed = price_counts(NONE, FULL, sched, cut, (0, 0), 0.05, SEL, (0, 0), MM, (1, 4))
    assert mixed.costs[1].forward_s == 4 * MM.block.forward_s + MM.last_extra.forward_s
    assert mixed.all_mm == (1, 4)
    one = price_counts(NONE, FULL, sched, cut, (0, 0), 0.05, SEL, (0, 0), MM, (1, 0))
    kept = price_counts(NONE, FULL, sched, cut, (0, 0), 0.05)
    assert one.costs[0].activation_bytes == kept.costs[0].activation_bytes - (2000 - 1200)
    # rank 0 now runs an M block: its transient (320) is the largest of the kinds it runs (N: 300)
    delta = one.simulation.ranks[0].peak_activation_bytes - kept.simulation.ranks[0].peak_activation_bytes
    assert one.rank_memory_bytes[0] == pytest.approx(kept.rank_memory_bytes[0] + delta + 20)
    with pytest.raises(ValueError, match="all-mm blocks without a all-mm pricing"):
        price_counts(NONE, FULL, sched, cut, (0, 0), 0.05, SEL, (0, 0), None, (1, 0))
    with pytest.raises(ValueError, match="stage 0: 1 checkpointed, 2 selective and 2 all-mm blocks of its 4"):
        price_counts(NONE, FULL, sched, cut, (1, 0), 0.05, SEL, (2, 0), MM, (2, 0))


def test_the_fastest_counts_are_a_brute_forces_over_every_count_triple():
    kinds = [FULL, SEL, MM]
    dt = [q.block.forward_s + q.block.backward_s - 3.0 for q in kinds]
    d = [2000 - q.block.activation_bytes for q in kinds]
    rng = random.Random(3)
    for _ in range(200):
        n, need = rng.randint(0, 6), rng.uniform(-100, 12000)
        best = None
        for x in itertools.product(range(n + 1), repeat=3):
            if sum(x) <= n and sum(a * b for a, b in zip(x, d)) >= need:
                t = sum(a * b for a, b in zip(x, dt))
                best = t if best is None else min(best, t)
        got = fastest_counts(n, need, NONE, kinds)
        assert (got is None) == (best is None), (n, need)
        if got is not None:
            assert sum(got) <= n and sum(a * b for a, b in zip(got, d)) >= need
            assert sum(a * b for a, b in zip(got, dt)) == pytest.approx(best, abs=1e-12)
    assert fastest_counts(4, 800, NONE, kinds) == (0, 0, 1)  # one M frees 800 for 0.12 s


def _brute_force(sched, cut, limit: float):
    """The fastest fitting ``(c, s, m)`` per stage of ``cut``, every triple of every stage priced."""
    sizes = [st.end_block - st.first_block for st in cut.stages]
    triples = [[x for x in itertools.product(range(n + 1), repeat=3) if sum(x) <= n] for n in sizes]
    best = None
    for choice in itertools.product(*triples):
        priced = price_counts(NONE, FULL, sched, cut, [x[0] for x in choice], 0.05, SEL, [x[1] for x in choice],
                              MM, [x[2] for x in choice])
        faster = best is None or priced.simulation.step_s < best.simulation.step_s
        if max(priced.rank_memory_bytes) <= limit and faster:
            best = priced
    return best


@pytest.mark.parametrize("schedule,v,n_blocks", [("1F1B", 1, 8), ("Interleaved1F1B", 2, 6),
                                                 ("ZBVZeroBubble", 2, 6)])
def test_the_four_kind_counts_fit_beat_the_three_kind_ones_and_match_a_brute_force(schedule, v, n_blocks):
    sched = build_schedule(schedule, n_ranks=2, n_microbatches=4, stages_per_rank=v)
    cut = balanced_cut(n_blocks, sched)
    zeros = [0] * sched.n_stages
    top = max(price_counts(NONE, FULL, sched, cut, zeros, 0.05).rank_memory_bytes)
    bottom = max(price_counts(NONE, FULL, sched, cut, [st.end_block - st.first_block for st in cut.stages],
                              0.05).rank_memory_bytes)
    used, faster = 0, 0
    for share in (0.85, 0.6, 0.35, 0.1):
        limit = bottom + share * (top - bottom)
        four, why = best_counts3(NONE, FULL, SEL, sched, cut, n_blocks, 0.05, limit, mm=MM)
        three, _ = best_counts3(NONE, FULL, SEL, sched, cut, n_blocks, 0.05, limit)
        assert four is not None, why
        assert max(four.rank_memory_bytes) <= limit
        assert four.simulation.step_s <= three.simulation.step_s  # M never makes the choice slower
        brute = _brute_force(sched, cut, limit)
        assert four.simulation.step_s <= 1.01 * brute.simulation.step_s, (share, four.counts, four.selective,
                                                                         four.all_mm, brute.counts, brute.selective,
                                                                         brute.all_mm)
        used += sum(four.all_mm)
        faster += four.simulation.step_s < three.simulation.step_s
    assert used > 0 and faster > 0  # the fourth kind is chosen where it pays


def test_the_fourth_kind_is_tried_and_priced_only_where_the_three_kinds_beat_the_incumbent():
    sched = build_schedule("1F1B", n_ranks=2, n_microbatches=4)
    cut = balanced_cut(8, sched)
    zeros = [0] * sched.n_stages
    top = max(price_counts(NONE, FULL, sched, cut, zeros, 0.05).rank_memory_bytes)
    limit = top - 1500
    three, _ = best_counts3(NONE, FULL, SEL, sched, cut, 8, 0.05, limit)
    four, _ = best_counts3(NONE, FULL, SEL, sched, cut, 8, 0.05, limit, mm=MM)
    assert four.simulation.step_s < three.simulation.step_s  # M pays here
    calls = []

    def price_mm():
        calls.append(1)
        return MM

    # an incumbent the three kinds cannot beat: the four-kind pass (and M's pricing) skipped
    kept, _ = best_counts3(NONE, FULL, SEL, sched, cut, 8, 0.05, limit, three.simulation.step_s, mm=price_mm)
    assert (kept.counts, kept.selective, kept.all_mm, calls) == (three.counts, three.selective, (), [])
    won, _ = best_counts3(NONE, FULL, SEL, sched, cut, 8, 0.05, limit, 1.001 * three.simulation.step_s,
                          mm=price_mm)
    assert won.simulation.step_s == four.simulation.step_s and calls == [1]


def test_the_search_mixes_all_mm_blocks_and_the_section_and_explain_record_them():
    limit = kept_peak_two_ranks() - 1500
    three = search_two_ranks(limit, price_selective=lambda mb: SEL)
    four = search_two_ranks(limit, price_selective=lambda mb: SEL, price_all_mm=lambda mb: MM)
    assert four.recompute == "partial" and sum(four.all_mm_blocks) > 0
    assert four.step_s < three.step_s
    section = two_ranks_section(four)
    assert [section.all_mm_blocks(k) for k in range(2)] == list(four.all_mm_blocks)
    assert PipelineSection.from_dict(section.to_dict()) == section
    assert "all-mm (op-level, every matmul saved) blocks per stage " + ", ".join(
        f"{k}/{st.n_blocks}" for k, st in zip(four.all_mm_blocks, section.stages)) in recompute_line(section)


def test_an_all_mm_count_outside_partial_or_its_stage_is_one_line():
    four = search_two_ranks(kept_peak_two_ranks() - 1500, price_selective=lambda mb: SEL, price_all_mm=lambda mb: MM)
    data = two_ranks_section(four).to_dict()
    data["stages"][0].update(recompute_blocks=1, recompute_selective_blocks=1, recompute_all_mm_blocks=3)
    with pytest.raises(PipelineError, match=r"stages\[0\].recompute_all_mm_blocks: needs a count from 0 to the "
                                            r"stage's 4 blocks less its 1 checkpointed and 1 selective, got 3"):
        PipelineSection.from_dict(data)
    data["stages"][0]["recompute_all_mm_blocks"] = True
    with pytest.raises(PipelineError, match="expected a count of blocks"):
        PipelineSection.from_dict(data)
    data["recompute"] = "full"
    data["stages"][0]["recompute_all_mm_blocks"] = 1
    for st in data["stages"]:
        for key in ("recompute_blocks", "recompute_selective_blocks"):
            st.pop(key, None)
    with pytest.raises(PipelineError, match="all-mm blocks goes with recompute 'partial'"):
        PipelineSection.from_dict(data)
