"""``autoshard solve MODULE:FACTORY --mesh 8x8 --dims dp,tp -o plan.json``.

Loads a model factory (``FACTORY(**kwargs) -> (model, example_inputs)``),
traces it on fake tensors, builds and solves the strategy graph with rich
progress, writes the plan atomically, and with ``--compare-baselines``
prints DDP / FSDP / TP / FSDP+TP priced by the same cost model beside it.
Every user error is one line and exit code 2; a memory limit no plan meets
is exit code 1 with the smallest peak found.

>>> parse_bytes("70GiB"), parse_bytes("1.5e9")
(75161927680, 1500000000)
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

__all__ = ["parse_bytes", "parse_pins", "add_arguments", "run"]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """``70GiB``, ``80GB``, ``1.5e9`` -> bytes."""
    match = re.fullmatch(r"\s*([0-9.]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"--memory-limit: expected a size such as 70GiB, 80GB or 1.5e9, got {text!r}")
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if not value > 0 or value == float("inf"):
        raise ValueError(f"--memory-limit: must be a positive size, got {text!r}")
    return int(value)


def parse_pins(items: list[str]) -> dict[str, str]:
    """``PATTERN=PLACEMENT`` items -> dict."""
    pins = {}
    for item in items:
        pattern, sep, placement = item.partition("=")
        if not sep or not pattern or not placement:
            raise ValueError(f"--pin: expected PATTERN=PLACEMENT (e.g. '*.wq.weight=S(0)R'), got {item!r}")
        pins[pattern] = placement
    return pins


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``autoshard solve``."""
    parser.add_argument("model", metavar="MODULE:FACTORY", help="e.g. examples.models.llama3:tiny")
    parser.add_argument("--kwargs", default="{}", metavar="JSON", help="factory overrides as a JSON object")
    parser.add_argument("--mesh", required=True, metavar="AxB", help="mesh shape, e.g. 8x8")
    parser.add_argument("--dims", metavar="NAMES", help="mesh dim names, e.g. dp,tp")
    parser.add_argument("--profile", default="h100-sxm-80gb", help="hardware profile name or file")
    parser.add_argument("--memory-limit", metavar="SIZE", help="per-rank limit (default: the profile's device memory)")
    parser.add_argument("--pin", action="append", default=[], metavar="PATTERN=PLACEMENT",
                        help="fix a parameter's or input's placement by name pattern (repeatable)")
    parser.add_argument("--time-limit", type=float, default=60.0, metavar="S", help="solver time limit (default 60)")
    parser.add_argument("--backend", default="cbc", help="ILP backend: cbc (default) or cpsat")
    parser.add_argument("--optimizer", default="adamw", help="adamw (default), sgd, sgd-momentum or none")
    parser.add_argument("--mixed-precision", action="store_true", help="low-precision params with fp32 master and state")
    parser.add_argument("--no-ties", action="store_true", help="let every repeated layer choose its own strategies")
    parser.add_argument("--search", default="auto", choices=("auto", "full", "seeded"),
                        help="full enumeration, or seeded from a coarser 2-D mesh (auto: seeded on 3-D+ meshes)")
    parser.add_argument("--baseline", help="solve an expert layout instead: ddp, fsdp, tp or fsdp+tp")
    parser.add_argument("--compare-baselines", action="store_true", help="price the expert layouts beside the plan")
    parser.add_argument("--dump-problem", metavar="FILE",
                        help="also write the solver problem (autoshard.problem/1, with what turns its solution into "
                             "this plan: POST it to autoshard serve's /v1/plans)")
    parser.add_argument("--server", metavar="URL", help="solve on an autoshard serve (e.g. http://host:8470; token "
                        "from $AUTOSHARD_TOKEN) instead of here")
    parser.add_argument("-o", "--output", metavar="PLAN.json", help="where to write the plan")


