"""``autoshard coverage MODULE:FACTORY``: which of a model's ops have sharding rules.

Traces the model's joint forward+backward graph (:mod:`autoshard.trace`) and
prints the table of :func:`autoshard.validation.coverage.compute_coverage`: every
distinct ATen op with its node count and the rule family that covers it
(``NO RULE`` when none does: such an op can only run replicated), and the
share of ops and of op nodes covered.

``MODULE:FACTORY`` names a function ``FACTORY(**overrides) -> (model,
example_inputs)`` whose model returns the scalar loss or an output with a
``loss`` (see ``examples/models/factory.py``, ``examples/models/hf.py``); ``--kwargs`` passes overrides as a JSON
object. The current directory and ``--path DIR`` folders are importable
(:mod:`autoshard.trace.model_spec`).

    $ autoshard coverage examples.models.llama3:tiny --kwargs '{"n_layers": 1}'

>>> import argparse
>>> p = argparse.ArgumentParser(); add_arguments(p)
>>> p.parse_args(["examples.models.mlp:tiny", "--json"]).json
True
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import TYPE_CHECKING, Any

from autoshard.trace.model_spec import parse_kwargs

if TYPE_CHECKING:  # the rules import torch: only when the command runs, so `autoshard coverage --help` stays fast
    from autoshard.validation.coverage import CoverageReport, RuleLookup

__all__ = ["print_report", "add_arguments", "load_registry", "run"]


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
    from autoshard.trace.model_spec import add_path_argument

    parser.add_argument("model", metavar="MODULE:FACTORY", help="e.g. examples.models.llama3:tiny")
    parser.add_argument("--kwargs", default="{}", metavar="JSON", help="factory overrides as a JSON object")
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    parser.add_argument("--dtensor-fallback", action="store_true",
                        help="count ops served by rules derived from DTensor as covered")
    add_path_argument(parser)


def load_registry(*, dtensor_fallback: bool = False) -> RuleLookup:
    """The rule registry to check against (tests replace this function)."""
    from autoshard.rules import load_rules
    from autoshard.validation.validator import check_derived_rule

    return load_rules(dtensor_fallback=check_derived_rule if dtensor_fallback else None)


def run(args: argparse.Namespace) -> int:
    """Run ``autoshard coverage``: 0 on success, 1 if the registry cannot load.

    Bad input (spec, kwargs, factory, untraceable model) raises ``ValueError``,
    which the CLI prints as one line with exit code 2.
    """
    from autoshard.trace.model_spec import import_factory, load_model, split_spec

    # the spec, the overrides and the module are checked before torch is imported
    paths = getattr(args, "path", [])
    split_spec(args.model)
    overrides = parse_kwargs(args.kwargs)
    import_factory(args.model, paths)
    from autoshard.validation.coverage import compute_coverage
    from autoshard.trace import trace_joint

    model, inputs = load_model(args.model, overrides, paths=paths)
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
