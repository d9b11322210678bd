"""Model -> plan on one mesh: trace, build the strategy graph, solve, write the plan.

``prepare`` does the model-dependent part once (no GPU, no process group: the
model is traced on fake tensors) so that several solves (the solved plan and
every baseline) share it; ``solve_prepared`` solves it. ``autoshard.solve``
(:mod:`autoshard.search.api`) calls both, or the mesh search.

>>> from examples.models import mlp
>>> plan = solve_prepared(prepare(*mlp.tiny(), (2,), profile="h100-sxm-80gb"), time_limit=20)
>>> sorted(plan.params)[0], plan.estimate.step_s > 0
('layers.0.w1.bias', True)
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

from costmodel.mesh import MeshSpec
from hw_profiles import HardwareProfile
from hw_profiles import load as load_profile
from solver import solve as solve_problem
from solver.solution import Status

from autoshard.graph.builder import StrategyGraph, build_graph
from autoshard.graph.memory import OptimizerMemory, optimizer_implementation
from autoshard.graph.problem import to_problem
from autoshard.graph.recompute_policy import parse_policy
from autoshard.graph.restrict import choose_search, seeded_restriction
from autoshard.search.baselines import applicable_baselines
from autoshard.assembly.from_graph import plan_from_solution
from autoshard.plan.fingerprint import make_fingerprint
from autoshard.plan.format import Plan
from autoshard.search.overlap_objective import edge_slack, overlap_problem, overlap_worthwhile
from autoshard.plan.options import NO_MEMORY_LIMIT, PLAN_GAP, SolveOptions, solve_options
from autoshard.search.pins import resolve_pins
from autoshard.search.pinned_problem import PinnedProblems, pins_and_layout
from autoshard.search.portfolio import (BASELINE_POLICIES, baseline_options, baselines_beside, baselines_instead,
                                      own_seconds, recompute_policies, with_expert_baselines)
from autoshard.search.prepared import Prepared
from autoshard.search.recompute_search import AutoAnswer, solve_auto
from autoshard.search.remote_solve import server_solver, solve_on_server
from autoshard.search.reservation_fit import fit_reservation, reserved_over
from autoshard.sizes import format_bytes
from autoshard.trace import TracedGraph, trace_joint

__all__ = ["PLAN_GAP", "SEED_SHARE", "Prepared", "solve_stage_seconds", "InfeasibleMemoryError", "prepare",
           "solve_prepared", "BaselineResult", "compare_baselines", "recompute_policies", "BASELINE_POLICIES",
           "problem_request"]

log = logging.getLogger(__name__)

SEED_SHARE = 0.25
"""Share of the time limit for the coarse solve that seeds a seeded search
(``autoshard.graph.restrict``): the solve itself gets what it leaves."""

PORTFOLIO_SHARE = 0.2
"""Share of the time limit kept for the expert layouts (``autoshard.search.portfolio``)."""

OVERLAP_FIRST_SHARE = 0.6
"""Share of the solve time the first solve gets when overlap rounds follow."""

OVERLAP_ROUND_FACTOR = 4.0
OVERLAP_ROUND_MIN_S = 2.0
"""An overlap round's solve gets at most ``max(OVERLAP_ROUND_MIN_S, OVERLAP_ROUND_FACTOR * t1)``
seconds, ``t1`` the first solve's: a round not proven by then is dropped whatever time it had
(an unproven round never counts), so more time would only be spent, not used. LLaMA-3 8B on
2x16x2: the first solve 1.4 s, a round 13.4 s of its 14.9 s and unproven; proven rounds take
0.4-2.6 s (8B on 8x8, 2x4x8, 2x16x2 and their layouts)."""

Progress = Callable[[str, float, float], None]
"""``progress(phase, done, total)``: phases ``trace``, ``build``, ``solve``
(a mesh search: ``trace``, ``layouts``)."""


class InfeasibleMemoryError(ValueError):
    """No plan fits the memory limit."""


def _profile(profile: str | HardwareProfile) -> HardwareProfile:
    return profile if isinstance(profile, HardwareProfile) else load_profile(profile)


def _host_ranks(mesh: MeshSpec) -> int:
    """Ranks of the job on this host: torchrun's ``LOCAL_WORLD_SIZE``, else the whole mesh."""
    return int(os.environ.get("LOCAL_WORLD_SIZE") or math.prod(mesh.shape))


