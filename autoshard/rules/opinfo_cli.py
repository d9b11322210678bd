"""``autoshard validate-rules --opinfo``: the OpInfo sweep
(:mod:`autoshard.rules.opinfo_sweep`) with a progress display on stderr and
its summary on stdout.

>>> # autoshard validate-rules --opinfo --opinfo-ops addmm --max-samples 1
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from autoshard.rules.opinfo import OpInfoUnavailable

__all__ = ["run_opinfo", "sweep_with_progress"]


def sweep_with_progress(opinfo_names: list[str], *, console: Any = None, **options: Any) -> Any:
    """:func:`autoshard.rules.opinfo_sweep.sweep` with a rich progress bar
    (tracing, then checking) on ``console`` (stderr by default)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from autoshard.rules.opinfo import load_op_db, select_infos
    from autoshard.rules.opinfo_sweep import sweep

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
    from autoshard.rules.opinfo_sweep import format_sweep
    from autoshard.rules.validator import select_ops

    registry = load_rules()
    ops = select_ops(registry, args.op, args.family) if (args.op or args.family) else None
    try:
        report = sweep_with_progress(list(args.opinfo_ops), registry=registry, ops=ops,
                                     max_samples=args.max_samples, seed=args.seed)
    except OpInfoUnavailable as exc:
        raise ValueError(f"--opinfo: {exc}") from exc
    print(format_sweep(report, show_findings=args.failures))
    return 0 if report.ok else 1
