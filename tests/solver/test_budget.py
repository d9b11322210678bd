"""solver.budget: one deadline, every time share named with its reason."""

from __future__ import annotations

import math
import pathlib
import re

import pytest

from solver.budget import SHARES, Budget, share_deadline


def test_every_share_says_why_and_is_a_fraction():
    for name, share in SHARES.items():
        assert 0 < share.fraction <= 1, name
        assert len(share.why) > 30, f"{name}: the reason is missing"
        assert share.at_least <= share.at_most, name
        assert share.of in ("left", "stage"), name


@pytest.mark.parametrize("name", sorted(SHARES))
def test_share_never_passes_the_deadline_unless_its_floor_may(name):
    share = SHARES[name]
    for left in (0.01, 0.5, 3.0, 100.0, 1e5):
        end = share_deadline(name, 1000.0 + left, now=1000.0, stage_start=900.0)
        assert end >= 1000.0
        if not share.may_pass_deadline:
            assert end <= 1000.0 + left
        else:
            assert end >= 1000.0 + share.at_least - 1e-9


def test_share_is_the_clamped_fraction_of_what_is_left():
    assert share_deadline("exact", 100.0, now=40.0) == pytest.approx(70.0)
    assert share_deadline("lagrangian_round", 100.0, now=98.0) == pytest.approx(99.0)  # floor 1 s
    assert share_deadline("elimination_order", 1e6, now=0.0) == pytest.approx(15.0)  # ceiling 15 s
    assert share_deadline("reduce", 0.5, now=0.0) == pytest.approx(1.0)  # may pass: a second at least


def test_stage_share_is_a_fraction_of_the_stage_not_of_what_is_left():
    # 10 % of a 100 s stage, even when only 20 s are left
    assert share_deadline("lns_window", 100.0, now=80.0, stage_start=0.0) == pytest.approx(90.0)
    with pytest.raises(ValueError, match="stage_start"):
        share_deadline("lns_window", 100.0, now=80.0)


def test_unknown_share_is_refused():
    with pytest.raises(KeyError):
        share_deadline("nope", 10.0)


def test_budget_for_problem_keeps_the_finish_margin_and_at_least_half():
    assert Budget.for_problem(60.0, start=0.0, size=100_000).deadline == pytest.approx(58.0)
    assert Budget.for_problem(1.0, start=5.0, size=0).deadline == pytest.approx(5.5)  # half of a short limit


def test_budget_left_and_expiry_follow_the_clock():
    b = Budget(deadline=math.inf)
    assert b.has(1e9) and not b.expired()
    past = Budget(deadline=0.0, start=0.0)
    assert past.left() == 0.0 and past.expired() and not past.has(0.0)
    child = Budget(deadline=1e12).share("exact")
    assert child.deadline < 1e12 and child.start <= child.deadline


def test_no_bare_time_fractions_outside_the_budget():
    # a share written as `0.3 * (deadline - now)` outside budget.py would escape the table
    root = pathlib.Path(__file__).resolve().parents[2] / "solver"
    pattern = re.compile(r"\d\s*\*\s*\(?\s*(deadline|remaining|budget)\b|\(deadline - [a-z_.()]+\)\s*\*")
    offenders = [f"{p.name}:{i}" for p in root.glob("*.py") if p.name != "budget.py"
                 for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not offenders, offenders
