"""``autoshard solve MODULE:FACTORY --mesh 8x8 --dims dp,tp -o plan.json`` (or ``--devices 64``).

Loads a model factory (``FACTORY(**kwargs) -> (model, example_inputs)``),
traces it on fake tensors, builds and solves the strategy graph with rich
progress, writes the plan atomically, and with ``--compare-baselines``
prints DDP / FSDP / TP / FSDP+TP priced by the same cost model beside it.
With ``--devices N`` instead of ``--mesh`` it searches the mesh layout
(``autoshard.cli.solve_search``).
Every user error is one line and exit code 2; a memory limit no plan meets
is exit code 1 with the smallest peak found.

>>> parse_bytes("70GiB"), parse_bytes("1.5e9")
(75161927680, 1500000000)
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from typing import Any

from autoshard.cli.values import parse_bytes

__all__ = ["parse_bytes", "parse_pins", "add_arguments", "run", "BACKEND_CHOICES", "OPTIMIZER_CHOICES",
           "BASELINE_CHOICES"]

# Copies of solver.backends.BACKENDS, autoshard.graph.memory.OPTIMIZERS and
# autoshard.search.baselines.BASELINES: those modules import numba or torch, and
# `autoshard solve --help` (and a typo's error) must stay instant.
# tests/autoshard/cli/test_cli_bad_input.py checks that the copies agree.
BACKEND_CHOICES = ("cbc", "cpsat")
OPTIMIZER_CHOICES = ("adamw", "sgd", "sgd-momentum", "none")
BASELINE_CHOICES = ("ddp", "fsdp", "tp", "fsdp+tp")
# What --help shows as the defaults of autoshard.plan.options.SolveOptions (which imports the solver,
# numba included: a second to load). Flags left out take SolveOptions' own defaults, never these;
# tests/autoshard/cli/test_cli_bad_input.py checks that they agree.
SHOWN_DEFAULTS = {"profile": "h100-sxm-80gb", "backend": "cbc", "optimizer": "adamw", "time_limit": 60.0,
                  "search_time_limit": 600.0}


def parse_pins(items: list[str]) -> dict[str, str]:
    """``PATTERN=PLACEMENT`` items -> dict; a placement that does not parse
    fails here, before tracing (whether the tensor can take it is checked
    once the graph is built)."""
    from costmodel.placements import parse_placements

    pins = {}
    for item in items:
        pattern, sep, placement = item.partition("=")
        if not sep or not pattern or not placement:
            raise ValueError(f"--pin: expected PATTERN=PLACEMENT (e.g. '*.wq.weight=S(0)R'), got {item!r}")
        try:
            parse_placements(placement)
        except ValueError as exc:
            raise ValueError(f"--pin {item}: {exc}") from None
        pins[pattern] = placement
    return pins


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``autoshard solve``."""
    from autoshard.trace.model_spec import add_path_argument

    parser.add_argument("model", metavar="MODULE:FACTORY", help="e.g. examples.models.llama3:tiny")
    parser.add_argument("--kwargs", default="{}", metavar="JSON", help="factory overrides as a JSON object")
    parser.add_argument("--mesh", metavar="AxB", help="mesh shape, e.g. 8x8 (or --devices: search the mesh)")
    parser.add_argument("--dims", metavar="NAMES", help="mesh dim names, e.g. dp,tp")
    parser.add_argument("--devices", type=int, metavar="N",
                        help="instead of --mesh: solve every mesh layout of N devices and keep the fastest")
    parser.add_argument("--devices-per-node", type=int, metavar="K",
                        help="with --devices: devices per node (default: the profile's innermost tier)")
    parser.add_argument("--jobs", type=int, metavar="J",
                        help="with --devices: layouts solved at once, in worker processes (default: the cores)")
    parser.add_argument("--cache-dir", metavar="DIR", help="with --devices: layout cache folder (default "
                        "$AUTOSHARD_CACHE_DIR or ~/.cache/autoshard/plans)")
    parser.add_argument("--no-cache", action="store_true", help="with --devices: solve every layout again")
    parser.add_argument("--profile", help=f"hardware profile name or file (default {SHOWN_DEFAULTS['profile']})")
    parser.add_argument("--memory-limit", metavar="SIZE", help="per-rank limit (default: the profile's device memory)")
    parser.add_argument("--pin", action="append", default=[], metavar="PATTERN=PLACEMENT",
                        help="fix a parameter's or input's placement by name pattern (repeatable)")
    parser.add_argument("--time-limit", type=float, metavar="S",
                        help=f"time limit of the whole solve in seconds (default {SHOWN_DEFAULTS['time_limit']:.0f}; "
                             f"with --devices the whole search's, default {SHOWN_DEFAULTS['search_time_limit']:.0f}; "
                             "at most a week)")
    parser.add_argument("--backend", choices=BACKEND_CHOICES, help=f"ILP backend (default {SHOWN_DEFAULTS['backend']})")
    parser.add_argument("--optimizer", choices=OPTIMIZER_CHOICES,
                        help=f"decides the optimizer state in memory (default {SHOWN_DEFAULTS['optimizer']})")
    parser.add_argument("--optimizer-impl", choices=("auto", "foreach", "fused", "for-loop"),
                        help="how the optimizer runs: its kernels' time and temporaries (default auto: torch's own "
                             "default on the profile's device, foreach on GPUs, for-loop on CPU)")
    parser.add_argument("--profile-correction", choices=("auto", "here", "remeasure", "calibrate", "off"),
                        help="correct the profile for THIS machine before pricing: a few seconds of reference ops "
                             "on the mesh's ranks, cached per machine (here; remeasure: measure again; calibrate: "
                             "a quick calibration of this machine first, ~2 min once, cached, then the same "
                             "correction). Default auto = off for an offline solve: the plan may run on another "
                             "machine")
    parser.add_argument("--mixed-precision", action="store_true", help="low-precision params with fp32 master and state")
    parser.add_argument("--expandable-segments", action="store_true",
                        help="the job runs with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: the plan's "
                             "estimated reservation (estimate.reserved_bytes) replays that allocator")
    parser.add_argument("--allow-over-reservation", action="store_true",
                        help="accept a plan whose live peak fits but whose estimated CUDA caching-allocator "
                             "reservation exceeds the device (default: solved again under a lower limit until it "
                             "fits, or exit code 1)")
    parser.add_argument("--no-ties", action="store_true", help="let every repeated layer choose its own strategies")
    parser.add_argument("--search", choices=("auto", "full", "seeded"),
                        help="full enumeration, or seeded from a coarser 2-D mesh (auto: seeded on 3-D+ meshes)")
    parser.add_argument("--baseline", choices=BASELINE_CHOICES, help="solve an expert layout instead")
    parser.add_argument("--recompute", metavar="POLICY",
                        help="what the backward recomputes: auto (the solver decides, with the placements; default), "
                             "none, full (every block), selective (torchtitan's op-level policy), every:K (every "
                             "K-th block)")
    parser.add_argument("--compare-baselines", action="store_true", help="price the expert layouts beside the plan")
    parser.add_argument("--dump-problem", metavar="FILE",
                        help="also write the solver problem (autoshard.problem/1, with what turns its solution into "
                             "this plan: POST it to autoshard serve's /v1/plans)")
    parser.add_argument("--server", metavar="URL", help="solve on an autoshard serve (e.g. http://host:8470; token "
                        "from $AUTOSHARD_TOKEN) instead of here")
    parser.add_argument("-o", "--output", metavar="PLAN.json", help="where to write the plan")
    add_path_argument(parser)


