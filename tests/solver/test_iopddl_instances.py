"""Real IOPDDL instances: an evaluator written here from the contest's rules agrees with the
solver's cost and peak; solutions are feasible and use no forbidden cost where a finite
alternative exists. V whole, and subgraphs cut from larger instances (seconds per case)."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from solver import Status, solve
from solver.io import problem_from_iopddl

DATA = Path(__file__).resolve().parents[3] / "shared" / "iopddl"
pytestmark = pytest.mark.skipif(not DATA.exists(), reason="../shared/iopddl not present")
FORBIDDEN = 1e18


def contest_evaluate(data: dict, choice: list[int]) -> tuple[int, int, int]:
    """(total cost, peak usage, number of forbidden terms); plain Python ints, contest rules."""
    nodes, edges = data["problem"]["nodes"], data["problem"]["edges"]
    total = forbidden = 0
    for costs, s in zip(nodes["costs"], choice):
        total += int(costs[s])
        forbidden += costs[s] >= FORBIDDEN
    for (u, v), flat in zip(edges["nodes"], edges["costs"]):
        c = flat[choice[u] * len(nodes["costs"][v]) + choice[v]]
        total += int(c)
        forbidden += c >= FORBIDDEN
    deltas: dict[int, int] = {}
    for (start, end), usage, s in zip(nodes["intervals"], nodes["usages"], choice):
        if start < end:
            deltas[start] = deltas.get(start, 0) + int(usage[s])
            deltas[end] = deltas.get(end, 0) - int(usage[s])
    peak = running = 0
    for t in sorted(deltas):
        running += deltas[t]
        peak = max(peak, running)
    return total, peak, forbidden


def load(name: str) -> dict:
    return json.loads(gzip.decompress((DATA / f"asplos-2025-iopddl-{name}.json.gz").read_bytes()))


def cut(data: dict, count: int) -> dict:
    """The first ``count`` nodes with the edges among them; the limit 1.1x the least-usage peak."""
    nodes = data["problem"]["nodes"]
    keep = {k: v[:count] for k, v in nodes.items()}
    pairs, costs = [], []
    for pair, flat in zip(data["problem"]["edges"]["nodes"], data["problem"]["edges"]["costs"]):
        if pair[0] < count and pair[1] < count:
            pairs.append(pair)
            costs.append(flat)
    sub = {"problem": {"name": "cut", "nodes": keep, "edges": {"nodes": pairs, "costs": costs}, "usage_limit": 0}}
    least = [min(range(len(u)), key=u.__getitem__) for u in keep["usages"]]
    sub["problem"]["usage_limit"] = int(1.1 * contest_evaluate(sub, least)[1])
    return sub


def check(data: dict, time_limit: float) -> None:
    problem = problem_from_iopddl(data)
    solution = solve(problem, time_limit=time_limit, threads=2)
    assert solution.status in (Status.OPTIMAL, Status.FEASIBLE, Status.TIMEOUT)
    total, peak, forbidden = contest_evaluate(data, list(solution.choice))
    assert forbidden == 0
    assert peak <= data["problem"]["usage_limit"]
    assert total == solution.cost
    assert peak == solution.peak_memory_bytes
    if solution.lower_bound is not None:
        assert solution.lower_bound <= total


# The limits are what the checks need, not what the best solution needs: these instances never prove
# optimal (A aside), so every case runs to (a share of) its limit. At 3 s (V) and 2 s (the cuts) the solve
# still ends FEASIBLE with its LP lower bound computed (measured: V's bound 0.94e6 against 1.09e6 at
# 8 s; N's the same at 2 s and 5 s), so every assertion below checks what it did at 8 s / 5 s.
def test_v_is_feasible_and_priced_like_the_contest():
    check(load("V"), time_limit=3)


@pytest.mark.parametrize("name, count", [("A", 3000), ("L", 2500), ("N", 4000), ("P", 5000)])
def test_subgraph_of_a_large_instance(name, count):
    check(cut(load(name), count), time_limit=2)


def test_evaluator_counts_duplicate_edges_and_half_open_intervals():
    data = {"problem": {"nodes": {"intervals": [[0, 2], [2, 3]], "costs": [[1, 2], [3, 4]],
                                  "usages": [[5, 1], [5, 1]]},
                        "edges": {"nodes": [[0, 1], [0, 1]], "costs": [[0, 1, 2, 3], [10, 0, 0, 0]]},
                        "usage_limit": 5}}
    # intervals [0,2) and [2,3) never overlap: peak 5, not 10; both edges count
    assert contest_evaluate(data, [0, 0]) == (1 + 3 + 0 + 10, 5, 0)
    solution = solve(problem_from_iopddl(data), time_limit=10)
    assert solution.cost == contest_evaluate(data, list(solution.choice))[0]
    assert not math.isinf(solution.cost)
