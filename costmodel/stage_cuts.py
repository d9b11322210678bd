r"""Contiguous stage cuts: which blocks each pipeline stage runs, slowest stage smallest.

**Input.** ``N`` blocks in model order (the repeated layers of the joint graph), each
with per-microbatch forward and backward times ``t_n = f_n + b_n`` on the stage's
sub-mesh, its state bytes ``s_n`` (parameters, gradients, optimizer state) and the
activation bytes ``a_n`` it saves per microbatch; the extra work of the first stage
(embedding) and of the last (final norm, output layer, loss), ``e^first`` and
``e^last`` with the same four figures; the number of stages ``K`` (``p * v``); per
stage ``k`` the microbatches it holds at its peak, ``h_k`` (what the schedule keeps
in flight: :func:`stage_in_flight`; 1F1B ``p - k``, GPipe ``m``); a memory limit
``M`` per rank and the stages per rank ``v``.

**Problem.** Cut positions ``0 = c_0 < c_1 < ... < c_K = N``; stage ``k`` runs blocks
``[c_k, c_{k+1})`` (at least one block each):

    (a) time_k  = sum_{n in stage k} t_n + [k = 0] t^first + [k = K - 1] t^last
    (b) mem_k   = sum s_n + h_k * sum a_n   (plus the extras' s and h_k * a on stages 0 and K - 1)
    (c) mem_k <= M_k = sigma_k M              for every stage k, sum_{k on rank r} sigma_k = 1
    minimise   max_k time_k, ties broken by the lexicographically smallest (c_1 .. c_{K-1}).

``max_k time_k`` is the bottleneck: in the steady state of a 1F1B-like schedule every
rank runs one forward and one backward per microbatch slot, paced by the slowest
stage; the schedule simulation (``costmodel.pipeline_simulate``) then prices the
step from these stage times. Constraint (c) gives each of a rank's ``v`` stages a
share ``sigma_k`` of its memory: any shares summing to one per rank make it
sufficient for the rank's sum, exact for ``v = 1`` (the stages of one rank are not
contiguous, so their sum is not a local term). Two share vectors are tried and the
smaller bottleneck kept (ties: the equal one): equal, ``sigma_k = 1 / v``; and, when
the caller says which rank holds each stage (``stage_ranks``), proportional to what
an average block costs on that stage, ``w_k = s_bar + h_k a_bar`` (``s_bar``,
``a_bar`` the mean state and activation bytes of a block),
``sigma_k = w_k / sum_{k' on rank(k)} w_{k'}``. Equal shares starve the early
virtual stages of an interleaved schedule, which hold more microbatches
(``h_k``) than the late ones of the same rank: with uniform blocks a cut of
``b`` blocks per stage fits the rank's sum ``b sum_k w_k <= M`` exactly when it
fits the proportional shares, while equal shares need ``b w_max <= M / v``.

**Dynamic program** (as Alpa's stage search, over block boundaries). ``D(k, i)``:
the least bottleneck of blocks ``[i, N)`` cut into stages ``k .. K - 1``:

    (d) D(K, N) = 0,  D(K, i) = inf for i < N
    (e) D(k, i) = min over j in (i, N - (K - k - 1)] with mem_k(i, j) <= M_k
                  of max(time_k(i, j), D(k + 1, j))

It keeps the optimum because a cut's bottleneck is ``max(stage k, the rest)`` and
the rest's feasibility and time depend only on where it starts and which stage
index it starts at (``h_k`` and the extras are per index). ``O(K N^2)`` steps.
**Tie-break** (f): walk forward from ``i = 0``, each time taking the smallest ``j``
with ``mem_k(i, j) <= M_k``, ``time_k(i, j) <= D(0, 0)`` and
``D(k + 1, j) <= D(0, 0)``: the lexicographically smallest optimal cut.

Refused with ``ValueError``: ``K > N`` (a stage without a block), and no cut fitting
memory (the message gives the least largest stage memory any cut reaches).

>>> unit = BlockCost(forward_s=1.0, backward_s=2.0, state_bytes=0, activation_bytes=0)
>>> cut = cut_stages([unit] * 5, 2, last_extra=unit)
>>> cut.cuts, cut.bottleneck_s
((3,), 9.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from costmodel.pipeline_schedules import ActionKind, PipelineSchedule

__all__ = ["BlockCost", "Stage", "StageCuts", "cut_stages", "stage_in_flight", "suffix_min_max"]


@dataclass(frozen=True, slots=True)
class BlockCost:
    """One block's per-microbatch times and bytes on a stage's sub-mesh."""

    forward_s: float
    backward_s: float
    state_bytes: int
    """Parameters, gradients and optimizer state, held for the whole step."""
    activation_bytes: int
    """Saved by the forward for the backward, per microbatch."""

    def __post_init__(self) -> None:
        if min(self.forward_s, self.backward_s) < 0 or min(self.state_bytes, self.activation_bytes) < 0:
            raise ValueError(f"BlockCost: times and bytes must be >= 0, got {self}")


_NOTHING = BlockCost(0.0, 0.0, 0, 0)


@dataclass(frozen=True, slots=True)
class Stage:
    """One stage of the chosen cut."""

    first_block: int
    end_block: int
    """One past its last block."""
    time_s: float
    """(a): forward + backward per microbatch, extras included."""
    memory_bytes: int
    """(b): state + activations of the microbatches in flight at its peak."""


@dataclass(frozen=True, slots=True)
class StageCuts:
    """The chosen cut (module docstring)."""

    stages: tuple[Stage, ...]
    bottleneck_s: float
    """``max_k time_k``."""

    @property
    def cuts(self) -> tuple[int, ...]:
        """``c_1 .. c_{K-1}``: the first block of every stage but the first."""
        return tuple(s.first_block for s in self.stages[1:])


def stage_in_flight(schedule: PipelineSchedule) -> tuple[int, ...]:
    """``h_k``: per stage, the most microbatches between their ``F`` and their ``B`` or
    ``W`` at once, from the schedule's order alone (times do not change the order of a
    rank's own actions, hence not this count)."""
    peak = [0] * schedule.n_stages
    for order in schedule.orders:
        held = [0] * schedule.n_stages
        for a in order:
            if a.kind is ActionKind.FORWARD:
                held[a.stage] += 1
                peak[a.stage] = max(peak[a.stage], held[a.stage])
            elif a.kind in (ActionKind.FULL_BACKWARD, ActionKind.BACKWARD_WEIGHT):
                held[a.stage] -= 1
    return tuple(peak)


