"""A value per strategy graph: made once per graph, by identity, for the last few graphs only."""

from __future__ import annotations

import doctest

import autoshard.assembly.graph_memo as graph_memo
from autoshard.assembly.graph_memo import GraphMemo


def test_a_value_is_made_once_per_graph_and_dropped_after_keep_others():
    made: list[int] = []
    memo = GraphMemo(keep=2)
    graphs = [object() for _ in range(3)]

    def make(graph):
        made.append(graphs.index(graph))
        return [graphs.index(graph)]

    first = memo.get(graphs[0], make)
    assert memo.get(graphs[0], make) is first and made == [0]
    memo.get(graphs[1], make)
    memo.get(graphs[0], make)  # the most recent again: graphs[1] is now the oldest
    memo.get(graphs[2], make)
    assert made == [0, 1, 2]
    assert memo.get(graphs[0], make) is first  # kept
    memo.get(graphs[1], make)  # dropped for graphs[2]: made again
    assert made == [0, 1, 2, 1]


def test_the_module_example_holds():
    result = doctest.testmod(graph_memo)
    assert result.attempted > 0 and result.failed == 0
