"""Windows of the anytime search (solver.window): the window problem, its growth, memory partners."""

from __future__ import annotations

import numpy as np

from solver.compiled import assemble_graph
from solver.window import extract_window, grow_window, memory_partner


def _chain_sharing_memory(limit: float = 10.0):
    # a chain 0-1-2 and a separate pair 3-4; variables 0 and 4 are live at point 0,
    # variable 3 at point 1; each has a small (1) and a large (6) layout
    usage = [np.array([1.0, 6.0])] * 3
    return assemble_graph(
        var_ids=np.arange(5), unary=[np.array([5.0, 0.0])] * 4 + [np.array([1.0, 0.0])],
        edge_u=[0, 1, 3], edge_v=[1, 2, 4], edge_costs=[np.zeros((2, 2))] * 3,
        term_var=[0, 4, 3], term_t0=[0, 0, 1], term_t1=[1, 1, 2], term_usage=usage,
        base=np.zeros(2), time_points=np.arange(2), limit=limit, constant=0.0)


def test_partner_frees_memory_at_the_windows_tightest_point():
    g = _chain_sharing_memory()
    x = np.array([0, 0, 0, 0, 1])  # point 0: 1 + 6 = 7; variable 4 could free 5 there
    profile = g.memory_profile(x)
    rng = np.random.default_rng(0)
    assert {memory_partner(g, x, np.array([0, 1, 2]), profile, rng) for _ in range(20)} == {4}


def test_no_partner_when_nothing_outside_could_free_memory():
    g = _chain_sharing_memory()
    x = np.array([1, 0, 0, 0, 0])  # variable 4 already uses its smallest layout
    rng = np.random.default_rng(0)
    assert memory_partner(g, x, np.array([0, 1, 2]), g.memory_profile(x), rng) is None
    # a window that covers no point has no tight point
    assert memory_partner(g, x, np.array([1, 2]), g.memory_profile(x), rng) is None


def test_coupled_window_trades_memory_that_a_connected_window_cannot():
    # limit 7 binds at point 0: variable 0 wants its large layout (cost 0 instead of
    # 5) but only fits when variable 4 moves to its small one (cost 1 instead of 0)
    g = _chain_sharing_memory(limit=7.0)
    x = np.array([0, 1, 1, 1, 1])
    profile = g.memory_profile(x)
    alone = extract_window(g, x, np.array([0, 1, 2]), profile)
    assert alone.cost(np.array([1, 1, 1])) == 0.0 and alone.memory_profile(np.array([1, 1, 1])).max() > alone.limit
    partner = memory_partner(g, x, np.array([0, 1, 2]), profile, np.random.default_rng(0))
    members = np.union1d([0, 1, 2], grow_window(g, partner, 100, 100, np.random.default_rng(0)))
    both = extract_window(g, x, members, profile)
    moved = np.array([1, 1, 1, 1, 0])  # members 0,1,2,3,4: variable 4 frees memory for 0
    assert both.memory_profile(moved).max() <= both.limit
    assert both.cost(moved) < both.cost(x[members])
