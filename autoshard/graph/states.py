"""Recomputation states of a strategy, and where they sit in a state-expanded strategy list (torch-free).

A node with states ``Sigma`` (``autoshard.graph.recompute``) has
``len(Sigma) * n`` strategies, state-major: strategy ``k`` is base strategy
``k mod n`` (placements) in state ``Sigma[k // n]``. ``KEEP`` always comes
first, so ``k mod n`` is the same placements kept.

>>> strategy_states((KEEP, RECOMPUTE), 4).tolist()
[0, 0, 2, 2]

This is the one home of that map: the graph builder, the plan's memory
timeline (``autoshard.program.memory``) and the assembler's tidying
(``autoshard.assembly.tidy_states``) read a chosen strategy's state and its
kept twin through :func:`state_of` and :func:`keep_index`.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["KEEP", "HOLD", "RECOMPUTE", "STATE_NAMES", "strategy_states", "state_of", "keep_index", "keep_choice"]

KEEP, HOLD, RECOMPUTE = 0, 1, 2
STATE_NAMES = ("keep", "hold", "recompute")


def strategy_states(states: tuple[int, ...], count: int) -> np.ndarray:
    """State of each of the ``count`` strategies of a node with state set ``states`` (state-major)."""
    if not states:
        return np.full(count, KEEP, dtype=np.int8)
    return np.repeat(np.array(states, dtype=np.int8), count // len(states))


def _base_count(node: Any) -> int:
    """``n``: the strategies of one state (the placements)."""
    return len(node.strategies) // len(node.states)


def state_of(node: Any, k: int) -> int:
    """The state of strategy ``k`` of a node with ``strategies`` and ``states`` (none: keep).

    >>> from types import SimpleNamespace
    >>> state_of(SimpleNamespace(strategies=range(4), states=(KEEP, RECOMPUTE)), 3)
    2
    """
    states = getattr(node, "states", ()) or ()
    return states[k // _base_count(node)] if states else KEEP


def keep_index(node: Any, k: int) -> int:
    """Strategy ``k``'s placements kept: ``k mod n`` (keep comes first)."""
    states = getattr(node, "states", ()) or ()
    return k % _base_count(node) if states else k


def keep_choice(graph: Any, choice: Sequence[int]) -> list[int]:
    """``choice`` with every node's state set to keep (the same placements)."""
    return [keep_index(node, k) for node, k in zip(graph.nodes, choice)]