def _validate(args: argparse.Namespace) -> tuple[Any, int | None, dict[str, str], dict[str, Any]]:
    """Every flag, checked before torch (or the solver) is imported or the model traced:
    (mesh, memory limit, pins, factory overrides)."""
    from hw_profiles import load

    from autoshard.cli.values import check_output_path, check_seconds, parse_mesh
    from autoshard.graph.recompute_policy import PolicyError, parse_policy
    from autoshard.trace.model_spec import parse_kwargs, split_spec

    split_spec(args.model)
    try:
        if args.recompute is not None:
            parse_policy(args.recompute)
    except PolicyError as exc:
        raise ValueError(f"--recompute: {str(exc).split(': ', 1)[1]}") from None
    overrides = parse_kwargs(args.kwargs)
    if args.devices is not None:
        from autoshard.cli.solve_search import validate_search

        mesh = None
        validate_search(args)
    elif args.mesh is None:
        raise ValueError("--mesh: give a mesh shape (e.g. --mesh 8x8) or --devices N to search for one")
    else:
        for flag in ("devices_per_node", "jobs", "cache_dir"):
            if getattr(args, flag) is not None:
                raise ValueError(f"--{flag.replace('_', '-')}: only with --devices")
        if args.no_cache:
            raise ValueError("--no-cache: only with --devices")
        mesh = parse_mesh(args.mesh, args.dims)
    if args.time_limit is not None:
        check_seconds(args.time_limit, "--time-limit")
    if args.profile is not None:
        load(args.profile)  # an unknown profile fails before tracing
    limit = parse_bytes(args.memory_limit) if args.memory_limit else None
    pins = parse_pins(args.pin)
    check_output_path(args.output, "-o/--output")
    check_output_path(args.dump_problem, "--dump-problem")
    return mesh, limit, pins, overrides


