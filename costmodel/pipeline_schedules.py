r"""Pipeline schedules: which stage and microbatch each rank computes, in which order.

A pipeline of ``S`` stages runs on ``p`` ranks (the ``pp`` mesh dim), ``v = S / p``
stages per rank, over ``m`` microbatches. A schedule is, per rank, an ordered
list of compute actions ``(stage, microbatch, kind)``. Kinds, with the letters
``torch.distributed.pipelining`` prints:

- ``F``: forward of one stage on one microbatch (the last stage's forward includes the loss);
- ``B``: full backward (input gradient and weight gradient together);
- ``I``: input-gradient half of a split backward (what the previous stage waits for);
- ``W``: weight-gradient half of a split backward (nobody waits for it: it fills bubbles).

Every stage computes every microbatch exactly once: one ``F`` and either one ``B``
or one ``I`` and one later ``W`` (:func:`check_schedule`).

**Stage placement.** Looped: stage ``s`` on rank ``s mod p`` (GPipe, 1F1B, the
interleaved schedules, looped BFS). V-shaped (``v = 2``): rank ``r`` holds stages
``r`` and ``2p - 1 - r``, so the turn from stage ``p - 1`` to stage ``p`` stays on
rank ``p - 1`` and the last stage sits on rank 0, beside the first.

**Orders** (``r`` the rank; the generators below are ours; the tests assert that
each equals what the installed torch runs, action for action):

- GPipe: ``F_0 .. F_{m-1}``, then ``B_0 .. B_{m-1}``.
- 1F1B (``m >= p``, as torch requires): ``w = min(m, p - 1 - r)`` warm-up forwards,
  then ``m - w`` pairs ``(F, B)``, then ``w`` backwards: rank 0 holds up to ``p``
  microbatches, the last rank one.
- Interleaved 1F1B (Megatron, as torch generalises it to any ``m`` with
  ``m mod max(1, m // p) = 0``): microbatches go in rounds of ``q = m / max(1, m // p)``;
  the rank's ``k``-th forward runs its local chunk ``floor(k / q) mod v`` and its
  ``k``-th backward its chunk ``v - 1 - floor(k / q) mod v`` (the deepest chunk first);
  ``w = min((v - 1) q + 2 (p - 1 - r), v m)`` warm-up forwards, then pairs ``(F, B)``,
  then ``w`` backwards.
- Interleaved zero bubble (ZB1P, torch's ``InterleavedZeroBubble``): as interleaved
  1F1B with ``w = min((v - 1) q + (p - 1 - r), v m)`` and ``I`` for ``B``; after the
  rank's ``j``-th ``I`` (``j >= r``) comes the ``W`` of its ``(j - r)``-th, the last ``r``
  ``W`` at the end. With ``v = 1`` this is ZB-H1.
- ZBV zero bubble (``v = 2``, V placement, chunk 0 = stage ``r``, chunk 1 = stage
  ``2p - 1 - r``; generated for ``n = max(m, 2p - 1)`` microbatches, then the
  microbatches ``>= m`` dropped): ``2(p - r) - 1`` forwards of chunk 0;
  ``r`` times ``(F chunk 1, F chunk 0)``; ``p - r`` times ``(F, I, W)`` of chunk 1;
  while chunk 0 has forwards left or chunk 1 trails: ``(F chunk 0 if left, I, W of
  chunk 0, F, I, W of chunk 1)``; ``r`` times ``(I chunk 0, I chunk 1)``; ``p - r``
  times ``(I chunk 0, W chunk 0)``; the remaining ``W`` of chunk 1, then of chunk 0.
- DualPipeV (``v = 2``, V placement, ``m >= 2p``): DeepSeek's schedule folded onto a
  V; see :func:`_dual_pipe_v_order` for its eight phases. Its overlapped pairs
  (a forward of one chunk computed together with a full backward of the other, so
  that one's communication hides under the other's compute) are two actions here,
  forward first, as torch's runtime runs them without a custom overlap function.
- Looped BFS (breadth first): every forward of chunk 0, then of chunk 1, ..., then the
  backwards, deepest chunk first and last microbatch first.

Torch also numbers idle slots (``None``) in its ``pipeline_order``; those are not
part of the order: a rank waits for its inputs whatever the slots say, and the
simulation (``costmodel.pipeline_simulate``) finds the waits from the times.

>>> s = build_schedule("1F1B", n_ranks=2, n_microbatches=3)
>>> [" ".join(str(a) for a in order) for order in s.orders]
['0F0 0F1 0B0 0F2 0B1 0B2', '1F0 1B0 1F1 1B1 1F2 1B2']
"""

