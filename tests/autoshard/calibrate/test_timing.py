"""autoshard.calibrate.timing: how many calls a trial gets, on a clock the test controls."""

from __future__ import annotations

import pytest

from autoshard.calibrate import timing
from autoshard.calibrate.timing import Job, Settings, measure


class _Clock:
    """``time.perf_counter`` for the timing module: moves only when the op runs."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    c = _Clock()
    monkeypatch.setattr(timing.time, "perf_counter", c)
    return c


def test_a_slow_first_timed_call_does_not_shorten_the_trials_of_a_microsecond_op(clock):
    # a 1 us op whose first timed call was preempted for 100 us (a core shared by more ranks than it has)
    calls = []

    def op() -> None:
        calls.append(None)
        clock.now += 1e-4 if len(calls) == 2 else 1e-6  # call 1 is the untimed warm-up

    settings = Settings(warmup=1, trials=3, min_trial_s=0.02)
    t = measure(Job.single(), op, settings)
    # trials of ~min_trial_s: 20,000 calls of 1 us (one call as the probe would have given 199)
    assert t.reps == settings.max_reps or t.reps >= 0.9 * settings.min_trial_s / 1e-6
    assert t.seconds == pytest.approx(1e-6, rel=1e-6)


def test_a_slow_op_is_probed_with_one_call(clock):
    calls = []

    def op() -> None:
        calls.append(None)
        clock.now += 0.05  # longer than a trial: the probe is one call, the trials one call each

    t = measure(Job.single(), op, Settings(warmup=0, trials=3, min_trial_s=0.02))
    assert t.reps == 1 and len(calls) == 1 + 3
    assert t.seconds == pytest.approx(0.05)


def test_trials_never_exceed_max_reps(clock):
    def op() -> None:
        clock.now += 1e-9

    t = measure(Job.single(), op, Settings(warmup=0, trials=2, min_trial_s=0.02, max_reps=1000))
    assert t.reps == 1000
