"""The step simulation against a plain event loop, on random schedules: the same floats.

``costmodel.overlap.simulate`` walks positions and adds a stretch of ops with nothing in
flight in one pass; the reference below steps every op through one event loop (the
simulation as it was first written). Both must make the same additions in the same
order, so every output is compared exactly, not approximately.
"""

from __future__ import annotations

import random
from collections import deque

import pytest

from costmodel.overlap import Transfer, simulate


def _reference(compute, transfers, tail_s, contention, skew_s):
    """(step, reached, timings) by one event loop over a program of actions."""
    n = len(compute)
    program = []
    for p in range(n + 1):
        program.append(("at", p))
        for k, t in enumerate(transfers):
            if t.issue == p:
                for j in range(len(t.durations_s) - 1):
                    program += [("issue", k, j), ("wait", k, j)]
                program.append(("issue", k, len(t.durations_s) - 1))
        for k, t in enumerate(transfers):
            if t.wait == p:
                program.append(("wait", k, len(t.durations_s) - 1))
        work = compute[p] if p < n else tail_s
        if work > 0:
            program.append(("work", float(work)))
    slow = 1.0 / (1.0 + contention)
    now, since, work_left, i = 0.0, 0.0, 0.0, 0
    queue, done, started, needed, reached = deque(), {}, {}, {}, [0.0] * (n + 1)
    while True:
        while i < len(program):
            action = program[i]
            if action[0] == "at":
                reached[action[1]] = now
            elif action[0] == "issue":
                seconds = transfers[action[1]].durations_s[action[2]] + (0.0 if queue else min(since, skew_s))
                since = 0.0
                queue.append([action[1], action[2], seconds])
                if len(queue) == 1:
                    started[action[1:]] = now
            elif action[0] == "wait":
                if action[2] == len(transfers[action[1]].durations_s) - 1:
                    needed.setdefault(action[1], now)
                if action[1:] not in done:
                    break
            else:
                if queue or work_left > 0.0:
                    work_left = work_left if work_left > 0.0 else action[1]
                    break
                now += action[1]
                since += action[1]
            i += 1
        computing = i < len(program) and program[i][0] == "work"
        if not computing and not queue:
            break
        rate = slow if (computing and queue) else 1.0
        step = min(work_left if computing else float("inf"), queue[0][2] if queue else float("inf")) / rate
        now += step
        if computing:
            work_left -= step * rate
            since += step * rate
            if work_left <= 1e-15:
                work_left, i = 0.0, i + 1
        if queue:
            queue[0][2] -= step * rate
            if queue[0][2] <= 1e-15:
                k, j, _ = queue.popleft()
                done[(k, j)] = now
                if queue:
                    started[(queue[0][0], queue[0][1])] = now
    timings = [(started[(k, len(t.durations_s) - 1)], done[(k, len(t.durations_s) - 1)], needed[k])
               for k, t in enumerate(transfers)]
    return now, tuple(reached), timings


@pytest.mark.parametrize("seed", range(4))
def test_the_simulation_makes_the_same_floats_as_one_event_loop(seed: int) -> None:
    rng = random.Random(seed)

    def seconds() -> float:  # zeros, short and long durations: ties and ops that end together
        return rng.choice([0.0, rng.random() * 1e-3, rng.random(), 0.5])

    for _ in range(300):
        n = rng.randint(0, 30)
        compute = [seconds() for _ in range(n)]
        transfers = []
        for _ in range(rng.randint(0, 10)):
            issue = rng.randint(0, n)
            transfers.append(Transfer(issue, rng.randint(issue, n), tuple(seconds() for _ in range(rng.randint(1, 3)))))
        tail, kappa, skew = seconds(), rng.choice([0.0, 1.0, rng.random()]), rng.choice([0.0, rng.random() * 1e-2])
        got = simulate(compute, transfers, tail_s=tail, contention=kappa, skew_s=skew)
        step, reached, timings = _reference(compute, transfers, tail, kappa, skew)
        assert got.step_s == step and got.reached_s == reached
        assert [(t.start_s, t.end_s, t.needed_s) for t in got.timings] == timings