from __future__ import annotations

import enum
from collections import Counter, deque
from dataclasses import dataclass
from typing import Callable

__all__ = [
    "ActionKind",
    "Action",
    "PipelineSchedule",
    "SCHEDULE_NAMES",
    "build_schedule",
    "check_schedule",
    "stage_to_rank",
]


class ActionKind(str, enum.Enum):
    """What one action computes (module docstring); values are torch's letters."""

    FORWARD = "F"
    FULL_BACKWARD = "B"
    BACKWARD_INPUT = "I"
    BACKWARD_WEIGHT = "W"


F, B, I, W = ActionKind.FORWARD, ActionKind.FULL_BACKWARD, ActionKind.BACKWARD_INPUT, ActionKind.BACKWARD_WEIGHT


@dataclass(frozen=True, slots=True)
class Action:
    """One compute action of one rank."""

    stage: int
    """Global stage index, ``0 .. S - 1``."""
    microbatch: int
    """Microbatch index, ``0 .. m - 1``."""
    kind: ActionKind

    def __str__(self) -> str:
        # torch's text form (``2F0``), so orders read the same as torch's pipeline_order
        return f"{self.stage}{self.kind.value}{self.microbatch}"


@dataclass(frozen=True, slots=True)
class PipelineSchedule:
    """Per-rank action orders of one schedule for one ``(p, v, m)``."""

    name: str
    """One of :data:`SCHEDULE_NAMES`."""
    n_ranks: int
    """``p``: ranks along the ``pp`` mesh dim."""
    stages_per_rank: int
    """``v``: stages (model chunks) per rank."""
    n_microbatches: int
    """``m``."""
    stage_ranks: tuple[int, ...]
    """Rank of each stage, ``S = p * v`` entries."""
    orders: tuple[tuple[Action, ...], ...]
    """Per rank, its compute actions in execution order."""

    @property
    def n_stages(self) -> int:
        return len(self.stage_ranks)

    @property
    def splits_backward(self) -> bool:
        """Whether some backward runs as ``I`` + ``W``."""
        return any(a.kind is I for order in self.orders for a in order)


def stage_to_rank(n_ranks: int, n_stages: int, *, v_shape: bool) -> tuple[int, ...]:
    """Rank of each stage: looped (``s mod p``) or V-shaped (module docstring)."""
    if n_stages % n_ranks:
        raise ValueError(f"n_stages={n_stages} is not a multiple of n_ranks={n_ranks}")
    if not v_shape:
        return tuple(s % n_ranks for s in range(n_stages))
    if n_stages != 2 * n_ranks:
        raise ValueError(f"a V-shaped placement has 2 stages per rank, got n_stages={n_stages}, n_ranks={n_ranks}")
    return tuple(s if s < n_ranks else 2 * n_ranks - 1 - s for s in range(n_stages))


class _Emitter:
    """Appends actions, numbering microbatches per (stage, kind) in order of appearance:
    every generator hands each stage its microbatches in increasing order."""

    def __init__(self) -> None:
        self.order: list[Action] = []
        self._next: Counter[tuple[int, ActionKind]] = Counter()

    def emit(self, stage: int, kind: ActionKind) -> Action:
        # a full backward and an input backward share one count: they are the same step
        # of the microbatch (DualPipeV switches from one to the other mid-stream)
        key = (stage, I if kind is B else kind)
        action = Action(stage, self._next[key], kind)
        self._next[key] += 1
        self.order.append(action)
        return action