def correct_for_here(profile: HardwareProfile, mode: str, *, ranks: int) -> tuple[HardwareProfile, dict[str, Any]]:
    """``profile`` corrected for this machine (``autoshard.calibrate.first_use``) when ``mode``
    asks for it (``auto`` is off here: an offline solve), and the record for ``plan.options``."""
    if mode in ("auto", "off"):
        return profile, {"mode": "off"}
    from autoshard.calibrate.first_use import corrected_profile

    return corrected_profile(profile, ranks=ranks, mode=mode)


def prepare(
    model: Any,
    example_inputs: Sequence[Any] | Mapping[str, Any],
    mesh_shape: Sequence[int],
    dim_names: Sequence[str] | None = None,
    options: SolveOptions | None = None,
    *,
    progress: Progress | None = None,
    traced: TracedGraph | None = None,
    seed_memo: dict[Any, Any] | None = None,
    **changes: Any,
) -> Prepared:
    """Trace ``model(*example_inputs)`` and build its strategy graph on the mesh.

    ``options`` (:class:`~autoshard.plan.options.SolveOptions`; keyword
    ``changes`` of its fields build or change it): this reads ``profile``,
    ``optimizer``, ``mixed_precision``, ``allow_uneven``, ``search``,
    ``bucket_bytes``, ``recompute`` and ``gather``.
    ``search``: ``full`` enumerates every strategy; ``seeded`` keeps only those
    near a solve on a coarser 2-D mesh (``autoshard.graph.restrict``: a
    restriction, so the plan is optimal over what it keeps; the seed's solve
    gets :data:`SEED_SHARE` of ``time_limit``, and the solve what is left);
    ``auto`` (default) seeds meshes with 3 or more dims of size > 1, whose
    full enumeration takes minutes to hours.
    ``bucket_bytes``: the runtime's gradient bucket cap (``costmodel.buckets.grouping``;
    0 = one collective per gradient). ``traced``: the model already traced
    (``trace_joint(model, example_inputs)``), reused instead of tracing again:
    the trace does not depend on the mesh, so a mesh search traces once;
    ``seed_memo``: a dict shared by calls on that trace, so that 3-D meshes with
    the same coarse mesh share its seed (``seeded_restriction(memo=...)``).
    ``recompute``: ``none`` builds the graph without recomputation states
    (smaller, and every solve of it keeps every activation); any other policy
    (``autoshard.graph.recompute_policy``) builds them, and the solves choose
    under their own policy. ``gather``: when gathered parameter copies are held
    (``autoshard.graph.copies``; ``reader``, as autoshard's runtime runs;
    ``fsdp2`` to price FSDP2's block-wise gathers with prefetch and its per-block
    gradient reductions, in ``reduce_dtype`` when given).
    """
    opts = solve_options(options, changes)
    optimizer, mixed_precision, allow_uneven = opts.optimizer, opts.mixed_precision, opts.allow_uneven
    bucket_bytes, recompute, gather = opts.bucket_bytes, opts.recompute, opts.gather
    parse_policy(recompute)
    base = _profile(opts.profile)
    mesh = MeshSpec(tuple(int(m) for m in mesh_shape), tuple(dim_names or ()))
    # priced with the profile corrected for this machine where asked; the plan's fingerprint
    # names the profile as given (the correction is recorded in plan.options)
    prof, correction = correct_for_here(base, opts.profile_correction, ranks=_host_ranks(mesh))
    t0 = time.perf_counter()
    if progress:
        progress("trace", 0, 1)
    if traced is None:  # for the device the plan runs on: its attention kernels are that device's
        # stamped (a deep stack traced as three blocks): planning only; the runtime traces whole
        traced = trace_joint(model, example_inputs, target_device=opts.device_type or prof.device_type, stamp=True)
    t1 = time.perf_counter()
    if progress:
        progress("trace", 1, 1)
    # the kernels and temporaries of the update as torch.optim will run it (auto: its default on the device)
    optimizer_impl = optimizer_implementation(opts.optimizer_impl, prof)
    opt_memory = OptimizerMemory(optimizer, mixed_precision, optimizer_impl)
    mode = choose_search(mesh.shape, opts.search)
    restrict, seed_timings = None, {}
    if mode == "seeded":
        # the coarse solves under the user's limit, not the device's: a seed that fits only a larger
        # device keeps the fine mesh's strategies near a plan this limit refuses
        restrict, seed = seeded_restriction(traced, mesh, prof, optimizer=opt_memory, allow_uneven=allow_uneven,
                                            memory_limit=opts.memory_limit,
                                            time_limit=SEED_SHARE * opts.time_limit, backend=opts.backend,
                                            memo=seed_memo, gap=PLAN_GAP)
        seed_timings = {"seed_build_s": seed.seconds["build"], "seed_solve_s": seed.seconds["solve"]}
    t_seed = time.perf_counter()
    graph = build_graph(
        traced, mesh, prof, optimizer=opt_memory, ties=True, allow_uneven=allow_uneven,
        on_progress=(lambda d, t: progress("build", d, t)) if progress else None, restrict=restrict,
        bucket_bytes=bucket_bytes, recompute=recompute != "none", gather=gather, reduce_dtype=opts.reduce_dtype,
        expert_imbalance=opts.expert_imbalance,
    )
    t2 = time.perf_counter()
    return Prepared(
        traced=traced, graph=graph, fingerprint=make_fingerprint(traced, mesh.shape, mesh.dim_names, base),
        timings={"trace_s": round(t1 - t0, 4), **seed_timings, "build_s": round(t2 - t_seed, 4)},
        # optimizer_impl as priced (``auto`` resolved for the profile's device): the runtime's user
        # builds that optimizer to get the step the plan predicts
        options={"optimizer": optimizer, "optimizer_impl": optimizer_impl, "mixed_precision": mixed_precision,
                 "allow_uneven": allow_uneven, "search": mode, "bucket_bytes": int(bucket_bytes), "recompute_states": recompute != "none",
                 "gather": gather, **({"reduce_dtype": opts.reduce_dtype} if opts.reduce_dtype else {}),
                 **({"expert_imbalance": opts.expert_imbalance} if graph.has_exchanges() else {}),
                 "profile_correction": correction},
    )


