"""``autoshard validate-rules``: its flags, checked before torch is imported,
and the tables of the rule validation (:mod:`autoshard.validation`).

The validator itself (``autoshard.validation.validator``) imports torch and every
rule; this module declares and checks the flags, so ``--help`` and a
mistyped flag answer at once, then runs the validator, or with ``--opinfo``
the OpInfo sweep (:mod:`autoshard.validation.opinfo_sweep`) with a progress
display on stderr and its summary on stdout.

The same command without the console script: ``python -m autoshard.cli.validate_rules``
(or ``python -m autoshard.cli validate-rules``).

>>> # autoshard validate-rules --opinfo --opinfo-ops addmm --max-samples 1
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import Any, Sequence

__all__ = ["add_arguments", "run", "run_opinfo", "sweep_with_progress"]

# far beyond any real use (a rule has at most a few hundred strategies on the
# meshes checked), low enough that a typo cannot start an hours-long run
MAX_CASES = 1000
MAX_STRATEGIES = 100_000
MAX_FAILURES = 10_000
MAX_SAMPLES = 1000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``autoshard validate-rules`` / ``python -m autoshard.cli.validate_rules``."""
    parser.add_argument("--op", action="append", default=[], metavar="NAME",
                        help="op to check (aten.mm.default, mm, or a glob); repeatable; default all")
    parser.add_argument("--family", action="append", default=[], metavar="NAME",
                        help="only rules of this family; repeatable")
    parser.add_argument("--cases", type=int, default=5, help="mesh cases per rule (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default %(default)s)")
    parser.add_argument("--max-strategies", type=int, default=40,
                        help="strategies checked per sample (default %(default)s)")
    parser.add_argument("--failures", type=int, default=3,
                        help="failures shown per failing rule (default %(default)s)")
    parser.add_argument("--opinfo", action="store_true",
                        help="check the rules on the ATen calls of PyTorch's OpInfo samples instead "
                             "(every CPU dtype; meshes 2, 3, 4, 2x2; even, uneven and strided shards)")
    parser.add_argument("--opinfo-ops", action="append", default=[], metavar="NAME",
                        help="with --opinfo: only these OpInfos (name or glob); repeatable; default all")
    parser.add_argument("--max-samples", type=int, default=3,
                        help="with --opinfo: samples per OpInfo and dtype (default %(default)s)")


def check_arguments(args: argparse.Namespace) -> None:
    """One ``ValueError`` naming the first bad flag."""
    for flag, value, low, high in (("--cases", args.cases, 1, MAX_CASES),
                                   ("--max-strategies", args.max_strategies, 1, MAX_STRATEGIES),
                                   ("--failures", args.failures, 0, MAX_FAILURES),
                                   ("--max-samples", args.max_samples, 1, MAX_SAMPLES)):
        if not low <= value <= high:
            raise ValueError(f"{flag}: expected {low}..{high}, got {value}")


def run(args: argparse.Namespace) -> int:
    """Validate the selected rules, print the table; 1 if any failed."""
    check_arguments(args)
    if args.opinfo_ops and not args.opinfo:
        raise ValueError("--opinfo-ops: only with --opinfo")
    if args.opinfo:
        return run_opinfo(args)
    return _run_checked(args)


def _run_checked(args: argparse.Namespace) -> int:
    """Validate the selected rules (flags checked), print the table; 1 if any failed."""
    from autoshard.rules import load_rules
    from autoshard.validation.validator import format_reports, select_ops, unavailable_named, validate_registry

    registry = load_rules()
    ops = select_ops(registry, args.op, args.family)
    reports = validate_registry(registry, ops, cases=args.cases, seed=args.seed, max_strategies=args.max_strategies)
    print(format_reports(reports, show_failures=args.failures))
    unavailable = unavailable_named(registry, args.op, args.family)
    if unavailable:
        packages = sorted({n.package for n in registry.named_rules() if n.name in unavailable})
        print(f"not checked ({', '.join(packages)} not installed, or its import failed): {', '.join(unavailable)}")
    return 0 if all(r.ok for r in reports) else 1


def sweep_with_progress(opinfo_names: list[str], *, console: Any = None, **options: Any) -> Any:
    """:func:`autoshard.validation.opinfo_sweep.sweep` with a rich progress bar
    (tracing, then checking) on ``console`` (stderr by default)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from autoshard.validation.opinfo import load_op_db, select_infos
    from autoshard.validation.opinfo_sweep import sweep

    console = console or Console(stderr=True)
    infos = len(select_infos(load_op_db(), opinfo_names))
    if not console.is_terminal:
        return _sweep_with_lines(opinfo_names, console, sweep, **options)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[now]}"))
    with Progress(*columns, console=console, transient=True) as progress:
        tracing = progress.add_task("tracing OpInfo samples", total=infos, now="")
        checking = progress.add_task("checking strategies", total=None, now="", visible=False)

        def on_opinfo(name: str) -> None:
            progress.update(tracing, advance=1, now=name)

        def on_traced(n: int) -> None:
            progress.update(tracing, visible=False)
            progress.update(checking, total=n, visible=True)

        def on_call(call: Any) -> None:
            progress.update(checking, advance=1, now=str(call.op))

        with _no_rule_warnings_quiet():
            return sweep(opinfo_names, on_opinfo=on_opinfo, on_traced=on_traced, on_call=on_call, **options)


@contextlib.contextmanager
def _no_rule_warnings_quiet() -> Iterator[None]:
    """An op without a rule warns once per registry; the summary counts them
    instead. The logger's level is restored afterwards (callers' state)."""
    logger = logging.getLogger("autoshard.rules.registry")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _sweep_with_lines(opinfo_names: list[str], console: Any, sweep: Any, **options: Any) -> Any:
    """The sweep with a progress line every 30 s, for logs (no live bar
    where stderr is not a terminal)."""
    import time

    state = {"total": 0, "done": 0, "last": time.monotonic()}

    def on_traced(n: int) -> None:
        state["total"] = n
        console.print(f"traced: {n} distinct calls to check")

    def on_call(call: Any) -> None:
        state["done"] += 1
        now = time.monotonic()
        if now - state["last"] >= 30 or state["done"] == state["total"]:
            state["last"] = now
            console.print(f"checked {state['done']}/{state['total']} calls (now {call.op})")

    with _no_rule_warnings_quiet():
        return sweep(opinfo_names, on_traced=on_traced, on_call=on_call, **options)


def run_opinfo(args: argparse.Namespace) -> int:
    """Run the sweep for the selected rules (``--op``/``--family``); 1 if a
    strategy was wrong or a rule crashed."""
    from autoshard.rules import load_rules
    from autoshard.validation.opinfo import OpInfoUnavailable
    from autoshard.validation.opinfo_sweep import format_sweep
    from autoshard.validation.validator import select_ops

    registry = load_rules()
    ops = select_ops(registry, args.op, args.family) if (args.op or args.family) else None
    try:
        report = sweep_with_progress(list(args.opinfo_ops), registry=registry, ops=ops,
                                     max_samples=args.max_samples, seed=args.seed)
    except OpInfoUnavailable as exc:
        raise ValueError(f"--opinfo: {exc}") from exc
    print(format_sweep(report, show_findings=args.failures))
    return 0 if report.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m autoshard.cli.validate_rules``: the command without the ``autoshard`` entry point."""
    parser = argparse.ArgumentParser(prog="python -m autoshard.cli.validate_rules",
                                     description="check sharding rules numerically on simulated shards")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ValueError as exc:
        print(f"validate-rules: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
