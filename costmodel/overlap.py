r"""Two-stream simulation of one rank's step: compute on one stream, collectives on another.

The runtime issues a collective as soon as its input exists and waits for it
at its first reader (``autoshard.program.schedule``); while it is in flight the
rank keeps computing. What a step pays for communication is therefore not the
sum of its collectives but what the compute stream waits for. This module
prices exactly that, for a schedule written as positions in the op order.

**Input.** ``N`` ops with compute times ``c_0 .. c_{N-1}`` (seconds at full
speed), an optional tail ``c_end`` after the last op (the optimizer step), and
transfers. Position ``p`` in ``[0, N]`` is the point just before op ``p``
(``N``: after the last op, before the tail). A transfer has an ``issue`` and a
``wait`` position (``issue <= wait``) and one or more collective durations
``d_1 .. d_k``: the first ``k - 1`` run synchronously when the transfer is
issued (the compute stream waits for each; a redistribution with several
collective steps needs each result before the next step), the last runs in
the background until the wait.

**Order at a position.** At position ``p`` the compute stream issues the
transfers whose ``issue == p`` in list order, then waits for those whose
``wait == p``, then runs op ``p`` (or the tail at ``N``). The communication
stream runs collectives one at a time, first issued first (gloo and NCCL both
serialise the collectives of a process group; one stream is the usual model).

**Contention.** On a GPU the collective runs on its own engines and hides
fully. On a CPU both streams need the same cores: the profile's contention
factor ``kappa`` in ``[0, 1]`` (``hw_profiles``: ``overlap.contention``) says
how much. While both streams are busy each advances at rate ``1 / (1 + kappa)``;
alone, at rate 1. ``kappa = 0``: full overlap (a step of compute ``C`` and a
fully hidden collective ``D <= C`` takes ``C``); ``kappa = 1``: overlap gains
nothing (``C + D``, as if run one after the other).

**Skew.** A collective starts when the last rank issues it. Ranks that compute
unsynchronised drift apart: on dedicated devices by little, but ranks
time-sliced on shared cores (4 gloo ranks on 2 cores) by up to a scheduler
slice. With the profile's ``skew_s`` (``overlap.skew_s``, measured by a profile
correction; 0 by default) a collective issued onto an idle communication
stream after ``g`` seconds of compute since the previous issue starts
``min(g, skew_s)`` later: it is priced ``min(g, skew_s)`` longer. Collectives
issued back to back (gradient buckets at the end of the backward) pay it once;
one behind another in flight, not at all (the stragglers catch up meanwhile).
Measured on 4 gloo ranks sharing 2 cores: a collective after ~10 ms of compute
waits 3.0-3.4 ms more than timed alone, after ~1 ms 0-2 ms.

**Output.** ``step_s`` (the time the compute stream finishes the tail),
``compute_s = sum c``, ``comm_s = sum d``, and ``exposed_comm_s = step_s -
compute_s``: what communication adds to the step (waits, and the slowdown of
compute by collectives beside it); ``0 <= exposed_comm_s <= comm_s``.
Per transfer the simulation also gives its start on the communication stream
and the time the compute stream reached its wait (``slack``: see
:func:`transfer_slack`), which the solver's overlap pricing reads.

Worked example (hand-checked in ``tests/costmodel/test_overlap.py``): ops of
1, 2, 3 ms; a 2.5 ms collective issued at position 1 (after op 0) and waited
at position 2 (before op 2). It runs from 1 ms to 3.5 ms; op 1 ends at 3 ms,
so op 2 starts at 3.5 ms: ``step_s = 6.5`` ms, ``exposed_comm_s = 0.5`` ms.

>>> r = simulate([1e-3, 2e-3, 3e-3], [Transfer(1, 2, (2.5e-3,))])
>>> round(r.step_s * 1e3, 3), round(r.exposed_comm_s * 1e3, 3)
(6.5, 0.5)
"""

from __future__ import annotations

import bisect
import functools
import itertools
import operator
from collections import deque
from dataclasses import dataclass
from typing import Sequence

__all__ = ["Transfer", "TransferTiming", "StepSimulation", "simulate", "transfer_slack", "exposed_cost_s"]