def _warmup_steady_cooldown(
    n_ops: int,
    warmup: int,
    forward_stage: Callable[[int], int],
    backward_stage: Callable[[int], int],
    *,
    weight_lag: int | None = None,
) -> list[Action]:
    """``warmup`` forwards, pairs (forward, backward), ``warmup`` backwards (1F1B and the
    interleaved schedules). ``weight_lag`` set: backwards are ``I``, and the ``W`` of the
    ``j``-th follows the ``(j + weight_lag)``-th ``I``; the rest close the order."""
    out = _Emitter()
    backward_stages: list[int] = []

    def backward(j: int) -> None:
        backward_stages.append(backward_stage(j))
        out.emit(backward_stages[j], B if weight_lag is None else I)
        if weight_lag is not None and j >= weight_lag:
            out.emit(backward_stages[j - weight_lag], W)

    for k in range(warmup):
        out.emit(forward_stage(k), F)
    for j in range(n_ops - warmup):
        out.emit(forward_stage(warmup + j), F)
        backward(j)
    for j in range(n_ops - warmup, n_ops):
        backward(j)
    if weight_lag is not None:
        for j in range(max(0, n_ops - weight_lag), n_ops):
            out.emit(backward_stages[j], W)
    return out.order


def _gpipe(p: int, v: int, m: int) -> list[list[Action]]:
    return [[Action(r, mb, F) for mb in range(m)] + [Action(r, mb, B) for mb in range(m)] for r in range(p)]


def _one_f_one_b(p: int, v: int, m: int) -> list[list[Action]]:
    if m < p:
        raise ValueError(f"1F1B needs n_microbatches >= n_ranks (torch refuses fewer), got {m} < {p}")
    return [_warmup_steady_cooldown(m, min(m, p - 1 - r), lambda k, r=r: r, lambda k, r=r: r) for r in range(p)]


