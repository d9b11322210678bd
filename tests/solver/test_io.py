"""solver/io.py: the IOPDDL writer keeps cost, memory and liveness through a round trip."""

from __future__ import annotations

import itertools
import json

import pytest

from solver import Problem, evaluate
from solver.io import problem_from_iopddl, problem_to_iopddl


def _through_iopddl(problem: Problem) -> tuple[Problem, dict]:
    data = json.loads(json.dumps(problem_to_iopddl(problem)))  # what a file would hold
    return problem_from_iopddl(data), data


def _assert_same_semantics(before: Problem, after: Problem) -> None:
    for choice in itertools.product(*(range(node.num_strategies) for node in before.nodes)):
        a, b = evaluate(before, choice), evaluate(after, choice)
        assert (a.cost, a.peak_memory_bytes, a.feasible) == (b.cost, b.peak_memory_bytes, b.feasible), choice


@pytest.mark.parametrize("limit", [None, 8, 6])
def test_nodes_without_live_count_at_every_time_after_the_round_trip(hand_problem, limit):
    # nodes 1 and 3 of the hand problem have no "live": they count at every time
    hand_problem["memory_limit"] = limit
    problem = Problem.from_dict(hand_problem)
    again, _ = _through_iopddl(problem)
    _assert_same_semantics(problem, again)


def test_a_problem_where_no_node_has_live_keeps_its_peak():
    problem = Problem.from_dict({"nodes": [{"cost": [1, 2], "memory": [3, 1]}, {"cost": [0, 5], "memory": [4, 4]}],
                                 "memory_limit": 5})
    again, _ = _through_iopddl(problem)
    _assert_same_semantics(problem, again)


def test_empty_live_interval_stays_empty(hand_problem):
    hand_problem["nodes"][0]["live"] = [3, 3]
    problem = Problem.from_dict(hand_problem)
    again, data = _through_iopddl(problem)
    assert data["problem"]["nodes"]["intervals"][0] == [3, 3]
    _assert_same_semantics(problem, again)


def test_fractional_memory_is_kept(hand_problem):
    hand_problem["nodes"][3]["memory"] = [1.5, 4.25]
    hand_problem["memory_limit"] = 7.75
    problem = Problem.from_dict(hand_problem)
    again, data = _through_iopddl(problem)
    assert data["problem"]["nodes"]["usages"][3] == [1.5, 4.25]
    assert again.nodes[3].memory_bytes.tolist() == [1.5, 4.25]
    _assert_same_semantics(problem, again)


def test_no_memory_limit_writes_no_usage_limit(hand_problem):
    problem = Problem.from_dict(hand_problem)
    again, data = _through_iopddl(problem)
    assert "usage_limit" not in data["problem"]
    assert again.memory_limit is None


def test_a_memory_limit_is_written_as_the_usage_limit(hand_problem):
    hand_problem["memory_limit"] = 8
    _, data = _through_iopddl(Problem.from_dict(hand_problem))
    assert data["problem"]["usage_limit"] == 8


def test_iopddl_without_edges_or_nodes_loads():
    empty = {"problem": {"nodes": {"intervals": [], "costs": [], "usages": []}, "edges": {"nodes": [], "costs": []}}}
    assert problem_from_iopddl(empty).num_nodes == 0
    one = {"problem": {"nodes": {"intervals": [[0, 1]], "costs": [[2, 1]], "usages": [[1, 1]]},
                       "edges": {"nodes": [], "costs": []}}}
    assert problem_from_iopddl(one).num_edges == 0
