"""Solution -> Plan without torch: the one assembler of ``autoshard solve`` and the plan service.

The plan is assembled from an :class:`~autoshard.assembly.request.AssemblyGraph`
(what the strategy graph knows that the solver problem does not; torch-free, so
the plan service assembles the same plan: ``autoshard.assembly.request`` says why).

The estimate: compute (every node's cost at its chosen strategy, optimizer
update included; the problem's node cost is the graph's ``compute_s``), for
every edge with a non-zero cost at the chosen pair the planner's steps
between the chosen placements, split into collectives and local re-layouts,
with every gradient bucket's one collective in place of its members' steps
(``costmodel.buckets.grouping``; buckets filled in the order gradients are made, so
that the first one can be reduced while the backward goes on), and the
recomputation (a recomputed op's compute and its input redistributions once
more: ``recompute_s``). The step time is not their sum: the plan's schedule
(``autoshard.program.schedule``: where each collective is issued and waited) is
simulated on a compute and a communication stream (``costmodel.overlap``,
with the profile's contention), and only what the compute stream waits for
adds to it; the recomputation's input redistributions are counted as
exposed (they run just before the block's backward needs them). The prefetch
depth of parameter gathers and the cap of gather buckets (consecutive
parameter all-gathers issued as one, ``costmodel.buckets.grouping``) are the ones
whose simulated step is best among those whose peak memory fits the limit.
Peak memory is counted exactly for the chosen placements
(:mod:`autoshard.program.memory`: the redistributed copies and bucket
payloads that really happen, where the program charged a bound), plus what
prefetched and bucketed gathers hold early.

>>> import numpy as np
>>> from solver.problem import Node
>>> held, always = Node(np.zeros(1), np.array([8.0]), live=(0, 2)), Node(np.zeros(1), np.array([4.0]))
>>> memory_timeline(Problem(nodes=(held, always)), (0, 0))  # (time, bytes live)
((0, 12.0), (2, 4.0))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from costmodel.buckets.grouping import GATHER_CAPS, group_buckets, group_gathers
from costmodel.mesh import MeshSpec
from costmodel.overlap import StepSimulation
from hw_profiles import HardwareProfile
from solver import Problem
from solver.solution import Solution

from autoshard.assembly.buckets import EdgeRoutes, choose_gradient_buckets, reschedule
from autoshard.assembly.request import AssemblyGraph, AssemblyNode, Placements, placement_text
from autoshard.assembly.step_program import StepDataflow, memory_program, names_dataflow, step_dataflow
from autoshard.graph.states import RECOMPUTE, keep_choice, state_of
from autoshard.program.memory import exact_timeline, param_view_roots, peak_with_extra, timeline_peak
from autoshard.assembly.tidy_states import tidy_states
from autoshard.plan.program_section import program_section
from autoshard.program.reservation import plan_reservation
from autoshard.program.shared_copies import share_copies
from autoshard.program.actions import StepProgram, simulate_program
from autoshard.plan.format import Estimate, Fingerprint, Plan, PlanNode, Redistribution, SolverReport
from autoshard.program.schedule import (VIEW_OPS, Schedule, build_schedule, gather_blocks, leaf_gathers, leaf_views,
                                     module_block, prefetch_intervals, gathered_bytes)

__all__ = ["assemble_plan", "memory_timeline", "PREFETCH_DEPTHS", "BLOCK_GATHERS", "StepPricing", "step_pricing",
           "price_schedule"]

PREFETCH_DEPTHS = (0, 1, 2, 4, 8)
"""Prefetch depths the assembler tries (``autoshard.program.schedule``)."""

PREFETCH_GAIN = 1e-3
"""A deeper prefetch is taken only if it shortens the simulated step by this
fraction: holding gathered parameters longer for nothing is a cost too."""

BLOCK_GATHERS = -1
"""``price_schedule``'s gather cap for one gather bucket per module block, whatever its size."""

def memory_timeline(problem: Problem, choice: tuple[int, ...]) -> tuple[tuple[int, float], ...]:
    """(time, bytes live) at every time the live memory changes (nodes without
    ``live`` count everywhere)."""
    always = 0.0
    events: dict[int, float] = {}
    for node, k in zip(problem.nodes, choice):
        m = float(node.memory_bytes[k])
        if not m:
            continue
        if node.live is None:
            always += m
        elif node.live[0] < node.live[1]:
            events[node.live[0]] = events.get(node.live[0], 0.0) + m
            events[node.live[1]] = events.get(node.live[1], 0.0) - m
    out, level = [], always
    for t in sorted(events):
        level += events[t]
        out.append((t, level))
    return tuple(out) or ((0, always),)


