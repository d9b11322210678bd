r"""LP-guided primal heuristic: round the LP relaxation, repair it, re-solve its fractional part.

On these problems the LP relaxation of ``solver.ilp`` (the local polytope plus
the active memory rows) is nearly integral: on IOPDDL-C, 10 of 220 variables
are fractional. Branch and cut can still fail to find any integer point in
its time (CBC's feasibility pump does on C), so we build one:

1. x_LP -> the value of largest LP weight per variable (rounding);
2. repair the memory limit and descend (``solver.localsearch``), giving a
   feasible assignment x0;
3. the variables the LP left fractional, with their neighbours, form a window
   (``solver.window``) around x0, solved exactly (by the caller's
   ``solve_window``: ``solver.exact`` passes its own solve): the LP's
   integral part is kept, its undecided part is decided optimally given the
   rest.

The result warm-starts the full program, whose branch and bound then starts
from a near-optimal incumbent.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Callable

import numpy as np

from solver.compiled import CompiledGraph
from solver.ilp import LinearProgram
from solver.localsearch import SearchState, descend, repair
from solver.window import extract_window

__all__ = ["round_and_fix"]

log = logging.getLogger(__name__)

INTEGRAL = 0.999


def round_and_fix(
    graph: CompiledGraph,
    program: LinearProgram,
    z: np.ndarray,
    *,
    solve_window: Callable[[CompiledGraph, np.ndarray, float], np.ndarray | None],
    deadline: float,
    seed: int = 0,
    max_window_choices: int = 3000,
) -> np.ndarray | None:
    """A feasible assignment built from the LP solution ``z`` (or None).

    ``solve_window(window, start, deadline)`` returns the best values of a
    window problem it finds from ``start`` by ``deadline`` (or None)."""
    arr = graph.arrays
    x = program.x_part(z)
    values = program.values_from_solution(z, graph)
    weight = np.maximum.reduceat(x, graph.unary_off[:-1]) if graph.num_vars else np.zeros(0)
    fractional = np.flatnonzero(weight < INTEGRAL)
    state = SearchState(arr, values, graph.num_times)
    if graph.num_times:
        repair(arr, state.x, state.tree, state.pend, 100_000)
    if not state.feasible():
        return None
    descend(state, enforce=True, rng=np.random.default_rng(seed), deadline=deadline)
    best = state.x.copy()
    if not math.isfinite(graph.cost(best)):
        return None
    log.info("LP rounding: %d fractional of %d variables, repaired cost %.6g",
             fractional.size, graph.num_vars, graph.cost(best))
    if fractional.size == 0 or time.perf_counter() >= deadline:
        return best
    members = _window(graph, fractional, max_window_choices)
    sub = extract_window(graph, best, members, graph.memory_profile(best))
    values = solve_window(sub, best[members], deadline)
    if values is not None:
        trial = best.copy()
        trial[members] = values
        if graph.cost(trial) < graph.cost(best) and (graph.num_times == 0 or
                                                     graph.memory_profile(trial).max() <= graph.limit):
            best = trial
            log.info("LP window of %d variables: cost %.6g", members.size, graph.cost(best))
    return best


def _window(graph: CompiledGraph, fractional: np.ndarray, max_choices: int) -> np.ndarray:
    """The fractional variables, then their neighbours while the value budget lasts."""
    chosen = set(fractional.tolist())
    budget = max_choices - int(graph.dom[fractional].sum())
    for v in fractional.tolist():
        for i in range(graph.adj_off[v], graph.adj_off[v + 1]):
            w = int(graph.adj_other[i])
            if w not in chosen and graph.dom[w] <= budget:
                chosen.add(w)
                budget -= int(graph.dom[w])
    return np.array(sorted(chosen), dtype=np.int64)
