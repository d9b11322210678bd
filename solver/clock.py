"""When this process started, on the ``time.perf_counter()`` clock.

The contest's time limit (and ours, from the command line) counts the whole
run, interpreter start and imports included. On Linux the process start time
is read from ``/proc``; elsewhere the import of this module is the best
approximation.
"""

from __future__ import annotations

import os
import time

__all__ = ["PROCESS_START", "process_start"]


def process_start() -> float:
    """``time.perf_counter()`` value at which this process started."""
    now = time.perf_counter()
    try:
        with open(f"/proc/{os.getpid()}/stat") as handle:
            # field 22 (after the parenthesised command name): start time in clock ticks after boot
            fields = handle.read().rsplit(")", 1)[1].split()
        started_ticks = int(fields[19])
        with open("/proc/uptime") as handle:
            uptime = float(handle.read().split()[0])
        elapsed = uptime - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return now
    return now - max(0.0, min(elapsed, 3600.0))


PROCESS_START = process_start()
