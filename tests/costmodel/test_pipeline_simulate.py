"""The pipeline simulation against hand-computed timelines and published closed forms."""

from __future__ import annotations

import itertools

import pytest

from costmodel.pipeline_schedules import Action, ActionKind, PipelineSchedule, build_schedule
from costmodel.pipeline_simulate import StageCost, TransferKind, simulate_pipeline

F, B = ActionKind.FORWARD, ActionKind.FULL_BACKWARD

# Two unequal stages (module docstring of costmodel.pipeline_simulate for the rules).
# stage 0: f = 1, b = 1.5 + 0.5 = 2, activation send 1.5 s, 10 B per microbatch, reduction 1, optimizer 0.5
# stage 1: f = 3, b = 3 + 1 = 4, gradient send 0.25 s, 100 B per microbatch, reduction 2, optimizer 0.5
HAND = (
    StageCost(forward_s=1.0, backward_input_s=1.5, backward_weight_s=0.5, send_activation_s=1.5,
              activation_bytes=10, gradient_reduction_s=1.0, optimizer_s=0.5),
    StageCost(forward_s=3.0, backward_input_s=3.0, backward_weight_s=1.0, send_gradient_s=0.25,
              activation_bytes=100, gradient_reduction_s=2.0, optimizer_s=0.5),
)


def _spans(sim, rank):
    return [(str(t.action), t.start_s, t.end_s) for t in sim.actions if t.rank == rank]


def test_one_f_one_b_two_unequal_stages_by_hand():
    sim = simulate_pipeline(build_schedule("1F1B", n_ranks=2, n_microbatches=2), HAND)
    # rank 0: F0 [0, 1], its activation on the link 0 -> 1 [1, 2.5]; F1 [1, 2], whose send
    # queues behind the first: [2.5, 4].
    # rank 1: F0 waits for the arrival: [2.5, 5.5]; B0 [5.5, 9.5], gradient [9.5, 9.75];
    # F1 (arrived at 4, rank free at 9.5) [9.5, 12.5]; B1 [12.5, 16.5], gradient [16.5, 16.75].
    # rank 0: B0 waits for its gradient: [9.75, 11.75]; B1 [16.75, 18.75].
    assert _spans(sim, 0) == [("0F0", 0, 1), ("0F1", 1, 2), ("0B0", 9.75, 11.75), ("0B1", 16.75, 18.75)]
    assert _spans(sim, 1) == [("1F0", 2.5, 5.5), ("1B0", 5.5, 9.5), ("1F1", 9.5, 12.5), ("1B1", 12.5, 16.5)]
    sends = [(t.kind, t.microbatch, t.start_s, t.end_s) for t in sim.transfers]
    assert sends == [
        (TransferKind.ACTIVATION, 0, 1, 2.5), (TransferKind.ACTIVATION, 1, 2.5, 4),
        (TransferKind.GRADIENT, 0, 9.5, 9.75), (TransferKind.GRADIENT, 1, 16.5, 16.75),
    ]
    assert sim.pipeline_s == 18.75
    # busy: rank 0 1 + 1 + 2 + 2 = 6, rank 1 3 + 4 + 3 + 4 = 14 -> bubble 1 - 20 / (2 * 18.75)
    assert [r.busy_s for r in sim.ranks] == [6, 14] and [r.idle_s for r in sim.ranks] == [12.75, 4.75]
    assert sim.bubble_fraction == pytest.approx(1 - 20 / 37.5)
    # tail: rank 0 18.75 + reduction 1 + optimizer 0.5 = 20.25; rank 1 16.5 + 2 + 0.5 = 19
    assert [r.finish_s for r in sim.ranks] == [20.25, 19.0] and sim.step_s == 20.25
    # rank 0 holds F0 and F1 before B0 (2 x 10 B), rank 1 one microbatch (100 B)
    assert [(r.peak_microbatches_held, r.peak_activation_bytes) for r in sim.ranks] == [(2, 20), (1, 100)]