_EPS = 1e-15


@dataclass(frozen=True, slots=True)
class Transfer:
    """One scheduled redistribution or bucket (module docstring)."""

    issue: int
    """Position where the compute stream issues it."""
    wait: int
    """Position where the compute stream waits for it (``>= issue``)."""
    durations_s: tuple[float, ...]
    """Its collectives in order; all but the last are waited at once."""


@dataclass(frozen=True, slots=True)
class TransferTiming:
    """When one transfer's last collective ran, and when its reader wanted it."""

    start_s: float
    """Start of its last collective on the communication stream."""
    end_s: float
    """End of its last collective."""
    needed_s: float
    """When the compute stream reached its wait position."""


@dataclass(frozen=True, slots=True)
class StepSimulation:
    """The simulated step (module docstring)."""

    step_s: float
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    """``step_s - compute_s``: what communication adds to the step."""
    timings: tuple[TransferTiming, ...]
    """One per transfer, in the order given."""
    reached_s: tuple[float, ...] = ()
    """When the compute stream reached each position ``0 .. N`` (before its waits)."""


def _events(n: int, transfers: Sequence[Transfer]) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """Transfers by issue position and by wait position, in list order (checked)."""
    issues: dict[int, list[int]] = {}
    waits: dict[int, list[int]] = {}
    for k, t in enumerate(transfers):
        if not 0 <= t.issue <= t.wait <= n:
            raise ValueError(f"transfer {k}: positions issue {t.issue}, wait {t.wait} not within 0 <= issue <= wait <= {n}")
        if not t.durations_s or any(d < 0 for d in t.durations_s):
            raise ValueError(f"transfer {k}: durations must be a non-empty list of non-negative seconds")
        issues.setdefault(t.issue, []).append(k)
        waits.setdefault(t.wait, []).append(k)
    return issues, waits


class _Streams:
    """The two streams' state while positions are walked (module docstring): the communication
    stream's queue of ``[transfer, collective, seconds left at full speed]``, and when each
    collective started and ended."""

    def __init__(self, contention: float, skew_s: float) -> None:
        self.slow = 1.0 / (1.0 + contention)
        self.skew_s = skew_s
        self.now = 0.0
        self.since_issue = 0.0  # compute since the last issue: how far the ranks may have drifted apart
        self.queue: deque[list] = deque()
        self.done: dict[tuple[int, int], float] = {}
        self.started: dict[tuple[int, int], float] = {}

    def _advance_head(self, seconds: float) -> None:
        """The head collective ran ``seconds`` at full speed; at its end the next one starts."""
        head = self.queue[0]
        head[2] -= seconds
        if head[2] <= _EPS:
            self.queue.popleft()
            self.done[(head[0], head[1])] = self.now
            if self.queue:
                self.started[(self.queue[0][0], self.queue[0][1])] = self.now

    def issue(self, k: int, j: int, seconds: float) -> None:
        if not self.queue:  # on an idle stream it starts when the last rank issues it
            seconds += min(self.since_issue, self.skew_s)
        self.since_issue = 0.0
        self.queue.append([k, j, seconds])
        if len(self.queue) == 1:
            self.started[(k, j)] = self.now

    def wait(self, key: tuple[int, int]) -> None:
        """The compute stream blocks until collective ``key`` is done: the collectives run alone."""
        while key not in self.done:
            if not self.queue:  # unreachable for checked positions: issues come before waits
                raise ValueError(f"schedule: the compute stream waits for transfer {key[0]} before issuing it")
            step = self.queue[0][2]
            self.now += step
            self._advance_head(step)

    def work(self, left: float) -> None:
        """Compute ``left`` seconds; while a collective is in flight both advance at rate ``slow``."""
        while True:
            rate = self.slow if self.queue else 1.0
            step = min(left, self.queue[0][2] if self.queue else float("inf")) / rate
            self.now += step
            left -= step * rate
            self.since_issue += step * rate
            if self.queue:
                self._advance_head(step * rate)
            if left <= _EPS:
                return


