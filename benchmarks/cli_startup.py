"""Start-up time of the command-line tools: what a user waits for before any work.

Why: `autoshard --help` used to import torch (about 2 s); the CLI now imports
only the chosen subcommand's module. This times each command as a fresh
process (the interpreter start included, as the user sees it), ``--repeat``
times after one unmeasured warm-up run (so the OS file cache is warm), and
prints a markdown table of the median and the slowest run, and whether the
process loaded torch (checked by a second run under ``python -X importtime``).

    python benchmarks/cli_startup.py              # median of 7 runs each
    python benchmarks/cli_startup.py --repeat 15
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/cli_startup.py`: re-executed as the module

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

COMMANDS: list[tuple[str, list[str]]] = [
    ("autoshard --help", ["-m", "autoshard.cli", "--help"]),
    ("autoshard --version", ["-m", "autoshard.cli", "--version"]),
    ("autoshard solve --help", ["-m", "autoshard.cli", "solve", "--help"]),
    ("autoshard serve --help", ["-m", "autoshard.cli", "serve", "--help"]),
    ("python -m solver --help", ["-m", "solver", "--help"]),
]


def _run(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def _loads_torch(args: list[str]) -> bool:
    proc = subprocess.run([sys.executable, "-X", "importtime", *args], cwd=ROOT, check=True,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return any(line.rsplit("|", 1)[-1].strip() == "torch" for line in proc.stderr.splitlines())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="measured runs per command (default %(default)s)")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat: expected at least 1")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"load average {load:.1f}; {args.repeat} runs each after one warm-up")
    print()
    print("| command | median s | slowest s | imports torch |")
    print("|---|---|---|---|")
    for label, argv in COMMANDS:
        _run(argv)
        times = [_run(argv) for _ in range(args.repeat)]
        print(f"| `{label}` | {statistics.median(times):.3f} | {max(times):.3f} | "
              f"{'yes' if _loads_torch(argv) else 'no'} |")
    if shutil.which("autoshard") is None:
        print("\n(the `autoshard` entry point is not on PATH here: timed as `python -m autoshard.cli`)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