def _prefix(values: Sequence[float]) -> list[float]:
    out = [0.0]
    for x in values:
        out.append(out[-1] + x)
    return out


_StageTerm = Callable[[int, int, int], float]  # (stage k, first block i, end block j) -> a figure of that stage


def suffix_min_max(n: int, k_stages: int, cost: _StageTerm, allowed: Callable[[int, int, int], bool]) -> list[list[float]]:
    """(d), (e): ``D[k][i]``, the least max ``cost`` of blocks ``[i, N)`` in stages ``k ..``."""
    table = [[math.inf] * (n + 1) for _ in range(k_stages + 1)]
    table[k_stages][n] = 0.0
    for k in range(k_stages - 1, -1, -1):
        for i in range(k, n - (k_stages - 1 - k)):
            best = math.inf
            for j in range(i + 1, n - (k_stages - 2 - k)):
                if table[k + 1][j] < best and allowed(k, i, j):
                    best = min(best, max(cost(k, i, j), table[k + 1][j]))
            table[k][i] = best
    return table


def cut_stages(
    blocks: Sequence[BlockCost],
    n_stages: int,
    *,
    first_extra: BlockCost = _NOTHING,
    last_extra: BlockCost = _NOTHING,
    in_flight: Sequence[int] | None = None,
    memory_limit_bytes: int | None = None,
    stages_per_rank: int = 1,
    stage_ranks: Sequence[int] | None = None,
) -> StageCuts:
    """The cut of ``blocks`` into ``n_stages`` stages with the smallest slowest stage
    (module docstring). ``in_flight`` is ``h_k`` (default 1 per stage);
    ``memory_limit_bytes`` per rank, ``None`` for no limit; ``stage_ranks`` the rank
    holding each stage (the schedule's ``stage_ranks``), for proportional shares.

    >>> unit = BlockCost(forward_s=1.0, backward_s=1.0, state_bytes=0, activation_bytes=10)
    >>> ranks, held = (0, 1, 0, 1), (4, 3, 2, 1)       # interleaved: 2 ranks, 2 stages each
    >>> cut_stages([unit] * 8, 4, in_flight=held, memory_limit_bytes=120, stages_per_rank=2).bottleneck_s
    6.0
    >>> cut_stages([unit] * 8, 4, in_flight=held, memory_limit_bytes=120, stages_per_rank=2,
    ...            stage_ranks=ranks).bottleneck_s
    4.0
    """
    n = len(blocks)
    if n_stages < 1:
        raise ValueError(f"n_stages must be >= 1, got {n_stages}")
    if n_stages > n:
        raise ValueError(f"n_stages={n_stages} exceeds the {n} blocks: every stage needs at least one block")
    h = tuple(in_flight) if in_flight is not None else (1,) * n_stages
    if len(h) != n_stages or min(h) < 0:
        raise ValueError(f"in_flight needs {n_stages} counts >= 0, got {h}")
    if stages_per_rank < 1:
        raise ValueError(f"stages_per_rank must be >= 1, got {stages_per_rank}")
    if stage_ranks is not None and len(stage_ranks) != n_stages:
        raise ValueError(f"stage_ranks needs {n_stages} ranks, got {tuple(stage_ranks)}")
    time = _prefix([b.forward_s + b.backward_s for b in blocks])
    state = _prefix([b.state_bytes for b in blocks])
    acts = _prefix([b.activation_bytes for b in blocks])
    limit = math.inf if memory_limit_bytes is None else memory_limit_bytes / stages_per_rank
    last = n_stages - 1

    def stage_time(k: int, i: int, j: int) -> float:  # (a)
        extras = [e for e, here in ((first_extra, k == 0), (last_extra, k == last)) if here]
        return time[j] - time[i] + sum(e.forward_s + e.backward_s for e in extras)

    def stage_memory(k: int, i: int, j: int) -> float:  # (b)
        extras = [e for e, here in ((first_extra, k == 0), (last_extra, k == last)) if here]
        held = acts[j] - acts[i] + sum(e.activation_bytes for e in extras)
        return state[j] - state[i] + sum(e.state_bytes for e in extras) + h[k] * held

    tried = [_cut_within(n, n_stages, stage_time, stage_memory, [limit] * n_stages)]
    if stage_ranks is not None and memory_limit_bytes is not None:
        weights = [state[n] / n + h[k] * acts[n] / n for k in range(n_stages)]
        per_rank: dict[int, float] = {}
        for k, r in enumerate(stage_ranks):
            per_rank[r] = per_rank.get(r, 0.0) + weights[k]
        if all(w > 0 for w in per_rank.values()):
            shares = [memory_limit_bytes * weights[k] / per_rank[r] for k, r in enumerate(stage_ranks)]
            tried.append(_cut_within(n, n_stages, stage_time, stage_memory, shares))
    found = [cut for cut in tried if cut is not None]
    if not found:
        least = suffix_min_max(n, n_stages, stage_memory, lambda k, i, j: True)[0][0]
        raise ValueError(
            f"no cut of {n} blocks into {n_stages} stages fits memory_limit_bytes={memory_limit_bytes} per rank "
            f"({limit:.0f} per stage with {stages_per_rank} stage(s) per rank): "
            f"the best cut's largest stage needs {least:.0f} bytes"
        )
    return min(found, key=lambda cut: cut.bottleneck_s)  # min keeps the first (equal shares) on a tie


def _cut_within(n: int, n_stages: int, stage_time: _StageTerm, stage_memory: _StageTerm,
                limits: Sequence[float]) -> StageCuts | None:
    """(d)-(f) under the per-stage limits ``M_k``; None when no cut fits them."""
    last = n_stages - 1

    def fits(k: int, i: int, j: int) -> bool:  # (c)
        return stage_memory(k, i, j) <= limits[k]

    table = suffix_min_max(n, n_stages, stage_time, fits)
    bottleneck = table[0][0]
    if math.isinf(bottleneck):
        return None
    stages = []
    i = 0
    for k in range(n_stages):  # (f)
        if k == last:
            j = n
        else:
            j = next(j for j in range(i + 1, n - (last - 1 - k))
                     if fits(k, i, j) and stage_time(k, i, j) <= bottleneck and table[k + 1][j] <= bottleneck)
        stages.append(Stage(i, j, stage_time(k, i, j), int(stage_memory(k, i, j))))
        i = j
    return StageCuts(stages=tuple(stages), bottleneck_s=bottleneck)
