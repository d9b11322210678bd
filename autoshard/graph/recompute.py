r"""Activation recomputation as strategies: keep or recompute, chosen with the placements.

The closure members of every checkpoint region (``autoshard.graph.regions``)
get one copy of their strategy list per state ``s`` in their state set
``Sigma_v`` (``KEEP``, ``HOLD``, ``RECOMPUTE``), state-major: strategy
``k = i n_v + j`` is base strategy ``j`` (placements) in state
``Sigma_v[i]``. The solver picks a placement and a state in one variable, in
the same problem as every other node; with repeated layers tied, the problem
grows by a constant, not per layer. Nothing else changes: a state is a
strategy, so pins, ties, reductions and every solver stage work as before.

Notation for a closure member v of region R: ``t_v`` its time, ``F_v`` /
``B_v`` the last forward / backward reader of its storage (``regions``),
``t_rc = t_rc(R)``, ``c_v(j)`` its compute at base strategy j, ``m_v(j)`` its
output's bytes, ``M`` an edge's redistribution matrix (``autoshard.graph.edges``).

**(C1) Compute.** ``cost_v(j, RECOMPUTE) = 2 c_v(j)`` (the forward, and again
at ``t_rc``); ``cost_v(j, KEEP) = cost_v(j, HOLD) = c_v(j)``.

**(C2) Redistributions.** On an edge x -> v: ``M'(a, (j, s)) = 2 M(a, j)``
when ``s = RECOMPUTE`` (the reader's input redistribution runs again, e.g.
FSDP's parameter all-gather re-issued in the backward), else ``M(a, j)``.

**(C3) Inputs must exist at t_rc.** ``M'(a, (j, RECOMPUTE)) = inf`` when x in
its state (a's state) does not exist during R's recomputation
(``RegionAnalysis.available``): a forward-only input kept only as long as
the forward needs it. The pair (reader recompute, input normal) is thus
forbidden, and the input must be ``HOLD`` (kept until ``t_rc``) or
``RECOMPUTE`` itself.

**(C4) Views follow their base.** On the edge from a closure member to its
view: ``M'(a, b) = inf`` unless a and b are in the same state (a view of a
recomputed storage is made again; a view of a kept one is kept).

**(C5) Memory, one live interval per node.** A storage-owning member's
memory over time is a union of intervals that depends on its state:

    KEEP, saved          [t_v, B_v + 1)
    RECOMPUTE, saved     [t_v, F_v + 1)  u  [s_v, B_v + 1)
    KEEP, forward-only   [t_v, F_v + 1)
    HOLD, forward-only   [t_v, L_v + 1)
    RECOMPUTE, fwd-only  [t_v, F_v + 1)  u  [s_v, L_v + 1)   (a temporary of the recomputation)

with ``s_v`` the slot where v runs again in R's recomputation phase (just
before ``t_rc``; ``autoshard.graph.regions``) and ``L_v`` the slot of its
last reader there. It is split into three pieces, each one problem node with
one interval, the last two memory-only nodes tied to v (same strategy list,
zero cost, no edges): the op node over ``[t_v, F_v + 1)`` with ``m_v(j)`` in
every state; ``gap`` over ``[F_v + 1, s_v)`` with ``m_v(j)`` in the states
that keep the storage (KEEP when saved, HOLD) and 0 otherwise; ``tail`` over
``[s_v, B_v + 1)`` with ``m_v(j)`` in every state when saved, or over
``[s_v, L_v + 1)`` with ``m_v(j)`` for HOLD and RECOMPUTE when forward-only.
Their sum is the table above at every time. Views own no storage; a
recomputed reader's input copies are charged again at its slot
(``autoshard.graph.copies``).

Exactness: (C1)-(C5) are what a non-reentrant checkpoint of the region does
when the listed values are recomputed and the rest kept, with redistributions
run per reader as the runtime runs them; the one over-estimate is ``L_v``,
taken over every reader that may be recomputed (a temporary may be held a
few slots longer when a reader is kept instead).

>>> expand_compute(np.array([1.0, 3.0]), (KEEP, RECOMPUTE)).tolist()
[1.0, 3.0, 2.0, 6.0]
>>> piece_memory(np.array([5.0]), (KEEP, HOLD, RECOMPUTE), "gap", saved=False).tolist()
[0.0, 5.0, 0.0]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from autoshard.graph.copies import ReaderSpan
from autoshard.graph.regions import RegionAnalysis
from autoshard.graph.states import HOLD, KEEP, RECOMPUTE, STATE_NAMES, strategy_states

__all__ = ["EdgeRule", "expand_compute", "expand_memory", "piece_memory", "state_signature", "strategy_states",
           "MemoryPiece", "member_pieces", "reader_span", "edge_rule"]


def state_signature(signature: str, states: tuple[int, ...]) -> str:
    """The signature of a node's list with ``states`` (equal lists, equal signatures)."""
    return signature + "|states:" + ",".join(STATE_NAMES[s] for s in states)


