"""The solver's problem of one solve: the strategy graph under the solve's pins, policy and memory limit.

A solve asks for the problem of its graph several times: ``recompute="auto"``
(``autoshard.search.recompute_search``) builds the problem under ``auto``, then
``none`` without a memory limit, then ``none`` under it; the fixed policies after
that when memory binds. Each build converts the graph (``to_problem``: policy
masks, validation) and reprices its gather edges (``gather_amortized_problem``):
0.1-0.2 s of CPU on a tiny model, three times per ``autoshard solve``.

Why a problem under another limit is the one already built: the memory limit is
the one field of the problem it sets. ``to_problem`` passes it through to
``Problem(memory_limit=...)`` and derives nothing from it (nodes, edges, ties and
pins depend on the graph, the pins, the baseline and the policy), and
``gather_amortized_problem`` keeps the problem's limit as given. So
``pinned_problem(g, o, L, p)`` and ``pinned_problem(g, o, None, p)`` with its limit
set to ``L`` hold the same numbers, and the solves of either give the same answer:
:class:`PinnedProblems` builds each policy's problem once and gives it under each
limit asked for (the same node and edge arrays, which the solver only reads).

>>> # problems = PinnedProblems(graph, options); problems(None, "none").memory_limit is None
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from autoshard.graph.builder import StrategyGraph
from autoshard.graph.problem import to_problem
from autoshard.plan.options import SolveOptions
from autoshard.search.baselines import baseline_allowed, baseline_pins
from autoshard.search.gather_objective import gather_amortized_problem
from autoshard.search.pins import resolve_pins

__all__ = ["PinnedProblems", "pinned_problem", "pins_and_layout"]


def pins_and_layout(graph: StrategyGraph, opts: SolveOptions) -> tuple[dict[str, str], Any]:
    """``(pins, allowed)`` of a solve under ``opts``: the baseline's pins under the user's, and the
    baseline's op layout (``baselines.baseline_allowed`` given its pins; None without a baseline)."""
    if opts.baseline is None:
        return dict(opts.pins), None
    layout = dict(baseline_pins(graph, opts.baseline, opts.tp_table))
    return {**layout, **opts.pins}, baseline_allowed(graph, opts.baseline, layout)


def pinned_problem(graph: StrategyGraph, opts: SolveOptions, memory_limit: float | None, recompute: str) -> Any:
    """The solver's problem of ``graph`` under ``opts``' pins (the baseline's under the user's),
    the baseline's op layout, ties and ``recompute``; parameter gathers priced as the runtime
    buckets them."""
    all_pins, allowed = pins_and_layout(graph, opts)
    problem = to_problem(graph, memory_limit=memory_limit, pins=resolve_pins(graph, all_pins), ties=opts.ties,
                         recompute=recompute, allowed=allowed)
    if getattr(graph, "bucket_bytes", 0) > 0:  # the runtime gathers parameters in buckets too
        problem = gather_amortized_problem(graph, problem)
    return problem


class PinnedProblems:
    """:func:`pinned_problem` of one graph and one solve's options, each policy's problem built once
    (module docstring: under another memory limit it is the same problem with that limit)."""

    def __init__(self, graph: StrategyGraph, opts: SolveOptions) -> None:
        self.graph = graph
        self.opts = opts
        self._built: dict[str, Any] = {}

    def __call__(self, memory_limit: float | None, recompute: str) -> Any:
        problem = self._built.get(recompute)
        if problem is None:
            problem = self._built[recompute] = pinned_problem(self.graph, self.opts, memory_limit, recompute)
        if problem.memory_limit == memory_limit:
            return problem
        return replace(problem, memory_limit=memory_limit, pins=dict(problem.pins))
