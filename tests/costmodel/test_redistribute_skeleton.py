"""Skeletons (costmodel.redistribute_classes): the edges a class decides from the shape-free
skeleton of its rank are, state by state, the edges ``SearchGraph._build_edges`` builds for its
representative, and the tables priced on them are the planner's own costs, bit for bit."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from costmodel import redistribute_classes
from costmodel.mesh import MeshSpec
from costmodel.placements import Partial, StridedShard, parse_placements
from costmodel.redistribute import clear_cache, redistribute_costs
from costmodel.redistribute_search import SHARED_OPS, SearchGraph, canonical
from hw_profiles import load

H100 = load("h100-sxm-80gb")
CPU = load("cpu-gloo")

# (mesh, shapes sharing one skeleton: one rank each, facts that differ from shape to shape, strided set)
CASES = [
    (MeshSpec((4,)), [(8, 4), (12, 5), (4, 1), (3, 6)], ()),
    (MeshSpec((2, 2)), [(8, 12), (6, 3), (1, 16), (2, 5)], ()),
    (MeshSpec((2, 4)), [(2, 16, 24), (3, 5, 7), (1, 1, 8)], ()),
    (MeshSpec((1, 2)), [(8, 4), (6, 2)], ()),
    (MeshSpec((2, 2, 2)), [(16, 4), (2, 1), (3, 24), (1, 2)], ()),
    (MeshSpec((2, 2, 2)), [(2, 16, 4), (1, 2, 8), (4, 3, 2)], ()),
    (MeshSpec((2, 2, 2), strides=(1, 4, 2)), [(16, 4), (2, 6), (4, 1)], ()),  # non-contiguous: other flat groups
    (MeshSpec((4, 2, 2), strides=(1, 8, 4)), [(8, 8), (2, 4), (12, 1)], ()),
    (MeshSpec((2, 4)), [(64, 32), (24, 16), (6, 3)], (StridedShard(0, 2), StridedShard(1, 2))),
    (MeshSpec((2, 2, 2)), [(16, 8), (6, 4), (2, 32)], (StridedShard(0, 2),)),
    (MeshSpec((2, 2)), [(72, 64), (6, 64), (9, 2)], (StridedShard(0, 3),)),
]


def _reachable(graph: SearchGraph, starts) -> list:
    frontier, seen = list(starts), set(starts)
    while frontier:
        state = frontier.pop()
        for target, *_ in graph._build_edges(state):
            if target not in seen:
                seen.add(target)
                frontier.append(target)
    return sorted(seen, key=str)


@pytest.mark.parametrize("mesh,shapes,strided", CASES)
def test_decided_skeleton_edges_are_build_edges_state_by_state(mesh, shapes, strided) -> None:
    """For every shape (each its own class, all on one skeleton, decided in turn) and every state
    reachable from all-R: the class's edges out of the state, in order, are the reference
    ``_build_edges`` of a structure-only graph of the shape (target, kind, group, size, relayout
    flags), and its local extents are ``_local_shape``'s."""
    clear_cache()
    skeletons = set()
    for shape in shapes:
        cls = redistribute_classes.class_edges(mesh, shape, CPU, True, strided)
        skeletons.add(id(cls.skeleton))
        ref = SearchGraph(mesh, shape, 1, CPU, True, SHARED_OPS, strided, structure_only=True)
        all_r = canonical(tuple(parse_placements("R" * mesh.ndim)), mesh)
        with_strided = [canonical(tuple(sp if j == k else all_r[j] for j in range(mesh.ndim)), mesh)
                        for sp in strided for k in range(mesh.ndim)]
        states = _reachable(ref, [all_r, *with_strided])
        for state in states:
            cls.state_id(state)
        cls.close()
        by_head: dict[int, list] = {}
        for e in range(len(cls.targets)):
            by_head.setdefault(int(cls.heads[e]), []).append((cls.states[int(cls.targets[e])], *cls.specs(e)))
        for state in states:
            theirs = [tuple(edge) for edge in ref._build_edges(state)]
            assert by_head.get(cls.state_id(state), []) == theirs, (shape, state)
            assert tuple(int(x) for x in cls.local[cls.state_id(state)]) == ref._local_shape(state), (shape, state)
        assert len(states) > 5
    assert len(skeletons) == 1  # one skeleton served every shape