def solve_prepared(
    prep: Prepared,
    options: SolveOptions | None = None,
    *,
    progress: Progress | None = None,
    started: float | None = None,
    peak_hint: bool = True,
    fit_reservation: bool = True,
    **changes: Any,
) -> Plan:
    """Solve a prepared graph with ``options`` (:class:`~autoshard.plan.options.SolveOptions`;
    keyword ``changes`` of its fields build or change it). ``memory_limit``
    defaults to the profile's usable memory, its memory less the allocator's headroom
    (:data:`~autoshard.plan.options.NO_MEMORY_LIMIT`:
    none); ``baseline`` (``ddp``, ``fsdp``, ``tp``, ``fsdp+tp``) adds its pins
    and its data-parallel op layout (``autoshard.search.baselines``) under the
    user's pins. ``recompute``: ``auto`` lets the solver choose what the
    backward recomputes, with the placements; ``none``, ``full``,
    ``selective`` or ``every:K`` impose a policy
    (``autoshard.graph.recompute_policy``). Without pins the expert layouts
    are priced too (in the last fifth of the time and what the search left; with
    the recomputation policies where a layout does not fit without; after a
    proven full search without their overlap rounds) and the plan is the one
    whose simulated step is shortest (``options["portfolio"]`` names the layout
    when it is one of them): the solver's objective cannot see the schedule, so
    even its proven optimum may simulate slower than a layout.
    ``server``: an ``autoshard serve`` URL that solves the problem and assembles
    the plan (the same plan as here; :class:`autoshard.service.client.ServiceError`
    when it cannot). ``started``: ``time.perf_counter()`` when the whole call began (before ``prepare``):
    ``time_limit`` then bounds it all, trace and build included, what assembling the plan takes kept
    after the solve (:func:`_assembly_reserve`; ``autoshard.solve`` and ``autoshard solve`` pass it).
    Every stage is handed what is left of the one deadline, so the call returns within 5 % of
    ``time_limit`` (``tests/autoshard/search/test_time_limit.py``) unless trace and build alone take it.
    ``peak_hint``: when no plan fits, the error names the smallest peak found (a solve of the FSDP
    layout without a limit); False skips it (the expert layouts, tried one policy after another).

    On a GPU profile the plan must also fit once the caching allocator's reservation is counted
    (``estimate.reserved_bytes``, ``autoshard.program.reservation``): a plan whose live peak fits
    but whose reservation exceeds the device's memory is solved again under a lower memory limit
    (:func:`_fit_reservation`), and :class:`InfeasibleMemoryError` is raised when no plan fits so;
    ``allow_over_reservation`` accepts such a plan with a warning. ``fit_reservation`` False: no
    re-solves (the expert layouts, whose winner the calling solve checks).
    """
    opts = solve_options(options, changes)
    end = time.perf_counter() + _solve_share(opts.time_limit, prep, started)
    plan = _solve_once(prep, opts, progress=progress, started=started, peak_hint=peak_hint)
    device = float(prep.graph.profile.device.memory_bytes)
    limit = opts.memory_limit_bytes(prep.graph.profile)
    if opts.allow_over_reservation or not fit_reservation or limit == NO_MEMORY_LIMIT:
        _warn_if_reserved_over(plan, device)
        return plan
    return _fit_reservation(prep, opts, plan, device, end)


