"""LP rounding (solver.lpguide): from an integral LP point it gives that labelling back, from
the real LP relaxation a feasible labelling, and its window solve only ever improves it."""

from __future__ import annotations

import time

import numpy as np
import pytest

from solver.backends import get_backend
from solver.ilp import build_program
from solver.lpguide import round_and_fix
from solver.memory_points import violated_points


def _fits(graph, values) -> bool:
    return violated_points(graph, values).size == 0 and np.isfinite(graph.cost(values))


def test_an_integral_optimum_comes_back_unchanged(random_graphs, graph_oracle):
    checked = 0
    for _, graph in random_graphs(81, 30):
        best, values = graph_oracle(graph)
        if values is None:
            continue
        program = build_program(graph, np.arange(graph.num_times) if np.isfinite(graph.limit) else [])
        calls = []
        got = round_and_fix(graph, program, program.solution_from_values(values, graph),
                            solve_window=lambda *args: calls.append(args), deadline=time.perf_counter() + 5)
        assert got is not None and graph.cost(got) == pytest.approx(best) and _fits(graph, got)
        assert not calls  # nothing fractional: no window to solve
        checked += 1
    assert checked > 10


def test_the_lp_relaxation_rounds_to_a_feasible_labelling(backend, random_graphs, graph_oracle):
    engine = get_backend(backend)
    checked = 0
    for _, graph in random_graphs(82, 30, ties=False, pins=False):
        best, _ = graph_oracle(graph)
        program = build_program(graph, np.arange(graph.num_times) if np.isfinite(graph.limit) else [])
        lp = engine.solve_relaxation(program, time_limit=10)
        if lp.status != "optimal":
            continue
        assert lp.bound <= best + 1e-6 * max(1.0, abs(best))

        def exact_window(sub, start, deadline):
            # the window's brute-force optimum: the best any window solve can return
            _, values = graph_oracle(sub)
            return values

        got = round_and_fix(graph, program, lp.z, solve_window=exact_window, deadline=time.perf_counter() + 5)
        if got is None:
            continue  # the repair could not reach the limit from this rounding
        assert _fits(graph, got) and graph.cost(got) >= best - 1e-9
        no_window = round_and_fix(graph, program, lp.z, solve_window=lambda *args: None,
                                  deadline=time.perf_counter() + 5)
        assert no_window is not None and graph.cost(got) <= graph.cost(no_window) + 1e-12
        checked += 1
    assert checked > 5