def _rounds(p: int, m: int, name: str) -> int:
    """Microbatches per round of the interleaved schedules (torch's flexible rounds)."""
    rounds = max(1, m // p)
    if m % rounds:
        raise ValueError(f"{name} needs n_microbatches to be a multiple of max(1, m // p) = {rounds}, got {m}")
    return m // rounds


def _interleaved(p: int, v: int, m: int, *, zero_bubble: bool) -> list[list[Action]]:
    per_round = _rounds(p, m, "InterleavedZeroBubble" if zero_bubble else "Interleaved1F1B")
    orders = []
    for r in range(p):
        # zero bubble warms up with half the margin: its W fill the gap 1F1B leaves for B
        warmup = min((v - 1) * per_round + (1 if zero_bubble else 2) * (p - 1 - r), v * m)

        def forward_stage(k: int, r: int = r) -> int:
            return (k // per_round) % v * p + r

        def backward_stage(j: int, r: int = r) -> int:
            return (v - 1 - (j // per_round) % v) * p + r

        lag = r if zero_bubble else None
        orders.append(_warmup_steady_cooldown(v * m, warmup, forward_stage, backward_stage, weight_lag=lag))
    return orders


def _interleaved_1f1b(p: int, v: int, m: int) -> list[list[Action]]:
    return _interleaved(p, v, m, zero_bubble=False)


def _interleaved_zero_bubble(p: int, v: int, m: int) -> list[list[Action]]:
    return _interleaved(p, v, m, zero_bubble=True)


def _looped_bfs(p: int, v: int, m: int) -> list[list[Action]]:
    orders = []
    for r in range(p):
        chunks = [r + k * p for k in range(v)]
        forwards = [Action(s, mb, F) for s in chunks for mb in range(m)]
        backwards = [Action(s, mb, B) for s in reversed(chunks) for mb in reversed(range(m))]
        orders.append(forwards + backwards)
    return orders


def _zbv(p: int, v: int, m: int) -> list[list[Action]]:
    n = max(m, 2 * p - 1)  # the pattern needs 2p - 1 microbatches; extra ones are dropped below
    orders = []
    for r in range(p):
        c0, c1 = r, 2 * p - 1 - r
        out = _Emitter()
        count: Counter[tuple[int, ActionKind]] = Counter()

        def emit(stage: int, kind: ActionKind) -> None:
            out.emit(stage, kind)
            count[stage, kind] += 1

        for _ in range(2 * (p - r) - 1):
            emit(c0, F)
        for _ in range(r):
            emit(c1, F)
            emit(c0, F)
        for _ in range(p - r):
            for kind in (F, I, W):
                emit(c1, kind)
        while count[c1, F] < count[c0, F] or count[c0, F] < n:
            if count[c0, F] < n:
                emit(c0, F)
            for stage, kind in ((c0, I), (c0, W), (c1, F), (c1, I), (c1, W)):
                emit(stage, kind)
        for _ in range(r):
            emit(c0, I)
            emit(c1, I)
        for _ in range(p - r):
            emit(c0, I)
            emit(c0, W)
        while count[c1, W] < count[c1, I]:
            emit(c1, W)
        while count[c0, W] < count[c0, I]:
            emit(c0, W)
        orders.append([a for a in out.order if a.microbatch < m])
    return orders


def _dual_pipe_v_order(p: int, m: int, r: int) -> list[Action]:
    """One rank of DualPipeV; chunk 0 = stage ``r``, chunk 1 = stage ``2p - 1 - r``.

    Phases (counts for rank ``r``): (1) ``2(p - r - 1)`` forwards of chunk 0; (2) ``r + 1``
    times forward chunk 0, forward chunk 1; (3) ``p - r - 1`` times ``I`` chunk 1, the
    oldest pending ``W``, forward chunk 1; (4) ``m - 2p + r + 1`` times [forward chunk 0 +
    full backward chunk 1, forward chunk 1 + full backward chunk 0]; (5) ``p - r - 1``
    times full backward chunk 1, forward chunk 1 + full backward chunk 0; (6) ``r + 1``
    times backward chunk 1, backward chunk 0, switching from full to input-only backward
    half way (before chunk 1's on odd ranks, between the two on even ones) so that the
    ``W`` fill the drain; (7) ``p - r - 1`` times a pending ``W``, a backward of chunk 0;
    (8) the ``r + 1`` pending ``W``.
    """
    c0, c1 = r, 2 * p - 1 - r
    out = _Emitter()
    pending_w: deque[Action] = deque()  # input-only backwards whose W has not run, oldest first

    def backward(stage: int, split: bool) -> None:
        action = out.emit(stage, I if split else B)
        if split:
            pending_w.append(action)

    def weight() -> None:
        # the W of the oldest split backward: its microbatch, not a count of W (full
        # backwards before it already did their weight gradients)
        if pending_w:
            done = pending_w.popleft()
            out.order.append(Action(done.stage, done.microbatch, W))

    for _ in range(2 * (p - r - 1)):
        out.emit(c0, F)
    for _ in range(r + 1):
        out.emit(c0, F)
        out.emit(c1, F)
    for _ in range(p - r - 1):
        backward(c1, True)
        weight()
        out.emit(c1, F)
    for _ in range(m - 2 * p + r + 1):  # overlapped pairs, forward first (module docstring)
        out.emit(c0, F)
        backward(c1, False)
        out.emit(c1, F)
        backward(c0, False)
    for _ in range(p - r - 1):
        backward(c1, False)
        out.emit(c1, F)
        backward(c0, False)
    split = False
    for i in range(r + 1):
        if i == (r + 1) // 2 and r % 2 == 1:
            split = True
        backward(c1, split)
        if i == (r + 1) // 2 and r % 2 == 0:
            split = True
        backward(c0, split)
    for _ in range(p - r - 1):
        weight()
        backward(c0, split)
    for _ in range(r + 1):
        weight()
    return out.order


def _dual_pipe_v(p: int, v: int, m: int) -> list[list[Action]]:
    if m < 2 * p:
        raise ValueError(f"DualPipeV needs n_microbatches >= 2 * n_ranks (the stage count), got {m} < {2 * p}")
    return [_dual_pipe_v_order(p, m, r) for r in range(p)]


@dataclass(frozen=True, slots=True)
class _Generator:
    build: Callable[[int, int, int], list[list[Action]]]
    stages_per_rank: int | None
    """Required ``v``, or ``None`` for any."""
    v_shape: bool


_GENERATORS: dict[str, _Generator] = {
    "GPipe": _Generator(_gpipe, 1, False),
    "1F1B": _Generator(_one_f_one_b, 1, False),
    "Interleaved1F1B": _Generator(_interleaved_1f1b, None, False),
    "InterleavedZeroBubble": _Generator(_interleaved_zero_bubble, None, False),
    "ZBVZeroBubble": _Generator(_zbv, 2, True),
    "DualPipeV": _Generator(_dual_pipe_v, 2, True),
    "LoopedBFS": _Generator(_looped_bfs, None, False),
}
SCHEDULE_NAMES: tuple[str, ...] = tuple(_GENERATORS)
"""Names as ``torch.distributed.pipelining.schedules.get_schedule_class`` takes them."""


def build_schedule(name: str, *, n_ranks: int, n_microbatches: int, stages_per_rank: int | None = None) -> PipelineSchedule:
    """The named schedule's per-rank orders (module docstring). ``stages_per_rank``
    defaults to what the schedule requires (1 or 2), or 2 for the interleaved ones."""
    if name not in _GENERATORS:
        raise ValueError(f"unknown pipeline schedule {name!r}; valid names: {', '.join(SCHEDULE_NAMES)}")
    gen = _GENERATORS[name]
    v = stages_per_rank if stages_per_rank is not None else (gen.stages_per_rank or 2)
    if gen.stages_per_rank is not None and v != gen.stages_per_rank:
        raise ValueError(f"{name} runs {gen.stages_per_rank} stage(s) per rank, got stages_per_rank={v}")
    if n_ranks < 1 or n_microbatches < 1 or v < 1:
        raise ValueError(f"n_ranks, n_microbatches and stages_per_rank must be >= 1, got {n_ranks}, {n_microbatches}, {v}")
    schedule = PipelineSchedule(
        name=name,
        n_ranks=n_ranks,
        stages_per_rank=v,
        n_microbatches=n_microbatches,
        stage_ranks=stage_to_rank(n_ranks, n_ranks * v, v_shape=gen.v_shape),
        orders=tuple(tuple(order) for order in gen.build(n_ranks, v, n_microbatches)),
    )
    check_schedule(schedule)
    return schedule


def check_schedule(schedule: PipelineSchedule) -> None:
    """Raise ``ValueError`` unless every stage computes every microbatch exactly once, on
    its own rank: one ``F`` and one ``B``, or one ``F``, one ``I`` and one ``W``, in that order."""
    seen: dict[tuple[int, int], list[ActionKind]] = {}
    for rank, order in enumerate(schedule.orders):
        for a in order:
            if not (0 <= a.stage < schedule.n_stages and 0 <= a.microbatch < schedule.n_microbatches):
                raise ValueError(f"{schedule.name}: action {a} on rank {rank} is out of range")
            if schedule.stage_ranks[a.stage] != rank:
                home = schedule.stage_ranks[a.stage]
                raise ValueError(f"{schedule.name}: action {a} on rank {rank}, but stage {a.stage} is on rank {home}")
            seen.setdefault((a.stage, a.microbatch), []).append(a.kind)
    for stage in range(schedule.n_stages):
        for mb in range(schedule.n_microbatches):
            kinds = seen.get((stage, mb), [])
            if kinds not in ([F, B], [F, I, W]):
                runs = [k.value for k in kinds]
                raise ValueError(f"{schedule.name}: stage {stage} microbatch {mb} runs {runs}, expected F B or F I W")
