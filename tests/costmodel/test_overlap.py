"""The two-stream step simulation on hand-made schedules, every answer worked out by hand.

Notation in the comments: ops run on the compute stream, ``|`` marks
positions; ``T`` a transfer (issue, wait, durations). Times in ms.
"""

from __future__ import annotations

import pytest

from costmodel.overlap import Transfer, exposed_cost_s, simulate, transfer_slack


def test_without_transfers_the_step_is_the_compute_and_the_tail():
    r = simulate([1.0, 2.0, 3.0], [], tail_s=0.5)
    assert r.step_s == pytest.approx(6.5) and r.exposed_comm_s == 0.0 and r.comm_s == 0.0


def test_a_collective_shorter_than_the_compute_it_spans_is_hidden():
    # T issued after op 0 (t=1), waited before op 2 (op 1 ends at t=3): 2 ms fits in op 1's 2 ms
    r = simulate([1.0, 2.0, 3.0], [Transfer(1, 2, (2.0,))])
    assert r.step_s == pytest.approx(6.0) and r.exposed_comm_s == pytest.approx(0.0)
    assert r.timings[0].start_s == pytest.approx(1.0) and r.timings[0].needed_s == pytest.approx(3.0)
    assert r.reached_s == pytest.approx((0.0, 1.0, 3.0, 6.0))


def test_the_part_that_does_not_fit_is_exposed():
    # 2.5 ms from t=1 ends at 3.5; op 1 ends at 3: op 2 waits 0.5
    r = simulate([1.0, 2.0, 3.0], [Transfer(1, 2, (2.5,))])
    assert r.step_s == pytest.approx(6.5) and r.exposed_comm_s == pytest.approx(0.5)
    assert transfer_slack(r.timings[0]) == pytest.approx(2.0)


def test_a_collective_issued_and_waited_at_the_end_is_fully_exposed():
    # a last gradient bucket: issued after the last op, waited before the optimizer step
    r = simulate([1.0, 1.0], [Transfer(2, 2, (0.75,))], tail_s=0.25)
    assert r.step_s == pytest.approx(3.0) and r.exposed_comm_s == pytest.approx(0.75)


def test_collectives_queue_first_issued_first_on_one_stream():
    # T1 (0 -> 1, 2 ms) runs 0..2: op 0 ends at 1 and waits until 2; op 1 runs 2..3.
    # T2 (0 -> 2, 2 ms) queues behind T1: runs 2..4, so op 2 starts at 4 and ends at 5.
    r = simulate([1.0, 1.0, 1.0], [Transfer(0, 1, (2.0,)), Transfer(0, 2, (2.0,))])
    assert r.step_s == pytest.approx(5.0) and r.exposed_comm_s == pytest.approx(2.0)
    assert [t.start_s for t in r.timings] == pytest.approx([0.0, 2.0])


def test_all_but_the_last_collective_of_a_transfer_are_waited_at_once():
    # at 0: collective 1 (1 ms) is waited at once -> t=1; collective 2 (2 ms) runs 1..3
    # beside op 0 (1..4); op 1 (4..5) finds it done: only collective 1 is exposed
    r = simulate([3.0, 1.0], [Transfer(0, 1, (1.0, 2.0))])
    assert r.step_s == pytest.approx(5.0) and r.exposed_comm_s == pytest.approx(1.0)


def test_full_contention_makes_overlap_gain_nothing():
    # both at half speed: the collective's 1.5 ms of work ends at 3, compute has done 1.5 of 2,
    # the last 0.5 at full speed: 3.5 = compute + collective
    r = simulate([1.0, 1.0], [Transfer(0, 2, (1.5,))], contention=1.0)
    assert r.step_s == pytest.approx(3.5)


def test_partial_contention_agrees_with_the_solvers_exposed_cost():
    # kappa 0.5: both at 2/3 speed; compute (2 ms) ends at 3 with 2 of the collective's 3 ms done,
    # the last 1 ms at full speed ends at 4: 2 ms added = max(0, 3 - 2) + 0.5 * 2
    r = simulate([2.0], [Transfer(0, 1, (3.0,))], contention=0.5)
    assert r.step_s == pytest.approx(4.0)
    assert r.exposed_comm_s == pytest.approx(exposed_cost_s(3.0, 2.0, 0.5))


def test_issues_at_a_position_come_before_its_waits():
    # issued and waited before op 1: nothing to hide it behind, the whole 1 ms is exposed
    r = simulate([1.0, 1.0], [Transfer(1, 1, (1.0,))])
    assert r.step_s == pytest.approx(3.0)


@pytest.mark.parametrize("transfer", [Transfer(2, 1, (1.0,)), Transfer(0, 3, (1.0,)), Transfer(0, 1, ()),
                                      Transfer(0, 1, (-1.0,))])
def test_a_broken_transfer_is_refused_naming_it(transfer):
    with pytest.raises(ValueError, match="transfer 0"):
        simulate([1.0, 1.0], [transfer])


def test_contention_out_of_range_is_refused():
    with pytest.raises(ValueError, match="contention"):
        simulate([1.0], [], contention=1.5)


def test_skew_is_paid_once_per_synchronisation_and_at_most_skew_s():
    """A collective issued after g seconds of compute since the last issue starts min(g, skew)
    late on an idle stream; one issued right behind another pays nothing (back-to-back buckets),
    nor one queued behind a collective in flight; skew 0 changes nothing."""
    ops = [1.0, 1.0, 1.0]
    # issued at 1 (after 1 s of compute), waited at once: 1 + (0.5 + 0.25) + 2 = 3.75
    assert simulate(ops, [Transfer(1, 1, (0.5,))], skew_s=0.25).step_s == pytest.approx(3.75)
    # skew larger than the compute before it: pays the compute (1 s), not the skew
    assert simulate(ops, [Transfer(1, 1, (0.5,))], skew_s=5.0).step_s == pytest.approx(4.5)
    # two back to back at position 3 (after 3 s): the first pays 0.25, the second nothing
    two = [Transfer(3, 3, (0.5,)), Transfer(3, 3, (0.5,))]
    assert simulate(ops, two, skew_s=0.25).step_s == pytest.approx(3 + 0.75 + 0.5)
    # every position a collective, waited at once (TP): each pays min(1 s, skew)
    tp = [Transfer(p, p, (0.5,)) for p in (1, 2, 3)]
    assert simulate(ops, tp, skew_s=0.25).step_s == pytest.approx(3 + 3 * 0.75)
    assert simulate(ops, tp, skew_s=0.0).step_s == pytest.approx(simulate(ops, tp).step_s)
    with pytest.raises(ValueError, match="skew_s"):
        simulate(ops, tp, skew_s=-1.0)
