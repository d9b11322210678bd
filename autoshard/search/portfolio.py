"""The expert baselines every unpinned solve is compared with: a plan is never worse than them.

The solver's objective cannot see the step's schedule, so even its proven optimum can
simulate slower than a hand baseline, and a seeded search proves its plan only over the
strategies its seed kept. So every unpinned ``solve_prepared`` also solves the expert
baselines (FSDP, FSDP+TP, TP, DDP: ``autoshard.search.baselines``), each under the first
recomputation policy that fits, and returns whichever simulates fastest: ``plan`` unless

    step(baseline) < step(plan)   for the baseline of least step among those that fit.

On graphs of :data:`BACKGROUND_MIN_NODES` or more the baselines are solved in a forked child
beside the search (:mod:`autoshard.search.background`), the parent taking those the child has
not started once its own search is done.

The functions take the solve itself (``solve``: ``autoshard.search.solve.solve_prepared``) as
an argument: a baseline is a solve with the baseline's pins, and this module is what that
solve calls.

A baseline's solve keeps the call's backend and limits, drops the user's pins for the baseline's:

>>> opts = baseline_options(SolveOptions(pins={"w": "R"}), "fsdp", "selective", 2**30, 10.0, overlap_rounds=0)
>>> opts.baseline, opts.recompute, dict(opts.pins), opts.time_limit, opts.overlap_rounds
('fsdp', 'selective', {}, 10.0, 0)
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import replace
from typing import Any, Callable, Iterator

from solver.solution import Status
from solver.tolerance import over_limit

from autoshard.search.background import Background, Claim, grace_s
from autoshard.search.baselines import applicable_baselines, baseline_pins, held_all_step_bytes
from autoshard.plan.format import Plan
from autoshard.plan.options import SolveOptions
from autoshard.search.pins import resolve_pins
from autoshard.search.prepared import Prepared

__all__ = ["BACKGROUND_MIN_NODES", "BASELINE_POLICIES", "PORTFOLIO_ORDER", "Solve", "baseline_options",
           "best_of_baselines", "baseline_candidates", "baselines_beside", "baselines_instead", "own_seconds",
           "recompute_policies", "rounds_beside", "with_expert_baselines"]

log = logging.getLogger(__name__)

Solve = Callable[..., Plan]
"""``solve(prep, options, *, peak_hint=..., fit_reservation=...)``: ``autoshard.search.solve.solve_prepared``."""

BACKGROUND_MIN_NODES = 2000
"""Smallest graph whose expert baselines are priced beside its search (:mod:`autoshard.search.background`):
below it they take a second or two, less than what a second process costs in contention
(the solver's backends already use both cores of a 2-core machine while they run)."""

PORTFOLIO_ORDER = ("fsdp", "fsdp+tp", "tp", "ddp")
"""The order the expert baselines are tried in when a search ends unproven: the
ones that shard parameters and optimizer state first, since a search that
found nothing is short of memory, where DDP never fits (tried first, it used
up the share that FSDP needed)."""

BASELINE_POLICIES = ("none", "selective", "every:2", "full")
"""The policies users run today, priced with every expert baseline."""


def recompute_policies(prep: Prepared, recompute: str = "auto") -> list[str]:
    """The recomputation policies to price a baseline with, in order of preference:
    ``none``, then the policies users run (``selective``, ``every:2``, ``full``)
    where the graph has regions and ``recompute`` is ``auto``; the one policy asked for otherwise."""
    if recompute != "auto":
        return [recompute]
    if not prep.graph.regions:
        return ["none"]
    return list(BASELINE_POLICIES)


def best_of_baselines(solve: Solve, prep: Prepared, plan: Plan | None, opts: SolveOptions, limit: float, end: float,
                    recompute: str, *, status: str | None = None, seconds_used: float | None = None,
                    spent: list[float] | None = None, overlap_rounds: int | None = None,
                    background: Background | None = None) -> Plan | None:
    """``plan``, or the cheapest expert baseline that fits if it simulates faster than the search's plan
    (``plan`` None: the search found nothing; then the cheapest baseline that fits, or None);
    a baseline that does not fit without recomputation is tried with the policies users run.
    The baselines share what is left until ``end`` (the solve's deadline: the portfolio's share of
    the time limit, and what the search left of its own); once it is spent, the ones left are not tried.
    ``background``: the baselines already priced beside the search (:func:`baselines_beside`),
    taken when priced with ``overlap_rounds`` (else priced here)."""
    rounds = opts.overlap_rounds if overlap_rounds is None else overlap_rounds
    # (baseline index, step, solve seconds, the plan or its JSON text): a baseline's plan from the child is
    # parsed only if taken
    found: list[tuple[int, float, float, Plan | str]] | None = None
    if background is not None:
        # the baselines the child has not started are priced here, last first (autoshard.search.background)
        own = ([(n, c.estimate.step_s, seconds, c) for n, c, seconds in baseline_candidates(
            solve, prep, opts, limit, end, recompute, rounds, claim=background.claim, last_first=True)]
               if rounds == rounds_beside(prep, opts) else [])
        items, complete = background.collect(until=end, grace=grace_s(opts.time_limit))
        if all(item["rounds"] == rounds for item in items):
            found = [(item["task"], item["step_s"], item["spent"], item["plan"]) for item in items] + own
            if not complete:  # the child ended early (an error, its deadline): the rest are priced here
                priced = {baseline[0] for baseline in found}
                found += [(n, c.estimate.step_s, seconds, c) for n, c, seconds in baseline_candidates(
                    solve, prep, opts, limit, end, recompute, rounds, claim=lambda n: n not in priced)]
            found.sort(key=lambda baseline: baseline[0])
    if found is None:
        found = [(n, c.estimate.step_s, seconds, c)
                 for n, c, seconds in baseline_candidates(solve, prep, opts, limit, end, recompute, rounds)]
    best_step = plan.estimate.step_s if plan is not None else math.inf
    chosen: Plan | str | None = None
    for _, step, seconds, baseline in found:
        if spent is not None:
            spent.append(seconds)
        if (plan is None and chosen is None) or step < best_step:
            chosen, best_step = baseline, step
    if chosen is None:
        return plan
    best = Plan.from_dict(json.loads(chosen)) if isinstance(chosen, str) else chosen
    base = plan.options if plan is not None else {**prep.options, "recompute": recompute}
    log.info("the search's plan%s; the %s baseline (recompute %s) is %s (%.6g s) and is the plan",
             " found nothing" if plan is None else f" simulates {plan.estimate.step_s:.6g} s", best.options["baseline"],
             best.options.get("recompute"), "the best found" if plan is None else "better", best.estimate.step_s)
    options = {**base, "portfolio": best.options["baseline"], "recompute": best.options.get("recompute")}
    solver = (replace(best.solver, status=plan.solver.status, gap=plan.solver.gap, seconds=plan.solver.seconds)
              if plan is not None else replace(best.solver, status=status or "timeout", gap=None,
                                                seconds=seconds_used if seconds_used is not None else 0.0))
    return replace(best, options=options, solver=solver)


def baseline_candidates(solve: Solve, prep: Prepared, opts: SolveOptions, limit: float, end: float, recompute: str,
                      overlap_rounds: int, *, claim: Claim | None = None,
                      last_first: bool = False) -> Iterator[tuple[int, Plan, float]]:
    """``(index, plan, solve seconds)`` of each expert baseline that fits, under the first policy that fits,
    the index its place in :data:`PORTFOLIO_ORDER` among the baselines that apply. ``claim``: the baselines
    are shared with another process (:class:`~autoshard.search.background.Background`): the ones it
    refuses are the other's, taken in order (``last_first``: from the last)."""
    names = sorted(applicable_baselines(prep.graph, opts.tp_table), key=PORTFOLIO_ORDER.index)
    policies = recompute_policies(prep, recompute)
    for n in reversed(range(len(names))) if last_first else range(len(names)):
        name = names[n]
        if claim is not None and not claim(n):
            continue  # the other process's
        after = n + 1 if last_first else len(names) - n  # this baseline and those that may be left after it
        try:
            pins = resolve_pins(prep.graph, {**baseline_pins(prep.graph, name, opts.tp_table), **opts.pins})
        except ValueError:  # does not apply (a batch the data-parallel dims do not divide)
            continue
        if over_limit(held_all_step_bytes(prep.graph, pins) - limit, limit):
            continue  # its parameters alone do not fit (DDP of 8B on 8x8: 4 solves to fail, 3.6 s)
        for policy in policies:
            left = end - time.perf_counter()
            if left <= 0:
                break
            try:
                # no smallest-peak hint: a baseline that does not fit is simply not taken (DDP of 8B on
                # 8x8 solved the FSDP baseline for its hint under each of the 4 policies: 10 s)
                # nor re-solves for the allocator's reservation: the calling solve checks the plan it keeps
                candidate = solve(prep, baseline_options(opts, name, policy, limit, left / after,
                                                                   overlap_rounds), peak_hint=False,
                                  fit_reservation=False)
            except ValueError:  # does not apply or does not fit: try the next policy
                continue
            yield n, candidate, own_seconds(candidate)
            break  # the first policy that fits is the cheapest of this baseline's (less recomputation)


def baselines_beside(solve: Solve, prep: Prepared, opts: SolveOptions, limit: float, end: float, recompute: str,
                   ) -> Background | None:
    """The expert baselines priced in a forked child while the search runs
    (:mod:`autoshard.search.background`), with the overlap rounds they get after a
    search that proves its plan (a seeded search never does: then with the rounds);
    the parent runs those the child has not started once its search is done.
    LLaMA-3 8B, 2 cores, the solve after prepare: 2x4x8 (seeded) 17-21 s in process,
    8.9-12.7 s beside; 8x8 12-13.5 s in process, 7.7-8.5 s beside (runs of 2026-11-28,
    the VM's speed varying by up to 1.5x between them)."""
    if len(prep.graph.nodes) < BACKGROUND_MIN_NODES:
        return None
    rounds = rounds_beside(prep, opts)

    def produce(claim: Claim) -> Iterator[dict[str, Any]]:
        for n, candidate, seconds in baseline_candidates(solve, prep, opts, limit, end, recompute, rounds, claim=claim):
            yield {"task": n, "plan": json.dumps(candidate.to_dict()), "step_s": candidate.estimate.step_s,
                   "spent": seconds, "rounds": rounds}

    return Background.start(produce, tasks=len(PORTFOLIO_ORDER))


def rounds_beside(prep: Prepared, opts: SolveOptions) -> int:
    """The overlap rounds the baselines beside the search get: none where the search will prove its
    plan (a full search; :func:`with_expert_baselines`), the plan's own where it cannot (seeded)."""
    return 0 if prep.options.get("search") != "seeded" else opts.overlap_rounds


def baselines_instead(solve: Solve, prep: Prepared, solution: Any, opts: SolveOptions, limit: float, end: float,
                    recompute: str, background: Background | None) -> Plan | None:
    """The cheapest expert baseline that fits when the search found nothing (None: none fits)."""
    spent: list[float] = []
    found = best_of_baselines(solve, prep, None, opts, limit, end, recompute, status=solution.status.value,
                            seconds_used=solution.seconds, spent=spent, background=background)
    if found is None:
        return None
    timings = {**prep.timings, "solve_s": round(solution.seconds, 4), "portfolio_s": round(sum(spent), 4)}
    return replace(found, solver=replace(found.solver, timings=timings))


def with_expert_baselines(solve: Solve, prep: Prepared, plan: Plan, solution: Any, opts: SolveOptions, limit: float,
                        end: float, recompute: str, background: Background | None = None) -> Plan:
    """``plan`` or the expert baseline that simulates fastest, priced until ``end``.

    Priced for every unpinned solve (docs/design.md, "Overlap"): the objective cannot see the schedule,
    so a proven optimum can simulate slower than a baseline (2x2 MLP on H100: FSDP 652 us, the proven
    plan 660 us); and a seeded search proves its plan optimal only over the strategies its seed
    kept (a 70B plan at 45.7 s per step against 8.99 s). After a proven full search the baselines are
    solved without overlap rounds (a third cheaper: tiny LLaMA 2x2's four baselines 14.2 -> 9.7 s; a
    baseline's rounds only make it simulate faster, so the comparison stays conservative: a baseline
    returned is faster than the plan; one that would win only after its rounds is missed)."""
    spent: list[float] = []
    before = plan.solver.timings  # the plan's own stages, whichever baseline wins
    proven = solution.status is Status.OPTIMAL and prep.options.get("search") != "seeded"
    plan = best_of_baselines(solve, prep, plan, opts, limit, end, recompute, spent=spent,
                           overlap_rounds=0 if proven else opts.overlap_rounds, background=background)
    return replace(plan, solver=replace(plan.solver, timings={**before, "portfolio_s": round(sum(spent), 4)}))


def own_seconds(plan: Plan) -> float:
    """The solve's stages of ``plan`` without the seed (a portfolio baseline shares its prep's seed)."""
    timings = plan.solver.timings
    return sum(float(timings.get(k, 0.0)) for k in ("solve_s", "overlap_s", "portfolio_s"))


def baseline_options(opts: SolveOptions, baseline: str, recompute: str, memory_limit: float,
                     time_limit: float, overlap_rounds: int | None = None) -> SolveOptions:
    """The options of one expert baseline's solve within ``opts``' solve: its backend,
    TP table and server, the baseline's pins only, its own limits (``overlap_rounds``
    None: ``opts``')."""
    return SolveOptions(memory_limit=memory_limit, time_limit=time_limit, backend=opts.backend, baseline=baseline,
                        tp_table=opts.tp_table, server=opts.server, recompute=recompute,
                        overlap_rounds=opts.overlap_rounds if overlap_rounds is None else overlap_rounds)
