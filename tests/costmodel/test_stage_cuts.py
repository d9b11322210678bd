"""Stage cuts by dynamic programming against brute-force enumeration of every cut."""

from __future__ import annotations

import itertools
import random

import pytest

from costmodel.pipeline_schedules import build_schedule
from costmodel.pipeline_simulate import StageCost, simulate_pipeline
from costmodel.stage_cuts import BlockCost, cut_stages, stage_in_flight


def _brute_force(blocks, k_stages, first, last, in_flight, limit):
    """Every cut in lexicographic order; the first with the least bottleneck, or None.
    Sums are over slices (no prefix sums), integer-valued so that ties are exact."""
    best = None
    for cuts in itertools.combinations(range(1, len(blocks)), k_stages - 1):
        bounds = (0, *cuts, len(blocks))
        times, fits = [], True
        for k in range(k_stages):
            part = list(blocks[bounds[k]:bounds[k + 1]]) + [first] * (k == 0) + [last] * (k == k_stages - 1)
            times.append(sum(b.forward_s + b.backward_s for b in part))
            memory = sum(b.state_bytes for b in part) + in_flight[k] * sum(b.activation_bytes for b in part)
            fits = fits and (limit is None or memory <= limit)
        if fits and (best is None or max(times) < best[0]):
            best = (max(times), cuts)
    return best


def _random_blocks(rng, n):
    # integer-valued seconds: sums are exact, so ties between cuts are exact too
    return [BlockCost(float(rng.randint(1, 9)), float(rng.randint(1, 18)), rng.randint(0, 50), rng.randint(0, 20))
            for _ in range(n)]


@pytest.mark.parametrize("seed", range(40))
def test_dp_equals_brute_force(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 9)
    k_stages = rng.randint(1, n)
    blocks = _random_blocks(rng, n)
    first, last = _random_blocks(rng, 2)
    in_flight = [rng.randint(1, k_stages + 1) for _ in range(k_stages)]
    # a limit somewhere between what the smallest stage needs and everything: sometimes infeasible
    limit = rng.choice([None, rng.randint(40, 400)])
    expected = _brute_force(blocks, k_stages, first, last, in_flight, limit)
    if expected is None:
        with pytest.raises(ValueError, match="no cut of .* fits memory_limit_bytes"):
            cut_stages(blocks, k_stages, first_extra=first, last_extra=last, in_flight=in_flight, memory_limit_bytes=limit)
        return
    got = cut_stages(blocks, k_stages, first_extra=first, last_extra=last, in_flight=in_flight, memory_limit_bytes=limit)
    assert (got.bottleneck_s, got.cuts) == expected
    assert max(s.time_s for s in got.stages) == got.bottleneck_s
    assert limit is None or all(s.memory_bytes <= limit for s in got.stages)


def test_some_random_cases_are_infeasible_and_some_not():
    # the seeds above exercise both branches (a test that only ever saw one could not fail on the other)
    outcomes = set()
    for seed in range(40):
        rng = random.Random(seed)
        n = rng.randint(1, 9)
        k_stages = rng.randint(1, n)
        blocks, (first, last) = _random_blocks(rng, n), _random_blocks(rng, 2)
        in_flight = [rng.randint(1, k_stages + 1) for _ in range(k_stages)]
        limit = rng.choice([None, rng.randint(40, 400)])
        outcomes.add((limit is None, _brute_force(blocks, k_stages, first, last, in_flight, limit) is None))
    assert {(True, False), (False, False), (False, True)} <= outcomes


def test_extras_move_the_cut():
    # 8 equal blocks of 3 s on 4 stages: 2 each (6 s). A 3 s loss head on the last stage:
    # 8 * 3 + 3 = 27 s over 4 stages needs a stage of >= 9 s (3 blocks, or 2 + the head).
    # Cuts with 9 s: (1, 3, 6) gives 3, 6, 9, 6 + 3, the lexicographically first of them
    # ((1, 2, x) would leave >= 5 blocks to two stages: one of >= 9 s plus a head one of 12).
    unit = BlockCost(1.0, 2.0, 0, 0)
    assert cut_stages([unit] * 8, 4).cuts == (2, 4, 6)
    heavy = cut_stages([unit] * 8, 4, last_extra=BlockCost(1.0, 2.0, 0, 0))
    assert heavy.bottleneck_s == 9.0 and heavy.cuts == (1, 3, 6)
    assert [s.time_s for s in heavy.stages] == [3.0, 6.0, 9.0, 9.0]


def test_memory_of_1f1b_in_flight_pushes_blocks_off_the_first_stage():
    # 1F1B on 2 ranks: stage 0 holds 2 microbatches, stage 1 one. Each block 10 B of
    # activations, no state; limit 40 B: stage 0 can take 2 blocks, stage 1 four.
    blocks = [BlockCost(1.0, 1.0, 0, 10)] * 6
    schedule = build_schedule("1F1B", n_ranks=2, n_microbatches=4)
    h = stage_in_flight(schedule)
    assert h == (2, 1)
    cut = cut_stages(blocks, 2, in_flight=h, memory_limit_bytes=40)
    assert cut.cuts == (2,) and [s.memory_bytes for s in cut.stages] == [40, 40]
    assert cut_stages(blocks, 2, in_flight=h).cuts == (3,)  # without the limit: balanced