@dataclass(frozen=True, slots=True)
class StepPricing:
    """What the assembler needs to simulate a plan's step, besides the plan's collectives."""

    node_names: tuple[str, ...]
    """The op nodes in order (schedule positions)."""
    op_compute_s: tuple[float, ...]
    """Compute of each op at its chosen strategy."""
    tail_s: float
    """The optimizer step (every non-op node's cost)."""
    times: tuple[int, ...]
    """Each position on the problem's time axis (``memory_timeline``), ``N + 1`` entries."""
    contention: float
    memory_limit: float | None
    view_candidates: tuple[tuple[str, str], ...] = ()
    """(view op, what it views) of every op that may be a leaf view (``autoshard.program.schedule.leaf_views``)."""
    regions: tuple[str, ...] = ()
    """The graph's module blocks (checkpoint regions, when recomputation is priced): the units of
    block-wise gather buckets (``autoshard.program.schedule.gather_blocks``)."""
    skew_s: float = 0.0
    """The ranks' drift at a collective (the profile's ``overlap.skew_s``, ``costmodel.overlap``)."""
    dataflow: StepDataflow | None = None
    """What the step program reads from the graph (``autoshard.assembly.step_program``); None: the op
    nodes by name alone (``names_dataflow``), which prices the same."""

    def program(self, schedule: Schedule, redistributions: Sequence[Redistribution],
                 gathers: Sequence[Any] = ()) -> StepProgram:
        """The step program of the plan under ``schedule``: what the runtime runs and the planner prices."""
        dataflow = self.dataflow or names_dataflow(self.node_names)
        return dataflow.program(schedule, redistributions, gathers)

    def simulate(self, schedule: Schedule, redistributions: Sequence[Redistribution], buckets: Sequence[Any],
                 gathers: Sequence[Any] = ()) -> StepSimulation:
        """The simulated step (``autoshard.program.actions.simulate_program``) of the plan's step program."""
        return simulate_program(self.program(schedule, redistributions, gathers), self.op_compute_s,
                                redistributions, buckets, gathers=gathers, tail_s=self.tail_s,
                                contention=self.contention, skew_s=self.skew_s)


def step_pricing(graph: AssemblyGraph, problem: Problem, choice: Sequence[int]) -> StepPricing:
    """:class:`StepPricing` of ``choice``."""
    ops = [i for i, n in enumerate(graph.nodes) if n.kind == "op"]
    compute = tuple(float(problem.nodes[i].cost[choice[i]]) for i in ops)
    tail = float(sum(problem.nodes[i].cost[k] for i, k in enumerate(choice))) - sum(compute)
    times = [problem.nodes[i].live[0] if problem.nodes[i].live is not None else 0 for i in ops]
    ends = [n.live[1] - 1 for n in problem.nodes if n.live is not None and n.live[1] > n.live[0]]
    times.append(max([t + 1 for t in times] + ends, default=0))
    reads: dict[int, list[int]] = {}
    for e in graph.edges:
        reads.setdefault(e.dst, []).append(e.src)
    views = tuple((graph.nodes[i].name, graph.nodes[reads[i][0]].name) for i in ops
                  if graph.nodes[i].target in VIEW_OPS and len(reads.get(i, ())) == 1)
    return StepPricing(tuple(graph.nodes[i].name for i in ops), compute, max(0.0, tail), tuple(times),
                       graph.profile.contention, problem.memory_limit, views,
                       tuple(sorted({n.region for n in graph.nodes if n.region})), graph.profile.skew_s,
                       step_dataflow(graph, choice))


