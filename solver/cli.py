"""``python -m solver PROBLEM.json``: solve a problem file, print or write the solution.

Exit codes: 0 a solution was found (optimal, feasible or timeout with one),
1 no solution (infeasible, or none found in time), 2 bad input or usage.
Errors are one line on stderr, never a traceback. The time limit counts from
the start of the process, so it covers loading and writing (as the IOPDDL
contest requires).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
from typing import Sequence

from solver.clock import PROCESS_START

__all__ = ["main", "build_parser", "MAX_TIME_LIMIT_S"]

MAX_TIME_LIMIT_S = 7 * 24 * 3600.0
"""Longest time limit accepted (a week): beyond it backends overflow their timers."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m solver",
        description="Solve an autoshard.problem/1 or IOPDDL problem file (JSON, optionally gzip).",
    )
    parser.add_argument("problem", help="problem file (.json or .json.gz)")
    parser.add_argument("-o", "--output", help="write the autoshard.solution/1 JSON here (atomically)")
    parser.add_argument("--format", choices=("autoshard", "iopddl"), help="input format (default: detected)")
    parser.add_argument("--backend", default="cbc", help="exact backend: cbc (default) or cpsat")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds, loading and writing included")
    parser.add_argument("--threads", type=int, default=None, help="threads for the backend (default: all cores)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (results are deterministic per seed)")
    parser.add_argument("--method", default="auto", choices=("auto", "exact", "anytime", "heuristic"),
                        help="auto: exact program when small, else the anytime search (default)")
    parser.add_argument("--inner", choices=("trws", "treedp", "toulbar2"), default=None,
                        help="pairwise solver inside the Lagrangian rounds (default trws; treedp: exact, for "
                             "graphs of small treewidth; toulbar2 needs the optional pytoulbar2)")
    parser.add_argument("--iopddl-output", action="store_true",
                        help="print the contest's [s0, s1, ...] line instead of the JSON solution")
    parser.add_argument("--server", metavar="URL",
                        help="solve on an autoshard serve (e.g. http://host:8470; token from $AUTOSHARD_TOKEN)")
    parser.add_argument("--quiet", action="store_true", help="no progress display")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser


def _progress_printer(enabled: bool):
    if not enabled:
        return None, None
    from rich.console import Console

    console = Console(stderr=True)
    status = console.status("loading")
    status.start()

    def update(event: dict) -> None:
        stage = event["stage"]
        extra = f" cost={event['cost']:.6g}" if "cost" in event else ""
        status.update(f"[{event['seconds']:.1f}s] {stage}{extra}")

    return update, status


def _solve_on_server(args: argparse.Namespace, update):
    """The file's bytes (gzip or not) to ``autoshard serve``, its solution back. The
    client lives with the service (standard library only) and is imported only here,
    so the solver itself still imports nothing above it."""
    from pathlib import Path

    from autoshard.service.client import ServiceClient

    raw = Path(args.problem).read_bytes()
    options = {"time_limit": args.time_limit, "backend": args.backend, "threads": args.threads, "seed": args.seed,
               "method": args.method, "inner": args.inner, "format": args.format}

    def on_status(status: dict) -> None:
        if update is not None:
            event = {"stage": f"{status['state']} {status['progress']['stage'] or ''}".strip(),
                     "seconds": status["progress"]["seconds"]}
            if status.get("incumbent") is not None:
                event["cost"] = status["incumbent"]
            update(event)

    return ServiceClient(args.server).solve_problem(raw, on_progress=on_status, **options)


def _raise_interrupt(signum, frame):  # pragma: no cover - signal handler
    raise KeyboardInterrupt


def _check_names_and_paths(args: argparse.Namespace) -> str | None:
    """What is wrong with the backend name, the input file or the output's folder,
    found before the work starts: a typo in ``-o`` must not cost a whole solve."""
    from pathlib import Path

    from solver.backends import BACKENDS

    if args.backend not in BACKENDS:
        return f"--backend: unknown backend {args.backend!r} (expected one of {', '.join(sorted(BACKENDS))})"
    source = Path(args.problem)
    if not source.exists():
        return f"{args.problem}: no such file"
    if source.is_dir():
        return f"{args.problem}: is a directory, not a problem file"
    if args.output:
        target = Path(args.output)
        if target.is_dir():
            return f"-o {args.output}: is a directory (give a file name)"
        if not target.parent.is_dir():
            return f"-o {args.output}: no such directory ({target.parent}); it is not created"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not math.isfinite(args.time_limit) or not 0 < args.time_limit <= MAX_TIME_LIMIT_S:
        print(f"error: --time-limit must be a number of seconds in (0, {MAX_TIME_LIMIT_S:.0f}], got {args.time_limit}",
              file=sys.stderr)
        return 2
    if args.threads is not None and args.threads < 1:
        print("error: --threads must be at least 1", file=sys.stderr)
        return 2
    usage_error = _check_names_and_paths(args)
    if usage_error:
        print(f"error: {usage_error}", file=sys.stderr)
        return 2
    from solver.backends import BackendUnavailable
    from solver.io import iopddl_choice_line, load_problem, write_json_atomic, write_text_atomic
    from solver.pipeline import solve
    from solver.problem import ProblemError

    # SIGTERM unwinds like Ctrl-C, so a running CBC child is killed on the way out
    signal.signal(signal.SIGTERM, _raise_interrupt)
    show = not args.quiet and sys.stderr.isatty()
    update, status = _progress_printer(show)
    try:
        if args.server:
            solution = _solve_on_server(args, update)
        else:
            problem = load_problem(args.problem, args.format)
            solution = solve(problem, backend=args.backend, time_limit=args.time_limit, threads=args.threads,
                             seed=args.seed, method=args.method, start_time=PROCESS_START, progress=update,
                             inner=args.inner)
    except FileNotFoundError:
        print(f"error: {args.problem}: no such file", file=sys.stderr)
        return 2
    except PermissionError:
        print(f"error: {args.problem}: permission denied", file=sys.stderr)
        return 2
    except ProblemError as exc:
        print(f"error: {args.problem}: {exc}", file=sys.stderr)
        return 2
    except (BackendUnavailable, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    finally:
        if status is not None:
            status.stop()
    if args.iopddl_output:
        text = iopddl_choice_line(solution.choice) + "\n"
    else:
        text = json.dumps(solution.to_dict(), indent=1) + "\n"
    if args.output:
        try:
            if args.iopddl_output:
                write_text_atomic(args.output, text)
            else:
                write_json_atomic(args.output, solution.to_dict())
        except OSError as exc:
            print(f"error: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    else:
        sys.stdout.write(text)
    summary = (f"{solution.status.value}: cost={solution.cost} bound={solution.lower_bound} "
               f"gap={solution.gap} in {solution.seconds:.2f}s ({os.path.basename(args.problem)})")
    compiled = float(solution.stats.get("compile_seconds") or 0.0)
    if compiled >= 0.05:  # a first run on this machine: numba compiled the kernels into its disk cache
        summary += f"; {compiled:.2f}s of it compiling solver kernels (first run only)"
    if solution.message:
        summary += f" - {solution.message}"
    print(summary, file=sys.stderr)
    return 0 if solution.has_solution else 1
