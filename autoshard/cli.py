"""The ``autoshard`` command line: one thin entry point per subcommand.

Each subcommand lives in the module that owns its concern and exposes
``add_arguments(parser)`` and ``run(args) -> int``; this file only wires them.
Errors that users cause (bad files, unknown names) are raised as
:class:`autoshard.errors.UserError` (or ``ValueError`` subclasses of the lower
layers) and printed as one line with a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Sequence

# (subcommand, module, one-line help). Modules are imported lazily so that
# ``autoshard --help`` does not pay for importing torch.
_COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("demo", "autoshard.demo", "run the end-to-end demo on small examples"),
    ("coverage", "autoshard.coverage", "list a model's aten ops and the rules that cover them"),
    ("validate-rules", "autoshard.rules.validator", "check sharding rules numerically on simulated shards"),
    ("solve", "autoshard.plan.solve_cli", "trace a model factory and solve its sharding plan for a mesh"),
    ("explain", "autoshard.plan.explain", "show a plan: placements, costliest redistributions, estimate"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autoshard", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name, help_text in _COMMANDS:
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        cmd.set_defaults(_module=module_name)
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:  # a subcommand whose module is not built yet
            cmd.set_defaults(_unavailable=str(exc))
            continue
        module.add_arguments(cmd)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
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
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        print("autoshard: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError) as exc:  # user errors: one line, no traceback
        print(f"autoshard {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
