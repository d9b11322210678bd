r"""Event simulation of a pipeline schedule: step time, bubble, per-rank timeline and memory.

**Input.** A :class:`~costmodel.pipeline_schedules.PipelineSchedule` (per rank, its
actions in order) and per stage a :class:`StageCost`: the per-microbatch times of
its forward ``f_s``, input backward ``i_s``, weight backward ``w_s`` and full backward
``b_s`` (``i_s + w_s`` unless given: a fused backward may be cheaper), the
point-to-point send of its output activation to stage ``s + 1`` (``a_s``) and of
its input gradient to stage ``s - 1`` (``g_s``), the bytes it keeps per microbatch,
and after the last microbatch its gradient reduction across dp and its optimizer step.

**Rules.** Each rank computes its actions one at a time, in its order. An action
starts at ``max(rank free, inputs here)``:

- ``F(s, k)``: stage 0 has its input at 0; stage ``s > 0`` when ``F(s - 1, k)``'s activation arrived;
- ``B(s, k)`` / ``I(s, k)``: after ``F(s, k)``; the last stage then has its loss; stage
  ``s < S - 1`` also needs ``B / I(s + 1, k)``'s gradient to have arrived;
- ``W(s, k)``: after ``I(s, k)``;
- every ``F(s, k)`` also after stage ``s``'s weight gathers (``weight_gather_s``): issued at the
  step's start on the rank's communication stream, one stage's after another in the order of
  the stages' first forward on that rank, and kept to the last backward (FSDP2 without
  resharding between microbatches), so a stage that waits for its first activation hides them.

A send leaves when its producer ends, on the directed link between the two ranks
(``r -> r'``; both directions are separate links, NVLink and InfiniBand being
full duplex). A link carries one send at a time, in the order they were issued;
issue order is the sending rank's program order, which is why one pass in
program order prices the queues exactly. The receiver waits for the arrival;
the sender does not wait (torch issues ``isend`` and waits for it only before
reusing the buffer). Two stages on one rank (the turn of a V) pass the tensor in
memory: no send. An order whose next actions all wait for each other is refused
(``ValueError`` naming them): it would hang on the devices too.

**Step.** The pipeline part ends at ``T_pipe = max`` over ranks of the last
action's end. A stage's gradient reduction across dp starts on its rank's
communication stream once the stage's last backward (``B`` or ``W``) has ended,
one reduction at a time, beside the rank's remaining compute (other stages'
work hides it); then each stage's optimizer step runs on the compute stream
after the rank's compute and that stage's reduction. With one stage per rank:
``finish_r = last backward end + reduction + optimizer``. ``step_s = max_r finish_r``.

**Bubble.** ``bubble = 1 - sum_r busy_r / (p * T_pipe)``, ``busy_r`` the rank's compute
in the pipeline part. Uniform stages, no sends, GPipe or 1F1B: ``T_pipe = (m + p - 1)(f + b)``,
``bubble = (p - 1) / (m + p - 1)`` (tests). Interleaved 1F1B with ``v`` chunks of ``f / v, b / v``
and ``p | m``: ``T_pipe = m (f + b) + (p - 1)(f + b) / v``, Megatron's bubble
``(p - 1) / (v m + p - 1)`` of the step (tests).

**Memory.** Per rank, walking its order: ``F`` adds the stage's ``activation_bytes``;
``B`` frees them; ``I`` frees them and keeps ``weight_grad_bytes`` (what ``W`` reads:
the inputs of the weight-gradient matmuls and their output gradients) until ``W``.
A microbatch is held on a stage from its ``F`` to its ``B`` or ``W``; the peak count
is per rank over its stages (1F1B: ``p - r`` on rank ``r``; GPipe: ``m``).

Worked example (``tests/costmodel/test_pipeline_simulate.py`` has it by hand):
two stages, two microbatches, 1F1B, unit times:

>>> from costmodel.pipeline_schedules import build_schedule
>>> unit = StageCost(forward_s=1.0, backward_input_s=1.0, backward_weight_s=1.0)
>>> sim = simulate_pipeline(build_schedule("1F1B", n_ranks=2, n_microbatches=2), [unit, unit])
>>> sim.pipeline_s, round(sim.bubble_fraction, 4)
(9.0, 0.3333)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Sequence

from costmodel.pipeline_schedules import Action, ActionKind, PipelineSchedule

__all__ = [
    "StageCost", "TimedAction", "TransferKind", "TimedTransfer", "RankTimes", "PipelineSimulation", "simulate_pipeline",
]

F, B, I, W = ActionKind.FORWARD, ActionKind.FULL_BACKWARD, ActionKind.BACKWARD_INPUT, ActionKind.BACKWARD_WEIGHT


@dataclass(frozen=True, slots=True)
class StageCost:
    """One stage's per-microbatch times and bytes (module docstring), on its sub-mesh."""

    forward_s: float
    """Forward of one microbatch (the last stage: with the loss)."""
    backward_input_s: float
    """Input-gradient half of the backward (``I``)."""
    backward_weight_s: float
    """Weight-gradient half of the backward (``W``)."""
    full_backward_s: float | None = None
    """Both halves as one action (``B``); ``None``: their sum."""
    send_activation_s: float = 0.0
    """Send of the output activation to the next stage on the link between their ranks."""
    send_gradient_s: float = 0.0
    """Send of the input gradient to the previous stage."""
    activation_bytes: int = 0
    """Saved by a forward for its backward, per microbatch; freed by ``B`` or ``I``."""
    weight_grad_bytes: int = 0
    """Kept from ``I`` to ``W`` per microbatch (what the weight gradient reads)."""
    gradient_reduction_s: float = 0.0
    """Reduction of the stage's gradients across dp, after its last microbatch."""
    optimizer_s: float = 0.0
    """The stage's optimizer step."""
    weight_gather_s: float = 0.0
    """Gathering the stage's weights across dp, once a step, before its first forward."""

    def __post_init__(self) -> None:
        times = (self.forward_s, self.backward_input_s, self.backward_weight_s, self.send_activation_s,
                 self.send_gradient_s, self.gradient_reduction_s, self.optimizer_s, self.weight_gather_s)
        if any(t < 0 for t in times) or (self.full_backward_s is not None and self.full_backward_s < 0):
            raise ValueError(f"StageCost: times must be >= 0 seconds, got {self}")
        if self.activation_bytes < 0 or self.weight_grad_bytes < 0:
            raise ValueError(f"StageCost: bytes must be >= 0, got {self}")

    @property
    def backward_s(self) -> float:
        """Time of a full backward ``B``."""
        return self.backward_input_s + self.backward_weight_s if self.full_backward_s is None else self.full_backward_s

    def duration_s(self, kind: ActionKind) -> float:
        return {F: self.forward_s, B: self.backward_s, I: self.backward_input_s, W: self.backward_weight_s}[kind]