def _solve_once(prep: Prepared, opts: SolveOptions, *, progress: Progress | None, started: float | None,
                peak_hint: bool) -> Plan:
    """One solve of ``prep`` under ``opts`` (:func:`solve_prepared` without the reservation's re-solves)."""
    pins, time_limit, backend, baseline = opts.pins, opts.time_limit, opts.backend, opts.baseline
    server = opts.server
    graph = prep.graph
    recompute = parse_policy(opts.recompute)
    limit = opts.memory_limit_bytes(graph.profile)
    problem_limit = None if limit == NO_MEMORY_LIMIT else limit
    start = time.perf_counter()  # before the problem is made: its gathers' pricing is part of the call
    time_limit = _solve_share(time_limit, prep, started)
    end = start + time_limit  # every stage below ends by then: solve, overlap rounds, expert layouts, hint
    pinned = PinnedProblems(graph, opts)  # each policy's problem built once (search/pinned_problem.py)
    problem = pinned(problem_limit, recompute)

    def on_event(event: dict[str, Any]) -> None:
        if progress:
            progress("solve", min(time.perf_counter() - start, time_limit), time_limit)

    # Unless the layout is pinned, a fifth of the time is kept for the expert
    # layouts: the plan is never worse than them.
    portfolio = baseline is None and not pins
    share = PORTFOLIO_SHARE if portfolio else 0.0
    options = _plan_options(prep, opts, problem_limit, recompute)
    remote, fallback = None, None
    rounds = opts.overlap_rounds if overlap_worthwhile(graph.profile.contention) else 0
    first = OVERLAP_FIRST_SHARE if rounds else 1.0
    deadline = start + time_limit * (1 - share)
    beside = portfolio and server is None  # the expert layouts priced in a child while the search runs
    background = baselines_beside(solve_prepared, prep, opts, limit, end, recompute) if beside else None
    try:
        if server is not None and not _searches_recompute(graph, recompute):
            remote, solution = solve_on_server(server, prep, problem, options, _left(deadline) * first,
                                                backend, progress)
        else:
            # the problem under a fixed policy
            under = lambda policy, memory_limit: pinned(memory_limit, policy)  # noqa: E731
            # with a server, the recomputation search's solves run there and the plan is assembled here
            answer = _solve_local(graph, problem, recompute, _left(deadline) * first, backend, on_event,
                                  under, problem_limit, solve=None if server is None else server_solver(server))
            solution, problem, fallback = answer.solution, answer.problem, answer.fallback
            if answer.policy != recompute:  # (A1): solved without recomputation; a dump of the plan's problem says so
                options["recompute_pruned"] = True
        if solution.status is not Status.INFEASIBLE and not solution.choice and portfolio:
            # the search ran out of time before any choice fit: the expert layouts (with the
            # recomputation policies) may still give one
            found = baselines_instead(solve_prepared, prep, solution, opts, limit, end, recompute, background)
            if found is not None:
                return found
        if solution.status is Status.INFEASIBLE or not solution.choice:
            raise InfeasibleMemoryError(
                f"memory limit {format_bytes(limit)}: no plan fits ({solution.message or solution.status.value})"
                + (_smallest_peak_hint(prep, opts, recompute, end) if peak_hint else "")
            )
        # the overlap rounds re-price edges from the simulated schedule of the plan at hand, here
        # (a server's plan too: its plan is then this one, as without a server)
        plan = remote if remote is not None else _assembled(prep, problem, solution, options)
        if remote is None and fallback is not None:  # the best fixed policy, when it simulates faster
            plan, solution = _faster_of(prep, problem, plan, solution, fallback, options)
        if rounds:
            plan = _overlap_rounds(prep, problem, solution, plan, rounds, deadline, backend)
        if portfolio:
            plan = with_expert_baselines(solve_prepared, prep, plan, solution, opts, limit, end, recompute, background)
    finally:
        if background is not None:
            background.stop()
    if progress:
        progress("solve", time_limit, time_limit)
    return plan


