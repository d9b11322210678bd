"""The integer program (solver.ilp) checked row by row at every labelling of small graphs:
the labelling's (x, y) vector satisfies (A)-(C), costs what the graph says, and meets a
memory row (D) exactly when the labelling fits at that point."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from solver.ilp import build_program


def _rows(program, z):
    """Activity of every row at ``z``."""
    rows = np.repeat(np.arange(program.num_rows), np.diff(program.row_off))
    activity = np.zeros(program.num_rows)
    np.add.at(activity, rows, program.row_val * z[program.row_col])
    return activity


def test_every_allowed_labelling_is_a_point_of_the_program(random_graphs):
    checked = 0
    for _, graph in random_graphs(61, 40):
        points = np.arange(graph.num_times) if np.isfinite(graph.limit) else np.zeros(0, np.int64)
        program = build_program(graph, points)
        equal = program.sense == ord("E")
        memory_rows = np.flatnonzero(~equal)
        assert memory_rows.size == program.memory_points.size
        for values in itertools.islice(itertools.product(*(range(int(d)) for d in graph.dom)), 60):
            x = np.array(values, dtype=np.int64)
            z = program.solution_from_values(x, graph)
            assert np.array_equal(program.values_from_solution(z, graph), x)
            activity = _rows(program, z)
            if not np.isfinite(graph.cost(x)):
                # a forbidden value or pair has no column: the labelling breaks a row (A)-(C)
                assert not np.allclose(activity[equal], program.rhs[equal])
                continue
            np.testing.assert_allclose(activity[equal], program.rhs[equal], atol=1e-12)
            assert float(program.cost @ z) + program.constant == pytest.approx(graph.cost(x))
            fits = graph.memory_profile(x)[program.memory_points] <= graph.limit
            assert np.array_equal(activity[memory_rows] <= program.rhs[memory_rows] + 1e-9, fits)
            checked += 1
    assert checked > 150


def test_rows_and_columns_count_the_formulation():
    from solver.compiled import assemble_graph

    inf = np.inf
    graph = assemble_graph(var_ids=np.arange(2), unary=[np.array([0.0, inf, 1.0]), np.array([2.0, 0.0])],
                           edge_u=[0], edge_v=[1], edge_costs=[np.array([[0.0, inf], [1.0, 1.0], [inf, 0.0]])],
                           term_var=[0], term_t0=[0], term_t1=[2], term_usage=[np.array([1.0, 2.0, 3.0])],
                           base=np.array([1.0, 0.0]), time_points=np.arange(2), limit=3.0, constant=5.0)
    program = build_program(graph, np.array([0]))
    # x: 3 + 2 columns, y: the 4 finite pairs; rows: (A) 2, (B) 3, (C) 2, (D) 1
    assert (program.num_binary, program.num_vars, program.num_rows) == (5, 9, 8)
    assert program.memory_points.tolist() == [0] and program.rhs[-1] == 3.0 - 1.0
    assert program.constant == 5.0
