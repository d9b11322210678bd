"""Memory points for lazy models (solver.memory_points) against a direct reading of the profile."""

from __future__ import annotations

import numpy as np

from solver.compiled import assemble_graph
from solver.memory_points import initial_points, violated_points
from solver.tolerance import REL_TOL


def profile_graph(profile: np.ndarray, limit: float):
    """One variable whose value 1 adds ``profile`` (as fixed memory), value 0 adds nothing:
    values [1] give exactly ``profile``."""
    points = profile.shape[0]
    return assemble_graph(var_ids=np.arange(1), unary=[np.zeros(2)], edge_u=[], edge_v=[], edge_costs=[],
                          term_var=[0], term_t0=[0], term_t1=[points], term_usage=[np.array([0.0, 1.0])],
                          base=profile - 1.0, time_points=np.arange(points), limit=limit, constant=0.0)


def runs_over(profile: np.ndarray, limit: float) -> list[tuple[int, int]]:
    runs, start = [], None
    for t, value in enumerate(profile.tolist() + [-np.inf]):
        if value > limit and start is None:
            start = t
        elif value <= limit and start is not None:
            runs.append((start, t))
            start = None
    return runs


def test_one_point_per_run_at_its_largest_excess():
    rng = np.random.default_rng(31)
    for _ in range(200):
        profile = rng.integers(0, 10, size=int(rng.integers(1, 30))).astype(np.float64)
        limit = float(rng.integers(3, 8))
        got = violated_points(profile_graph(profile, limit), np.array([1]))
        expected = [s + int(np.argmax(profile[s:e])) for s, e in runs_over(profile, limit)]
        assert got.tolist() == expected


def test_per_round_keeps_the_largest_excesses():
    profile = np.array([5.0, 0, 9, 0, 7, 0, 6, 0, 8])
    got = violated_points(profile_graph(profile, 4.0), np.array([1]), per_round=2)
    assert got.tolist() == [2, 8]


def test_excess_within_the_tolerance_is_no_violation():
    limit = 1e9
    profile = np.array([limit * (1 + 0.5 * REL_TOL), limit * (1 + 2 * REL_TOL)])
    assert violated_points(profile_graph(profile, limit), np.array([1])).tolist() == [1]


def test_initial_points_are_the_highest_and_spread_out():
    rng = np.random.default_rng(32)
    for _ in range(100):
        points = int(rng.integers(1, 200))
        profile = rng.random(points) * 100
        count = int(rng.integers(1, 10))
        got = initial_points(profile_graph(profile, 50.0), np.array([1]), count=count)
        spacing = max(1, points // (4 * count))
        assert 1 <= got.size <= count and np.all(np.diff(got) >= spacing)
        assert int(np.argmax(profile)) in got.tolist()  # the peak always comes first
        # greedy: every point skipped before the last pick was too close to a pick
        ranked = np.argsort(-profile)
        last = max(np.flatnonzero(np.isin(ranked, got)))
        for p in ranked[:last]:
            assert p in got or np.min(np.abs(got - p)) < spacing


def test_no_points_without_a_limit_or_a_solution():
    profile = np.array([3.0, 9.0])
    assert violated_points(profile_graph(profile, np.inf), np.array([1])).size == 0
    assert initial_points(profile_graph(profile, np.inf), np.array([1])).size == 0
    assert initial_points(profile_graph(profile, 5.0), None).size == 0