def simulate(compute_s: Sequence[float], transfers: Sequence[Transfer], *, tail_s: float = 0.0,
             contention: float = 0.0, skew_s: float = 0.0) -> StepSimulation:
    """Simulate one step (module docstring). ``compute_s[p]`` is op ``p``'s time;
    ``tail_s`` runs after position ``N = len(compute_s)``; ``contention`` is kappa;
    ``skew_s`` the ranks' largest drift at a collective.

    >>> simulate([1.0, 1.0], [Transfer(0, 2, (1.5,))]).step_s
    2.0
    >>> simulate([1.0, 1.0], [Transfer(0, 2, (1.5,))], contention=1.0).step_s
    3.5
    >>> simulate([1.0, 1.0], [Transfer(1, 1, (0.5,))], skew_s=0.25).step_s  # issued after 1 s of compute
    2.75
    """
    n = len(compute_s)
    if not 0.0 <= contention <= 1.0:
        raise ValueError(f"contention: {contention} is not in [0, 1]")
    if skew_s < 0:
        raise ValueError(f"skew_s: {skew_s} is negative")
    issues, waits = _events(n, transfers)
    sim = _Streams(contention, skew_s)
    needed: dict[int, float] = {}
    reached = [0.0] * (n + 1)
    # Positions in order. The event loop runs only while a collective is in flight or the compute
    # stream waits; a stretch of positions with no event and nothing in flight adds its ops' times one
    # after the other (itertools.accumulate: the same additions in the same order, so the same floats).
    seconds_at = [float(c) if c > 0 else 0.0 for c in compute_s]
    seconds_at.append(float(tail_s) if tail_s > 0 else 0.0)
    events = sorted(set(issues) | set(waits))
    p = 0
    while p <= n:
        if not sim.queue and p not in issues and p not in waits:
            e = events[bisect.bisect_right(events, p)] if events and events[-1] > p else n + 1
            sums = list(itertools.accumulate(seconds_at[p:e], initial=sim.now))
            reached[p:e] = sums[:-1]
            sim.now = sums[-1]
            sim.since_issue = functools.reduce(operator.add, seconds_at[p:e], sim.since_issue)
            p = e
            continue
        reached[p] = sim.now
        for k in issues.get(p, ()):
            durations = transfers[k].durations_s
            last = len(durations) - 1
            for j in range(last):  # a redistribution's earlier steps: each needed before the next
                sim.issue(k, j, durations[j])
                sim.wait((k, j))
            sim.issue(k, last, durations[last])
        for k in waits.get(p, ()):
            needed.setdefault(k, sim.now)
            sim.wait((k, len(transfers[k].durations_s) - 1))
        if seconds_at[p] > 0:
            sim.work(seconds_at[p])
        p += 1
    now = sim.now
    total_compute = float(sum(compute_s)) + float(tail_s)
    total_comm = float(sum(sum(t.durations_s) for t in transfers))
    timings = tuple(TransferTiming(sim.started[(k, len(t.durations_s) - 1)], sim.done[(k, len(t.durations_s) - 1)],
                                   needed[k]) for k, t in enumerate(transfers))
    return StepSimulation(now, total_compute, total_comm, max(0.0, now - total_compute), timings, tuple(reached))


def transfer_slack(timing: TransferTiming) -> float:
    """Seconds a transfer's last collective can take before its reader waits:
    from its start on the communication stream to when the compute stream
    reached its wait (0 when it started late)."""
    return max(0.0, timing.needed_s - timing.start_s)


def exposed_cost_s(comm_s: float, slack_s: float, contention: float) -> float:
    r"""What a collective of ``comm_s`` adds to the step when ``slack_s`` of
    compute can run beside it: the part that does not fit, plus the
    contention slowdown of the part that does,
    ``max(0, d - s) + kappa * min(d, s)``.

    >>> exposed_cost_s(3.0, 2.0, 0.0), exposed_cost_s(3.0, 2.0, 0.5), exposed_cost_s(1.0, 2.0, 1.0)
    (1.0, 2.0, 1.0)
    """
    hidden = min(comm_s, max(0.0, slack_s))
    return comm_s - hidden + contention * hidden