def expand_compute(base: np.ndarray, states: tuple[int, ...]) -> np.ndarray:
    """(C1): the base compute per state, doubled for RECOMPUTE."""
    return np.concatenate([base * (2.0 if s == RECOMPUTE else 1.0) for s in states])


def expand_memory(base: np.ndarray, states: tuple[int, ...]) -> np.ndarray:
    """The op node's own memory: the output in every state (its forward piece)."""
    return np.tile(base, len(states))


def piece_memory(base: np.ndarray, states: tuple[int, ...], piece: str, *, saved: bool) -> np.ndarray:
    """(C5): memory of the ``gap`` or ``tail`` piece per strategy."""
    if piece == "gap":
        holds = {KEEP, HOLD} if saved else {HOLD}
    elif piece == "tail":
        holds = {KEEP, HOLD, RECOMPUTE} if saved else {HOLD, RECOMPUTE}
    else:
        raise ValueError(f"recompute: unknown memory piece {piece!r}")
    return np.concatenate([base if s in holds else np.zeros_like(base) for s in states])


@dataclass(frozen=True, slots=True)
class MemoryPiece:
    """A memory-only node tied to a closure member."""

    role: str
    """``gap`` or ``tail``."""
    live: tuple[int, int]
    memory: np.ndarray


def member_pieces(analysis: RegionAnalysis, name: str, time: int, base_memory: np.ndarray
                  ) -> tuple[tuple[int, int], list[MemoryPiece]]:
    """(C5) for the storage-owning member ``name`` at ``time``: the op node's
    own interval and the tied pieces (empty ones left out)."""
    m = analysis.members[name]
    own = (time, m.forward_end + 1)
    pieces = []
    if m.forward_end + 1 < m.slot:
        pieces.append(MemoryPiece("gap", (m.forward_end + 1, m.slot),
                                  piece_memory(base_memory, m.states, "gap", saved=m.saved)))
    end = (m.backward_end + 1) if m.saved and m.backward_end is not None else m.last_slot + 1
    pieces.append(MemoryPiece("tail", (m.slot, end), piece_memory(base_memory, m.states, "tail", saved=m.saved)))
    return own, [p for p in pieces if p.memory.any()]


def reader_span(analysis: RegionAnalysis, name: str, time: int, alias_end: int | None,
                forward_alias_end: int | None) -> ReaderSpan:
    """When the input copies of op ``name`` live (``autoshard.graph.copies``):
    ``alias_end`` is one past the last reader of its aliases for a view (None
    for an owner), ``forward_alias_end`` the same over forward readers."""
    m = analysis.members.get(name)
    keep_end = time + 1 if alias_end is None else alias_end
    if m is None or RECOMPUTE not in m.states:
        return ReaderSpan(time, keep_end, keep_end)
    if alias_end is None:
        return ReaderSpan(time, keep_end, time + 1, m.slot, m.slot + 1)
    return ReaderSpan(time, keep_end, forward_alias_end or time + 1, m.slot,
                      alias_end if m.saved else m.last_slot + 1)


@dataclass(frozen=True, slots=True)
class EdgeRule:
    """(C2)-(C4) on one edge; hashable, so that equal rules share a matrix."""

    src_states: tuple[int, ...]
    dst_states: tuple[int, ...]
    available: tuple[bool, bool, bool]
    """Whether the producer exists at the reader's ``t_rc`` in KEEP, HOLD, RECOMPUTE."""
    follows: bool
    """The reader is a view of the producer and takes its state (C4)."""

    def apply(self, matrix: np.ndarray) -> np.ndarray:
        """The edge matrix of the state-expanded ends from the (tiled) placement matrix."""
        rows = strategy_states(self.src_states, matrix.shape[0])
        cols = strategy_states(self.dst_states, matrix.shape[1])
        recomputed = cols == RECOMPUTE
        out = np.where(recomputed[None, :], 2.0 * matrix, matrix)
        missing = ~np.array(self.available, dtype=bool)[rows]
        out[np.ix_(missing, recomputed)] = np.inf
        if self.follows:
            out[rows[:, None] != cols[None, :]] = np.inf
        return out


def edge_rule(analysis: RegionAnalysis, src_name: str | None, src_states: Sequence[int], dst_name: str,
              dst_states: Sequence[int]) -> EdgeRule | None:
    """The rule of the edge from fx node ``src_name`` (None: a leaf) to closure
    member ``dst_name``; None when neither end has states."""
    src_states, dst_states = tuple(src_states), tuple(dst_states)
    if not src_states and not dst_states:
        return None
    member = analysis.members.get(dst_name)
    available = (True, True, True)
    follows = False
    if member is not None and RECOMPUTE in member.states and src_name is not None:
        available = tuple(analysis.available(src_name, s, member.region)  # type: ignore[assignment]
                          for s in (KEEP, HOLD, RECOMPUTE))
    if member is not None and member.follows is not None and src_name == member.follows:
        follows = True
    return EdgeRule(src_states, dst_states, available, follows)