def price_schedule(pricing: StepPricing, redistributions: Sequence[Redistribution], buckets: Sequence[Any],
                   timeline: Sequence[tuple[int, float]], *, mesh: MeshSpec, profile: HardwareProfile,
                   dtypes: Mapping[tuple[str, str, int], str], prefetch: int | None = None,
                   gather_cap: int | None = None, held: bool = False) -> tuple[Schedule, Any, float, tuple[Any, ...]]:
    """(schedule, simulation, peak memory, gather buckets) of the plan's
    collectives: with the given ``prefetch`` depth and ``gather_cap``, or the
    best of :data:`PREFETCH_DEPTHS` x ``costmodel.buckets.grouping.GATHER_CAPS` that
    fits the memory limit (the first, no prefetch and no gather buckets, when
    none fits), and of one gather bucket per module block (FSDP2's unit:
    ``gather_cap`` :data:`BLOCK_GATHERS`). A candidate replaces the best so far only when it shortens the
    simulated step by :data:`PREFETCH_GAIN`. ``held``: the timeline already holds the gathered copies
    (a plan priced with ``gather="fsdp2"``), so prefetched ones add nothing to it."""
    depths = PREFETCH_DEPTHS if prefetch is None else (prefetch,)
    caps = GATHER_CAPS if gather_cap is None else (gather_cap,)
    views = leaf_views(pricing.view_candidates, redistributions)
    leaf = [((r.tensor, r.to, r.input_index), r)
            for r in leaf_gathers(pricing.node_names, redistributions, buckets, views)]
    items = [(edge, dtypes.get(edge, ""), r.steps) for edge, r in leaf]
    best = None
    base_peak = max((b for _, b in timeline), default=0.0)
    if gather_cap is None:
        caps = (*caps, BLOCK_GATHERS)
    blocks = gather_blocks([e for e, _ in leaf], pricing.view_candidates, pricing.regions)
    for cap in caps:
        gathers = (group_gathers(items, mesh, profile, 2**62, blocks) if cap == BLOCK_GATHERS
                   else group_gathers(items, mesh, profile, cap))
        if cap and not gathers:
            continue
        for depth in depths:
            schedule = build_schedule(pricing.node_names, redistributions, buckets, prefetch=depth, gathers=gathers,
                                      leaf_views=views)
            sim = pricing.simulate(schedule, redistributions, buckets, gathers)
            if best is not None and not sim.step_s < best[1].step_s * (1 - PREFETCH_GAIN):
                continue  # not faster enough: its peak (the costly part) cannot change the choice
            extra = [(pricing.times[i], pricing.times[w], float(b))
                     for i, w, b in prefetch_intervals(schedule, redistributions, gathers, pricing.node_names)]
            peak = peak_with_extra(timeline, extra) if extra and not held else base_peak
            fits = pricing.memory_limit is None or peak <= pricing.memory_limit
            if best is None or fits:
                best = (schedule, sim, peak, gathers)
    if best is None:  # the one cap asked for made no bucket: none
        return price_schedule(pricing, redistributions, buckets, timeline, mesh=mesh, profile=profile, dtypes=dtypes,
                              prefetch=prefetch, gather_cap=0, held=held)
    return best