def _fit_reservation(prep: Prepared, opts: SolveOptions, plan: Plan, device: float, end: float) -> Plan:
    """``plan``, or the plan solved again under a lower memory limit until its replayed reservation
    fits the device's ``device`` bytes, by ``end`` (``autoshard.search.reservation_fit``)."""

    def solve_under(memory_limit: float, seconds: float) -> Plan | None:
        try:
            return _solve_once(prep, opts.with_changes(memory_limit=memory_limit, time_limit=seconds), progress=None,
                               started=None, peak_hint=False)
        except InfeasibleMemoryError:
            return None

    fit = fit_reservation(plan, device, solve_under, deadline=end)
    if fit.plan is None:
        raise InfeasibleMemoryError(
            f"memory limit {format_bytes(plan.estimate.memory_limit_bytes or device)}: no plan found fits the "
            f"device's {format_bytes(device)} once the CUDA caching allocator's reservation is counted (the plan's "
            f"live peak {format_bytes(plan.estimate.peak_memory_bytes)}, reserved "
            f"{format_bytes(plan.estimate.reserved_bytes)}; {fit.rounds} re-solve(s) under a lower limit found "
            "none); allow_over_reservation (--allow-over-reservation) accepts it")
    if not fit.rounds:
        return plan
    log.info("the plan solved again %d time(s) under a lower memory limit (%s) to fit the caching allocator's "
             "reservation: %s of the device's %s", fit.rounds, format_bytes(fit.plan.estimate.memory_limit_bytes),
             format_bytes(fit.plan.estimate.reserved_bytes), format_bytes(device))
    return replace(fit.plan, options={**fit.plan.options, "reservation_rounds": fit.rounds})


def _plan_options(prep: Prepared, opts: SolveOptions, limit: float | None, recompute: str) -> dict[str, Any]:
    """``plan.options``: how the graph was built (``prep.options``), then how it was solved."""
    return {**prep.options, "ties": opts.ties, "pins": dict(opts.pins), "memory_limit_bytes": limit,
            "baseline": opts.baseline, "time_limit_s": opts.time_limit, "backend": opts.backend,
            "recompute": recompute, **({"expandable_segments": True} if opts.expandable_segments else {}),
            **({"allow_over_reservation": True} if opts.allow_over_reservation else {})}


def _warn_if_reserved_over(plan: Plan, device: float) -> None:
    """Say so when the live peak fits but what the caching allocator reserves does not (a plan the user
    accepted so: ``allow_over_reservation``)."""
    if reserved_over(plan, device):
        log.warning("the plan's live peak is %s but the CUDA caching allocator would reserve %s, more than the "
                    "device's %s: lower memory_limit (or set expandable_segments if the job runs with them)",
                    format_bytes(plan.estimate.peak_memory_bytes), format_bytes(plan.estimate.reserved_bytes),
                    format_bytes(device))


