"""The backends (solver.backends): the registry, and every available backend's integer
program and LP relaxation against brute force and against each other (one shared set of
tests, run per backend as PuLP's are)."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest

from solver.backends import BACKENDS, get_backend
from solver.backends.base import integer_costs, objective_scale
from solver.ilp import LinearProgram, build_program


def small_lp(sense_last: str = "L", rhs_last: float = 2.0) -> LinearProgram:
    """min x + 2y  s.t.  x + y = 1,  3x + y <= 2 (or >= via rhs),  0 <= x, y <= 1.
    Optimum x = y = 1/2, value 3/2; duals 5/2 (equality) and -1/2 (the binding <= row)."""
    return LinearProgram(cost=np.array([1.0, 2.0]), num_binary=0, row_off=np.array([0, 2, 4]),
                         row_col=np.array([0, 1, 0, 1]), row_val=np.array([1.0, 1.0, 3.0, 1.0]),
                         sense=np.array([ord("E"), ord(sense_last)], dtype=np.uint8),
                         rhs=np.array([1.0, rhs_last]), constant=0.25,
                         memory_points=np.zeros(0, np.int64), y_entry=np.zeros(0, np.int64))


def test_unknown_backend_lists_the_valid_names():
    with pytest.raises(ValueError) as err:
        get_backend("glpk")
    for name in BACKENDS:
        assert name in str(err.value)


def test_integer_program_matches_brute_force(backend, random_graphs, graph_oracle):
    engine = get_backend(backend)
    solved = 0
    for _, graph in random_graphs(101, 8, ties=False, pins=False):
        best, _ = graph_oracle(graph)
        program = build_program(graph, np.arange(graph.num_times) if np.isfinite(graph.limit) else [])
        result = engine.solve_program(program, time_limit=20, threads=1)
        if np.isinf(best):
            assert result.status in ("infeasible", "unknown") and result.z is None
            continue
        assert result.status == "optimal"
        assert result.objective == pytest.approx(best) and result.bound == pytest.approx(best)
        assert graph.cost(program.values_from_solution(result.z, graph)) == pytest.approx(best)
        solved += 1
    assert solved >= 4


def test_lp_relaxation_of_a_hand_solved_program(backend):
    result = get_backend(backend).solve_relaxation(small_lp(), time_limit=10)
    assert result.status == "optimal"
    np.testing.assert_allclose(result.z, [0.5, 0.5], atol=1e-9)
    assert result.objective == pytest.approx(1.75) and result.bound <= result.objective
    assert result.bound == pytest.approx(1.75, rel=1e-6)
    if result.duals is not None:  # GLOP gives them; the CBC binary's are not reliable
        np.testing.assert_allclose(result.duals, [2.5, -0.5], atol=1e-9)


def test_infeasible_lp(backend):
    result = get_backend(backend).solve_relaxation(small_lp(rhs_last=0.5), time_limit=10)
    assert result.status in ("infeasible", "unknown") and result.z is None


def test_every_backend_gives_the_same_lp_bound(all_backends, random_graphs, graph_oracle):
    """The pure LP (every column continuous) has one optimum value; with binary columns CBC
    first tightens their bounds (a valid bound between the LP and the integer optimum)."""
    if len(all_backends) < 2:
        pytest.skip("needs two backends")
    compared = 0
    for _, graph in random_graphs(102, 8, ties=False, pins=False):
        best, _ = graph_oracle(graph)
        program = build_program(graph, np.arange(graph.num_times) if np.isfinite(graph.limit) else [])
        pure = replace(program, num_binary=0)
        results = [get_backend(name).solve_relaxation(pure, time_limit=10) for name in all_backends]
        if any(r.status != "optimal" for r in results):
            assert np.isinf(best)
            continue
        values = [r.objective for r in results]
        assert max(values) - min(values) <= 1e-6 * max(1.0, abs(values[0]))
        for name in all_backends:
            result = get_backend(name).solve_relaxation(program, time_limit=10)
            assert min(values) - 1e-6 * max(1.0, abs(best)) <= result.bound <= best + 1e-9 * max(1.0, abs(best))
        compared += 1
    assert compared >= 4


def test_no_backend_starts_before_its_deadline_passes(backend):
    start = time.perf_counter()
    get_backend(backend).solve_relaxation(small_lp(), time_limit=5)
    assert time.perf_counter() - start < 5


def test_integer_costs_are_exact_when_integral_and_bounded_otherwise():
    ints, scale, error = integer_costs(np.array([3.0, 0.0, 7.0]))
    assert ints.tolist() == [3, 0, 7] and scale == 1.0 and error == 0.0
    cost = np.array([1e-3, 2.5e-4, 7.77e-5])
    ints, scale, error = integer_costs(cost)
    assert np.abs(ints / scale - cost).sum() <= error
    assert float(np.log2(scale)).is_integer()


def test_objective_scale_is_a_power_of_two_near_1e3():
    scale = objective_scale(np.array([0.0, 1e-6, 2e-6, 4e-6]))
    assert float(np.log2(scale)).is_integer() and 5e2 <= 2e-6 * scale <= 2e3
    assert objective_scale(np.zeros(3)) == 1.0