def _own_graph_table(placements, mesh, shape, itemsize, profile):
    """Reference: every pair searched (Dijkstra) on a priced search graph of the pair's own
    signature, nothing shared with another shape or signature."""
    table, graphs = [], {}
    for src in placements:
        row = []
        for dst in placements:
            ops = tuple(sorted({p.reduce_op for p in src + dst if isinstance(p, Partial)}))
            strided = tuple(sorted({p for p in src + dst if isinstance(p, StridedShard)}, key=str))
            graph = graphs.get((ops, strided)) or graphs.setdefault(
                (ops, strided), SearchGraph(mesh, shape, itemsize, profile, True, ops, strided))
            s, t = graph.state_id(canonical(src, mesh)), graph.state_id(canonical(dst, mesh))
            tree = graph.search(s, t)
            row.append(tree[t][0] if t in tree else float("inf"))
        table.append(row)
    return table


@pytest.mark.parametrize("mesh,shapes,strided", CASES)
def test_tables_on_a_shared_skeleton_are_the_planners_costs(mesh, shapes, strided) -> None:
    """Shapes priced one after the other on one skeleton (states and candidates met by earlier
    shapes, bytes priced once per distinct step) get the costs of their own Dijkstra, exactly."""
    clear_cache()
    per_dim = ["R", "P(sum)", "P(max)"]
    for k, shape in enumerate(shapes):
        texts = ["".join(p) for p in itertools.product(per_dim + [f"S({d})" for d in range(len(shape))],
                                                       repeat=mesh.ndim)]
        random.Random(k).shuffle(texts)
        placements = [parse_placements(t) for t in texts[:9]]
        placements += [tuple(sp if j == i else parse_placements("R")[0] for j in range(mesh.ndim))
                       for i, sp in enumerate(strided)]
        itemsize, profile = (2, 4)[k % 2], (H100, CPU)[k % 2]
        table = redistribute_costs(placements, placements, mesh, shape, itemsize, profile)
        assert table == _own_graph_table(placements, mesh, shape, itemsize, profile)


def test_scalars_have_a_skeleton_of_their_own() -> None:
    """A 0-d tensor (a loss) has no dim to split: only reductions and Partial fills."""
    clear_cache()
    mesh = MeshSpec((2, 2, 2))
    placements = [parse_placements(t) for t in ("RRR", "P(sum)RR", "RP(sum)P(sum)", "P(max)RR")]
    table = redistribute_costs(placements, placements, mesh, (), 4, CPU)
    assert table == _own_graph_table(placements, mesh, (), 4, CPU)


def test_huge_tensors_price_on_python_ints() -> None:
    """Bytes past int64's safe range are summed as Python ints: the same costs as the planner's."""
    clear_cache()
    mesh, shape = MeshSpec((2, 2)), (2 ** 40, 2 ** 22)
    placements = [parse_placements(t) for t in ("RR", "S(0)R", "S(0)S(1)", "P(sum)R", "RS(1)")]
    table = redistribute_costs(placements, placements, mesh, shape, 4, H100)
    assert table == _own_graph_table(placements, mesh, shape, 4, H100)
    assert redistribute_classes.tensor_table(mesh, shape, 4, H100, True)._state_bytes().dtype == object


def test_skeletons_are_bounded_and_cleared(monkeypatch) -> None:
    """The skeleton store is emptied when full (a long-running server) and by ``clear_cache``."""
    clear_cache()
    monkeypatch.setattr(redistribute_classes, "_MAX_CLASSES", 2)
    for ndim in (1, 2, 3, 4):
        redistribute_classes.class_edges(MeshSpec((2,)), (8,) * ndim, CPU, True)
    assert 0 < len(redistribute_classes._SKELETONS) <= 2
    clear_cache()
    assert not redistribute_classes._SKELETONS and not redistribute_classes._CLASSES
    assert np.asarray(redistribute_classes.class_edges(MeshSpec((2,)), (8,), CPU, True).heads).size == 0
