"""Seeded search on a ``dp x cp x tp`` mesh (autoshard.graph.restrict, step 1): seeded from every
contiguous split, it keeps batch on ``dp``, the sequence on ``cp`` and the heads on ``tp``.

The example LLaMA (one layer, dim 128, 2 heads, batch 2 x 16,384 tokens: one sequence per ``dp``
rank, long enough that context parallelism pays) on ``2x2x2`` named ``dp,cp,tp``, the sequence
inputs pinned ``S(0)S(1)R`` as a cp layout pins them (H100 profile, no recomputation states).
Seeded from the balanced split ``2 x (2*2)`` alone, the merged ``cp x tp`` dim splits the sequence
4 ways (2 heads do not split 4 ways) and the fine ``tp`` keeps no head or column split: every
attention and matmul ran whole on ``tp`` (7.11 ms). Seeded from ``(2*2) x 2`` beside it: 5.02 ms,
the layout below. The unrestricted search of this mesh (430 strategies a node, a 46 s build) stopped
unproven at 120 s with 5.64 ms (2026-12-06, the shared 2-core VM), so it is not run here.
"""

from __future__ import annotations

import pytest

from costmodel.mesh import MeshSpec
from costmodel.placements import Shard
from hw_profiles import load

from autoshard.graph.builder import build_graph
from autoshard.graph.problem import to_problem
from autoshard.graph.restrict import coarse_groups, seed_groupings, seeded_restriction
from autoshard.search.pins import resolve_pins
from autoshard.trace import trace_joint
from examples.models import llama3
from solver import solve as solve_problem

H100 = load("h100-sxm-80gb")
MESH = MeshSpec((2, 2, 2), ("dp", "cp", "tp"))
PINS = {"tokens": "S(0)S(1)R", "labels": "S(0)S(1)R"}
SEQ = 16384


@pytest.fixture(scope="module")
def graphs():
    """The fine graph seeded as ``prepare`` seeds it (every split) and from the balanced split alone
    (one memo: the balanced coarse mesh is built and solved once), each with its seed's info."""
    traced = trace_joint(*llama3.tiny(device="meta", batch_size=2, seq_len=SEQ, max_seq_len=SEQ, dim=128, n_heads=2,
                                      n_kv_heads=2, n_layers=1))
    memo: dict = {}
    out = {}
    for label, groups in (("every split", None), ("balanced split", coarse_groups(MESH.shape))):
        restrict, info = seeded_restriction(traced, MESH, H100, groups=groups, time_limit=10, memo=memo, gap=1e-6)
        out[label] = build_graph(traced, MESH, H100, ties=True, recompute=False, restrict=restrict), info
    return out


def _solve(graph):
    problem = to_problem(graph, memory_limit=H100.device.usable_memory_bytes, pins=resolve_pins(graph, PINS),
                         recompute="none")
    found = solve_problem(problem, time_limit=20, gap=1e-6)
    assert found.choice, found.status
    return found


def _attention(graph):
    return [i for i, n in enumerate(graph.nodes) if n.kind == "op" and "scaled_dot_product" in n.target]


def test_seed_groupings_are_every_contiguous_split_the_balanced_one_first() -> None:
    assert seed_groupings((2, 2, 2)) == (((0,), (1, 2)), ((0, 1), (2,)))
    assert seed_groupings((2, 4, 8)) == (((0, 1), (2,)), ((0,), (1, 2)))
    assert seed_groupings((2, 2, 2, 2))[0] == coarse_groups((2, 2, 2, 2)) and len(seed_groupings((2, 2, 2, 2))) == 3
    # a split with a one-rank group is a 1-D coarse mesh, and size-1 dims do not make a new split
    assert seed_groupings((1, 2, 4)) == (((0, 1), (2,)),)
    assert seed_groupings((2, 1, 4, 8)) == (((0, 1, 2), (3,)), ((0,), (1, 2, 3)))


def test_the_seed_solves_both_coarse_meshes_of_a_3d_mesh(graphs) -> None:
    _, info = graphs["every split"]
    assert info.coarse_shapes == ((2, 4), (4, 2))
    assert graphs["balanced split"][1].coarse_shapes == ((2, 4),)


def test_attention_keeps_batch_on_dp_sequence_on_cp_and_heads_on_tp(graphs) -> None:
    def split_three_ways(graph, i):
        return any(s.exchange is not None and s.exchange[1] == 1
                   and tuple(s.output_placements[0]) == (Shard(0), Shard(2), Shard(1))
                   for s in graph.nodes[i].strategies)

    seeded, _ = graphs["every split"]
    assert _attention(seeded) and all(split_three_ways(seeded, i) for i in _attention(seeded))
    # the balanced split alone offers the fine tp no head split (what this test guards against)
    alone, _ = graphs["balanced split"]
    assert not any(split_three_ways(alone, i) for i in _attention(alone))


def test_the_seeded_solve_splits_dp_cp_tp_without_relayouts_at_the_matmuls(graphs) -> None:
    seeded, _ = graphs["every split"]
    found = _solve(seeded)
    for i in _attention(seeded):  # forward and backward: batch on dp, the CP exchange on cp, heads on tp
        s = seeded.nodes[i].strategies[found.choice[i]]
        assert s.exchange is not None and s.exchange[1] == 1, s
        assert tuple(s.output_placements[0]) == (Shard(0), Shard(2), Shard(1)), s
    # the matmuls' [B S, d] rows split dp then cp are read back as [B, S, d] by the views after them as they lie
    mm_edges = [e for e in seeded.edges if seeded.nodes[e.src].target == "aten.mm.default"
                and seeded.nodes[e.dst].target == "aten._unsafe_view.default"]
    assert mm_edges
    for e in mm_edges:
        matrix = seeded.matrices[e.matrix]
        assert matrix.shape == (len(seeded.nodes[e.src].strategies), len(seeded.nodes[e.dst].strategies))
        assert matrix[found.choice[e.src], found.choice[e.dst]] == 0.0, seeded.nodes[e.src].name
        view = seeded.nodes[e.dst].strategies[found.choice[e.dst]]
        assert tuple(view.output_placements[0])[:2] == (Shard(0), Shard(1)), view  # batch on dp, sequence on cp
    # and it is well below the balanced split's seed (measured 5.02 against 7.11 ms)
    alone = _solve(graphs["balanced split"][0])
    assert found.cost < 0.9 * alone.cost, (found.cost, alone.cost)
