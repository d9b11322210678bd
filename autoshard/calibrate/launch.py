"""``--nproc-per-node N``: start the ranks of a one-host job ourselves,
instead of ``torchrun``.

Why a launcher of our own: under ``torchrun`` a Ctrl-C or a failed rank ends
with torchrun's own tracebacks and summaries, however carefully the ranks
behave. Here the parent starts ``N`` child processes with torchrun's
environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``), so each child runs exactly what a
torchrun rank runs, and the parent alone reports the outcome in one line:

* a child that fails writes its one-line error to a status folder and exits
  non-zero; the parent stops the others (SIGTERM, then SIGKILL), prints the
  first error and exits 1;
* a child that dies without a word (a crash: SIGABRT, SIGSEGV; SIGKILL from
  the out-of-memory killer) is reported as that rank's failure, with the
  signal, and the parent exits 1: the others it then stops are not the story;
* Ctrl-C reaches every process of the foreground group; children exit
  quietly (code 130), the parent waits for them, prints one line and exits
  130;
* either way the previous profile is untouched (only rank 0 writes, at the
  very end, atomically) and any temporary file of an interrupted write is
  removed.

>>> _free_port() > 0
True
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["CHILD_ENV", "ARGS_ENV", "spawn", "unchanged_text", "stopped_text", "stopped_code"]

CHILD_ENV = "AUTOSHARD_CALIBRATE_STATUS_DIR"
"""Set in children: the folder where a failing child writes its error line."""
ARGS_ENV = "AUTOSHARD_CALIBRATE_ARGS"
"""Set in children: the parsed command line, as JSON."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def unchanged_text(path: str | None) -> str:
    """What an aborted run says about its output file.

    >>> unchanged_text(None), unchanged_text("/no/such.json")
    ('nothing written', 'nothing written to /no/such.json')
    """
    if not path:
        return "nothing written"
    return f"{path} left unchanged" if os.path.exists(path) else f"nothing written to {path}"


def stopped_text(signals: list[int], *, peers: bool = False) -> str:
    """What a run stopped by ``signals`` (the first counts; none: a
    KeyboardInterrupt without a signal) says, before what it left unchanged;
    ``peers``: a rank of a job of several, where SIGTERM is rarely the user's.

    >>> stopped_text([signal.SIGINT]), stopped_text([]), stopped_text([signal.SIGTERM])
    ('interrupted', 'interrupted', 'stopped by SIGTERM')
    >>> stopped_text([signal.SIGTERM], peers=True)
    'stopped by SIGTERM (torchrun sends it to every rank when one rank fails: look for that rank above)'
    """
    if not signals or signals[0] != signal.SIGTERM:
        return "interrupted"
    if peers:
        return "stopped by SIGTERM (torchrun sends it to every rank when one rank fails: look for that rank above)"
    return "stopped by SIGTERM"


def stopped_code(signals: list[int]) -> int:
    """Exit code of a run stopped by ``signals``: 128 + the first signal, 130 (SIGINT) by default.

    >>> stopped_code([signal.SIGTERM]), stopped_code([])
    (143, 130)
    """
    return 128 + int(signals[0]) if signals else 128 + int(signal.SIGINT)


def _exit_text(code: int) -> str:
    """How a child ended, for the parent's line.

    >>> _exit_text(-6), _exit_text(1)
    ('died of SIGABRT without an error line (a crash)', 'exited with code 1 without an error line')
    """
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"died of {name} without an error line (a crash)" if -code != signal.SIGKILL \
            else "was killed by SIGKILL (out of memory? the system log says)"
    return f"exited with code {code} without an error line"


