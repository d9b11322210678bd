"""autoshard.problem/1 and autoshard.solution/1: round trips and every bad-input case."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from solver import Problem, ProblemError, Solution, Status
from solver.io import load_problem, problem_from_iopddl, problem_to_iopddl, write_json_atomic


def test_problem_round_trips_through_json(hand_problem):
    hand_problem["edges"][0]["cost"][0][1] = None
    hand_problem["ties"] = [[1, 3]]
    hand_problem["pins"] = {"0": 1}
    hand_problem["memory_limit"] = 8
    p = Problem.from_dict(hand_problem)
    again = Problem.from_dict(json.loads(json.dumps(p.to_dict())))
    assert again.to_dict() == p.to_dict()
    assert math.isinf(again.edges[0].cost[0, 1])
    assert again.nodes[0].strategies == ("S(0)", "R")


def test_huge_finite_cost_is_forbidden_like_null(hand_problem):
    hand_problem["nodes"][0]["cost"][0] = 1e18
    assert math.isinf(Problem.from_dict(hand_problem).nodes[0].cost[0])


def test_missing_memory_and_live_mean_zero_and_always():
    p = Problem.from_dict({"nodes": [{"cost": [1, 2]}]})
    assert p.nodes[0].live is None and not p.nodes[0].memory_bytes.any()


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda d: d["edges"][1].__setitem__("cost", [[0, 1]]), "edges[1].cost"),
        (lambda d: d["edges"][2]["cost"][0].__setitem__(1, -3), "edges[2].cost[0][1]"),
        (lambda d: d["nodes"][2]["cost"].__setitem__(0, float("nan")), "nodes[2].cost[0]"),
        (lambda d: d["nodes"][2]["cost"].__setitem__(1, -1), "nodes[2].cost[1]"),
        (lambda d: d["nodes"][1].__setitem__("memory", [1]), "nodes[1].memory"),
        (lambda d: d["edges"][0].__setitem__("dst", 9), "edges[0].dst"),
        (lambda d: d["edges"][0].__setitem__("src", -1), "edges[0].src"),
        (lambda d: d.__setitem__("pins", {"7": 0}), "pins[7]"),
        (lambda d: d.__setitem__("pins", {"2": 5}), "pins[2]"),
        (lambda d: d.__setitem__("ties", [[0, 9]]), "ties[0]"),
        (lambda d: (d["nodes"][4]["cost"].append(1), d["nodes"][4]["memory"].append(1),
                    d["nodes"][4]["strategies"].append("R"),
                    d["edges"][3]["cost"][0].append(0), d["edges"][3]["cost"][1].append(0),
                    d.__setitem__("ties", [[1, 4]])), "ties[0]"),
        (lambda d: d["nodes"][0].__setitem__("live", [5, 2]), "nodes[0].live"),
        (lambda d: d["nodes"][0].__setitem__("cost", "cheap"), "nodes[0].cost"),
        (lambda d: d.__setitem__("memory_limit", "lots"), "memory_limit"),
        (lambda d: d.__setitem__("format", "other/1"), "format"),
        (lambda d: d["nodes"][3].__setitem__("strategies", ["R"]), "nodes[3].strategies"),
    ],
)
def test_bad_field_is_named_in_the_error(hand_problem, change, field):
    change(hand_problem)
    with pytest.raises(ProblemError) as info:
        Problem.from_dict(hand_problem)
    assert str(info.value).startswith(field + ":"), str(info.value)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d["nodes"][3]["cost"].__setitem__(0, True), "nodes[3].cost[0]: expected a number, got true"),
        (lambda d: d["nodes"][1]["memory"].__setitem__(1, False), "nodes[1].memory[1]: expected a number, got false"),
        (lambda d: d["nodes"][1].__setitem__("memory", [1, None]), "nodes[1].memory[1]: expected a number, got null"),
        (lambda d: d["nodes"][0]["cost"].__setitem__(1, "1"), 'nodes[0].cost[1]: expected a number, got "1"'),
        (lambda d: d["edges"][2]["cost"][0].__setitem__(1, True), "edges[2].cost[0][1]: expected a number, got true"),
        (lambda d: (d.__setitem__("matrices", [[[0, 1], [False, 0]]]), d["edges"][0].pop("cost"),
                    d["edges"][0].__setitem__("matrix", 0)), "matrices[0][1][0]: expected a number, got false"),
        (lambda d: d.__setitem__("memory_limit", True), "memory_limit"),
        (lambda d: d.__setitem__("pins", {"0": True}), "pins[0]"),
    ],
)
def test_a_boolean_is_not_a_number(hand_problem, change, message):
    change(hand_problem)
    with pytest.raises(ProblemError) as info:
        Problem.from_dict(hand_problem)
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d["nodes"][1].__setitem__("memmory", [9, 9]),
         "nodes[1].memmory: unknown key (allowed: cost, live, memory, name, strategies)"),
        (lambda d: d["edges"][0].__setitem__("costs", [[0, 1], [1, 0]]),
         "edges[0].costs: unknown key (allowed: cost, dst, matrix, src)"),
        (lambda d: d.__setitem__("memory_limt", 8), "memory_limt: unknown key (allowed: autoshard, edges, format, "
                                                    "matrices, memory_limit, name, nodes, pins, ties)"),
    ],
)
def test_an_unknown_key_is_refused_naming_it_and_the_allowed_ones(hand_problem, change, message):
    change(hand_problem)
    with pytest.raises(ProblemError) as info:
        Problem.from_dict(hand_problem)
    assert str(info.value) == message


def test_the_dumped_problems_autoshard_section_is_accepted(hand_problem):
    hand_problem["autoshard"] = {"format": "autoshard.plan_request/1", "anything": [1, 2]}
    assert Problem.from_dict(hand_problem).num_nodes == 5


def test_an_edge_with_both_cost_and_matrix_is_refused(hand_problem):
    hand_problem["matrices"] = [[[0, 1], [1, 0]]]
    hand_problem["edges"][0]["matrix"] = 0
    with pytest.raises(ProblemError, match=r"^edges\[0\]: give one of cost and matrix, not both"):
        Problem.from_dict(hand_problem)


@pytest.mark.parametrize("where", ["costs", "usages"])
def test_a_boolean_in_an_iopddl_file_is_refused(where):
    data = {"problem": {"nodes": {"intervals": [[0, 1], [0, 1]], "costs": [[1, 2], [3]], "usages": [[1, 1], [1]]},
                        "edges": {"nodes": [[0, 1]], "costs": [[1, 2]]}, "usage_limit": 5}}
    data["problem"]["nodes"][where][1][0] = True
    with pytest.raises(ProblemError, match=rf"^problem\.nodes\.{where}\[1\]\[0\]: expected a number, got true"):
        problem_from_iopddl(data)


def test_malformed_json_file_is_one_clear_error(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"nodes": [ {"cost": [1,}')
    with pytest.raises(ProblemError, match="malformed JSON"):
        load_problem(path)


def test_gzip_input_is_read(tmp_path, hand_problem):
    import gzip

    path = tmp_path / "p.json.gz"
    path.write_bytes(gzip.compress(json.dumps(hand_problem).encode()))
    assert load_problem(path).num_nodes == 5


def test_iopddl_round_trip_keeps_semantics():
    data = {"problem": {"name": "t", "nodes": {"intervals": [[0, 2], [1, 1], [0, 3]],
                                               "costs": [[1, 1e18], [2, 3], [0]],
                                               "usages": [[5, 1], [9, 9], [2]]},
                        "edges": {"nodes": [[0, 1], [1, 0], [2, 0]],
                                  "costs": [[0, 1, 2, 3], [4, 5, 6, 7], [1, 1e18]]},
                        "usage_limit": 10}}
    p = problem_from_iopddl(data)
    assert math.isinf(p.nodes[0].cost[1]) and p.nodes[1].live == (1, 1)
    assert p.edges[1].cost.tolist() == [[4, 5], [6, 7]]  # [u=1 value, v=0 value]
    assert problem_from_iopddl(problem_to_iopddl(p)).to_dict() == p.to_dict()


def test_iopddl_edge_of_wrong_size_is_named():
    data = {"problem": {"nodes": {"intervals": [[0, 1], [0, 1]], "costs": [[1, 2], [3]], "usages": [[1, 1], [1]]},
                        "edges": {"nodes": [[0, 1]], "costs": [[1, 2, 3]]}, "usage_limit": 5}}
    with pytest.raises(ProblemError, match=r"problem\.edges\.costs\[0\]: expected 2x1=2 costs, got 3"):
        problem_from_iopddl(data)


def test_solution_json_matches_design_fields():
    s = Solution(choice=(0, 2), cost=10.0, lower_bound=9.0, status=Status.TIMEOUT, seconds=1.5, backend="cbc")
    d = s.to_dict()
    for key in ("choice", "cost", "lower_bound", "status", "seconds", "backend"):
        assert key in d
    assert d["status"] == "timeout" and d["gap"] == pytest.approx(0.1)
    assert Solution.from_dict(d).choice == (0, 2)


def test_solution_peak_memory_names_its_unit_and_the_old_key_is_still_read():
    s = Solution(choice=(0,), cost=1.0, lower_bound=1.0, status=Status.OPTIMAL, seconds=0.1, backend="cbc",
                 peak_memory_bytes=4096.0)
    d = s.to_dict()
    assert d["peak_memory_bytes"] == 4096 and "peak_memory" not in d
    assert Solution.from_dict(d).peak_memory_bytes == 4096
    old = {k: v for k, v in d.items() if k != "peak_memory_bytes"} | {"peak_memory": 2048}
    assert Solution.from_dict(old).peak_memory_bytes == 2048


@pytest.mark.parametrize("fmt", ["autoshard.problem/1", "autoshard.plan/1", "autoshard.solution/2"])
def test_a_file_of_another_format_is_not_read_as_a_solution(fmt):
    data = {"format": fmt, "choice": [0], "status": "optimal", "nodes": []}
    with pytest.raises(ValueError, match=rf"^format: expected 'autoshard.solution/1', got '{fmt}'$"):
        Solution.from_dict(data)


def test_a_solution_without_choice_names_the_field():
    with pytest.raises(ValueError, match=r"^choice: missing"):
        Solution.from_dict({"problem": {"nodes": {}}})


def test_atomic_write_leaves_no_partial_file(tmp_path):
    target = tmp_path / "out.json"
    write_json_atomic(target, {"a": 1})
    with pytest.raises(TypeError):
        write_json_atomic(target, {"a": object()})
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_problem_arrays_are_float64():
    p = Problem.from_dict({"nodes": [{"cost": [1, 2], "memory": [3, 4]}]})
    assert p.nodes[0].cost.dtype == np.float64 and p.nodes[0].memory_bytes.dtype == np.float64