def assemble_plan(
    graph: AssemblyGraph,
    problem: Problem,
    solution: Solution,
    *,
    fingerprint: Fingerprint,
    options: Mapping[str, Any] | None = None,
    timings: Mapping[str, float] | None = None,
) -> Plan:
    """The :class:`Plan` of ``solution`` to ``problem``, which ``graph`` describes (:meth:`AssemblyGraph.check`).

    >>> # plan = assemble_plan(request.assembly, problem, solution, fingerprint=request.fingerprint)
    """
    # states that change nothing go back to keep, so that the plan lists only recomputation that matters
    choice = tidy_states(graph, problem, solution.choice)
    compute = float(sum(n.cost[k] for n, k in zip(problem.nodes, choice)))
    recomputed = {i for i, (n, k) in enumerate(zip(graph.nodes, choice))
                  if n.kind == "op" and state_of(n, k) == RECOMPUTE}
    # a recomputed op's cost holds its forward twice (autoshard.graph.recompute, C1)
    recompute_s = float(sum(problem.nodes[i].cost[choice[i]] for i in recomputed)) / 2
    compute -= recompute_s
    moved = _redistributions(graph, problem, choice, recomputed)
    redistributions, copies, dtypes, grads = moved.redistributions, moved.copies, moved.dtypes, moved.grads
    comm, relayout, recompute_comm = moved.comm_s, moved.relayout_s, moved.recompute_comm_s
    recompute_s += recompute_comm
    # a bucket issues one collective in place of its members' steps: the
    # estimate counts what runs (costmodel.buckets.grouping). Gradients join buckets
    # in the order the backward makes them (producer order), so a bucket is
    # complete, and issued, as early as possible; the cap is the one whose simulated step is best.
    grads.sort(key=lambda g: g[0])
    # the simulation runs every op at its problem cost (a recomputed op's holds its forward twice)
    pricing = step_pricing(graph, problem, choice)
    fsdp2 = (options or {}).get("gather") == "fsdp2"
    buckets = _gradient_buckets(graph, pricing, grads, redistributions, options or {})
    if buckets:
        members = {m for b in buckets for m in b.members}
        comm += sum(b.cost_s for b in buckets) - sum(g[4] for g in grads if g[1] in members)
    # a parameter's views alias its one gathered copy, as FSDP2 gathers it (priced as FSDP2 runs)
    roots = param_view_roots(graph, VIEW_OPS) if fsdp2 else None
    timeline, without = _timelines(graph, problem, choice, copies, buckets, bool(recomputed), roots,
                                   pricing.dataflow.memory_program())
    # priced as FSDP2 holds its gathers (autoshard.graph.copies): then run as FSDP2 does, a block ahead
    schedule, sim, peak, gathers = price_schedule(pricing, redistributions, buckets, timeline, mesh=graph.mesh,
                                                  profile=graph.profile, dtypes=dtypes, held=fsdp2,
                                                  **({"prefetch": 1, "gather_cap": BLOCK_GATHERS} if fsdp2 else {}))
    settled, delta, local_delta = moved.routes.settle(redistributions, buckets, gathers)
    if settled != redistributions:  # routed for a bucket that none took: the planner's route if faster
        resettled = reschedule(pricing, settled, buckets, gathers, schedule)
        if resettled[1].step_s < sim.step_s:
            redistributions, comm, relayout, (schedule, sim) = settled, comm + delta, relayout + local_delta, resettled
    if gathers:  # a gather bucket issues one collective in place of its members' steps
        gathered = {m for g in gathers for m in g.members}
        comm += sum(g.cost_s for g in gathers) - sum(
            s.cost_s for r in redistributions if (r.tensor, r.to, r.input_index) in gathered for s in r.steps)
    # the buckets' flat-buffer copies are local work on the compute stream (costmodel.buckets.grouping)
    relayout += sum(b.pack_s + b.unpack_s for b in (*buckets, *gathers))
    step = sim.step_s + recompute_comm
    exposed = max(0.0, step - compute - relayout - recompute_s)
    reserved = _reserved(graph, problem, choice, copies, buckets, pricing, schedule, redistributions, gathers,
                         options or {}, roots)

    def chosen(i: int) -> str | None:
        return placement_text(graph.nodes[i].strategies[choice[i]].output_placements[0])

    params = {}
    for fqn, i in graph.params.items():
        params[fqn] = text = chosen(i)
        for alias in graph.param_aliases.get(fqn, ()):
            params[alias] = text
    nodes = _plan_nodes(graph, choice)
    gap = None
    if solution.lower_bound is not None and solution.cost:
        gap = max(0.0, (solution.cost - solution.lower_bound) / solution.cost)
    reduced = solution.stats.get("reduction", {}).get("after", {}).get("variables")
    return Plan(
        fingerprint=fingerprint,
        params=params,
        inputs={name: chosen(i) for name, i in graph.inputs.items()},
        buffers={name: chosen(i) for name, i in graph.buffers.items()},
        nodes=nodes,
        redistributions=tuple(redistributions),
        estimate=Estimate(step_s=step, compute_s=compute, comm_s=comm, relayout_s=relayout,
                          peak_memory_bytes=peak, memory_limit_bytes=problem.memory_limit,
                          recompute_s=recompute_s, peak_without_recompute_bytes=without, exposed_comm_s=exposed,
                          reserved_bytes=reserved),
        solver=SolverReport(backend=solution.backend, status=solution.status.value, gap=gap,
                            seconds=round(solution.seconds, 4), problem_nodes=problem.num_nodes,
                            problem_edges=problem.num_edges, reduced_nodes=reduced, timings=dict(timings or {})),
        param_aliases={k: tuple(v) for k, v in graph.param_aliases.items()},
        options=dict(options or {}),
        memory_timeline=timeline,
        buckets=buckets,
        constants={name: chosen(i) for name, i in graph.constants.items()},
        recompute=tuple(graph.nodes[i].name for i in sorted(recomputed)),
        gather_buckets=gathers,
        schedule=schedule,
        program=program_section(pricing.program(schedule, redistributions, gathers)),
    )