def _wait(procs: list[subprocess.Popen], seconds: float) -> None:
    """Wait until every child in ``procs`` ended, at most ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.05)


def _stop(procs: list[subprocess.Popen], first: int | None = None, grace_s: float = 10.0) -> None:
    """Send ``first`` (if any) to the children still running, wait up to
    ``grace_s``, then SIGTERM, then SIGKILL."""
    for sig, wait_s in ((first, grace_s), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        alive = [p for p in procs if p.poll() is None]
        if not alive:
            return
        if sig is not None:
            for p in alive:
                try:
                    p.send_signal(sig)
                except ProcessLookupError:
                    pass
        _wait(alive, wait_s)


def _remove_strays(targets: list[str], since: float) -> None:
    """Temporary files of an interrupted atomic write (``solver.io``'s
    ``.NAME.XXXX.tmp`` beside the target) created by this run."""
    for target in targets:
        path = Path(target)
        for tmp in path.parent.glob(f".{path.name}.*.tmp"):
            try:
                if tmp.stat().st_mtime >= since - 1:
                    tmp.unlink()
            except OSError:
                pass


def _error_lines(folder: str) -> list[str]:
    """The error lines the children wrote, oldest first."""
    errors = []
    for entry in Path(folder).glob("rank*.err"):
        try:
            errors.append((entry.stat().st_mtime, entry.read_text().strip()))
        except OSError:
            continue
    return [line for _, line in sorted(errors)]


def spawn(args: Any, nproc: int, command: str) -> int:
    """Run ``nproc`` ranks of ``autoshard calibrate-hardware`` on this host
    (module docstring); returns the exit code."""
    payload = {k: v for k, v in vars(args).items() if not k.startswith("_") and k != "nproc_per_node"}
    payload["command_line"] = command
    folder = tempfile.mkdtemp(prefix="autoshard-calibrate-")
    targets = [p for p in (args.output, args.report, args.plot, args.measurements) if p]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(nproc),
               LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK="0", ROLE_RANK="0", **{CHILD_ENV: folder,
                                                                              ARGS_ENV: json.dumps(payload)})
    started = time.time()
    procs: list[subprocess.Popen] = []
    first_failure: tuple[int, int] | None = None  # (rank, exit code) of the first child to fail, before any stop
    signals: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        signals.append(signum)
        raise KeyboardInterrupt(f"signal {signum}")

    # explicit handlers: a parent started with SIGINT ignored (a background job of a script) still stops its ranks
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for rank in range(nproc):
            procs.append(subprocess.Popen([sys.executable, "-m", "autoshard.calibrate.rank"],
                                          env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}))
        while any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs):
                # the others fail on their own once a peer is gone, and a peer's "connection reset" can exit
                # before the crash that caused it is reaped (a killed process with many threads and a large
                # heap takes a while to become a zombie): judge only once everyone ended on their own or the
                # grace is over, and before any signal of ours; a crash then wins over the error lines
                _wait(procs, 3.0)
                failed = [(rank, p.returncode) for rank, p in enumerate(procs) if p.poll() not in (None, 0)]
                first_failure = min(failed, key=lambda f: (f[1] >= 0, f[0]))
                _stop(procs, signal.SIGTERM, grace_s=5.0)
                break
            time.sleep(0.05)
        codes = [p.wait() for p in procs]
        if all(c == 0 for c in codes):
            return 0
        errors = _error_lines(folder)
        if first_failure is None:  # every child ended before the loop looked: a crash first, else the lowest rank
            first_failure = min(((rank, c) for rank, c in enumerate(codes) if c != 0), key=lambda f: (f[1] >= 0, f[0]))
        rank, code = first_failure
        if not errors and code == 128 + signal.SIGINT:  # a Ctrl-C that reached the children, not us
            raise KeyboardInterrupt("a rank was interrupted")
        # a crash first: the error lines of the others say only that their peer is gone
        line = errors[0] if errors and code >= 0 else f"rank {rank} {_exit_text(code)}"
        print(f"autoshard calibrate-hardware: {line}; {unchanged_text(args.output)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        _stop(procs, signal.SIGINT)
        print(f"autoshard calibrate-hardware: {stopped_text(signals)}; {unchanged_text(args.output)}",
              file=sys.stderr)
        return stopped_code(signals)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _stop(procs, signal.SIGTERM)
        _remove_strays(targets, started)
        shutil.rmtree(folder, ignore_errors=True)
