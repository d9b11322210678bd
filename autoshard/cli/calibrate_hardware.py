"""``autoshard calibrate-hardware``: measure this machine into a hardware
profile, or check a profile against held-out measurements.

Why a command: datasheet profiles guess efficiency, launch cost and real
collective latency; a plan priced with wrong figures is a wrong plan. The
command measures them on the job's own ranks and process groups.

Flags: ``-o PROFILE.json`` (calibrate and write), ``--check PROFILE.json``
(accuracy report only), ``--report R.md`` / ``--plot R.png`` (after a
calibration: check the new profile too), ``--quick``, ``--mesh 2x4 --dims
dp,tp``, ``--backend gloo|nccl``, ``--base PROFILE`` (datasheet to compare
with; source of figures this run cannot measure), ``--nproc-per-node N``
(start N ranks here instead of torchrun), ``--threads`` (per rank; default
the host's cores / ranks on it), ``--measurements M.json`` (raw samples).

Errors are one line and a non-zero exit; an interrupted (SIGINT, exit 130),
stopped (SIGTERM, exit 143: torchrun sends it to every rank when one rank
fails) or failed run prints one line saying the old profile was left
unchanged.

>>> import argparse
>>> p = argparse.ArgumentParser(); add_arguments(p)
>>> p.parse_args(["-o", "x.json", "--quick"]).quick
True
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from autoshard.calibrate.rank import CalibrationError, model_kwargs, run_rank

__all__ = ["add_arguments", "run", "run_rank", "CalibrationError"]

_EPILOG = """examples:
  torchrun --standalone --nproc-per-node 4 -m autoshard.cli calibrate-hardware -o cpu.json \\
      --report report.md --plot report.png        # calibrate 4 CPU ranks, then check the new profile
  autoshard calibrate-hardware --nproc-per-node 4 -o cpu.json --quick   # the same without torchrun
  autoshard calibrate-hardware --nproc-per-node 4 --check cpu.json      # accuracy report only
  torchrun --nproc-per-node 8 -m autoshard.cli calibrate-hardware --backend nccl --base h100-sxm-80gb \\
      --mesh 2x4 --dims dp,tp -o h100.json        # GPUs (untested: no GPU was available)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``autoshard calibrate-hardware`` (module docstring)."""
    from autoshard.trace.model_spec import add_path_argument

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _EPILOG
    parser.add_argument("-o", "--output", metavar="PROFILE.json", help="measured profile to write")
    parser.add_argument("--check", metavar="PROFILE.json", help="only check this profile on held-out measurements")
    parser.add_argument("--backend", choices=("gloo", "nccl"), help="process-group backend (default: nccl on GPUs)")
    parser.add_argument("--base", metavar="PROFILE",
                        help="datasheet profile to compare with and to copy unmeasured figures from")
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repeats (about 2 minutes)")
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # tests only: seconds
    parser.add_argument("--mesh", metavar="AxB", help="mesh whose groups to measure (default 2 x ranks/2)")
    parser.add_argument("--dims", metavar="NAMES", help="mesh dim names, e.g. dp,tp")
    parser.add_argument("--name", help="profile name (default: the output file's stem)")
    parser.add_argument("--threads", type=int, metavar="N", help="torch threads per rank")
    parser.add_argument("--nproc-per-node", type=int, metavar="N", help="start N ranks on this host (no torchrun)")
    parser.add_argument("--measurements", metavar="PATH.json", help="also write the raw measurements")
    parser.add_argument("--report", metavar="REPORT.md", help="accuracy report (markdown)")
    parser.add_argument("--plot", metavar="REPORT.png", help="accuracy plot, predicted vs measured (log-log)")
    parser.add_argument("--model", default=None, metavar="MODULE:FACTORY",
                        help="example model whose ops the check times (default examples.models.llama3:tiny, widened)")
    parser.add_argument("--model-kwargs", default=None, metavar="JSON", help="factory overrides for --model")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="S",
                        help="seconds a rank waits for the others before failing (default %(default)g)")
    add_path_argument(parser)


def _validate(args: argparse.Namespace) -> None:
    """Every flag, checked before any rank starts or anything is measured."""
    from autoshard.cli.values import check_count, check_output_path, check_seconds, parse_mesh

    if not args.output and not args.check:
        raise ValueError("give -o PROFILE.json (calibrate) or --check PROFILE.json (accuracy report)")
    if args.output and args.check:
        raise ValueError("-o and --check: calibrate (-o, with --report/--plot to check it) or check, not both")
    if args.check and args.measurements:
        raise ValueError("--measurements: only with -o (a calibration)")
    if args.quick and args.tiny:
        raise ValueError("--quick and --tiny: pick one")
    check_count(args.threads, "--threads", 1, 4096)
    check_count(args.nproc_per_node, "--nproc-per-node", 1, 1024)
    check_seconds(args.timeout, "--timeout")
    if args.dims and not args.mesh:
        raise ValueError("--dims: needs --mesh")
    if args.name is not None and not args.name.strip():
        raise ValueError("--name: must not be empty")
    for flag, path in (("-o", args.output), ("--report", args.report), ("--plot", args.plot),
                       ("--measurements", args.measurements)):
        check_output_path(path, flag)
    if args.mesh:
        parse_mesh(args.mesh, args.dims)
    if args.check:
        from hw_profiles import load

        load(args.check)  # a bad profile fails before any rank starts
    if args.base:
        from hw_profiles import load

        load(args.base)
    if args.model_kwargs is not None:
        model_kwargs(args.model_kwargs)
    from autoshard.trace.model_spec import check_importable, use_paths

    use_paths(getattr(args, "path", []))
    if args.model or args.report or args.plot or args.check:  # the held-out check imports the model, in every rank
        if args.model:
            check_importable(args.model, getattr(args, "path", []))
        else:
            from autoshard.calibrate.heldout import DEFAULT_MODEL

            check_importable(DEFAULT_MODEL[0], getattr(args, "path", []))


def run(args: argparse.Namespace) -> int:
    """Run the command: spawn ranks (``--nproc-per-node``), or run this rank."""
    _validate(args)
    command = "autoshard calibrate-hardware " + " ".join(shlex.quote(a) for a in sys.argv[2:]) \
        if len(sys.argv) > 1 and sys.argv[1] == "calibrate-hardware" else ""
    if args.nproc_per_node and "WORLD_SIZE" not in os.environ:
        from autoshard.calibrate.launch import spawn

        return spawn(args, args.nproc_per_node, command)
    return run_rank(args, command=command)
