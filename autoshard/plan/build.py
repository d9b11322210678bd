"""Solution -> Plan: names, placements, the steps of every redistribution, the estimate.

The estimate is the solver's objective taken apart: compute (every node's
``compute_s`` at its chosen strategy, optimizer update included) plus, for
every edge, the planner's steps between the chosen placements, split into
collectives and local re-layouts. Their sum equals ``solver.evaluate`` of
the choice (a test checks it). Peak memory is ``evaluate``'s peak.

>>> # plan = plan_from_solution(graph, problem, solution, fingerprint=fp)
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

import torch

from costmodel.placements import Placement
from hw_profiles import HardwareProfile
from solver import Problem, evaluate
from solver.solution import Solution

import autoshard
from autoshard.graph.builder import StrategyGraph
from autoshard.graph.edges import EdgePricer
from autoshard.plan.format import Estimate, Fingerprint, Plan, PlanNode, Redistribution, SolverReport
from autoshard.trace import TracedGraph

__all__ = ["graph_hash", "make_fingerprint", "plan_from_solution", "placement_text", "memory_timeline"]


def placement_text(placements: tuple[Placement, ...] | None) -> str | None:
    """``S(0)R`` for a placement tuple (None stays None)."""
    return None if placements is None else "".join(str(p) for p in placements)


def graph_hash(traced: TracedGraph) -> str:
    """``sha256:<hex>`` of the joint graph's code and its inputs' names, shapes and
    dtypes: equal for the same model, inputs and torch, different otherwise."""
    h = hashlib.sha256(traced.graph_module.code.encode())
    for node in traced.graph_module.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("val")
            desc = node.meta.get("desc")
            h.update(f"{node.name}|{getattr(desc, 'target', '')}|{tuple(val.shape)}|{val.dtype}\n".encode())
    for fqn in sorted(traced.params):
        h.update(f"param {fqn}\n".encode())
    return "sha256:" + h.hexdigest()


def make_fingerprint(traced: TracedGraph, mesh_shape: tuple[int, ...], dim_names: tuple[str, ...],
                     profile: HardwareProfile) -> Fingerprint:
    """The fingerprint a plan for ``traced`` on this mesh and profile carries."""
    return Fingerprint(graph_hash(traced), tuple(mesh_shape), tuple(dim_names), profile.fingerprint,
                       torch.__version__.split("+")[0], autoshard.__version__)


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


def plan_from_solution(
    graph: StrategyGraph,
    problem: Problem,
    solution: Solution,
    *,
    fingerprint: Fingerprint,
    options: Mapping[str, Any] | None = None,
    timings: Mapping[str, float] | None = None,
) -> Plan:
    """The :class:`Plan` of a solved problem built from ``graph``."""
    choice = solution.choice
    pricer = EdgePricer(graph.mesh, graph.profile)
    compute = float(sum(n.compute_s[k] for n, k in zip(graph.nodes, choice)))
    comm = relayout = 0.0
    redistributions = []
    for e in graph.edges:
        u, v = graph.nodes[e.src], graph.nodes[e.dst]
        a, b = choice[e.src], choice[e.dst]
        if graph.matrices[e.matrix][a, b] == 0.0:
            continue
        src = u.strategies[a].output_placements[e.src_output]
        dst = _reader_placement(v, b, e.dst_input)
        steps = pricer.plan(e.tensor.shape, e.tensor.itemsize, src, dst)
        comm += steps.comm_s
        relayout += steps.local_s
        redistributions.append(Redistribution(
            tensor=u.name, to=v.name, input_index=e.dst_input, output_index=e.src_output,
            src=placement_text(src), dst=placement_text(dst), steps=steps.steps, cost_s=steps.cost_s,
        ))
    check = evaluate(problem, choice)
    params = {}
    for fqn, i in graph.params.items():
        text = placement_text(graph.nodes[i].strategies[choice[i]].output_placements[0])
        params[fqn] = text
        for alias in graph.param_aliases.get(fqn, ()):
            params[alias] = text
    nodes = tuple(
        PlanNode(n.name, n.target, tuple(placement_text(p) for p in n.strategies[k].output_placements),
                 tuple(placement_text(p) for p in n.strategies[k].input_placements))
        for n, k in zip(graph.nodes, choice) if n.kind == "op"
    )
    gap = None
    if solution.lower_bound is not None and solution.cost:
        gap = max(0.0, (solution.cost - solution.lower_bound) / solution.cost)
    reduced = solution.stats.get("reduction", {}).get("after", {}).get("variables")
    return Plan(
        fingerprint=fingerprint,
        params=params,
        inputs={name: placement_text(graph.nodes[i].strategies[choice[i]].output_placements[0])
                for name, i in graph.inputs.items()},
        buffers={name: placement_text(graph.nodes[i].strategies[choice[i]].output_placements[0])
                 for name, i in graph.buffers.items()},
        nodes=nodes,
        redistributions=tuple(redistributions),
        estimate=Estimate(step_s=compute + comm + relayout, compute_s=compute, comm_s=comm, relayout_s=relayout,
                          peak_memory_bytes=float(check.peak_memory_bytes), memory_limit_bytes=problem.memory_limit),
        solver=SolverReport(backend=solution.backend, status=solution.status.value, gap=gap,
                            seconds=round(solution.seconds, 4), variables=problem.num_nodes,
                            constraints=problem.num_edges, reduced_variables=reduced, timings=dict(timings or {})),
        param_aliases={k: tuple(v) for k, v in graph.param_aliases.items()},
        options=dict(options or {}),
        memory_timeline=memory_timeline(problem, choice),
    )


def _reader_placement(node: Any, k: int, position: int) -> tuple[Placement, ...] | None:
    """The placement node ``node`` (strategy ``k``) requires on input ``position``;
    sinks require their own (the parameter's) placement."""
    strategy = node.strategies[k]
    if node.kind == "op":
        return strategy.input_placements[position]
    return strategy.output_placements[0]