@dataclass(frozen=True, slots=True)
class TimedAction:
    """One action on the timeline."""

    rank: int
    action: Action
    start_s: float
    end_s: float


class TransferKind(str, enum.Enum):
    ACTIVATION = "activation"
    """Forward output, stage ``s`` to ``s + 1``."""
    GRADIENT = "gradient"
    """Input gradient, stage ``s`` to ``s - 1``."""


@dataclass(frozen=True, slots=True)
class TimedTransfer:
    """One point-to-point send between two ranks on the timeline."""

    kind: TransferKind
    from_stage: int
    to_stage: int
    microbatch: int
    from_rank: int
    to_rank: int
    start_s: float
    """When the link started carrying it (its producer's end, or later if the link was busy)."""
    end_s: float
    """When it arrived."""


@dataclass(frozen=True, slots=True)
class RankTimes:
    """One rank's share of the step."""

    rank: int
    busy_s: float
    """Compute of its actions."""
    idle_s: float
    """``T_pipe - busy_s``: waiting inside the pipeline part."""
    last_backward_end_s: float
    """End of its last ``B`` or ``W``."""
    finish_s: float
    """After its gradient reductions and optimizer steps."""
    peak_microbatches_held: int
    """Most (stage, microbatch) pairs whose saved tensors it held at once."""
    peak_activation_bytes: int
    """Most bytes of saved activations (and tensors kept for ``W``) it held at once."""


