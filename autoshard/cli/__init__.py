"""The ``autoshard`` command line: one module per subcommand in this package.

Each subcommand's module (``autoshard.cli.solve`` for ``autoshard solve``,
``autoshard.cli.calibrate_hardware`` for ``autoshard calibrate-hardware``...)
exposes ``add_arguments(parser)`` and ``run(args) -> int``; this file only
wires them. The package holds argument parsing, printing and wiring only: what
the commands compute lives in the library (``autoshard.plan``,
``autoshard.rules``, ``autoshard.validation``, ``autoshard.calibrate``...), and
no library module imports a module of this package (tests/test_import_graph.py).
Errors that users cause (bad files, unknown names) are raised as
``ValueError`` (or its subclasses in every layer: ``PlanError``, ``ProblemError``,
``ProfileError``...) or ``OSError`` and printed as one line with a non-zero exit code, never a traceback.

``autoshard ...`` (the console script) and ``python -m autoshard.cli ...`` are the same command.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import logging
import os
import sys
from typing import Any, Sequence

# (subcommand, module, one-line help). Modules are imported lazily so that
# ``autoshard --help`` does not pay for importing torch.
_COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("demo", "autoshard.cli.demo", "run the end-to-end demo on small examples"),
    ("coverage", "autoshard.cli.coverage", "list a model's aten ops and the rules that cover them"),
    ("validate-rules", "autoshard.cli.validate_rules", "check sharding rules numerically on simulated shards"),
    ("solve", "autoshard.cli.solve", "trace a model factory and solve its sharding plan for a mesh"),
    ("explain", "autoshard.cli.explain", "show a plan: placements, costliest redistributions, estimate"),
    ("calibrate-hardware", "autoshard.cli.calibrate_hardware", "measure this machine into a hardware profile, or check one"),
    ("check-profile", "autoshard.cli.check_profile", "validate hardware profile files without measuring"),
    ("correct-profile", "autoshard.cli.correct_profile", "correct a CPU profile for this machine (reference ops, cached)"),
    ("serve", "autoshard.cli.serve", "run the plan service: HTTP API, job queue, result cache"),
)


def _command_in(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (the first word that is not a flag)."""
    for word in argv:
        if not word.startswith("-"):
            return word
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; only the subcommand named in ``argv`` has its module imported
    (every one when ``argv`` is None), so ``autoshard --help`` and a torch-free
    subcommand (``serve``) do not pay for importing torch."""
    parser = argparse.ArgumentParser(
        prog="autoshard",
        description="Automatic sharding for PyTorch: trace a model, solve how to split it over a device mesh, "
                    "explain the plan, run it, calibrate the hardware profile, serve plans to a team.",
        epilog="Run 'autoshard COMMAND --help' for a command's options.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"autoshard {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = None if argv is None else _command_in(argv)
    for name, module_name, help_text in _COMMANDS:
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        cmd.set_defaults(_module=module_name)
        if argv is not None and name != wanted:
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:  # a subcommand whose dependencies are not installed
            cmd.set_defaults(_unavailable=str(exc))
            continue
        module.add_arguments(cmd)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("autoshard")
    except PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    """The ``autoshard`` command on ``argv`` (default ``sys.argv[1:]``, the process's own: then a
    command of :data:`_EXIT_AT_ONCE` ends the process when done); its exit code.

    >>> main(["explain", "/nonexistent/plan.json"])
    2
    """
    argv_given = argv
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv_given is None and _command_in(argv) in _EXIT_AT_ONCE:
        _collect_less_often()
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    if getattr(args, "_unavailable", None):
        print(f"autoshard {args.command}: not available ({args._unavailable})", file=sys.stderr)
        return 2
    module = importlib.import_module(args._module)
    code = _run(module, args)
    if argv_given is None and args.command in _EXIT_AT_ONCE:
        _exit_at_once(code)
    return code


_EXIT_AT_ONCE = ("solve", "explain", "coverage", "check-profile")
"""Commands that, run as the process (the console script, ``python -m autoshard.cli``), end it as
soon as their output is flushed: the interpreter's own teardown after ``autoshard solve`` (torch,
the traced graph, the strategy graph freed object by object) took 1.5-2.4 s of a 8-10 s run on a
tiny model, for nothing. Their files are written and closed before ``run`` returns, and they leave
no process or thread behind (a mesh search's workers and the expert layouts' child are joined or
ended first); a command that may (``serve``, ``calibrate-hardware`` under ``torchrun``, ``demo``)
exits normally."""


GC_THRESHOLDS = (100_000, 50, 100)
"""The cyclic collector's thresholds (``gc.set_threshold``) for a command of :data:`_EXIT_AT_ONCE` run
as the process. Python's defaults (700, 10, 10) run a collection every 700 new container objects; torch's
import and a trace create millions, and each full collection walks all of them again: 1.7-2.1 s of CPU
of a 10 s ``autoshard solve`` of a tiny model (15-20 %), 0.4 s with these (2026-12-05, hf_mamba2 2x2,
measured with ``gc.callbacks``), for ~10 MB more peak memory. Cycles are still collected (a long solve
keeps a bounded heap); only less often."""


def _collect_less_often() -> None:
    """Raise the cyclic collector's thresholds for the rest of the process (:data:`GC_THRESHOLDS`)."""
    gc.set_threshold(*GC_THRESHOLDS)


def _exit_at_once(code: int) -> None:
    """Flush what the command printed and logged, then end the process without the teardown."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (``autoshard solve ... | head``): nothing left to flush
            pass
    logging.shutdown()
    os._exit(code)


def _run(module: Any, args: argparse.Namespace) -> int:
    """``module.run(args)``'s exit code; a user's error as one line (module docstring)."""
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        print("autoshard: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError) as exc:  # user errors: one line, no traceback
        print(f"autoshard {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except ImportError as exc:  # a dependency of the command that is not installed here
        logging.getLogger("autoshard").debug("import failed", exc_info=True)
        print(f"autoshard {args.command}: error: a dependency is missing or the install is broken: {exc}",
              file=sys.stderr)
        return 2


def _one_line(exc: BaseException) -> str:
    """The message on one line: a library's multi-line text is folded, so the
    error stays the one line scripts and people read."""
    text = " ".join(part.strip() for part in str(exc).splitlines() if part.strip())
    return text or type(exc).__name__
