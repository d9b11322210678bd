"""Which of a traced model's ops have sharding rules: the report of ``autoshard coverage``.

:func:`compute_coverage` lists every distinct ATen op of a joint graph
(:mod:`autoshard.trace`) with its node count and the rule family that covers
it (``NO RULE`` when none does: such an op can only run replicated), and the
share of ops and of op nodes covered. The command that prints it is
:mod:`autoshard.cli.coverage`.

>>> from examples.models import mlp
>>> from autoshard.trace import trace_joint
>>> class OnlyMatmul:
...     def rule_for(self, op):
...         return type("Rule", (), {"family": "matmul"}) if "mm" in str(op) else None
>>> report = compute_coverage(trace_joint(*mlp.tiny()), OnlyMatmul())
>>> report.covered_ops, report.total_ops
(2, 11)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # for annotations: compute_coverage reads a graph traced elsewhere
    from autoshard.trace import TracedGraph

__all__ = ["NO_RULE", "FALLBACK", "RuleLookup", "OpCoverage", "CoverageReport", "compute_coverage"]

NO_RULE = "NO RULE"
FALLBACK = "dtensor fallback"


class RuleLookup(Protocol):
    """What coverage needs from a rule registry (``autoshard.rules.RuleRegistry`` fits)."""

    def rule_for(self, op: Any) -> Any: ...


@dataclass(frozen=True, slots=True)
class OpCoverage:
    """One distinct op of a traced graph."""

    op: str
    """The op's name, ``aten.mm.default``."""

    count: int
    """Number of nodes calling it."""

    family: str
    """The covering rule family, ``dtensor fallback``, or ``NO RULE``."""

    @property
    def covered(self) -> bool:
        """Whether some rule covers the op."""
        return self.family != NO_RULE


@dataclass(frozen=True, slots=True)
class CoverageReport:
    """Coverage of one model's joint graph."""

    model: str
    """What was traced (``MODULE:FACTORY`` or a description)."""

    nodes: int
    """``call_function`` nodes in the joint graph (tuple accesses included)."""

    trace_s: float
    """Seconds spent tracing."""

    ops: tuple[OpCoverage, ...]
    """Every distinct op, sorted by name."""

    @property
    def total_ops(self) -> int:
        """Distinct ops."""
        return len(self.ops)

    @property
    def covered_ops(self) -> int:
        """Distinct ops with a rule."""
        return sum(op.covered for op in self.ops)

    @property
    def op_nodes(self) -> int:
        """Nodes calling an ATen op."""
        return sum(op.count for op in self.ops)

    @property
    def covered_nodes(self) -> int:
        """Nodes calling an op with a rule."""
        return sum(op.count for op in self.ops if op.covered)

    @property
    def percent(self) -> float:
        """Distinct ops covered, in percent (100 for a graph without ops)."""
        return 100.0 * self.covered_ops / self.total_ops if self.ops else 100.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (what ``--json`` prints)."""
        return {
            "model": self.model, "nodes": self.nodes, "trace_s": round(self.trace_s, 3),
            "ops": [{"op": o.op, "count": o.count, "family": o.family} for o in self.ops],
            "covered_ops": self.covered_ops, "total_ops": self.total_ops,
            "covered_nodes": self.covered_nodes, "op_nodes": self.op_nodes,
            "percent": round(self.percent, 2),
        }


def compute_coverage(traced: TracedGraph, registry: RuleLookup, *, model: str = "", trace_s: float = 0.0) -> CoverageReport:
    """Match every distinct op of ``traced`` against ``registry``.

    When the registry has a DTensor fallback (``fallback_uses``), an op with
    no rule of its own is enumerated once on a 2-device mesh; if the fallback
    served it, its family reads ``dtensor fallback``.
    """
    from autoshard.trace import traced_ops

    examples = {}
    for info in traced.nodes.values():
        examples.setdefault(info.op, info)
    rows = []
    for op, count in traced_ops(traced).items():
        rule = registry.rule_for(op)
        family = rule.family if rule is not None else _fallback_family(registry, examples[op])
        rows.append(OpCoverage(op=_op_name(op), count=count, family=family))
    rows.sort(key=lambda row: row.op)
    return CoverageReport(model=model, nodes=len(traced.nodes), trace_s=trace_s, ops=tuple(rows))


def _op_name(op: Any) -> str:
    """``aten.mm.default`` for ``torch.ops.aten.mm.default``."""
    return f"{op.namespace}.{op._opname}.{op._overloadname}"


def _fallback_family(registry: RuleLookup, info: Any) -> str:
    """``dtensor fallback`` if the registry's fallback serves this call, else ``NO RULE``."""
    uses = getattr(registry, "fallback_uses", None)
    if uses is None:
        return NO_RULE
    before = uses.get(info.op, 0)
    try:
        registry.strategies(info.op, info.args, info.kwargs, (2,), out_meta=info.outputs)
    except Exception:  # a fallback that cannot handle the call does not cover the op
        return NO_RULE
    return FALLBACK if uses.get(info.op, 0) > before else NO_RULE
