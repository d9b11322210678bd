"""The shipped example problem (a 2-layer transformer priced in seconds on an 8x8 H100 mesh).

Regression: with costs around 1e-3 s, CBC's absolute tolerances once made it
declare 0.00423346 optimal although 0.00421971 is feasible (found by CP-SAT);
the CBC backend now rescales the objective.
"""

from __future__ import annotations

from pathlib import Path

from solver import Status, evaluate, load_problem, solve

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "problems" / "transformer_2_layers.json"
KNOWN_FEASIBLE = 0.0042197131  # a solution CP-SAT found; the optimum cannot be above it


def test_cbc_optimum_is_not_above_a_known_solution():
    problem = load_problem(EXAMPLE)
    solution = solve(problem, backend="cbc", method="exact", time_limit=60, threads=2)
    assert solution.status is Status.OPTIMAL
    assert solution.cost <= KNOWN_FEASIBLE + 1e-12
    assert evaluate(problem, solution.choice).feasible