@dataclass(frozen=True, slots=True)
class PipelineSimulation:
    """The simulated step of one schedule (module docstring)."""

    schedule_name: str
    pipeline_s: float
    """``T_pipe``: the last action's end over all ranks."""
    step_s: float
    """The last rank's finish, with gradient reductions and optimizer steps."""
    bubble_fraction: float
    """``1 - sum busy / (p * T_pipe)``."""
    ranks: tuple[RankTimes, ...]
    actions: tuple[TimedAction, ...]
    """Every action, by rank then order."""
    transfers: tuple[TimedTransfer, ...]
    """Every send between two ranks, in the order the simulation priced them."""


def simulate_pipeline(schedule: PipelineSchedule, stage_costs: Sequence[StageCost]) -> PipelineSimulation:
    """Simulate ``schedule`` with ``stage_costs[s]`` for stage ``s`` (module docstring)."""
    if len(stage_costs) != schedule.n_stages:
        raise ValueError(
            f"stage_costs has {len(stage_costs)} entries, schedule {schedule.name} has {schedule.n_stages} stages"
        )
    n_stages, ranks = schedule.n_stages, schedule.stage_ranks
    ends: dict[tuple[int, int, ActionKind], float] = {}
    arrivals: dict[tuple[TransferKind, int, int], float] = {}  # (kind, receiving stage, microbatch) -> time
    link_free: dict[tuple[int, int], float] = {}
    rank_free = [0.0] * schedule.n_ranks
    position = [0] * schedule.n_ranks
    timed: list[list[TimedAction]] = [[] for _ in range(schedule.n_ranks)]
    transfers: list[TimedTransfer] = []
    gathered = _weights_gathered(schedule, stage_costs)

    def inputs_at(a: Action) -> float | None:
        """When ``a``'s inputs are on its rank; ``None`` while a producer has not run yet."""
        need: list[float | None] = []
        if a.kind is F:
            need.append(gathered[a.stage])
            if a.stage > 0:
                need.append(arrivals.get((TransferKind.ACTIVATION, a.stage, a.microbatch)))
        elif a.kind in (B, I):
            need.append(ends.get((a.stage, a.microbatch, F)))
            if a.stage < n_stages - 1:
                need.append(arrivals.get((TransferKind.GRADIENT, a.stage, a.microbatch)))
        else:
            need.append(ends.get((a.stage, a.microbatch, I)))
        known = [t for t in need if t is not None]
        return max(known, default=0.0) if len(known) == len(need) else None

    def send(kind: TransferKind, a: Action, to_stage: int, at_s: float, seconds: float) -> None:
        src, dst = ranks[a.stage], ranks[to_stage]
        if src == dst:  # the turn of a V: the tensor stays in memory
            arrivals[kind, to_stage, a.microbatch] = at_s
            return
        start = max(at_s, link_free.get((src, dst), 0.0))
        link_free[src, dst] = end = start + seconds
        arrivals[kind, to_stage, a.microbatch] = end
        transfers.append(TimedTransfer(kind, a.stage, to_stage, a.microbatch, src, dst, start, end))

    remaining = sum(len(order) for order in schedule.orders)
    while remaining:
        progressed = False
        for rank, order in enumerate(schedule.orders):
            while position[rank] < len(order):
                a = order[position[rank]]
                ready = inputs_at(a)
                if ready is None:
                    break
                cost = stage_costs[a.stage]
                start = max(rank_free[rank], ready)
                rank_free[rank] = end = start + cost.duration_s(a.kind)
                ends[a.stage, a.microbatch, a.kind] = end
                timed[rank].append(TimedAction(rank, a, start, end))
                if a.kind is F and a.stage < n_stages - 1:
                    send(TransferKind.ACTIVATION, a, a.stage + 1, end, cost.send_activation_s)
                if a.kind in (B, I) and a.stage > 0:
                    send(TransferKind.GRADIENT, a, a.stage - 1, end, cost.send_gradient_s)
                position[rank] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = ", ".join(
                f"rank {r}: {order[position[r]]}" for r, order in enumerate(schedule.orders) if position[r] < len(order)
            )
            raise ValueError(f"schedule {schedule.name} deadlocks: every next action waits for another ({stuck})")

    pipeline_s = max((t[-1].end_s for t in timed if t), default=0.0)
    rank_times = tuple(_rank_times(r, timed[r], stage_costs, pipeline_s) for r in range(schedule.n_ranks))
    busy = sum(rt.busy_s for rt in rank_times)
    return PipelineSimulation(
        schedule_name=schedule.name,
        pipeline_s=pipeline_s,
        step_s=max(rt.finish_s for rt in rank_times),
        bubble_fraction=1.0 - busy / (schedule.n_ranks * pipeline_s) if pipeline_s > 0 else 0.0,
        ranks=rank_times,
        actions=tuple(a for t in timed for a in t),
        transfers=tuple(transfers),
    )


