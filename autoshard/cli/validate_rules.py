"""``autoshard validate-rules``: its flags, checked before torch is imported.

The validator itself (``autoshard.rules.validator``) imports torch and every
rule; this module only declares and checks the flags, so ``--help`` and a
mistyped flag answer at once.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

__all__ = ["add_arguments", "run"]

# far beyond any real use (a rule has at most a few hundred strategies on the
# meshes checked), low enough that a typo cannot start an hours-long run
MAX_CASES = 1000
MAX_STRATEGIES = 100_000
MAX_FAILURES = 10_000
MAX_SAMPLES = 1000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``autoshard validate-rules`` / ``python -m autoshard.validate_rules``."""
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
        from autoshard.rules.opinfo_cli import run_opinfo

        return run_opinfo(args)
    return _run_checked(args)


def _run_checked(args: argparse.Namespace) -> int:
    """Validate the selected rules (flags checked), print the table; 1 if any failed."""
    from autoshard.rules import load_rules
    from autoshard.rules.validator import format_reports, select_ops, unavailable_named, validate_registry

    registry = load_rules()
    ops = select_ops(registry, args.op, args.family)
    reports = validate_registry(registry, ops, cases=args.cases, seed=args.seed, max_strategies=args.max_strategies)
    print(format_reports(reports, show_failures=args.failures))
    unavailable = unavailable_named(registry, args.op, args.family)
    if unavailable:
        packages = sorted({n.package for n in registry.named_rules() if n.name in unavailable})
        print(f"not checked ({', '.join(packages)} not installed, or its import failed): {', '.join(unavailable)}")
    return 0 if all(r.ok for r in reports) else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m autoshard.validate_rules``: the command without the ``autoshard`` entry point."""
    parser = argparse.ArgumentParser(prog="python -m autoshard.validate_rules",
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