def _solve_share(time_limit: float, prep: Prepared, started: float | None) -> float:
    """Seconds the solve stages get of the call's ``time_limit``: what is left once the assembly of
    the plan that ends it is kept (:func:`_assembly_reserve`)."""
    reserve = _assembly_reserve(time_limit, prep)
    if started is not None:  # the one time limit covers the whole call: what prepare took, and assembly
        spent = time.perf_counter() - started
        return max(time_limit - reserve - spent, MIN_SOLVE_SHARE * time_limit)
    # the seed of a seeded search took its share of the one time limit; the solve gets the rest
    return max(time_limit - reserve - float(prep.timings.get("seed_solve_s", 0.0)), MIN_SOLVE_SHARE * time_limit)


def _assembly_reserve(time_limit: float, prep: Prepared) -> float:
    """Seconds kept after the solve stages' deadline for what follows the last of them: assembling
    (and simulating) the plan a stage chose, writing it. It grows with the graph, not with the
    limit: :data:`ASSEMBLY_SHARE` of the limit, or :data:`ASSEMBLY_PER_BUILD` of the graph's build
    time where that is more (a short limit on a graph whose assembly takes longer)."""
    return max(ASSEMBLY_SHARE * time_limit, ASSEMBLY_PER_BUILD * float(prep.timings.get("build_s", 0.0)))


def _assembled(prep: Prepared, problem: Any, solution: Any, options: Mapping[str, Any]) -> Plan:
    """The plan of ``solution``, with the prep's timings, the solve's and the assembly's."""
    timings = {**prep.timings, "solve_s": round(solution.seconds, 4)}
    compiled = float(solution.stats.get("compile_seconds") or 0.0)
    if compiled > 0:  # a first run's numba compilation, part of solve_s but not solving
        timings["solve_compile_s"] = round(compiled, 4)
    t = time.perf_counter()
    plan = plan_from_solution(prep.graph, problem, solution, fingerprint=prep.fingerprint, options=options,
                              timings=timings)
    return replace(plan, solver=replace(plan.solver, timings={**timings, "plan_s": round(time.perf_counter() - t, 4)}))


def _faster_of(prep: Prepared, problem: Any, plan: Plan, solution: Any, fallback: Any,
               options: Mapping[str, Any]) -> tuple[Plan, Any]:
    """(plan, solution) of the search or of the best fixed recomputation policy
    (``autoshard.search.recompute_search``, A2), whichever simulates the faster step."""
    other = _assembled(prep, problem, replace(fallback, seconds=solution.seconds, stats=solution.stats), options)
    if other.estimate.step_s < plan.estimate.step_s:
        return other, replace(solution, choice=fallback.choice, cost=fallback.cost)
    return plan, solution


def _left(deadline: float) -> float:
    """Seconds left until ``deadline`` for a stage that must run (the solve: a plan needs a choice),
    at least :data:`MIN_STAGE_S`."""
    return max(deadline - time.perf_counter(), MIN_STAGE_S)


MIN_STAGE_S = 0.05
"""The least a stage that must run is given (a solver's time limit must be positive)."""

MIN_SOLVE_SHARE = 0.05
"""The least share of the time limit a solve starts with after the seed's (a seed that overran)."""

ASSEMBLY_SHARE = 0.04
"""Share of the time limit kept for what follows the solve's deadline: assembling the chosen
plan and writing it."""

ASSEMBLY_PER_BUILD = 0.3
"""Seconds of assembly per second of the graph's build, at most: a plan's assembly and
simulation took 0.15-0.24 of the build (LLaMA-3 8B on 8x8: 0.4 s of 2.7 s; tiny LLaMA on 2x2
under load: 0.64 s of 2.64 s)."""


def _with_timing(plan: Plan, name: str, seconds: float) -> Plan:
    """``plan`` with one more stage in ``solver.timings`` (seconds of a stage of the one time limit)."""
    return replace(plan, solver=replace(plan.solver, timings={**plan.solver.timings, name: round(seconds, 4)}))