def _plan_nodes(graph: AssemblyGraph, choice: Sequence[int]) -> tuple[PlanNode, ...]:
    """The plan's op nodes: each one's chosen placements, region and exchange (None: a local op)."""
    return tuple(
        PlanNode(n.name, n.target, tuple(placement_text(p) for p in n.strategies[k].output_placements),
                 tuple(placement_text(p) for p in n.strategies[k].input_placements), n.region,
                 n.strategies[k].exchange)
        for n, k in zip(graph.nodes, choice) if n.kind == "op"
    )


def _reserved(graph: AssemblyGraph, problem: Problem, choice: Sequence[int], copies: Sequence[Any],
              buckets: Sequence[Any], pricing: StepPricing, schedule: Schedule,
              redistributions: Sequence[Redistribution], gathers: Sequence[Any], options: Mapping[str, Any],
              roots: Mapping[int, int] | None) -> float | None:
    """What the CUDA caching allocator reserves for the plan (``autoshard.program.reservation``);
    None on a CPU profile (CPU tensors come from the system allocator: nothing is cached).
    ``roots``: the parameter views (:func:`param_view_roots`) when priced as FSDP2 runs, else None."""
    if graph.profile.device_type == "cpu":
        return None
    extra, flat = (), ()
    fsdp2 = roots is not None
    if fsdp2:
        flat = _flat_gathers(graph, schedule, gathers, roots, pricing.times, redistributions)
    else:
        extra = [(pricing.times[i], pricing.times[w], float(b))
                 for i, w, b in prefetch_intervals(schedule, redistributions, gathers, pricing.node_names)]
    peaks = plan_reservation(graph, problem, choice, copies, buckets, program=pricing.dataflow.memory_program(),
                             mixed_precision=bool(options.get("mixed_precision")),
                             extra=extra,
                             flat_gathers=flat, param_views=roots,
                             fsdp2_reductions=fsdp2, expandable_segments=bool(options.get("expandable_segments")),
                             capacity_bytes=graph.profile.device.memory_bytes)
    return float(peaks.reserved_bytes)


def _flat_gathers(graph: AssemblyGraph, schedule: Schedule, gathers: Sequence[Any], roots: Mapping[int, int],
                  times: Sequence[int], redistributions: Sequence[Redistribution]) -> list[tuple[int, int, float]]:
    """(issue time, wait time, bytes) of each unit's flat all-gather output as FSDP2 makes it: the
    unit's parameters gathered once each (a parameter read through several views is one)."""
    index = {n.name: i for i, n in enumerate(graph.nodes)}
    by_edge = {(r.tensor, r.to, r.input_index): r for r in redistributions}
    out = []
    for item in schedule.items:
        if item.gather is None:
            continue
        sizes: dict[Any, float] = {}
        for member in gathers[item.gather].members:
            root = roots.get(index.get(member[0], -1), member[0])
            sizes[root] = max(sizes.get(root, 0.0), float(gathered_bytes(by_edge[member])))
        out.append((times[item.issue], times[item.wait], sum(sizes.values())))
    return out


def _timelines(graph: AssemblyGraph, problem: Problem, choice: Sequence[int], copies: Sequence[Any],
               buckets: Sequence[Any], recomputed: bool, shared: Mapping[int, int] | None, program: StepProgram
               ) -> tuple[tuple[tuple[int, float], ...], float | None]:
    """The plan's memory timeline, and the peak of the same placements with nothing recomputed
    (None when nothing is); ``shared`` (the parameter views, :func:`param_view_roots`): counted as
    FSDP2 runs (``autoshard.program.memory``: a parameter gathered once per pass whichever views
    of it are read, FSDP2's reductions); None: as autoshard's runtime runs. ``program``: the step
    program of ``choice`` whose lives the timeline counts."""
    fsdp2 = shared is not None
    timeline = exact_timeline(graph, problem, choice, copies, buckets, program=program,
                              param_views=shared, fsdp2_reductions=fsdp2)
    if not recomputed:
        return timeline, None
    keep = keep_choice(graph, choice)
    return timeline, timeline_peak(exact_timeline(graph, problem, keep, copies, buckets, recomputed=False,
                                                  program=memory_program(graph, keep), param_views=shared,
                                                  fsdp2_reductions=fsdp2))


