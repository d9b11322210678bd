"""solver.jit: numba compilation is measured apart from solve time."""

from __future__ import annotations

import numba
import numpy as np

from solver.jit import CompileClock


def test_compile_clock_counts_a_fresh_compilation_once():
    @numba.njit  # no cache: compiles in this process
    def twice(x):
        return x * 2

    calls = []
    clock = CompileClock(on_first=lambda: calls.append(1))
    with clock.installed():
        twice(np.ones(3))
        first = clock.seconds
        twice(np.ones(3))  # already compiled for this signature
    assert first > 0 and clock.seconds == first
    assert calls == [1]


def test_compile_clock_ignores_work_outside_it():
    @numba.njit
    def plus(x):
        return x + 1

    clock = CompileClock()
    plus(1.0)
    with clock.installed():
        plus(2.0)
    assert clock.seconds == 0.0