def _validate(args: argparse.Namespace) -> tuple[Any, int | None, dict[str, str]]:
    from costmodel.mesh import MeshSpec
    from hw_profiles import load

    try:
        mesh = MeshSpec.from_text(args.mesh, args.dims)
    except ValueError as exc:
        raise ValueError(f"--mesh/--dims: {exc}") from None
    from solver.cli import MAX_TIME_LIMIT_S

    if not 0 < args.time_limit <= MAX_TIME_LIMIT_S:  # also refuses nan
        raise ValueError(f"--time-limit: must be a number of seconds in (0, {MAX_TIME_LIMIT_S:.0f}], "
                         f"got {args.time_limit}")
    load(args.profile)  # an unknown profile fails before tracing
    limit = parse_bytes(args.memory_limit) if args.memory_limit else None
    return mesh, limit, parse_pins(args.pin)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from autoshard.coverage import load_example, parse_kwargs
    from autoshard.plan.explain import explain_text
    from autoshard.plan.solve import InfeasibleMemoryError, compare_baselines, prepare, solve_prepared

    mesh, limit, pins = _validate(args)
    if args.server:  # an unreachable server fails before the model is traced
        from autoshard.service.client import ServiceClient

        ServiceClient(args.server).health()
    model, inputs = load_example(args.model, parse_kwargs(args.kwargs))
    console = Console(stderr=True)
    with Progress(TextColumn("{task.description:<7}"), BarColumn(), TextColumn("{task.fields[detail]}"),
                  TimeElapsedColumn(), console=console, transient=not console.is_terminal) as bar:
        tasks: dict[str, Any] = {}

        def progress(phase: str, done: float, total: float) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total or 1, detail="")
            detail = f"{done:.0f}/{total:.0f} ops" if phase == "build" else (f"{done:.1f} s" if phase == "solve" else "")
            bar.update(tasks[phase], completed=done, total=total or 1, detail=detail)

        prep = prepare(model, inputs, mesh.shape, mesh.dim_names, profile=args.profile, optimizer=args.optimizer,
                       mixed_precision=args.mixed_precision, progress=progress, search=args.search)
        try:
            plan = solve_prepared(prep, memory_limit=limit, pins=pins, time_limit=args.time_limit,
                                  backend=args.backend, ties=not args.no_ties, baseline=args.baseline,
                                  progress=progress, server=args.server)
        except InfeasibleMemoryError as exc:
            print(f"autoshard solve: {exc}", file=sys.stderr)
            return 1
        if args.dump_problem:
            _dump_problem(prep, plan, pins, limit, args)
    if args.output:
        plan.save(args.output)
    print(explain_text(plan))
    if args.compare_baselines:
        rows = compare_baselines(prep, memory_limit=limit, time_limit=min(args.time_limit, 30.0), backend=args.backend)
        print("\n| layout | step ms | compute ms | comm ms | peak GiB | fits |\n|---|---:|---:|---:|---:|---|")
        print(_row("solved", plan))
        for r in rows:
            print(_row(r.name, r.plan) if r.plan else f"| {r.name} | - | - | - | - | {r.error} |")
    if args.output:
        print(f"\nplan written to {args.output}")
    return 0


def _row(name: str, plan: Any) -> str:
    e = plan.estimate
    return (f"| {name} | {e.step_s * 1e3:.3f} | {e.compute_s * 1e3:.3f} | {(e.comm_s + e.relayout_s) * 1e3:.3f} "
            f"| {e.peak_memory_bytes / 2**30:.2f} | {'yes' if e.fits else 'no'} |")


def _dump_problem(prep: Any, plan: Any, pins: dict[str, str], limit: int | None, args: argparse.Namespace) -> None:
    """The problem with its ``"autoshard"`` section (``autoshard.plan.assemble.PlanRequest``):
    solved by ``autoshard serve`` (``POST /v1/plans``) it gives back this plan
    (unless an expert layout won the portfolio: ``plan.options["portfolio"]``)."""
    import json

    from autoshard.graph.problem import to_problem
    from autoshard.plan.baselines import baseline_pins
    from autoshard.plan.build import plan_request
    from autoshard.plan.pins import resolve_pins
    from autoshard.plan.solve import PLAN_GAP, PORTFOLIO_SHARE
    from solver.io import write_text_atomic

    all_pins = dict(baseline_pins(prep.graph, args.baseline)) if args.baseline else {}
    all_pins.update(pins)
    problem = to_problem(prep.graph, memory_limit=plan.estimate.memory_limit_bytes,
                         pins=resolve_pins(prep.graph, all_pins), ties=not args.no_ties, labels=True)
    share = PORTFOLIO_SHARE if args.baseline is None and not pins else 0.0
    data = plan_request(prep.graph, problem, fingerprint=plan.fingerprint, options=plan.options,
                        timings=prep.timings,
                        solve={"time_limit": args.time_limit * (1 - share), "backend": args.backend, "gap": PLAN_GAP})
    write_text_atomic(args.dump_problem, json.dumps(data, allow_nan=False) + "\n")
