"""``autoshard solve MODULE:FACTORY --devices 64 [--devices-per-node 8] [--jobs J]``: search the mesh.

The ``--devices`` half of ``autoshard solve`` (``autoshard.cli.solve``
parses the flags and hands over): every flag is checked before torch is
imported, then :func:`autoshard.search.mesh_search.search_mesh` runs with rich
progress (layouts done / total, the best step so far and its layout), the
chosen plan is written atomically and explained with the table of every
layout. ``--compare-baselines`` and ``--dump-problem`` act on the chosen
layout (built once more, in this process).

>>> # autoshard solve examples.models.llama3:llama3_8b --devices 64 --mixed-precision -o plan.json
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["validate_search", "run_search"]

MAX_JOBS = 1024


def validate_search(args: argparse.Namespace) -> None:
    """The ``--devices`` flags, torch-free: one ``ValueError`` naming the flag."""
    from hw_profiles import load

    from autoshard.cli.values import check_count
    from autoshard.search.mesh_layouts import check_devices, devices_per_node_of, profile_for_nodes

    if args.mesh is not None:
        raise ValueError("--mesh and --devices: give one (--devices searches the mesh for you)")
    if args.dims is not None:
        raise ValueError("--dims: only with --mesh (a search names the mesh dims itself)")
    devices, node = check_devices(args.devices, args.devices_per_node, flag="--devices",
                                  node_flag="--devices-per-node")
    check_count(args.jobs, "--jobs", 1, MAX_JOBS)
    if args.no_cache and args.cache_dir is not None:
        raise ValueError("--cache-dir and --no-cache: give one")
    if args.profile is None:
        from autoshard.plan.options import DEFAULT_PROFILE  # the solver's import: only on this path

        args.profile = DEFAULT_PROFILE
    profile = profile_for_nodes(load(args.profile), node, flag="--devices-per-node")
    devices_per_node_of(profile, devices, node, flag="--devices", node_flag="--devices-per-node")


def run_search(args: argparse.Namespace, options: Any, overrides: dict[str, Any], paths: list[str]) -> int:
    """Search, write, explain; 1 when no layout fits the memory limit."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from autoshard.cli.solve_report import dump_problem, print_baselines
    from autoshard.plan.explain import explain_text
    from autoshard.search.mesh_search import SearchStatus, search_mesh
    from autoshard.search.solve import InfeasibleMemoryError
    from autoshard.trace.model_spec import load_model

    model, inputs = load_model(args.model, overrides, paths=paths)
    console = Console(stderr=True)
    # no refresh thread: the search forks its workers, and a fork must not copy a thread holding a lock
    bar = Progress(TextColumn("{task.description:<7}"), BarColumn(), TextColumn("{task.fields[detail]}"),
                   TimeElapsedColumn(), console=console, disable=not console.is_terminal, auto_refresh=False)
    tasks: dict[str, Any] = {}

    def progress(status: SearchStatus) -> None:
        if status.phase not in tasks:
            if not tasks:
                bar.start()
            tasks[status.phase] = bar.add_task(status.phase, total=status.total or 1, detail="")
        detail = ""
        if status.phase == "layouts":
            detail = f"{status.done}/{status.total}"
            if status.best is not None:
                detail += (f", best {status.best.step_s * 1e3:.3f} ms on {status.best.text} "
                           f"({','.join(status.best.dim_names)})")
        bar.update(tasks[status.phase], completed=status.done, total=status.total or 1, detail=detail)
        bar.refresh()

    try:
        plan = search_mesh(model, inputs, args.devices, args.devices_per_node, options, jobs=args.jobs,
                           cache_dir=False if args.no_cache else args.cache_dir, progress=progress)
    except InfeasibleMemoryError as exc:
        bar.stop()
        print(f"autoshard solve: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    finally:
        bar.stop()
    if args.output:
        plan.save(args.output)
    print(explain_text(plan))
    if args.compare_baselines or args.dump_problem:
        prep = _prepare_chosen(model, inputs, plan, options, args.devices_per_node)
        if args.dump_problem:
            dump_problem(prep, plan, options, args.dump_problem)
        if args.compare_baselines:
            print_baselines(prep, plan, options)
    if args.output:
        print(f"\nplan written to {args.output}")
    return 0


def _prepare_chosen(model: Any, inputs: Any, plan: Any, options: Any, devices_per_node: int | None) -> Any:
    """The chosen layout's strategy graph, built as the search built it."""
    from hw_profiles import load

    from autoshard.search.mesh_layouts import profile_for_nodes
    from autoshard.search.solve import prepare

    profile = options.profile if not isinstance(options.profile, str) else load(options.profile)
    fp = plan.fingerprint
    return prepare(model, inputs, fp.mesh_shape, fp.dim_names,
                   options.with_changes(profile=profile_for_nodes(profile, devices_per_node)))
