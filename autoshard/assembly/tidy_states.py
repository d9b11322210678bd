"""Recomputation states that change nothing, set back to keep before a plan is written (torch-free).

Two choices the objective cannot tell apart from keeping, which a solver
without a binding memory limit may therefore make at random:

- ``hold`` on a forward-only value that no recomputed op reads: it costs the
  same as ``keep`` and only holds memory longer;
- ``recompute`` of an op that costs nothing and owns no memory (a view of a
  parameter, a view of a view) and whose inputs arrive without a
  redistribution: re-running it changes neither time nor memory.

:func:`tidy_states` moves such nodes to ``keep`` (the same placements),
together with everything that must choose with them (tie groups, and the
neighbours in the same situation, e.g. a view that takes its base's state),
and only when every edge around them stays finite and no dearer: the plan
costs the same and holds no more memory. The plan then lists only
recomputation that matters.

>>> tidy_states.__name__
'tidy_states'
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from autoshard.graph.states import HOLD, KEEP, RECOMPUTE, keep_index, state_of

__all__ = ["tidy_states"]


def tidy_states(graph: Any, problem: Any, choice: Sequence[int]) -> list[int]:
    """``choice`` with pointless holds and free recomputes set to keep (module docstring)."""
    choice = list(choice)
    n = len(choice)
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(a: int, b: int) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    state = [state_of(node, k) for node, k in zip(graph.nodes, choice)]
    candidate = [False] * n
    for i, node in enumerate(graph.nodes):
        if node.kind != "op" or state[i] == KEEP:
            continue
        if state[i] == HOLD:
            candidate[i] = True
        elif float(problem.nodes[i].cost[choice[i]]) == 0.0 and float(problem.nodes[i].memory_bytes[choice[i]]) == 0.0:
            candidate[i] = True
    if not any(candidate):
        return choice
    for group in problem.ties:
        for m in group[1:]:
            union(group[0], m)
    incident: list[list[int]] = [[] for _ in range(n)]
    for j, e in enumerate(problem.edges):
        incident[e.src].append(j)
        incident[e.dst].append(j)
        if candidate[e.src] and candidate[e.dst]:
            union(e.src, e.dst)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(i)
    for members in groups.values():
        ops = [i for i in members if graph.nodes[i].kind == "op"]
        if not ops or not all(candidate[i] for i in ops):
            continue
        new = {i: keep_index(graph.nodes[i], choice[i]) for i in members}
        if any(float(problem.nodes[i].cost[new[i]]) > float(problem.nodes[i].cost[choice[i]]) for i in members):
            continue
        ok, seen = True, set()
        for i in members:
            for j in incident[i]:
                if j in seen:
                    continue
                seen.add(j)
                e = problem.edges[j]
                a, b = choice[e.src], choice[e.dst]
                a2, b2 = new.get(e.src, a), new.get(e.dst, b)
                before, after = float(e.cost[a, b]), float(e.cost[a2, b2])
                # a free recompute with a redistribution into it would keep that copy longer as keep
                if math.isinf(after) or after > before or (e.dst in new and state[e.dst] == RECOMPUTE and before > 0):
                    ok = False
                    break
            if not ok:
                break
        if ok:
            for i, k in new.items():
                choice[i] = k
    return choice
