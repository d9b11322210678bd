r"""Repeated layers: nodes that play the same part in every copy of a block.

A 32-layer transformer traces to 32 copies of one layer's ops (forward and
backward). Tying the copies (``ties`` of ``autoshard.problem/1``: every member
picks the same strategy index) makes the problem the size of one layer.

Which nodes are copies of each other is read from the graph's structure, not
from names (module paths are not kept on forward nodes of the joint trace, and
users' models name layers as they like). Colour refinement (Weisfeiler-Lehman):

    h_0(v)     = signature(v)       (op, argument shapes/dtypes/values, output shapes)
    h_{k+1}(v) = H(h_k(v), [(i, h_k(u_i)) for the i-th input u_i],
                           sorted [(i, h_k(w)) for every reader w reading v as its i-th input])

After ``rounds`` refinements, nodes with equal colour have the same op and
the same neighbourhood up to ``rounds`` hops, in both directions: the same
node of different layers. Layers at the ends of the stack see the embedding
or the head within a few hops and keep their own colours; they stay free.
Equal colours imply equal signatures, hence equal strategy lists.

A tie is a restriction, not a reduction: it can exclude the optimum when
layers would profit from different layouts (e.g. under a tight memory limit
only some layers shard their activations). ``--no-ties`` lets every layer
choose.

>>> from examples.models import mlp
>>> from autoshard.trace import trace_joint
>>> traced = trace_joint(*mlp.tiny(device="meta", n_layers=4))
>>> groups = repeated_groups(traced.graph_module, lambda n: str(n.target))
>>> max(len(g) for g in groups) >= 2
True
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from typing import Callable

import torch.fx as fx

__all__ = ["repeated_groups", "UnionFind"]


def _digest(*parts: object) -> str:
    return hashlib.blake2b(repr(parts).encode(), digest_size=12).hexdigest()


def repeated_groups(
    graph_module: fx.GraphModule, signature: Callable[[fx.Node], str], *, rounds: int = 4
) -> list[list[str]]:
    """Groups (of at least two fx node names, in graph order) whose members
    have equal colour after ``rounds`` refinements (module docstring)."""
    nodes = [n for n in graph_module.graph.nodes if n.op in ("placeholder", "call_function")]
    inputs = {n: [u for u in n.all_input_nodes if u.op != "get_attr"] for n in nodes}
    readers: dict[fx.Node, list[tuple[int, fx.Node]]] = defaultdict(list)
    for n in nodes:
        for i, u in enumerate(inputs[n]):
            readers[u].append((i, n))
    colour = {n: _digest(signature(n)) for n in nodes}
    for _ in range(rounds):
        colour = {
            n: _digest(
                colour[n],
                tuple((i, colour.get(u, "out")) for i, u in enumerate(inputs[n])),
                tuple(sorted((i, colour[w]) for i, w in readers[n] if w in colour)),
            )
            for n in nodes
        }
    classes: dict[str, list[str]] = defaultdict(list)
    for n in nodes:
        classes[colour[n]].append(n.name)
    return [members for members in classes.values() if len(members) > 1]


class UnionFind:
    """Disjoint sets of node indices (ties that must not overlap in the problem).

    >>> uf = UnionFind(4); uf.union(0, 2); uf.union(2, 3)
    >>> uf.groups()
    [[0, 2, 3]]
    """

    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        root = i
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[i] != root:
            self.parent[i], i = root, self.parent[i]
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)

    def groups(self) -> list[list[int]]:
        """Sets with more than one member, each sorted, ordered by first member."""
        out: dict[int, list[int]] = defaultdict(list)
        for i in range(len(self.parent)):
            out[self.find(i)].append(i)
        return sorted((g for g in out.values() if len(g) > 1), key=lambda g: g[0])
