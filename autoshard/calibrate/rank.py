"""One rank of ``autoshard calibrate-hardware``: measure (or check) on this
rank and turn any failure into one line, also as the entry of a child rank
started by ``--nproc-per-node`` (``python -m autoshard.calibrate.rank``,
see :mod:`autoshard.calibrate.launch`).

Why a module of its own: the launcher starts children that run this and
nothing else; the command module (:mod:`autoshard.cli.calibrate_hardware`) chooses
between launching and running one rank. Each builds on this one, and this
one on the launcher's exit-status texts only.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from autoshard.calibrate.launch import ARGS_ENV, CHILD_ENV, stopped_code, stopped_text, unchanged_text

__all__ = ["CalibrationError", "model_kwargs", "run_rank", "child_main"]

log = logging.getLogger(__name__)


class CalibrationError(ValueError):
    """A calibration that could not complete (the message says why and that
    the old profile was left unchanged)."""


def model_kwargs(text: str) -> dict[str, Any]:
    """The ``--model-kwargs`` JSON object; ``ValueError`` naming the flag."""
    from autoshard.trace.model_spec import parse_kwargs

    try:
        return parse_kwargs(text)
    except ValueError as exc:
        raise ValueError(str(exc).replace("--kwargs", "--model-kwargs", 1)) from None


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
        overrides = model_kwargs(args.model_kwargs) if args.model_kwargs else {}
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
    from autoshard.trace.model_spec import use_paths

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


def child_main() -> int:
    """Entry of one child rank: run the rank with the parent's arguments;
    report a failure in the status folder instead of printing it."""
    signals: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:  # until run_rank installs its own
        signals.append(signum)
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    try:
        data = json.loads(os.environ[ARGS_ENV])
        command = data.pop("command_line", "")
        return run_rank(argparse.Namespace(**data), command=command)
    except KeyboardInterrupt:
        return stopped_code(signals)


if __name__ == "__main__":
    code = child_main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown: a rank whose peers are gone must not hang in atexit handlers
