"""Every sharding rule on the ATen calls of PyTorch's OpInfo samples: the whole sweep.

Traces the first ``--max-samples`` samples of every OpInfo in every CPU dtype
(forward and backward) to ATen calls, then checks every strategy the
registry enumerates for each distinct call on meshes 2, 3, 4 and 2x2 (even,
uneven and strided shards) on simulated shards
(:mod:`autoshard.validation.opinfo_sweep`). Writes the results page (ops, calls,
strategies checked, wrong, crashes, ops without a rule) as markdown with
the command, machine and date. Long: a progress bar shows where it is.
Not a test (the suite runs a bounded subset: tests/autoshard/validation/test_opinfo.py).

    python -m benchmarks.opinfo_rules                          # everything -> benchmarks/results/opinfo_rules.md
    python -m benchmarks.opinfo_rules --ops addmm --ops cumsum --max-samples 1 -o /tmp/part.md

Needs PyTorch's OpInfo database, which imports ``expecttest`` (pip install expecttest).
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/opinfo_rules.py`: re-executed as the module

import argparse
import datetime
import os
import platform
import shlex
import sys
from pathlib import Path

import torch

from autoshard.validation.opinfo import OpInfoUnavailable
from autoshard.cli.validate_rules import sweep_with_progress
from autoshard.validation.opinfo_sweep import format_sweep, sweep_markdown
from solver.io import write_text_atomic

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "opinfo_rules.md"


def machine() -> str:
    """CPU model, cores and torch build, for the results page."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.opinfo_rules", description=__doc__.splitlines()[0])
    parser.add_argument("--ops", action="append", default=[], metavar="NAME",
                        help="only these OpInfos (name or glob); repeatable; default all")
    parser.add_argument("--max-samples", type=int, default=3, help="samples per OpInfo and dtype (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default %(default)s)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="worker processes for the checks (same result as one; default %(default)s)")
    parser.add_argument("-o", "--out", default=str(DEFAULT_OUT), help="markdown results page (default %(default)s)")
    args = parser.parse_args(argv)
    if args.max_samples < 1:
        print("opinfo_rules: error: --max-samples: expected >= 1", file=sys.stderr)
        return 2
    try:
        report = sweep_with_progress(args.ops, max_samples=args.max_samples, seed=args.seed, jobs=max(args.jobs, 1))
    except (OpInfoUnavailable, ValueError) as exc:
        print(f"opinfo_rules: error: {exc}", file=sys.stderr)
        return 2
    print(format_sweep(report))
    command = "python -m benchmarks.opinfo_rules" + "".join(f" {shlex.quote(a)}" for a in (argv if argv is not None else sys.argv[1:]))
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    write_text_atomic(args.out, sweep_markdown(report, command=command, machine=machine(), date=date), parents=True)
    print(f"wrote {args.out}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
