"""What the reductions did to a problem: its size before and after and the
count of each reduction, reported by :func:`solver.reductions.reduce_problem`
and filled in by the passes (:mod:`solver.reduction_passes`) as they run.

>>> report = ReductionReport(GraphSize(3, 2, 9, 12, 0))
>>> report.count("dominated", 2); report.counts
{'dominated': 2}
"""

from __future__ import annotations

from dataclasses import dataclass, field

from solver.graph import WorkingGraph

__all__ = ["GraphSize", "ReductionReport", "graph_size"]


@dataclass(frozen=True, slots=True)
class GraphSize:
    """Size of a problem or of a reduced graph."""

    variables: int
    edges: int
    choices: int
    edge_pairs: int
    memory_terms: int

    def to_dict(self) -> dict[str, int]:
        return {
            "variables": self.variables,
            "edges": self.edges,
            "choices": self.choices,
            "edge_pairs": self.edge_pairs,
            "memory_terms": self.memory_terms,
        }


@dataclass(slots=True)
class ReductionReport:
    """What the reductions did: sizes before and after, and counts per reduction.

    ``seconds`` is the reduction time; ``compile_seconds`` the time spent
    before it compiling (or loading from numba's cache) the kernels, once per
    process, kept apart so that it is not counted as reduction time.
    """

    before: GraphSize
    after: GraphSize | None = None
    counts: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    compile_seconds: float = 0.0

    def count(self, key: str, amount: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + amount

    def to_dict(self) -> dict[str, object]:
        return {
            "before": self.before.to_dict(),
            "after": None if self.after is None else self.after.to_dict(),
            "counts": dict(sorted(self.counts.items())),
            "seconds": round(self.seconds, 4),
        }


def graph_size(graph: WorkingGraph) -> GraphSize:
    """The size of a working graph (variables, edges, choices, edge pairs, memory terms)."""
    return GraphSize(
        variables=len(graph.unary),
        edges=len(graph.edges),
        choices=graph.num_choices(),
        edge_pairs=sum([m.size for m in graph.edges.values()]),
        memory_terms=sum(map(len, graph.memory.values())),
    )