def test_stage_in_flight_agrees_with_the_simulation():
    # one stage per rank: the per-stage peak from the order is the rank's peak from the timeline
    for name in ("GPipe", "1F1B", "InterleavedZeroBubble"):
        s = build_schedule(name, n_ranks=3, n_microbatches=6, stages_per_rank=1)
        sim = simulate_pipeline(s, [StageCost(1.0, 1.0, 1.0)] * 3)
        assert stage_in_flight(s) == tuple(r.peak_microbatches_held for r in sim.ranks)


def test_cut_times_feed_the_simulation():
    # the bottleneck paces the steady state: 1F1B step = (m + p - 1) * bottleneck when stages are equal
    unit = BlockCost(1.0, 2.0, 0, 0)
    cut = cut_stages([unit] * 6, 3)
    costs = [StageCost(s.time_s / 3, 2 * s.time_s / 3, 0.0) for s in cut.stages]
    sim = simulate_pipeline(build_schedule("1F1B", n_ranks=3, n_microbatches=4), costs)
    assert sim.pipeline_s == pytest.approx((4 + 3 - 1) * cut.bottleneck_s)


def test_refusals_name_why():
    unit = BlockCost(1.0, 1.0, 10, 10)
    with pytest.raises(ValueError, match="n_stages=4 exceeds the 3 blocks"):
        cut_stages([unit] * 3, 4)
    with pytest.raises(ValueError, match=r"fits memory_limit_bytes=30 per rank \(15 per stage.*needs 20 bytes"):
        cut_stages([unit] * 4, 4, memory_limit_bytes=30, stages_per_rank=2)
    with pytest.raises(ValueError, match="in_flight needs 2 counts"):
        cut_stages([unit] * 4, 2, in_flight=(1,))
    with pytest.raises(ValueError, match="must be >= 0"):
        BlockCost(-1.0, 1.0, 0, 0)


def _rank_sums(cut, in_flight, stage_ranks, first, last):
    sums: dict[int, int] = {}
    for k, st in enumerate(cut.stages):
        sums[stage_ranks[k]] = sums.get(stage_ranks[k], 0) + st.memory_bytes
    return sums


@pytest.mark.parametrize("seed", range(30))
def test_proportional_shares_keep_every_rank_within_its_memory_and_never_cut_worse(seed):
    # interleaved-like: p ranks, v stages each, stage k on rank k % p; the proportional shares are
    # a second sufficient split of each rank's memory, kept only when its bottleneck is smaller
    rng = random.Random(1000 + seed)
    p, v = rng.randint(1, 3), rng.randint(1, 3)
    k_stages = p * v
    n = rng.randint(k_stages, k_stages + 5)
    blocks = _random_blocks(rng, n)
    first, last = _random_blocks(rng, 2)
    ranks = [k % p for k in range(k_stages)]
    in_flight = sorted((rng.randint(1, k_stages + 1) for _ in range(k_stages)), reverse=True)
    limit = rng.randint(100, 600)
    kw = dict(first_extra=first, last_extra=last, in_flight=in_flight, memory_limit_bytes=limit, stages_per_rank=v)
    try:
        equal = cut_stages(blocks, k_stages, **kw)
    except ValueError:
        equal = None
    try:
        shared = cut_stages(blocks, k_stages, stage_ranks=ranks, **kw)
    except ValueError:
        assert equal is None, "the proportional split may only add cuts, never lose the equal one"
        return
    assert all(total <= limit for total in _rank_sums(shared, in_flight, ranks, first, last).values())
    if equal is not None:
        assert shared.bottleneck_s <= equal.bottleneck_s


def test_proportional_shares_give_early_interleaved_stages_the_memory_they_hold():
    # 2 ranks x 2 stages, the early stages hold more microbatches: equal shares (60 B per stage)
    # allow 1, 2, 3, 6 blocks; the rank's own sum allows 2 blocks on every stage
    unit = BlockCost(1.0, 1.0, 0, 10)
    held, ranks = (4, 3, 2, 1), (0, 1, 0, 1)
    equal = cut_stages([unit] * 8, 4, in_flight=held, memory_limit_bytes=120, stages_per_rank=2)
    shared = cut_stages([unit] * 8, 4, in_flight=held, memory_limit_bytes=120, stages_per_rank=2, stage_ranks=ranks)
    assert equal.bottleneck_s == 6.0 and shared.bottleneck_s == 4.0
    assert shared.cuts == (2, 4, 6)
    with pytest.raises(ValueError, match="stage_ranks needs 4 ranks"):
        cut_stages([unit] * 8, 4, stage_ranks=(0, 1))
