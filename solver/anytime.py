r"""Anytime search for graphs too large for one exact solve.

Starting from a feasible assignment (``solver.localsearch.greedy``), the
search keeps the best feasible assignment x* and repeats until the deadline:

1. Large-neighbourhood search (LNS): grow a connected window W of variables
   (breadth-first from a seed drawn with probability proportional to its local
   cost), solve the window problem of ``solver.window`` exactly with the
   chosen backend (its memory rows are exact, so the result is feasible), and
   splice the result in. When the memory limit binds, a window can also be two
   halves, the second grown around a variable that could free memory at the
   first half's tightest point (``solver.window.memory_partner``), so that it
   trades memory between distant parts of the graph; windows of one kind run
   until two in a row fail to improve, then the other kind. The window budget
   grows when windows are solved to optimality without improvement (the
   neighbourhood is exhausted at that size) and shrinks when they time out.
2. Every few windows, a perturbation: a random connected region of 1-5 % of
   the variables moves to random values, then repair and descent (1- and
   2-variable moves under the memory limit); kept if it beats x*.

Every accepted step is checked against the memory tree, so x* is always
feasible; the cost only decreases.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from solver.compiled import CompiledGraph, KernelArrays
from solver.exact import solve_exact
from solver.kernels import apply_value
from solver.localsearch import SearchState, descend, repair
from solver.tolerance import REL_TOL, improves, kernel_costs
from solver.window import extract_window, grow_window, memory_partner
from solver.budget import share_deadline

__all__ = ["AnytimeReport", "improve"]

log = logging.getLogger(__name__)

# memory binds when the incumbent's peak is within this fraction of the limit:
# then windows may be coupled with a memory partner
TIGHT = 0.01


@dataclass(slots=True)
class AnytimeReport:
    """What the anytime search did."""

    windows: int = 0
    windows_improved: int = 0
    perturbations: int = 0
    perturbations_improved: int = 0
    history: list[tuple[float, float]] = field(default_factory=list)  # (seconds, cost)

    def to_dict(self) -> dict[str, object]:
        return {
            "windows": self.windows,
            "windows_improved": self.windows_improved,
            "perturbations": self.perturbations,
            "perturbations_improved": self.perturbations_improved,
        }


def improve(
    graph: CompiledGraph,
    arr: KernelArrays,
    state: SearchState,
    *,
    backend: str,
    deadline: float,
    threads: int = 1,
    seed: int = 0,
    on_improve=None,
) -> AnytimeReport:
    """Improve the feasible ``state`` in place until ``deadline``."""
    rng = np.random.default_rng(seed)
    report = AnytimeReport()
    start = time.perf_counter()
    best_cost = graph.cost(state.x)
    report.history.append((0.0, best_cost))
    n = graph.num_vars
    if n == 0:
        return report
    max_choices, max_pairs = 400, 60_000
    stale = 0
    # windows of one kind (connected, or coupled with a memory partner) until two
    # in a row fail to improve, then the other kind: on IOPDDL S connected windows
    # improve two times in three, on N they stall and coupled ones find 1.3 %
    coupled, misses = False, 0
    perturb_seconds = 0.0
    # a window needs time to build its program and start the backend: none is
    # started in the last half second (measured overruns of 0.1-0.3 s on K)
    while time.perf_counter() < deadline - 0.5:
        # -- LNS window ---------------------------------------------------
        weights = kernel_costs(graph.cost_shares(state.x))  # a variable's share of the cost
        weights = weights - weights.min() + REL_TOL * (abs(weights).max() + 1.0)
        seed_var = int(rng.choice(n, p=weights / weights.sum()))
        profile = graph.memory_profile(state.x)
        members = _window(graph, state.x, profile, seed_var, max_choices, max_pairs, rng, coupled)
        sub = extract_window(graph, state.x, members, profile)
        window_deadline = share_deadline("lns_window", deadline, stage_start=start)
        result = solve_exact(sub, backend, deadline=window_deadline, threads=threads,
                             start=state.x[members], seed=int(rng.integers(1 << 30)))
        report.windows += 1
        improved = False
        if result.values is not None:
            old = state.x[members].copy()
            for i, v in enumerate(members):
                _set(arr, state, int(v), int(result.values[i]))
            new_cost = graph.cost(state.x)
            if improves(new_cost, best_cost) and state.feasible():
                best_cost = new_cost
                improved = True
                report.windows_improved += 1
            else:
                for i, v in enumerate(members):
                    _set(arr, state, int(v), int(old[i]))
        misses = 0 if improved else misses + 1
        if misses >= 2:
            coupled, misses = not coupled, 0
        if result.status == "optimal" and not improved:
            stale += 1
            if stale >= 3:
                max_choices = min(int(max_choices * 1.5), 20_000)
                max_pairs = min(int(max_pairs * 1.5), 2_000_000)
                stale = 0
        elif result.status != "optimal":
            max_choices = max(int(max_choices / 1.5), 50)
            max_pairs = max(int(max_pairs / 1.5), 5_000)
        # -- perturbation -------------------------------------------------
        # its region growth and repair do not watch the clock (a window and a
        # perturbation took up to 20 s on the 60,000-node graph, whose solve once
        # ended 3.4 s past its limit): none starts unless the last one's length is left
        if report.windows % 5 == 0 and time.perf_counter() < deadline - 0.1 - perturb_seconds:
            perturb_start = time.perf_counter()
            candidate = state.copy()
            size = max(1, int(n * rng.uniform(0.01, 0.05)))
            region = grow_window(graph, int(rng.integers(n)), 10 * size * int(graph.dom.max()), 10**12, rng)[:size]
            for v in region:
                _set(arr, candidate, int(v), int(rng.integers(graph.dom[v])))
            if graph.num_times:
                repair(arr, candidate.x, candidate.tree, candidate.pend, 100_000)
            if candidate.feasible():
                descend(candidate, enforce=True, rng=rng, deadline=deadline)
                report.perturbations += 1
                cost = graph.cost(candidate.x)
                if candidate.feasible() and improves(cost, best_cost):
                    state.take(candidate)
                    best_cost = cost
                    improved = True
                    report.perturbations_improved += 1
            perturb_seconds = time.perf_counter() - perturb_start
        if improved:
            report.history.append((time.perf_counter() - start, best_cost))
            if on_improve is not None:
                on_improve(best_cost)
            log.debug("anytime: cost %.6g (window budget %d values)", best_cost, max_choices)
    return report


def _window(graph: CompiledGraph, x: np.ndarray, profile: np.ndarray, seed_var: int, max_choices: int,
            max_pairs: int, rng: np.random.Generator, coupled: bool) -> np.ndarray:
    """The next window: grown around ``seed_var`` or, when ``coupled`` and the limit
    binds, half there and half around a memory partner (``memory_partner``)."""
    tight = graph.num_times and np.isfinite(graph.limit) and profile.max() >= (1 - TIGHT) * graph.limit
    if not (coupled and tight):
        return grow_window(graph, seed_var, max_choices, max_pairs, rng)
    first = grow_window(graph, seed_var, max_choices // 2, max_pairs // 2, rng)
    partner = memory_partner(graph, x, first, profile, rng)
    if partner is None:
        return grow_window(graph, seed_var, max_choices, max_pairs, rng)
    second = grow_window(graph, partner, max_choices // 2, max_pairs // 2, rng)
    return np.union1d(first, second)


def _set(arr: KernelArrays, state: SearchState, var: int, value: int) -> None:
    apply_value(arr, state.tree, state.pend, state.x, var, value)
