"""What ``prepare`` hands every solve of one model on one mesh: the trace, the strategy graph,
the plan fingerprint, the stages' timings and the options the graph was built with
(:func:`autoshard.search.solve.prepare`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from autoshard.graph.strategy_graph import StrategyGraph
from autoshard.plan.format import Fingerprint
from autoshard.trace import TracedGraph

__all__ = ["Prepared"]


@dataclass(frozen=True, slots=True)
class Prepared:
    """A traced model and its strategy graph on one mesh and profile."""

    traced: TracedGraph
    graph: StrategyGraph
    fingerprint: Fingerprint
    timings: Mapping[str, float] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
