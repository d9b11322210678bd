"""Shared solver fixtures: the hand-worked 5-node problem, random problems, brute force.

The hand-built problem is a chain 0-1-2-3-4 (two strategies each). Worked by
hand (dynamic programming along the chain, see test_solver_fixture.py):

* no memory limit: optimum 4 at (1, 1, 1, 1, 1), peak memory 9;
* memory limit 8: node 3 must take strategy 0 (the only non-constant usage);
  optimum 9 at (0, 0, 0, 0, 0), peak 5;
* memory limit 4: infeasible, the smallest achievable peak is 5.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from solver.evaluate import evaluate
from solver.problem import Problem


def hand_problem_dict() -> dict:
    return {
        "format": "autoshard.problem/1",
        "nodes": [
            {"name": "x", "strategies": ["S(0)", "R"], "cost": [0, 1], "memory": [2, 2], "live": [0, 1]},
            {"name": "w1", "strategies": ["R", "S(1)"], "cost": [3, 0], "memory": [1, 1]},
            {"name": "mm1", "strategies": ["S(0)", "S(1)"], "cost": [1, 1], "memory": [2, 2], "live": [1, 3]},
            {"name": "w2", "strategies": ["R", "S(0)"], "cost": [0, 2], "memory": [1, 5]},
            {"name": "mm2", "strategies": ["S(0)", "P(sum)"], "cost": [5, 0], "memory": [1, 1], "live": [2, 4]},
        ],
        "edges": [
            {"src": 0, "dst": 1, "cost": [[0, 4], [4, 0]]},
            {"src": 1, "dst": 2, "cost": [[0, 1], [3, 0]]},
            {"src": 2, "dst": 3, "cost": [[0, 3], [3, 0]]},
            {"src": 3, "dst": 4, "cost": [[0, 6], [1, 0]]},
        ],
    }


@pytest.fixture
def hand_problem() -> dict:
    """A fresh copy of the hand-worked problem's JSON (tests change one field)."""
    return hand_problem_dict()


def brute_force(problem: Problem) -> tuple[float, tuple[int, ...] | None]:
    """Best feasible cost and choice by enumeration (inf, None if none)."""
    best, best_choice = math.inf, None
    for choice in itertools.product(*(range(node.num_strategies) for node in problem.nodes)):
        ev = evaluate(problem, choice)
        if ev.feasible and ev.cost < best:
            best, best_choice = ev.cost, choice
    return best, best_choice


def random_problem(rng: np.random.Generator, *, max_nodes: int = 6, max_strategies: int = 4,
                   memory: bool = True, ties: bool = True, pins: bool = True, forbidden: float = 0.1) -> Problem:
    """A random small problem: parallel and reversed edges, forbidden entries,
    live intervals (some always live), a limit between the smallest and
    largest possible peak, ties among nodes of equal strategy count, pins."""
    n = int(rng.integers(2, max_nodes + 1))
    counts = rng.integers(1, max_strategies + 1, size=n)
    nodes = []
    for i in range(n):
        k = int(counts[i])
        cost = [None if rng.random() < forbidden / 2 else int(rng.integers(0, 20)) for _ in range(k)]
        node = {"cost": cost, "memory": [int(v) for v in rng.integers(0, 10, size=k)]}
        if rng.random() < 0.7:
            start = int(rng.integers(0, 6))
            node["live"] = [start, start + int(rng.integers(0, 4))]
        nodes.append(node)
    edges = []
    for _ in range(int(rng.integers(0, 2 * n))):
        u, v = (int(x) for x in rng.choice(n, size=2, replace=False))
        mat = [[None if rng.random() < forbidden else int(rng.integers(0, 20)) for _ in range(int(counts[v]))]
               for _ in range(int(counts[u]))]
        edges.append({"src": u, "dst": v, "cost": mat})
    data = {"nodes": nodes, "edges": edges}
    if ties and rng.random() < 0.3:
        for k in set(counts.tolist()):
            same = [i for i in range(n) if counts[i] == k]
            if len(same) >= 2:
                data["ties"] = [same[:2]]
                break
    if pins and rng.random() < 0.3:
        node = int(rng.integers(n))
        data["pins"] = {str(node): int(rng.integers(counts[node]))}
    problem = Problem.from_dict(data)
    if memory and rng.random() < 0.8:
        peaks = []
        for choice in itertools.islice(itertools.product(*(range(int(k)) for k in counts)), 4096):
            peaks.append(evaluate(problem, choice).peak_memory_bytes)
        low, high = min(peaks), max(peaks)
        data["memory_limit"] = float(low + rng.random() * (high - low))
        problem = Problem.from_dict(data)
    return problem


def available_backends() -> list[str]:
    from solver.backends import BACKENDS, get_backend

    names = []
    for name in sorted(BACKENDS):
        try:
            get_backend(name)
        except Exception:  # not installed here: its tests are skipped, not failed
            continue
        names.append(name)
    return names


@pytest.fixture
def all_backends() -> list[str]:
    """The names of the backends available here."""
    return available_backends()


def pytest_generate_tests(metafunc):
    """Every test taking ``backend`` runs once per available backend (as PuLP's tests do)."""
    if "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend", available_backends())


@pytest.fixture
def oracle():
    """The brute-force oracle, as a fixture (test modules cannot import conftest)."""
    return brute_force


@pytest.fixture
def make_random_problem():
    return random_problem


def unreduced_graph(problem: Problem):
    """``(working graph, compiled graph)`` with only the exact reductions a compiled graph needs
    (forbidden values, pins, ties) and every time point kept; None when they prove it infeasible."""
    from solver.compiled import compile_graph
    from solver.reductions import InfeasibleError, reduce_problem

    try:
        working, _ = reduce_problem(problem, dominance=False, followers=False, elimination=False)
    except InfeasibleError:
        return None
    return working, compile_graph(working, drop_redundant_times=False)


def brute_force_graph(graph) -> tuple[float, np.ndarray | None]:
    """Best cost (constant included) and values of a compiled graph within its memory limit,
    by enumeration (inf, None if none)."""
    best, best_values = math.inf, None
    for values in itertools.product(*(range(int(d)) for d in graph.dom)):
        x = np.array(values, dtype=np.int64)
        if graph.num_times and graph.memory_profile(x).max() > graph.limit:
            continue
        cost = graph.cost(x)
        if cost < best:
            best, best_values = cost, x
    return best, best_values


@pytest.fixture
def random_graphs():
    """``graphs(seed, count, **random_problem options)``: up to ``count`` random unreduced
    graphs with at least one variable, each as ``(rng, graph)`` (the generator that made it,
    for the test's own random choices)."""
    def graphs(seed: int, count: int, **options):
        rng = np.random.default_rng(seed)
        for _ in range(count):
            made = unreduced_graph(random_problem(rng, **options))
            if made is not None and made[1].num_vars:
                yield rng, made[1]
    return graphs


@pytest.fixture
def unreduced():
    """:func:`unreduced_graph`, as a fixture."""
    return unreduced_graph


@pytest.fixture
def graph_oracle():
    """Brute force over a compiled graph (:func:`brute_force_graph`)."""
    return brute_force_graph