def solve_stage_seconds(plan: Plan) -> float:
    """The seconds the stages of the one time limit took, as ``plan.solver.timings`` reports
    them: the seed's solve, the solve, the overlap rounds and the expert layouts (module
    ``autoshard.plan.options``: ``time_limit`` is the whole solve's).

    >>> solve_stage_seconds(plan) <= plan.options["time_limit_s"] * 1.05  # doctest: +SKIP
    True
    """
    return float(plan.solver.timings.get("seed_solve_s", 0.0)) + own_seconds(plan)


def _searches_recompute(graph: StrategyGraph, recompute: str) -> bool:
    """Whether the solver chooses what to recompute (``autoshard.search.recompute_search``)."""
    return recompute == "auto" and any(n.states for n in graph.nodes)


def _solve_local(graph: StrategyGraph, problem: Any, recompute: str, time_limit: float, backend: str,
                 on_event: Callable[[dict[str, Any]], None], under: Callable[[str, float | None], Any],
                 limit: float | None, *, solve: Callable[..., Any] | None = None) -> AutoAnswer:
    """The solver's answer to ``problem``. When the solver chooses recomputation
    (``auto`` on a graph with states): ``autoshard.search.recompute_search`` (no
    recomputation in the problem when it cannot pay; otherwise the search starts
    from the best fixed policy and never returns worse). ``solve``: where its
    solves run (default here; :func:`autoshard.search.remote_solve.server_solver`)."""
    if not _searches_recompute(graph, recompute):
        return AutoAnswer(solve_problem(problem, backend=backend, time_limit=time_limit, gap=PLAN_GAP,
                                        progress=on_event), problem, policy=recompute)
    return solve_auto(problem, under, limit, time_limit, backend, PLAN_GAP, regions=bool(graph.regions),
                      on_event=on_event, solve=solve)


def _overlap_rounds(prep: Prepared, problem: Any, solution: Any, plan: Plan, rounds: int, deadline: float,
                    backend: str) -> Plan:
    """Solve again with overlap-priced edges until the choice repeats (module
    ``autoshard.search.overlap_objective``) or a round ends unproven (each within
    :data:`OVERLAP_ROUND_FACTOR` times the first solve's time); the plan with the best
    simulated step among the first solve's and the proven rounds'."""
    from autoshard.assembly.from_graph import assembly_graph

    graph = prep.graph
    assembly = assembly_graph(graph)
    best, best_round = plan, 0
    previous, previous_plan = tuple(solution.choice), plan
    ran, spent = 0, 0.0
    cap = max(OVERLAP_ROUND_MIN_S, OVERLAP_ROUND_FACTOR * float(solution.seconds))
    for r in range(rounds):
        remaining = deadline - time.perf_counter()
        if remaining <= 0.5:
            break
        slack = edge_slack(assembly, problem, previous, previous_plan)
        priced = overlap_problem(problem, slack, graph.profile.contention)
        again = solve_problem(priced, backend=backend, time_limit=min(remaining / (rounds - r), cap), gap=PLAN_GAP,
                              initial=list(previous))
        ran += 1
        spent += again.seconds
        if again.status is Status.INFEASIBLE or not again.choice or tuple(again.choice) == previous:
            break
        if again.status is not Status.OPTIMAL:  # what an unproven round found depends on the time it got:
            break  # taking it would make the plan depend on the time limit (a different plan at 60 s and 300 s)
        candidate = plan_from_solution(graph, problem, again, fingerprint=prep.fingerprint, options=plan.options,
                                       timings=plan.solver.timings)
        if candidate.estimate.step_s < best.estimate.step_s:
            best, best_round = candidate, r + 1
        previous, previous_plan = tuple(again.choice), candidate
    if best is not plan:
        log.info("overlap round %d: simulated step %.6g s (first solve %.6g s)", best_round, best.estimate.step_s,
                 plan.estimate.step_s)
    best = _with_timing(best, "overlap_s", spent)
    return replace(best, options={**best.options, "overlap_rounds": ran, "overlap_round": best_round})


MIN_HINT_S = 0.5
"""Below this much time left, an infeasible solve's error gives no smallest-peak hint."""