def test_gpipe_two_unequal_stages_by_hand():
    sim = simulate_pipeline(build_schedule("GPipe", n_ranks=2, n_microbatches=2), HAND)
    # rank 1: F0 [2.5, 5.5], F1 [5.5, 8.5], B0 [8.5, 12.5] (gradient [12.5, 12.75]), B1 [12.5, 16.5]
    # rank 0: B0 [12.75, 14.75], B1 after the gradient of [16.5, 16.75]: [16.75, 18.75]
    assert _spans(sim, 1) == [("1F0", 2.5, 5.5), ("1F1", 5.5, 8.5), ("1B0", 8.5, 12.5), ("1B1", 12.5, 16.5)]
    assert _spans(sim, 0)[2:] == [("0B0", 12.75, 14.75), ("0B1", 16.75, 18.75)]
    # same time as 1F1B here, but the last stage holds both microbatches
    assert [(r.peak_microbatches_held, r.peak_activation_bytes) for r in sim.ranks] == [(2, 20), (2, 200)]


def test_zero_bubble_h1_two_stages_by_hand():
    # InterleavedZeroBubble with v = 1 (ZB-H1), unit F, I, W, no sends.
    # rank 0: F0 F1 I0 W0 I1 W1; rank 1: F0 I0 F1 I1 W0 W1 (its W lag one I behind).
    # rank 0 F0 [0,1] F1 [1,2]; rank 1 F0 [1,2] I0 [2,3] F1 [3,4] I1 [4,5] W0 [5,6] W1 [6,7];
    # rank 0 I0 [3,4] W0 [4,5] I1 [5,6] W1 [6,7]: 7 s where 1F1B takes 9 (module doctest).
    unit = StageCost(forward_s=1.0, backward_input_s=1.0, backward_weight_s=1.0)
    schedule = build_schedule("InterleavedZeroBubble", n_ranks=2, n_microbatches=2, stages_per_rank=1)
    sim = simulate_pipeline(schedule, [unit, unit])
    assert _spans(sim, 0) == [("0F0", 0, 1), ("0F1", 1, 2), ("0I0", 3, 4), ("0W0", 4, 5), ("0I1", 5, 6), ("0W1", 6, 7)]
    assert sim.pipeline_s == 7 and sim.bubble_fraction == pytest.approx(1 - 12 / 14)


@pytest.mark.parametrize("name", ["GPipe", "1F1B"])
@pytest.mark.parametrize("p, m", [(2, 2), (2, 5), (3, 3), (3, 8), (4, 4), (4, 9)])
def test_uniform_fill_drain_closed_form(name, p, m):
    f, b = 0.7, 1.3
    sim = simulate_pipeline(build_schedule(name, n_ranks=p, n_microbatches=m), [StageCost(f, b, 0.0)] * p)
    assert sim.pipeline_s == pytest.approx((m + p - 1) * (f + b))
    assert sim.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))
    held = [r.peak_microbatches_held for r in sim.ranks]
    assert held == ([m] * p if name == "GPipe" else [p - r for r in range(p)])


_TORCH_ACCEPTS = [(p, m, v) for p, m, v in itertools.product((2, 3, 4), (4, 5, 6, 8, 12), (2, 3)) if m % max(1, m // p) == 0]


@pytest.mark.parametrize("p, m, v", _TORCH_ACCEPTS)
def test_interleaved_matches_megatron(p, m, v):
    # chunks of f / v and b / v: T = m (f + b) + (p - 1)(f + b) / v, bubble (p - 1) / (v m + p - 1)
    f, b = 1.0, 2.0
    schedule = build_schedule("Interleaved1F1B", n_ranks=p, n_microbatches=m, stages_per_rank=v)
    sim = simulate_pipeline(schedule, [StageCost(f / v, b / v, 0.0)] * (p * v))
    assert sim.pipeline_s == pytest.approx(m * (f + b) + (p - 1) * (f + b) / v)
    assert sim.bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1))
    # rank 0 holds its warm-up forwards plus one: (v - 1) q + 2 (p - 1) + 1 chunk-microbatches
    q = m // max(1, m // p)
    assert sim.ranks[0].peak_microbatches_held == min((v - 1) * q + 2 * (p - 1) + 1, v * m)


