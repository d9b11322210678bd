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
import logging
import os
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_arguments", "run", "run_rank", "CalibrationError"]

log = logging.getLogger(__name__)


class CalibrationError(ValueError):
    """A calibration that could not complete (the message says why and that
    the old profile was left unchanged)."""


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
    from autoshard.model_spec import add_path_argument

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
    from autoshard.cli_values import check_count, check_output_path, check_seconds, parse_mesh

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
        _model_kwargs(args.model_kwargs)
    from autoshard.model_spec import check_importable, use_paths

    use_paths(getattr(args, "path", []))
    if args.model or args.report or args.plot or args.check:  # the held-out check imports the model, in every rank
        if args.model:
            check_importable(args.model, getattr(args, "path", []))
        else:
            from autoshard.calibrate.heldout import DEFAULT_MODEL

            check_importable(DEFAULT_MODEL[0], getattr(args, "path", []))


def _model_kwargs(text: str) -> dict[str, Any]:
    """The ``--model-kwargs`` JSON object; ``ValueError`` naming the flag."""
    from autoshard.coverage import parse_kwargs

    try:
        return parse_kwargs(text)
    except ValueError as exc:
        raise ValueError(str(exc).replace("--kwargs", "--model-kwargs", 1)) from None


def run(args: argparse.Namespace) -> int:
    """Run the command: spawn ranks (``--nproc-per-node``), or run this rank."""
    _validate(args)
    command = "autoshard calibrate-hardware " + " ".join(shlex.quote(a) for a in sys.argv[2:]) \
        if len(sys.argv) > 1 and sys.argv[1] == "calibrate-hardware" else ""
    if args.nproc_per_node and "WORLD_SIZE" not in os.environ:
        from autoshard.calibrate.launch import spawn

        return spawn(args, args.nproc_per_node, command)
    return run_rank(args, command=command)


def _options(args: argparse.Namespace, job: Any, command: str) -> Any:
    import torch

    from costmodel.mesh import MeshSpec
    from hw_profiles import load

    from autoshard.calibrate.heldout import DEFAULT_MODEL
    from autoshard.calibrate.output import host_cores
    from autoshard.calibrate.runner import Options

    threads = args.threads or (max(1, host_cores() // job.local_world) if not job.is_cuda else torch.get_num_threads())
    torch.set_num_threads(threads)
    model = None  # the default held-out model (test-sized in --tiny)
    if args.model or args.model_kwargs:
        overrides = _model_kwargs(args.model_kwargs) if args.model_kwargs else {}
        model = (args.model or DEFAULT_MODEL[0], overrides)
    name = args.name or (Path(args.output).stem if args.output else None)
    base = load(args.base) if args.base else _default_base(job)
    return Options(output=args.output, check=args.check, mode="tiny" if args.tiny else ("quick" if args.quick else "full"),
                   mesh=MeshSpec.from_text(args.mesh, args.dims) if args.mesh else None, base=base, name=name,
                   threads=threads, measurements=args.measurements, report=args.report, plot=args.plot, model=model,
                   command=command)


def _default_base(job: Any) -> Any:
    """The shipped profile of this GPU (by name), ``cpu-gloo`` for a single
    CPU process (its interconnect figures), else none."""
    from hw_profiles import available, load

    if not job.is_cuda:
        return load("cpu-gloo") if job.world == 1 else None
    import torch

    gpu = torch.cuda.get_device_name(job.device).lower()
    for name in available():
        key = name.split("-")[0]
        if key != "cpu" and key in gpu:
            return load(name)
    return None


def run_rank(args: argparse.Namespace, *, command: str = "") -> int:
    """One rank of the job (all of it on a single process): calibrate or check."""
    from autoshard.calibrate.launch import CHILD_ENV, stopped_code, stopped_text, unchanged_text
    from autoshard.model_spec import use_paths

    use_paths(getattr(args, "path", []))  # ranks started by --nproc-per-node import the model here too

    status = os.environ.get(CHILD_ENV)
    target = args.output or args.report
    rank = int(os.environ.get("RANK", "0"))
    interrupted: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        interrupted.append(signum)
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    job = None
    try:
        from hw_profiles import HardwareProfile, load

        from autoshard.calibrate.runner import calibrate, check
        from autoshard.calibrate.timing import Job

        job = Job.from_env(args.backend, timeout_s=args.timeout)
        options = _options(args, job, command)
        if args.check:
            check(job, options, load(args.check))
        else:
            data = calibrate(job, options)
            if args.report or args.plot:
                check(job, options, HardwareProfile.from_dict(data))
        job.close()
        return 0
    except KeyboardInterrupt:
        if rank == 0 and not status:
            peers = int(os.environ.get("WORLD_SIZE", "1")) > 1
            print(f"autoshard calibrate-hardware: {stopped_text(interrupted, peers=peers)}; {unchanged_text(target)}",
                  file=sys.stderr)
        return stopped_code(interrupted)
    except Exception as exc:  # noqa: BLE001 - every failure of a rank becomes one line
        if interrupted:
            return stopped_code(interrupted)
        log.debug("calibrate-hardware failed", exc_info=True)
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        line = f"rank {rank}: {message}" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else message
        if status:
            Path(status, f"rank{rank}.err").write_text(line + "\n")
            return 1
        raise CalibrationError(f"{line}; {unchanged_text(target)}") from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
