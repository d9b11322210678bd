r"""``recompute="auto"``: the solver chooses what to recompute, and never returns worse than a fixed policy.

The problem under ``auto`` (``P_auto``) holds every state of every closure
member (``autoshard.graph.recompute``); a fixed policy ``p`` (``none``,
``selective``, ``full``: ``autoshard.graph.recompute_policy``) is the same
problem with the states it forbids priced ``inf`` (``P_p``): same nodes, same
strategy indices, so a choice of ``P_p`` is a choice of ``P_auto`` at the same
cost. Write ``c(x)`` for a choice's cost, ``m(x)`` for its peak, ``L`` for the
memory limit and ``keep(x)`` for ``x`` with every state set to ``KEEP`` (same
placements).

**(A1) When recomputation cannot pay, it is not in the problem.** By (C1)-(C2)
of ``autoshard.graph.recompute`` a recomputed member costs twice its compute
and its inputs' redistributions, a held one as much as a kept one, and (C3)-(C4)
forbid nothing when every member is kept; so ``keep(x)`` is a choice of
``P_none`` with ``c(keep(x)) <= c(x)``, for every ``x``. Let ``x*`` be optimal
for ``P_none`` *without* the memory limit. Then ``c(x*) <= c(keep(x)) <= c(x)``
for every choice ``x`` of ``P_auto``, limit or not; if also ``m(x*) <= L``,
``x*`` is optimal for ``P_auto``. (A1') The same holds of bounds: a lower bound
of ``P_none`` without a limit bounds ``P_auto``, so a choice of it that fits is
as close to ``P_auto``'s optimum as the bound proves; when the first solve ends
unproven with a choice that fits, the rest of the time continues it (from that
choice), not the larger ``P_auto``. So ``auto`` first solves ``P_none`` with no
limit (a smaller problem: the forbidden states go in the solver's first
reduction); when its optimum is proven and fits, that is the answer, and
``P_none`` (with the limit) is the problem the plan is assembled and re-priced
with: the run is the ``recompute="none"`` run.

**(A2) Otherwise, the search starts from the best fixed policy.** Each of
:data:`FIXED_POLICIES` is solved under the limit (``none`` only when the model has
no checkpoint regions); ``x_f`` is the cheapest choice that fits. ``P_auto`` is
then solved with ``x_f`` as its first incumbent, and its answer ``x_a`` is kept
only when ``c(x_a) <= c(x_f)``; otherwise ``x_f`` is returned, with the search's
status (an unproven search stays unproven). The caller assembles both plans
when they differ and keeps the smaller simulated step
(:attr:`AutoAnswer.fallback`), so the plan is never worse than the best fixed
policy's, by the solver's cost or by the plan's estimate.

>>> FIXED_POLICIES
('none', 'selective', 'full')
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from solver import solve as _local_solve
from solver.evaluate import peak_memory
from solver.solution import Status

__all__ = ["AutoAnswer", "FIXED_POLICIES", "solve_auto"]

FIXED_POLICIES = ("none", "selective", "full")
"""The fixed policies the search must beat (A2): keep everything, torchtitan's
op-level selective policy, full recomputation."""

FREE_SHARE = 0.4
"""Share of the solve time for ``P_none`` without the memory limit (A1): the answer whenever
memory does not bind, so it gets the largest share (an unproven incumbent of the exact stage can
be ten times the optimum: HF Mistral tiny on 2x2, greedy 25.6 ms against 1.73 ms)."""

FIXED_SHARE = 0.3
"""Share of the solve time for the fixed policies under the limit (A2), shared in order."""


@dataclass(frozen=True, slots=True)
class AutoAnswer:
    """What the recomputation search returns to ``autoshard.search.solve``."""

    solution: Any
    """The solver's answer (``solver.solution.Solution``)."""
    problem: Any
    """The problem it is a choice of, assembled and re-priced with (``P_none`` under (A1))."""
    fallback: Any = None
    """The best fixed policy's solution when it differs from ``solution``: the caller keeps
    whichever plan simulates faster (A2)."""
    policy: str = "auto"
    """``none`` when (A1) removed recomputation from the problem, else ``auto``."""


