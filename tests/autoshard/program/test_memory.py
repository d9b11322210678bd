"""autoshard.program.memory: the peak of a memory timeline with extra intervals (prefetched copies)."""

from __future__ import annotations

import random

import pytest

from autoshard.program.memory import peak_with_extra


def _peak_by_definition(timeline, extra):
    """Every point where something changes, the level there plus every interval open there,
    summed in the order of ``extra`` (what the sweep must reproduce to the last bit)."""
    points = sorted({t for t, _ in timeline} | {t for s, e, _ in extra for t in (s, e)})
    peak = 0.0
    for t in points:
        level = timeline[0][1]
        for when, value in timeline:
            if when <= t:
                level = value
        peak = max(peak, level + sum(b for s, e, b in extra if s <= t < e))
    return peak


@pytest.mark.parametrize("seed", range(40))
def test_the_sweep_gives_the_peak_of_the_definition_bit_for_bit(seed):
    rng = random.Random(seed)
    times = sorted(rng.sample(range(200), rng.randint(1, 40)))
    timeline = [(t, rng.uniform(0, 1e9)) for t in times]
    extra = []
    for _ in range(rng.randint(0, 60)):
        s = rng.randint(-5, 210)
        extra.append((s, s + rng.randint(0, 30), rng.choice([rng.uniform(0, 1e8), 2**20, 0.1, 1e-3])))
    assert peak_with_extra(timeline, extra) == _peak_by_definition(timeline, extra)


def test_an_interval_counts_from_its_start_up_to_but_not_at_its_end():
    timeline = [(0, 10.0), (5, 4.0)]
    assert peak_with_extra(timeline, [(3, 5, 1.0)]) == 11.0  # open at 3 and 4, closed at 5 (level 4 there)
    assert peak_with_extra(timeline, [(5, 9, 7.0), (6, 9, 1.0)]) == 12.0
    assert peak_with_extra(timeline, [(2, 2, 100.0)]) == 10.0  # empty
