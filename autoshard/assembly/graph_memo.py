"""Values computed once per strategy graph and reused by every solve of one call.

One ``autoshard.solve`` call solves the same strategy graph many times (the search,
its overlap rounds, each expert baseline and theirs), and each of those solves needs
values that depend on the graph alone: its assembly graph, its gather-pricing
tables. :class:`GraphMemo` keeps them for the last few graphs, keyed by identity
(a :class:`~autoshard.graph.strategy_graph.StrategyGraph` is frozen). Each entry
holds its graph alive, so a recycled ``id`` cannot return another graph's value;
few entries, since a graph of an 8B model is large.

>>> memo = GraphMemo(keep=1)
>>> g, h = object(), object()
>>> memo.get(g, lambda graph: [1]) is memo.get(g, list)
True
>>> memo.get(h, lambda graph: [2]) and memo.get(g, lambda graph: [3])  # g was dropped for h
[3]
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Generic, TypeVar

__all__ = ["GraphMemo"]

V = TypeVar("V")


class GraphMemo(Generic[V]):
    """``make(graph)`` kept for the last ``keep`` graphs, by identity (module docstring)."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._entries: OrderedDict[int, tuple[Any, V]] = OrderedDict()

    def get(self, graph: Any, make: Callable[[Any], V]) -> V:
        entry = self._entries.get(id(graph))
        if entry is None or entry[0] is not graph:
            entry = self._entries[id(graph)] = (graph, make(graph))
            while len(self._entries) > self.keep:
                self._entries.popitem(last=False)
        self._entries.move_to_end(id(graph))
        return entry[1]