def _smallest_peak_hint(prep: Prepared, opts: SolveOptions, recompute: str, end: float) -> str:
    """The peak of the FSDP layout without a limit (with full recomputation
    when the policy allows it): the smallest peak found in what is left of the
    time limit (``end``), if anything is."""
    left = end - time.perf_counter()
    if opts.baseline == "fsdp" or left < MIN_HINT_S:
        return ""
    policy = "full" if recompute == "auto" and prep.graph.regions else recompute
    try:
        plan = solve_prepared(prep, baseline_options(opts, "fsdp", policy, NO_MEMORY_LIMIT, left))
    except ValueError:
        return ""
    how = "FSDP layout" + (f", {policy} recomputation" if policy not in ("none", "auto") else "")
    return f"; smallest peak found: {format_bytes(plan.estimate.peak_memory_bytes)} ({how})"


@dataclass(frozen=True, slots=True)
class BaselineResult:
    """One row of the comparison: a baseline's best plan under one recomputation policy, or why there is none."""

    name: str
    plan: Plan | None
    error: str | None = None
    recompute: str = "none"
    """The recomputation policy it runs with (``none``, ``full``, ``selective``, ``every:K``)."""


def compare_baselines(
    prep: Prepared,
    options: SolveOptions | None = None,
    *,
    policies: Sequence[str] | None = None,
    **changes: Any,
) -> list[BaselineResult]:
    """Every applicable baseline with every recomputation policy users run
    (``policies``; default :func:`recompute_policies`), each solved with its
    pins and no memory limit (so a layout that does not fit still gets its
    numbers; ``fits`` tells against ``options.memory_limit``). The rows share
    ``options.time_limit``: each gets what is left over the rows left; a row
    past it has no plan (its error says so)."""
    opts = solve_options(options, changes)
    deadline = time.perf_counter() + opts.time_limit
    limit = opts.memory_limit_bytes(prep.graph.profile)
    if policies is None:
        policies = recompute_policies(prep) if prep.options.get("recompute_states", True) else ["none"]
    out = []
    rows = [(name, policy) for name in applicable_baselines(prep.graph, opts.tp_table) for policy in policies]
    for n, (name, policy) in enumerate(rows):
        left = deadline - time.perf_counter()
        if left <= 0:
            out.append(BaselineResult(name, None, "time limit reached before it started", recompute=policy))
            continue
        try:
            row = baseline_options(opts, name, policy, NO_MEMORY_LIMIT, left / (len(rows) - n))
            plan = solve_prepared(prep, row.with_changes(server=None))  # the rows are priced here
            plan = replace(plan, estimate=replace(plan.estimate, memory_limit_bytes=limit))
            out.append(BaselineResult(name, plan, recompute=policy))
        except ValueError as exc:
            out.append(BaselineResult(name, None, str(exc), recompute=policy))
    return out


def problem_request(prep: Prepared, plan: Plan, options: SolveOptions) -> dict[str, Any]:
    """The problem of ``prep`` with its ``"autoshard"`` section (``autoshard.assembly.request.PlanRequest``),
    ready for JSON: solved by ``autoshard serve`` (``POST /v1/plans``) it gives back ``plan``
    (unless an expert layout won the portfolio: ``plan.options["portfolio"]``). What
    ``autoshard solve --dump-problem`` writes."""
    from autoshard.assembly.from_graph import plan_request

    all_pins, allowed = pins_and_layout(prep.graph, options)
    # (A1) of autoshard.search.recompute_search: an `auto` plan solved without recomputation came from `none`'s problem
    recompute = "none" if plan.options.get("recompute_pruned") else options.recompute
    problem = to_problem(prep.graph, memory_limit=plan.estimate.memory_limit_bytes,
                         pins=resolve_pins(prep.graph, all_pins), ties=options.ties, labels=True,
                         recompute=recompute, allowed=allowed)
    share = PORTFOLIO_SHARE if options.baseline is None and not options.pins else 0.0
    return plan_request(prep.graph, problem, fingerprint=plan.fingerprint, options=plan.options,
                        timings=prep.timings,
                        solve={"time_limit": options.time_limit * (1 - share), "backend": options.backend,
                               "gap": PLAN_GAP})
