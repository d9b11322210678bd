"""Independent evaluation of a choice: cost breakdown and violated constraints.

Written directly from the problem's definition, sharing no code with the
formulations or the search, so that tests can check every backend against it
(as XLA's solver library does with ``Evaluate``).

Memory at time t is ``sum(memory[i][choice[i]] for i live at t)`` where node i
is live at t iff ``start <= t < end`` (nodes without ``live`` count at every
t). The peak is the maximum over t.

>>> from solver.problem import Problem
>>> p = Problem.from_dict({"nodes": [{"cost": [1, 2], "memory": [4, 2]}], "memory_limit": 3})
>>> e = evaluate(p, [0])
>>> e.cost, e.peak_memory_bytes, e.feasible
(1.0, 4.0, False)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from solver.problem import Problem

__all__ = ["Evaluation", "evaluate", "peak_memory"]


@dataclass(frozen=True, slots=True)
class Evaluation:
    """Cost of a choice and what it violates (empty ``violations`` = feasible)."""

    cost: float
    node_cost: float
    edge_cost: float
    peak_memory_bytes: float
    peak_time: int | None
    forbidden: int
    violations: tuple[str, ...]

    @property
    def feasible(self) -> bool:
        return not self.violations


def peak_memory(problem: Problem, choice: Sequence[int]) -> tuple[float, int | None]:
    """Peak memory over time and a time where it is reached."""
    always = 0.0
    events: dict[int, float] = {}
    for i, node in enumerate(problem.nodes):
        usage = float(node.memory_bytes[choice[i]])
        if node.live is None:
            always += usage
        elif node.live[0] < node.live[1] and usage:
            events[node.live[0]] = events.get(node.live[0], 0.0) + usage
            events[node.live[1]] = events.get(node.live[1], 0.0) - usage
    best, best_t, running = always, None, always
    for t in sorted(events):
        running += events[t]
        if running > best:
            best, best_t = running, t
    return best, best_t


def evaluate(problem: Problem, choice: Sequence[int]) -> Evaluation:
    """Cost breakdown and violations of ``choice`` (one strategy index per node)."""
    if len(choice) != problem.num_nodes:
        raise ValueError(f"choice has {len(choice)} entries, problem has {problem.num_nodes} nodes")
    violations: list[str] = []
    for i, node in enumerate(problem.nodes):
        if not 0 <= choice[i] < node.num_strategies:
            raise ValueError(f"choice[{i}] = {choice[i]} out of range (node has {node.num_strategies} strategies)")
    forbidden = 0
    node_cost = 0.0
    for i, node in enumerate(problem.nodes):
        c = float(node.cost[choice[i]])
        if math.isinf(c):
            forbidden += 1
            violations.append(f"node {i} uses forbidden strategy {choice[i]}")
        else:
            node_cost += c
    edge_cost = 0.0
    for j, edge in enumerate(problem.edges):
        c = float(edge.cost[choice[edge.src], choice[edge.dst]])
        if math.isinf(c):
            forbidden += 1
            violations.append(f"edge {j} ({edge.src}->{edge.dst}) uses a forbidden pair")
        else:
            edge_cost += c
    for i, k in problem.pins.items():
        if choice[i] != k:
            violations.append(f"node {i} pinned to {k}, chose {choice[i]}")
    for t, group in enumerate(problem.ties):
        if len({choice[m] for m in group}) > 1:
            violations.append(f"ties[{t}] not all equal")
    peak, peak_t = peak_memory(problem, choice)
    if problem.memory_limit is not None and peak > problem.memory_limit:
        violations.append(f"peak memory {peak:.6g} exceeds limit {problem.memory_limit:.6g} at t={peak_t}")
    cost = node_cost + edge_cost if forbidden == 0 else math.inf
    return Evaluation(
        cost=cost,
        node_cost=node_cost,
        edge_cost=edge_cost,
        peak_memory_bytes=peak,
        peak_time=peak_t,
        forbidden=forbidden,
        violations=tuple(violations),
    )


def choice_array(choice: Sequence[int]) -> np.ndarray:
    """A choice as an int64 array (for vectorised callers)."""
    return np.asarray(choice, dtype=np.int64)
