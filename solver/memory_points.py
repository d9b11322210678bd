"""Which memory points a lazily built model starts with, and which it adds.

The integer program (``solver.exact``), the Lagrangian rounds
(``solver.lagrangian``), column generation (``solver.colgen``) and toulbar2's
knapsacks (``solver.wcsp``) all post the memory limit only at some of the
kept time points, then add the points that a solution exceeds:

* :func:`initial_points`: the highest points of a known solution's profile,
  at least T / (4 count) apart so that they cover different parts of the
  schedule;
* :func:`violated_points`: per maximal run of points over the limit (by more
  than the tolerance of ``solver.tolerance.over_limit``), the point of
  largest excess; one row there usually brings the whole run down.

A model with a subset of the points is a relaxation of the full one, so its
bounds stay valid whichever points it holds.

>>> from solver.compiled import assemble_graph
>>> g = assemble_graph(var_ids=np.arange(1), unary=[np.zeros(2)], edge_u=[], edge_v=[], edge_costs=[],
...     term_var=[0], term_t0=[0], term_t1=[4], term_usage=[np.array([1.0, 3.0])],
...     base=np.array([0.0, 1.0, 0.0, 1.0]), time_points=np.arange(4), limit=2.0, constant=0.0)
>>> violated_points(g, np.array([1])).tolist()   # profile 3 4 3 4: one run, largest excess first
[1]
>>> initial_points(g, np.array([0]), count=2).tolist()
[1, 3]
"""

from __future__ import annotations

import math

import numpy as np

from solver.compiled import CompiledGraph
from solver.tolerance import over_limit

__all__ = ["initial_points", "violated_points"]


def violated_points(graph: CompiledGraph, values: np.ndarray, *, per_round: int = 50) -> np.ndarray:
    """Per maximal run of points over the limit, the point of largest excess (at most
    ``per_round`` of them, the largest excesses)."""
    if not graph.num_times or not math.isfinite(graph.limit):
        return np.zeros(0, dtype=np.int64)
    excess = graph.memory_profile(values) - graph.limit
    over = over_limit(excess, graph.limit)
    if not over.any():
        return np.zeros(0, dtype=np.int64)
    edges = np.diff(np.concatenate([[0], over.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    picks = np.array([s + int(np.argmax(excess[s:e])) for s, e in zip(starts, ends)], dtype=np.int64)
    if picks.size > per_round:
        picks = picks[np.argsort(-excess[picks])[:per_round]]
    return np.sort(picks)


def initial_points(graph: CompiledGraph, values: np.ndarray | None, *, count: int = 8) -> np.ndarray:
    """Points to start with: the highest points of a known solution's profile, spread out."""
    if not graph.num_times or not math.isfinite(graph.limit) or values is None:
        return np.zeros(0, dtype=np.int64)
    profile = graph.memory_profile(values)
    order = np.argsort(-profile)
    picks: list[int] = []
    spacing = max(1, graph.num_times // (4 * count))
    for p in order:
        if all(abs(int(p) - q) >= spacing for q in picks):
            picks.append(int(p))
        if len(picks) >= count:
            break
    return np.array(sorted(picks), dtype=np.int64)
