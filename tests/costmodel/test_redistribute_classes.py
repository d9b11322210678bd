"""Shape classes (costmodel.redistribute_classes): tensors that split alike share one search
structure, and their tables equal those of search graphs of their own, bit for bit."""

from __future__ import annotations

import itertools
import random

import pytest

from costmodel import redistribute_classes
from costmodel.mesh import MeshSpec
from costmodel.placements import Partial, StridedShard, parse_placements
from costmodel.redistribute import clear_cache, redistribute_costs
from costmodel.redistribute_search import SHARED_OPS, SearchGraph, canonical
from hw_profiles import load

H100 = load("h100-sxm-80gb")
CPU = load("cpu-gloo")


def _own_graph_table(placements, mesh, shape, itemsize, profile):
    """Reference: every pair searched (Dijkstra) on the search graph of the pair's own signature,
    priced for this shape alone (nothing shared with another shape or signature)."""
    table, graphs = [], {}
    for src in placements:
        row = []
        for dst in placements:
            ops = tuple(sorted({p.reduce_op for p in src + dst if isinstance(p, Partial)}))
            strided = tuple(sorted({p for p in src + dst if isinstance(p, StridedShard)}, key=str))
            graph = graphs.get((ops, strided)) or graphs.setdefault(
                (ops, strided), SearchGraph(mesh, shape, itemsize, profile, True, ops, strided))
            s, t = graph.state_id(canonical(src, mesh)), graph.state_id(canonical(dst, mesh))
            tree = graph.search(s, t)  # the planner's Dijkstra
            row.append(tree[t][0] if t in tree else float("inf"))
        table.append(row)
    return table


def _placements(mesh_shape, ndim, count, seed, strided=()):
    per_dim = ["R", "P(sum)", "P(max)", "P(avg)"] + [f"S({d})" for d in range(ndim)]
    texts = ["".join(p) for p in itertools.product(per_dim, repeat=len(mesh_shape))]
    random.Random(seed).shuffle(texts)
    return [parse_placements(t) for t in texts[:count] + list(strided)]


@pytest.mark.parametrize("mesh_shape,shapes", [
    ((2, 2), [(8, 12), (16, 20), (64, 8)]),           # every dim a class dim
    ((2, 2), [(6, 8, 3), (6, 32, 3)]),                # uneven dims kept exact
    ((2, 4), [(2, 16, 24), (2, 64, 40)]),             # a dim of 2 on 8 ranks: split to 1 or uneven
    ((2, 2, 2), [(16, 4), (24, 4), (40, 4)]),         # 3-D: strided shards appear, flat groups
    ((1,), [(8, 4), (3,)]),                           # one rank: no steps, every pair free
    ((1, 2), [(8, 4), (6, 2)]),                       # a mesh dim of size 1 holds R
    ((4,), [(8, 4), (12, 4), (8, 5)]),                # a dim equal to the rank count stays exact
    ((4,), [(4, 8), (8, 8), (4, 12)]),                # ... as it splits to 1 where a multiple does not
    ((2, 2), [(4, 6, 8), (8, 6, 8), (4, 6, 16)]),
])
def test_class_members_get_the_tables_of_search_graphs_of_their_own(mesh_shape, shapes) -> None:
    """Each shape priced after another member of its class (so on the first member's structure)
    gets, for every pair, the cost a search graph of its own computes: the same float."""
    mesh = MeshSpec(mesh_shape)
    clear_cache()
    for k, shape in enumerate(shapes):
        placements = _placements(mesh_shape, len(shape), 14, seed=k)
        itemsize = (2, 4)[k % 2]
        profile = (H100, CPU)[k % 2]
        table = redistribute_costs(placements, placements, mesh, shape, itemsize, profile)
        assert table == _own_graph_table(placements, mesh, shape, itemsize, profile)


@pytest.mark.parametrize("mesh_shape,shapes,strided", [
    ((2, 2), [(72, 64), (144, 32), (44, 64), (6, 64)], ["R_S(0,sf=3)", "_S(0,sf=3)R", "S(1)_S(0,sf=3)"]),
    ((2, 4), [(64, 32), (128, 16), (24, 16)], ["_S(1,sf=2)R", "R_S(0,sf=2)"]),
    ((2, 2, 2), [(16, 8), (80, 8)], ["R_S(0,sf=2)R", "RR_S(0,sf=2)"]),
])
def test_signatures_with_strided_placements_get_the_tables_of_their_own_graphs(mesh_shape, shapes, strided) -> None:
    """Placements with a strided shard (a reshape's output, a split factor that is not a mesh
    size) have search graphs of their own signature; those are shared by a class too, whose
    dims are multiples of the ranks times the split factors."""
    mesh = MeshSpec(mesh_shape)
    clear_cache()
    for k, shape in enumerate(shapes):
        placements = _placements(mesh_shape, len(shape), 10, seed=k, strided=strided)
        table = redistribute_costs(placements, placements, mesh, shape, 4, H100)
        assert table == _own_graph_table(placements, mesh, shape, 4, H100)


@pytest.mark.parametrize("mesh_shape,representative,member", [
    ((2, 2), (8, 12), (40, 100)),
    ((2, 2, 2), (16, 24), (48, 8 * 1000)),
    ((2, 4), (2, 16, 24), (2, 72, 800)),
])
def test_a_members_own_structure_is_the_representatives(mesh_shape, representative, member) -> None:
    """The module's claim, checked state by state: every state reachable from all-R has the same
    out-edges (target, step kind, group, relayout flags) in a member's own search graph as in
    the representative's, and the representative's local extents scale to the member's."""
    mesh = MeshSpec(mesh_shape)
    assert redistribute_classes.shape_class(representative, mesh) == redistribute_classes.shape_class(member, mesh)
    rep = SearchGraph(mesh, representative, 4, H100, True, SHARED_OPS, ())
    own = SearchGraph(mesh, member, 4, H100, True, SHARED_OPS, ())
    start = canonical(tuple(parse_placements("R" * len(mesh_shape))), mesh)
    frontier, seen = [start], {start}
    while frontier:
        state = frontier.pop()
        ours = [(e.state, e.step.collective, e.step.mesh_dims, e.relayouts) for e in own._build_edges(state)]
        theirs = [(e.state, e.step.collective, e.step.mesh_dims, e.relayouts) for e in rep._build_edges(state)]
        assert ours == theirs, state
        for r, m, n_rep, n_own in zip(representative, member, rep._local_shape(state), own._local_shape(state)):
            if redistribute_classes.shape_class((m,), mesh)[0] == redistribute_classes.ANY:
                assert n_own * (r // n_rep) == m
            else:
                assert n_own == n_rep
        for target, *_ in ours:
            if target not in seen:
                seen.add(target)
                frontier.append(target)
    assert len(seen) > 20


def test_the_structure_is_built_once_per_class() -> None:
    """Two shapes of one class share one structure object: its edges are built for the first."""
    mesh = MeshSpec((2, 2))
    clear_cache()
    placements = _placements((2, 2), 2, 10, seed=1)
    redistribute_costs(placements, placements, mesh, (16, 32), 4, H100)
    first = redistribute_classes.tensor_table(mesh, (16, 32), 4, H100, True).edges
    built = len(first.targets)
    redistribute_costs(placements, placements, mesh, (64, 128), 2, H100)
    second = redistribute_classes.tensor_table(mesh, (64, 128), 2, H100, True).edges
    assert second is first and len(first.targets) == built