def _gradient_buckets(graph: AssemblyGraph, pricing: StepPricing, grads: Sequence[tuple[Any, ...]],
                      redistributions: Sequence[Redistribution], options: Mapping[str, Any]) -> tuple[Any, ...]:
    """The plan's gradient buckets: the cap whose simulated step is best, or, priced as FSDP2
    runs (``gather="fsdp2"``), one reduction per unit in its reduce dtype (``costmodel.buckets.grouping``)."""
    if options.get("gather") == "fsdp2":
        units = {g[1]: module_block(g[1].split(":", 1)[-1], pricing.regions) for g in grads}
        return group_buckets([g[1:4] for g in grads], graph.mesh, graph.profile, units=units,
                             reduce_dtype=options.get("reduce_dtype"))
    buckets, _ = choose_gradient_buckets([g[1:4] for g in grads], pricing, redistributions, mesh=graph.mesh,
                                         profile=graph.profile, cap=graph.bucket_bytes)
    return buckets


@dataclass(frozen=True, slots=True)
class _Moved:
    """What the chosen placements move along the graph's edges (:func:`_redistributions`)."""

    redistributions: list[Redistribution]
    copies: list[tuple[int, Any, bool]]
    """(edge, reader placement, reader recomputed): the copies a redistribution makes."""
    dtypes: dict[tuple[str, str, int], str]
    grads: list[tuple[int, str, str, tuple[Any, ...], float]]
    """(producer, sink, dtype, steps, comm_s) of gradient redistributions, for the buckets."""
    comm_s: float
    relayout_s: float
    recompute_comm_s: float
    """The recomputation's input redistributions again (not in the simulated schedule)."""
    routes: EdgeRoutes


def _redistributions(graph: AssemblyGraph, problem: Problem, choice: Sequence[int], recomputed: set[int]) -> _Moved:
    """The planner's steps on every edge whose chosen placements differ."""
    comm = relayout = recompute_comm = 0.0
    redistributions: list[Redistribution] = []
    copies: list[tuple[int, Any, bool]] = []
    dtypes: dict[tuple[str, str, int], str] = {}
    grads: list[tuple[int, str, str, tuple[Any, ...], float]] = []
    routes = EdgeRoutes(graph)  # bucketed edges take the route they were priced at (not the planner's alone)
    for j, (e, pe) in enumerate(zip(graph.edges, problem.edges)):
        a, b = choice[e.src], choice[e.dst]
        u, v = graph.nodes[e.src], graph.nodes[e.dst]
        if v.kind == "memory":
            # an edge into a memory-only node (an exact copy node, autoshard.graph.tied_memory) only ties
            # its choice: no tensor moves; the copy it stands for is the producer -> reader edge's
            continue
        src = u.strategies[a].output_placements[e.src_output]
        dst = _reader_placement(v, b, e.dst_input)
        # a free edge needs nothing only when the placements agree: a bucketed gradient's
        # amortised cost can round to 0 while its reduction must still run
        if pe.cost[a, b] == 0.0 and (dst is None or placement_text(src) == placement_text(dst)):
            continue
        steps = routes.route(j, src, dst)
        comm += steps.comm_s
        relayout += steps.local_s
        if e.dst in recomputed:  # the reader's input is redistributed again for the recomputation (C2)
            recompute_comm += steps.cost_s
        if steps.steps and src != dst:
            copies.append((j, dst, e.dst in recomputed))
        redistributions.append(Redistribution(
            tensor=u.name, to=v.name, input_index=e.dst_input, output_index=e.src_output,
            src=placement_text(src), dst=placement_text(dst), steps=steps.steps, cost_s=steps.cost_s,
        ))
        dtypes[(u.name, v.name, e.dst_input)] = e.dtype
        if v.kind == "grad":
            grads.append((e.src, v.name, e.dtype, steps.steps, steps.comm_s))
    # a later reader of the same copy reads it instead of redistributing again (autoshard.program.shared_copies)
    times = {i: p.live[0] for i, (n, p) in enumerate(zip(graph.nodes, problem.nodes)) if n.kind == "op" and p.live}
    redistributions, saved_comm, saved_local = share_copies(graph, redistributions, times, recomputed)
    return _Moved(redistributions, copies, dtypes, grads, comm - saved_comm, relayout - saved_local, recompute_comm,
                  routes)


def _reader_placement(node: AssemblyNode, k: int, position: int) -> Placements | None:
    """The placement node ``node`` (strategy ``k``) requires on input ``position``;
    sinks require their own (the parameter's) placement."""
    strategy = node.strategies[k]
    if node.kind == "op":
        return strategy.input_placements[position]
    return strategy.output_placements[0]
