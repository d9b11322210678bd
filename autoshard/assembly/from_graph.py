"""Solution -> Plan for a traced model: what the assembler needs (the fingerprint: ``autoshard.plan.fingerprint``).

The plan itself is put together by :mod:`autoshard.assembly.assemble` (torch-free,
shared with the plan service): :func:`plan_from_solution` hands it the
strategy graph's :func:`assembly_graph`; :func:`plan_request` writes the same
as JSON beside the problem (``autoshard solve --dump-problem``, ``POST
/v1/plans``). The estimate is the solver's objective taken apart (compute,
collectives, local re-layouts; gradient buckets as they run); see there.

>>> # plan = plan_from_solution(graph, problem, solution, fingerprint=fp)
"""

from __future__ import annotations

from typing import Any, Mapping


from solver import Problem
from solver.solution import Solution

from autoshard.graph.builder import StrategyGraph
from autoshard.assembly.assemble import assemble_plan, memory_timeline
from autoshard.assembly.request import AssemblyEdge, AssemblyGraph, AssemblyNode, PlanRequest, placement_text
from autoshard.plan.format import Fingerprint, Plan
from autoshard.assembly.graph_memo import GraphMemo

__all__ = ["plan_from_solution", "assembly_graph", "plan_request",
           "placement_text", "memory_timeline"]


def plan_from_solution(
    graph: StrategyGraph,
    problem: Problem,
    solution: Solution,
    *,
    fingerprint: Fingerprint,
    options: Mapping[str, Any] | None = None,
    timings: Mapping[str, float] | None = None,
) -> Plan:
    """The :class:`Plan` of a solved problem built from ``graph`` (``problem`` is
    ``to_problem(graph, ...)``): :func:`autoshard.assembly.assemble.assemble_plan` on
    the graph's :func:`assembly_graph`, as the plan service does."""
    return assemble_plan(assembly_graph(graph), problem, solution, fingerprint=fingerprint, options=options,
                         timings=timings)


_ASSEMBLY_GRAPHS = 2
"""Strategy graphs whose assembly graphs are kept (each held alive with its graph): one call assembles
the plans of one graph many times (the search's, every overlap round's, each expert baseline's and
their rounds': 7-10 on the 8B, 0.15 s each to build)."""

_ASSEMBLY: GraphMemo[AssemblyGraph] = GraphMemo(_ASSEMBLY_GRAPHS)


def assembly_graph(graph: StrategyGraph) -> AssemblyGraph:
    """What plan assembly needs from ``graph``, sharing its objects (no copies), made once per
    graph (kept for the last :data:`_ASSEMBLY_GRAPHS` graphs, by identity: a strategy graph is
    frozen). Nodes of equal signature share one strategy list (equal by the signature's
    contract), so :meth:`AssemblyGraph.to_dict` writes each list once."""
    return _ASSEMBLY.get(graph, _assembly_graph)


def _assembly_graph(graph: StrategyGraph) -> AssemblyGraph:
    lists: dict[str, Any] = {}
    regions = [r.name for r in getattr(graph, "regions", ())]
    nodes = tuple(AssemblyNode(n.name, n.kind, n.target, lists.setdefault(n.signature, n.strategies), n.states,
                               regions[n.region] if n.region >= 0 else None)
                  for n in graph.nodes)
    live = getattr(graph, "copy_live", ()) or ((),) * len(graph.edges)
    live_rc = getattr(graph, "copy_live_recomputed", ()) or ((),) * len(graph.edges)
    edges = tuple(AssemblyEdge(e.src, e.dst, e.src_output, e.dst_input, tuple(e.tensor.shape), e.tensor.itemsize,
                               str(e.tensor.dtype), live[j], live_rc[j])
                  for j, e in enumerate(graph.edges))
    return AssemblyGraph(graph.mesh, graph.profile, nodes, edges, dict(graph.params), dict(graph.inputs),
                         dict(graph.buffers), {k: tuple(v) for k, v in graph.param_aliases.items()},
                         getattr(graph, "bucket_bytes", 0), dict(getattr(graph, "constants", {})))


def plan_request(
    graph: StrategyGraph,
    problem: Problem,
    *,
    fingerprint: Fingerprint,
    options: Mapping[str, Any],
    timings: Mapping[str, float],
    solve: Mapping[str, Any],
) -> dict[str, Any]:
    """``problem``'s JSON with the ``"autoshard"`` section (:class:`PlanRequest`)
    that turns its solution into a plan without torch: what ``autoshard solve
    --dump-problem`` writes and ``POST /v1/plans`` takes."""
    data = problem.to_dict()
    data["autoshard"] = PlanRequest(fingerprint, assembly_graph(graph), dict(options), dict(timings),
                                    dict(solve)).to_dict()
    return data
