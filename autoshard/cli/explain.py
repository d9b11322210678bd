"""``autoshard explain PLAN.json``: what a plan does, for a person.

Prints the tables of :func:`autoshard.plan.explain.explain_text` (the estimate,
the recomputation, parameter placements, the costliest redistributions and, for
a plan of a mesh search, every layout tried); ``--plot`` draws live memory over
the step (:func:`autoshard.plan.explain.plot_memory`), ``--plot-layouts`` the
layouts' step time against peak memory (``autoshard.plan.layout_report``),
``--plot-schedule`` a pipeline plan's per-rank timeline of its schedule
(``autoshard.plan.explain_pipeline.plot_schedule``).
Flags and paths are checked before the plan is read: one line and exit code 2.

>>> import argparse
>>> p = argparse.ArgumentParser(); add_arguments(p)
>>> p.parse_args(["plan.json", "--top", "3"]).top
3
"""

from __future__ import annotations

import argparse

from autoshard.plan.explain import explain_text, plot_memory
from autoshard.plan.explain_pipeline import plot_schedule
from autoshard.plan.format import Plan
from autoshard.plan.layout_report import plot_layouts, search_rows

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``autoshard explain``."""
    parser.add_argument("plan", metavar="PLAN.json", help="a plan written by `autoshard solve`")
    parser.add_argument("--top", type=int, default=10, metavar="N",
                        help="how many redistributions to list (default %(default)s)")
    parser.add_argument("--plot", metavar="PNG", help="also draw memory over the step into this PNG")
    parser.add_argument("--plot-layouts", metavar="PNG",
                        help="for a plan of a mesh search (solve --devices): step time vs peak memory of every layout")
    parser.add_argument("--plot-schedule", metavar="PNG",
                        help="for a plan with pipeline stages: each rank's forward / backward timeline and its bubbles")


def run(args: argparse.Namespace) -> int:
    from autoshard.cli.values import check_count, check_output_path

    check_count(args.top, "--top", 0, 10**9)
    for flag, path in (("--plot", args.plot), ("--plot-layouts", args.plot_layouts),
                       ("--plot-schedule", args.plot_schedule)):
        if path:
            check_output_path(path, flag)
            import importlib.util

            if importlib.util.find_spec("matplotlib") is None:
                raise ValueError(f"{flag}: needs matplotlib (pip install matplotlib)")
    plan = Plan.load(args.plan)
    if args.plot_layouts and not any(r.outcome == "solved" for r in search_rows(plan.options)):
        raise ValueError(f"--plot-layouts: {args.plan} is not the plan of a mesh search (autoshard solve --devices)")
    if args.plot_schedule and plan.pipeline is None:
        raise ValueError(f"--plot-schedule: {args.plan} has no pipeline stages (solve it on a mesh with a 'pp' dim)")
    print(explain_text(plan, top=args.top))
    if args.plot:
        plot_memory(plan, args.plot)
        print(f"\nmemory plot written to {args.plot}")
    if args.plot_layouts:
        plot_layouts(plan.options, args.plot_layouts)
        print(f"\nlayout plot written to {args.plot_layouts}")
    if args.plot_schedule:
        plot_schedule(plan, args.plot_schedule)
        print(f"\nschedule plot written to {args.plot_schedule}")
    return 0