def solve_options(args: argparse.Namespace, limit: int | None, pins: dict[str, str]) -> Any:
    """The one :class:`~autoshard.plan.options.SolveOptions` of this command: the flags
    given, every other option its default (``--devices``: the search's time limit)."""
    from autoshard.plan.options import DEFAULT_SEARCH_TIME_LIMIT_S, SolveOptions

    given = {"profile": args.profile, "memory_limit": limit, "time_limit": args.time_limit, "backend": args.backend,
             "optimizer": args.optimizer, "optimizer_impl": args.optimizer_impl, "baseline": args.baseline,
             "search": args.search,
             "recompute": args.recompute, "server": args.server, "profile_correction": args.profile_correction}
    options = SolveOptions(pins=pins, ties=not args.no_ties, mixed_precision=args.mixed_precision,
                           expandable_segments=getattr(args, "expandable_segments", False),
                           allow_over_reservation=getattr(args, "allow_over_reservation", False),
                           **{name: value for name, value in given.items() if value is not None})
    if args.devices is not None and args.time_limit is None:
        options = options.with_changes(time_limit=DEFAULT_SEARCH_TIME_LIMIT_S)
    return options


def run(args: argparse.Namespace) -> int:
    mesh, limit, pins, overrides = _validate(args)
    paths = getattr(args, "path", [])
    from autoshard.trace.model_spec import import_factory, load_model

    import_factory(args.model, paths)  # a spec that does not import fails before the server is asked
    if args.server:  # an unreachable server fails before the model is traced
        from autoshard.service.client import ServiceClient

        ServiceClient(args.server).health()
    if args.devices is not None:
        from autoshard.cli.solve_search import run_search  # the search's own progress and output

        return run_search(args, solve_options(args, limit, pins), overrides, paths)

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from costmodel.redistribute_disk import use_folder

    from autoshard.cli.solve_report import dump_problem, print_baselines
    from autoshard.plan.cache_folder import tables_folder
    from autoshard.plan.explain import explain_text
    from autoshard.search.solve import InfeasibleMemoryError, prepare, solve_prepared

    options = solve_options(args, limit, pins)
    model, inputs = load_model(args.model, overrides, paths=paths)
    # redistribution tables priced by earlier solves on this machine: ~2.5 s of a tiny model's run
    tables = use_folder(tables_folder())
    console = Console(stderr=True)
    # on a terminal only: piped into a log, rich's final render is a stray empty line on stderr
    bar = Progress(TextColumn("{task.description:<7}"), BarColumn(), TextColumn("{task.fields[detail]}"),
                   TimeElapsedColumn(), console=console, disable=not console.is_terminal)
    tasks: dict[str, Any] = {}

    def progress(phase: str, done: float, total: float) -> None:
        if phase not in tasks:
            if not tasks:  # started on the first report: an error before it prints no empty progress line
                bar.start()
            tasks[phase] = bar.add_task(phase, total=total or 1, detail="")
        detail = f"{done:.0f}/{total:.0f} ops" if phase == "build" else (f"{done:.1f} s" if phase == "solve" else "")
        bar.update(tasks[phase], completed=done, total=total or 1, detail=detail)

    from autoshard.plan.pipeline_section import PipelineError
    from autoshard.search.pipeline_model import PIPELINE_DIM

    pipeline = None
    try:  # a pp dim: the pipeline first, so that bad input stops before the solve (nothing written)
        if PIPELINE_DIM in mesh.dim_names:  # else the runtime package (25 modules) is not needed here
            from autoshard.runtime.pipeline_api import pipeline_for

            pipeline = pipeline_for(model, inputs, mesh.shape, mesh.dim_names, options)
    except PipelineError as exc:
        print(f"autoshard solve: {exc}", file=sys.stderr)
        return 2
    try:
        started = time.perf_counter()  # --time-limit bounds trace to written plan
        prep = prepare(model, inputs, mesh.shape, mesh.dim_names, options, progress=progress)
        try:
            plan = solve_prepared(prep, options, progress=progress, started=started)
        except InfeasibleMemoryError as exc:
            bar.stop()
            print(f"autoshard solve: {exc}", file=sys.stderr)
            return 1
        if args.dump_problem:
            dump_problem(prep, plan, options, args.dump_problem)
    finally:
        bar.stop()
        tables.flush()  # what this solve priced, for the next one (the tables are right even after an error)
        use_folder(None)  # in-process callers (tests, notebooks) go on without it
    if pipeline is not None:
        plan = replace(plan, pipeline=pipeline)
    if args.output:
        plan.save(args.output)
    print(explain_text(plan))
    if args.compare_baselines:
        print_baselines(prep, plan, options)
    if args.output:
        print(f"\nplan written to {args.output}")
    return 0