def _weights_gathered(schedule: PipelineSchedule, stage_costs: Sequence[StageCost]) -> list[float]:
    """When each stage's weights are gathered: its rank's gathers back to back from 0, in the order
    of the stages' first forward on the rank (module docstring, Rules)."""
    done = [0.0] * schedule.n_stages
    for order in schedule.orders:
        clock, seen = 0.0, set()
        for a in order:
            if a.kind is F and a.stage not in seen:
                seen.add(a.stage)
                clock += stage_costs[a.stage].weight_gather_s
                done[a.stage] = clock
    return done


def _rank_times(rank: int, timed: list[TimedAction], costs: Sequence[StageCost], pipeline_s: float) -> RankTimes:
    """Busy time, the tail after the last backward, and the memory peaks of one rank."""
    busy = sum(t.end_s - t.start_s for t in timed)
    # the tail: each stage's reduction once its last backward ended, one at a time on the
    # communication stream; optimizer steps on the compute stream after all compute
    last_backward: dict[int, float] = {}
    for t in timed:
        if t.action.kind in (B, W):
            last_backward[t.action.stage] = max(last_backward.get(t.action.stage, 0.0), t.end_s)
    compute_free = timed[-1].end_s if timed else 0.0
    comm_free = 0.0
    for stage in sorted(last_backward, key=lambda s: (last_backward[s], s)):
        comm_free = max(comm_free, last_backward[stage]) + costs[stage].gradient_reduction_s
        compute_free = max(compute_free, comm_free) + costs[stage].optimizer_s
    # memory: walk the order (a rank's own actions are the only ones that change its memory)
    held = held_bytes = peak = peak_bytes = 0
    for t in timed:
        a, cost = t.action, costs[t.action.stage]
        if a.kind is F:
            held, held_bytes = held + 1, held_bytes + cost.activation_bytes
        elif a.kind is B:
            held, held_bytes = held - 1, held_bytes - cost.activation_bytes
        elif a.kind is I:
            held_bytes += cost.weight_grad_bytes - cost.activation_bytes
        else:
            held, held_bytes = held - 1, held_bytes - cost.weight_grad_bytes
        peak, peak_bytes = max(peak, held), max(peak_bytes, held_bytes)
    return RankTimes(
        rank=rank,
        busy_s=busy,
        idle_s=pipeline_s - busy,
        last_backward_end_s=max(last_backward.values(), default=0.0),
        finish_s=compute_free,
        peak_microbatches_held=peak,
        peak_activation_bytes=peak_bytes,
    )
