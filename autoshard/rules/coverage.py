"""``autoshard coverage MODULE:FACTORY``: which of a model's ops have sharding rules.

Traces the model's joint forward+backward graph (:mod:`autoshard.trace`),
lists every distinct ATen op with its node count and the rule family that
covers it (``NO RULE`` when none does: such an op can only run replicated),
and prints the share of ops and of op nodes covered.

``MODULE:FACTORY`` names a function ``FACTORY(**overrides) -> (model,
example_inputs)`` whose model returns the scalar loss or an output with a
``loss`` (see ``examples/models/factory.py``, ``examples/models/hf.py``); ``--kwargs`` passes overrides as a JSON
object. The current directory and ``--path DIR`` folders are importable
(:mod:`autoshard.model_spec`).

    $ autoshard coverage examples.models.llama3:tiny --kwargs '{"n_layers": 1}'

>>> from examples.models import mlp
>>> from autoshard.trace import trace_joint
>>> class OnlyMatmul:
...     def rule_for(self, op):
...         return type("Rule", (), {"family": "matmul"}) if "mm" in str(op) else None
>>> report = compute_coverage(trace_joint(*mlp.tiny()), OnlyMatmul())
>>> report.covered_ops, report.total_ops
(2, 10)
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from autoshard.model_spec import parse_kwargs

if TYPE_CHECKING:  # torch is imported only when the command runs: `autoshard --help` stays fast
    from torch import nn

    from autoshard.trace import TracedGraph

__all__ = ["OpCoverage", "CoverageReport", "load_example", "compute_coverage", "add_arguments", "run"]

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


def load_example(spec: str, overrides: Mapping[str, Any] | None = None, *,
                 paths: Sequence[str] = ()) -> tuple[nn.Module, tuple | dict]:
    """Import ``MODULE:FACTORY`` (also from ``paths``, see
    :mod:`autoshard.model_spec`) and call ``FACTORY(**overrides)``.

    The example inputs are a tuple of positional tensors or a dict of keyword
    tensors (``examples.models.hf``).

    Every failure (bad spec, missing module or factory, a factory that raises
    or returns something else) is a ``ValueError`` with a one-line message.

    >>> model, inputs = load_example("examples.models.mlp:tiny", {"device": "meta"})
    >>> len(inputs)
    2
    """
    from autoshard.model_spec import load_model

    return load_model(spec, overrides, paths=paths)


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


def print_report(report: CoverageReport, *, file: Any = None) -> None:
    """Print the op table and the coverage line with rich."""
    from rich.console import Console
    from rich.table import Table

    out = file or sys.stdout
    console = Console(file=out, width=None if out.isatty() else 120, highlight=False)
    table = Table(title=f"{report.model}: {report.nodes} nodes, traced in {report.trace_s:.1f} s")
    table.add_column("op")
    table.add_column("count", justify="right")
    table.add_column("rule family")
    for row in report.ops:
        family = row.family if row.covered else f"[bold red]{row.family}[/]"
        table.add_row(row.op, str(row.count), family)
    console.print(table)
    console.print(
        f"coverage: {report.covered_ops}/{report.total_ops} ops ({report.percent:.1f}%), "
        f"{report.covered_nodes}/{report.op_nodes} op nodes"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``autoshard coverage``."""
    from autoshard.model_spec import add_path_argument

    parser.add_argument("model", metavar="MODULE:FACTORY", help="e.g. examples.models.llama3:tiny")
    parser.add_argument("--kwargs", default="{}", metavar="JSON", help="factory overrides as a JSON object")
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    parser.add_argument("--dtensor-fallback", action="store_true",
                        help="count ops served by rules derived from DTensor as covered")
    add_path_argument(parser)


def load_registry(*, dtensor_fallback: bool = False) -> RuleLookup:
    """The rule registry to check against (tests replace this function)."""
    from autoshard.rules import load_rules

    return load_rules(dtensor_fallback=dtensor_fallback)


def run(args: argparse.Namespace) -> int:
    """Run ``autoshard coverage``: 0 on success, 1 if the registry cannot load.

    Bad input (spec, kwargs, factory, untraceable model) raises ``ValueError``,
    which the CLI prints as one line with exit code 2.
    """
    from autoshard.model_spec import import_factory, split_spec

    # the spec, the overrides and the module are checked before torch is imported
    paths = getattr(args, "path", [])
    split_spec(args.model)
    overrides = parse_kwargs(args.kwargs)
    import_factory(args.model, paths)
    from autoshard.trace import trace_joint

    model, inputs = load_example(args.model, overrides, paths=paths)
    start = time.perf_counter()
    try:
        traced = trace_joint(model, inputs)
    except (ValueError, TypeError, RuntimeError) as exc:  # a model that does not trace is the user's input, not our crash
        raise ValueError(f"tracing {args.model} failed: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None
    trace_s = time.perf_counter() - start
    try:
        registry = load_registry(dtensor_fallback=getattr(args, "dtensor_fallback", False))
    except ImportError as exc:  # a rules family missing from this checkout: our fault, not the user's
        print(f"autoshard coverage: error: cannot load the rule registry: {exc}", file=sys.stderr)
        return 1
    # the table says which ops lack rules; the registry's per-op warnings would repeat it
    rules_log = logging.getLogger("autoshard.rules")
    level = rules_log.level
    rules_log.setLevel(logging.ERROR)
    try:
        report = compute_coverage(traced, registry, model=args.model, trace_s=trace_s)
    finally:
        rules_log.setLevel(level)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print_report(report)
    return 0
