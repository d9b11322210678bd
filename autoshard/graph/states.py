"""Recomputation states of a strategy, and where they sit in a state-expanded strategy list (torch-free).

A node with states ``Sigma`` (``autoshard.graph.recompute``) has
``len(Sigma) * n`` strategies, state-major: strategy ``k`` is base strategy
``k mod n`` (placements) in state ``Sigma[k // n]``. ``KEEP`` always comes
first, so ``k mod n`` is the same placements kept.

>>> strategy_states((KEEP, RECOMPUTE), 4).tolist()
[0, 0, 2, 2]
"""

from __future__ import annotations

import numpy as np

__all__ = ["KEEP", "HOLD", "RECOMPUTE", "STATE_NAMES", "strategy_states"]

KEEP, HOLD, RECOMPUTE = 0, 1, 2
STATE_NAMES = ("keep", "hold", "recompute")


def strategy_states(states: tuple[int, ...], count: int) -> np.ndarray:
    """State of each of the ``count`` strategies of a node with state set ``states`` (state-major)."""
    if not states:
        return np.full(count, KEEP, dtype=np.int8)
    return np.repeat(np.array(states, dtype=np.int8), count // len(states))
