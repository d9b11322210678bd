"""Seconds numba spends compiling the solver's kernels, measured apart from solving.

Every kernel is compiled with ``cache=True``: the first solve on a machine (or
after an upgrade) compiles them and writes numba's on-disk cache (next to the
modules, or under ``NUMBA_CACHE_DIR`` / the user cache folder when the
package folder is read-only); later processes load them in milliseconds. The
first run's compilation still happens inside some stage, so the pipeline
listens to numba's ``numba:compile`` events, whose durations count only real
compilation (a cache load fires none), and reports them per stage in the
solution's stats (``compile_seconds``) and as a progress event, instead of
letting them pass for solve time.

>>> clock = CompileClock()
>>> with clock.installed():
...     pass
>>> clock.seconds
0.0
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator

from numba.core import event

__all__ = ["CompileClock", "COMPILING_NOTE"]

COMPILING_NOTE = "compiling solver kernels (first run only; cached on disk afterwards)"


class CompileClock(event.Listener):
    """Accumulates the wall time of outermost numba compilations while installed.

    ``on_first`` is called once, when the first compilation starts, so that a
    progress display can say why a stage is slow.
    """

    def __init__(self, on_first: Callable[[], None] | None = None) -> None:
        self.seconds = 0.0
        self._depth = 0
        self._started = 0.0
        self._on_first = on_first

    def on_start(self, ev: event.Event) -> None:
        if self._depth == 0:
            self._started = time.perf_counter()
            if self._on_first is not None:
                on_first, self._on_first = self._on_first, None
                on_first()
        self._depth += 1

    def on_end(self, ev: event.Event) -> None:
        self._depth -= 1
        if self._depth == 0:  # a kernel compiles the kernels it calls inside its own event
            self.seconds += time.perf_counter() - self._started

    @contextmanager
    def installed(self) -> Iterator["CompileClock"]:
        with event.install_listener("numba:compile", self):
            yield self
