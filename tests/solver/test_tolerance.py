"""The numerical conventions (solver.tolerance): each helper at its boundary, and no search
module writing the sentinel or a tolerance as a bare number."""

from __future__ import annotations

import io
import math
import tokenize
from pathlib import Path

import numpy as np
import pytest

from solver.tolerance import (
    BIG,
    DEFAULT_GAP,
    FORBIDDEN,
    REL_TOL,
    ROUND_OFF,
    descent_target,
    fits_limit,
    floor_tolerant,
    improves,
    is_proven,
    kernel_costs,
    not_ruled_out,
    over_limit,
)

SOLVER = Path(__file__).resolve().parents[2] / "solver"


def test_forbidden_sentinel_survives_sums_and_differences():
    costs = kernel_costs(np.array([3.0, np.inf, 0.0]))
    assert costs.tolist() == [3.0, BIG, 0.0]
    # BIG plus any realistic finite sum stays forbidden; BIG - BIG is 0, not NaN
    assert BIG + 1e12 >= FORBIDDEN and BIG - 1e12 >= FORBIDDEN
    assert BIG - BIG == 0.0
    assert 2 * 1e12 < FORBIDDEN


@pytest.mark.parametrize("cost", [0.0, 1e-6, 0.5, 1.0, 1e9])
def test_is_proven_at_its_boundary(cost):
    width = DEFAULT_GAP * max(1.0, abs(cost))
    assert is_proven(cost, cost - 0.5 * width)
    assert not is_proven(cost, cost - 2.0 * width)
    assert is_proven(cost, cost - 2.0 * width, rel_gap=10 * DEFAULT_GAP)


def test_improves_needs_more_than_the_tolerance():
    old = 1e6
    assert improves(old * (1 - 2 * REL_TOL), old)
    assert not improves(old * (1 - 0.5 * REL_TOL), old)
    assert not improves(old, old)
    # rounding noise is far below the default tolerance
    assert improves(old * (1 - 0.5 * REL_TOL), old, rel=ROUND_OFF)
    assert not improves(old, old, rel=ROUND_OFF)


@pytest.mark.parametrize("cost", [0.0, 1e-3, -2.0, 1e8])
def test_descent_target_is_a_strict_decrease_above_rounding(cost):
    target = descent_target(cost)
    assert target < cost
    assert cost - target == pytest.approx(ROUND_OFF * (abs(cost) + 1.0), rel=1e-3)


def test_memory_tolerances():
    limit = 1e9
    assert not over_limit(0.5 * REL_TOL * limit, limit)
    assert over_limit(2 * REL_TOL * limit, limit)
    # a limit below 1 byte still tolerates REL_TOL bytes, not less
    assert not over_limit(0.5 * REL_TOL, 0.25) and over_limit(2 * REL_TOL, 0.25)
    assert over_limit(np.array([0.0, 1.0, 2.0]), limit).tolist() == [False, False, True]
    assert fits_limit(np.array([limit, limit * (1 + 0.5 * ROUND_OFF)]), limit)
    assert not fits_limit(np.array([limit * (1 + 2 * REL_TOL)]), limit)


def test_reduced_cost_fixing_keeps_ties_and_drops_real_losers():
    upper = 10.0
    lower = np.array([9.0, 10.0, 10.0 * (1 + 0.5 * REL_TOL), 10.0 * (1 + 2 * REL_TOL)])
    assert not_ruled_out(lower, upper).tolist() == [True, True, True, False]


def test_floor_tolerant_counts_near_integers_as_integers():
    assert floor_tolerant(3.0 - 1e-12) == 3
    assert floor_tolerant(2.5) == 2
    assert floor_tolerant(7.0) == 7
    assert floor_tolerant(-0.5) == -1


def _numbers(path: Path) -> list[tuple[int, float]]:
    """Numeric literals in the code of ``path`` (docstrings and comments do not count)."""
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type == tokenize.NUMBER:
            try:
                found.append((tok.start[0], float(tok.string.replace("_", ""))))
            except ValueError:  # complex or other
                continue
    return found


def test_no_search_module_writes_the_sentinel_or_a_tolerance_as_a_number():
    banned = {1e30: "BIG", 1e-9: "REL_TOL / LP_ZERO", 1e-12: "ROUND_OFF"}
    offenders = []
    for path in sorted(SOLVER.rglob("*.py")):
        if path.name in ("tolerance.py", "solution.py"):  # the definitions; the output format's gap
            continue
        for line, value in _numbers(path):
            if any(math.isclose(value, b, rel_tol=0, abs_tol=0) for b in banned):
                offenders.append(f"{path.relative_to(SOLVER.parent)}:{line}: {value!r} (use {banned[value]})")
    assert not offenders, "\n".join(offenders)
