"""The segment tree behind local search agrees with a plain array."""

from __future__ import annotations

import numpy as np
import pytest

from solver.kernels import MemoryTree


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 1000])
def test_range_add_and_max_match_a_plain_array(size):
    rng = np.random.default_rng(size)
    values = rng.random(size) * 10
    tree, ref = MemoryTree(values), values.copy()
    for _ in range(2000):
        lo = int(rng.integers(0, size))
        hi = int(rng.integers(lo + 1, size + 1))
        if rng.random() < 0.5:
            delta = float(rng.normal())
            tree.add(lo, hi, delta)
            ref[lo:hi] += delta
        else:
            assert tree.max(lo, hi) == pytest.approx(ref[lo:hi].max())
    peak, point = tree.argmax()
    assert peak == pytest.approx(ref.max()) and ref[point] == pytest.approx(ref.max())


def test_empty_range_has_no_maximum():
    assert MemoryTree(np.ones(4)).max(2, 2) == -np.inf