@pytest.mark.parametrize("f, i, w", [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (2.0, 1.0, 0.5), (1.0, 1.5, 0.5)])
@pytest.mark.parametrize("p, m", [(3, 6), (4, 8), (4, 5)])
def test_zb_h1_bubble_is_f_plus_i_minus_w(f, i, w, p, m):
    # ZB paper (Qi et al. 2024), ZB-H1 with W <= F: bubble (p - 1)(F + I - W) against 1F1B's (p - 1)(F + I + W)
    cost = StageCost(f, i, w)
    zb_h1 = build_schedule("InterleavedZeroBubble", n_ranks=p, n_microbatches=m, stages_per_rank=1)
    zb = simulate_pipeline(zb_h1, [cost] * p)
    one = simulate_pipeline(build_schedule("1F1B", n_ranks=p, n_microbatches=m), [cost] * p)
    assert zb.pipeline_s == pytest.approx(m * (f + i + w) + (p - 1) * (f + i - w))
    assert one.pipeline_s == pytest.approx((m + p - 1) * (f + i + w))


@pytest.mark.parametrize("p, m", [(2, 4), (3, 6), (4, 8), (4, 12)])
def test_split_backward_schedules_beat_1f1b(p, m):
    def run(name, v):
        s = build_schedule(name, n_ranks=p, n_microbatches=m, stages_per_rank=v)
        return simulate_pipeline(s, [StageCost(1.0 / v, 1.0 / v, 1.0 / v, activation_bytes=12 // v)] * s.n_stages)

    one, zbh1, zbv, dual = run("1F1B", 1), run("InterleavedZeroBubble", 1), run("ZBVZeroBubble", 2), run("DualPipeV", 2)
    assert zbv.bubble_fraction < zbh1.bubble_fraction < one.bubble_fraction
    assert dual.bubble_fraction < one.bubble_fraction
    # ZB-V keeps on every rank what 1F1B keeps on its first: p microbatches of a whole stage
    assert [r.peak_activation_bytes for r in zbv.ranks] == [one.ranks[0].peak_activation_bytes] * p


def test_deadlocked_order_is_refused():
    # rank 0 runs B0 before F1, but rank 1 wants F1 before B0: each waits for the other
    orders = ((Action(0, 0, F), Action(0, 0, B), Action(0, 1, F), Action(0, 1, B)),
              (Action(1, 0, F), Action(1, 1, F), Action(1, 0, B), Action(1, 1, B)))
    schedule = PipelineSchedule("custom", 2, 1, 2, (0, 1), orders)
    with pytest.raises(ValueError, match="deadlocks.*rank 0: 0B0.*rank 1: 1F1"):
        simulate_pipeline(schedule, [StageCost(1.0, 1.0, 0.0)] * 2)


def test_refusals():
    with pytest.raises(ValueError, match="stage_costs has 1 entries.*2 stages"):
        simulate_pipeline(build_schedule("GPipe", n_ranks=2, n_microbatches=2), [StageCost(1.0, 1.0, 0.0)])
    with pytest.raises(ValueError, match="times must be >= 0"):
        StageCost(-1.0, 1.0, 0.0)


def test_weight_gathers_delay_the_first_stage_and_hide_behind_the_fill() -> None:
    """Each stage gathers its weights once, before its first forward, on its rank's communication
    stream from the step's start: stage 0 waits for them, stage 1 gathers while stage 0 computes."""
    from costmodel.pipeline_schedules import build_schedule

    sched = build_schedule("1F1B", n_ranks=2, n_microbatches=2)
    unit = StageCost(forward_s=1.0, backward_input_s=1.0, backward_weight_s=1.0)
    gathered = StageCost(forward_s=1.0, backward_input_s=1.0, backward_weight_s=1.0, weight_gather_s=0.5)
    base = simulate_pipeline(sched, [unit, unit]).step_s
    both = simulate_pipeline(sched, [gathered, gathered])
    assert both.step_s == pytest.approx(base + 0.5)
    first = {(a.action.stage, a.action.microbatch): a.start_s for a in both.actions if a.action.kind.name == "FORWARD"}
    assert first[0, 0] == pytest.approx(0.5) and first[1, 0] == pytest.approx(1.5)
    # stage 1's gathers alone cost nothing: its first input arrives after them
    assert simulate_pipeline(sched, [unit, gathered]).step_s == pytest.approx(base)