def _fits(problem: Any, solution: Any, limit: float | None) -> bool:
    return bool(solution.choice) and (limit is None or peak_memory(problem, solution.choice)[0] <= limit)


def solve_auto(problem: Any, under: Callable[[str, float | None], Any], limit: float | None, time_limit: float,
               backend: str, gap: float, *, regions: bool = True,
               on_event: Callable[[dict[str, Any]], None] | None = None,
               solve: Callable[..., Any] | None = None) -> AutoAnswer:
    """(A1), then (A2) (module docstring). ``problem`` is ``P_auto`` with ``limit``;
    ``under(policy, limit)`` gives the same problem under a fixed policy and a limit;
    ``regions``: the model has checkpoint regions (else only ``none`` is a fixed policy).
    ``solve``: what solves one problem (``solver.solve``'s keywords ``backend``, ``time_limit``,
    ``gap``, ``progress``, ``initial``; default ``solver.solve``, or an ``autoshard serve``'s)."""
    solve_problem = _local_solve if solve is None else solve
    start = time.perf_counter()

    def left(share: float = 1.0) -> float:
        return max(share * time_limit - (time.perf_counter() - start), 1e-3)

    tried: dict[str, dict[str, Any]] = {}
    # (A1) keeping everything, no limit: when its optimum fits, recomputation cannot pay
    free_problem = under("none", None)
    free = solve_problem(free_problem, backend=backend, time_limit=left(FREE_SHARE), gap=gap)
    tried["none (no limit)"] = _summary(free)
    best = None
    if _fits(free_problem, free, limit):
        if free.status is not Status.OPTIMAL:  # (A1') unproven: the rest of the time goes on proving it
            free = solve_problem(free_problem, backend=backend, time_limit=left(), gap=gap, progress=on_event,
                                 initial=list(free.choice))
            tried["none (no limit), continued"] = _summary(free)
        stats = {**free.stats, "warm_start": tried, "recompute_pruned": free.status is Status.OPTIMAL}
        return AutoAnswer(replace(free, seconds=time.perf_counter() - start, stats=stats), under("none", limit),
                          policy="none")
    # (A2) the fixed policies under the limit; the cheapest that fits starts the search
    policies = FIXED_POLICIES if regions else ("none",)
    for k, policy in enumerate(policies):
        budget = left(FREE_SHARE + FIXED_SHARE) / (len(policies) - k)
        found = solve_problem(under(policy, limit), backend=backend, time_limit=budget, gap=gap)
        tried[policy] = _summary(found)
        if found.choice and (best is None or found.cost < best.cost):
            best = found
    initial = list(best.choice) if best is not None else None
    searched = solve_problem(problem, backend=backend, time_limit=left(), gap=gap, progress=on_event, initial=initial)
    stats = {**searched.stats, "warm_start": tried}
    if "none" in tried:
        stats["without_recompute"] = tried["none"]
    seconds = time.perf_counter() - start
    if best is None or (searched.choice and searched.cost is not None and searched.cost <= best.cost):
        fallback = None if best is None or tuple(best.choice) == tuple(searched.choice) else best
        return AutoAnswer(replace(searched, seconds=seconds, stats=stats), problem, fallback=fallback)
    # the search ended worse than its start (out of time): the fixed policy's choice, unproven as the search is
    status = best.status if searched.status is Status.INFEASIBLE else searched.status
    kept = replace(best, status=status, lower_bound=searched.lower_bound if searched.choice else best.lower_bound,
                   seconds=seconds, stats={**stats, "kept_fixed_policy": True})
    return AutoAnswer(kept, problem)


def _summary(solution: Any) -> dict[str, Any]:
    return {"status": solution.status.value, "cost": solution.cost, "seconds": round(solution.seconds, 4)}
