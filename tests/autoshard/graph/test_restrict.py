"""Seeded search (autoshard.graph.restrict): the restriction keeps the fallback,
is a function of the signature, never beats the full search, and runs on 3-D meshes."""

from __future__ import annotations

import pytest

from costmodel.mesh import MeshSpec
from costmodel.placements import Partial, Replicate, Shard, StridedShard
from hw_profiles import load

from autoshard.graph.builder import build_graph
from autoshard.graph.problem import to_problem
from autoshard.graph.restrict import (
    choose_search,
    coarse_groups,
    coarse_mesh,
    dim_choice,
    seeded_restriction,
)
from autoshard.search.solve import prepare, solve_prepared
from autoshard.rules import OpStrategy
from autoshard.trace import trace_joint
from examples.models import mlp
from solver import solve as solve_problem

PROFILE = load("h100-sxm-80gb")


def test_coarse_groups_and_mesh_keep_the_rank_numbering() -> None:
    assert coarse_groups((2, 4, 8)) == ((0, 1), (2,))
    assert coarse_groups((8, 2, 4)) == ((0,), (1, 2))
    assert coarse_groups((2, 2, 2)) == ((0,), (1, 2)) or coarse_groups((2, 2, 2)) == ((0, 1), (2,))
    fine = MeshSpec((2, 4, 8))
    coarse = coarse_mesh(fine, ((0, 1), (2,)))
    assert coarse.shape == (8, 8) and coarse.strides == (8, 1)
    # same rank groups: the coarse mesh is the row-major 8x8 mesh
    assert coarse.strides == MeshSpec((8, 8)).strides
    with pytest.raises(ValueError):
        coarse_mesh(fine, ((0, 2), (1,)))


def test_choose_search() -> None:
    assert choose_search((8, 8)) == "full"
    assert choose_search((1, 8, 8)) == "full"
    assert choose_search((2, 4, 8)) == "seeded"
    assert choose_search((2, 4, 8), "full") == "full"
    with pytest.raises(ValueError):
        choose_search((2, 2), "nearest")


def test_dim_choice_forgets_split_factors_only() -> None:
    s = OpStrategy(((StridedShard(0, 2), Partial()),), ((Shard(0), Replicate()), None))
    assert dim_choice(s, 0) == (("S", 0), ("S", 0), None)
    assert dim_choice(s, 1) == (("P", "sum"), "R", None)


@pytest.fixture(scope="module")
def mlp_traced():
    return trace_joint(*mlp.tiny(device="meta", dim=64, hidden_dim=256, batch_size=256))


@pytest.fixture(scope="module")
def seeded_2d(mlp_traced):
    """A 2x2 mesh seeded from its 1-D coarsening (4,): small enough to compare with the full search."""
    mesh = MeshSpec((2, 2))
    restrict, info = seeded_restriction(mlp_traced, mesh, PROFILE, groups=((0, 1),), time_limit=10)
    full = build_graph(mlp_traced, mesh, PROFILE)
    restricted = build_graph(mlp_traced, mesh, PROFILE, restrict=restrict)
    return restrict, info, full, restricted


def test_replicate_always_kept_and_lists_shrink(seeded_2d) -> None:
    _, info, full, restricted = seeded_2d
    assert info.coarse_shape == (4,)
    shrunk = 0
    # memory-only nodes (copy bounds) exist only where their memory is not zero: compare the rest
    pairs = [(full.nodes[full.index[r.name]], r) for r in restricted.nodes if r.kind != "memory"]
    assert len(pairs) == sum(1 for f in full.nodes if f.kind != "memory")
    for f, r in pairs:
        assert f.name == r.name
        if r.kind != "op":
            assert len(r.strategies) == len(f.strategies)  # leaves and sinks are not restricted
            continue
        assert r.strategies[0] == f.strategies[0]  # all-replicate first, always kept
        assert all(p is None or all(isinstance(x, Replicate) for x in p)
                   for p in (*r.strategies[0].output_placements, *r.strategies[0].input_placements))
        assert set(r.strategies) <= set(f.strategies)
        shrunk += len(r.strategies) < len(f.strategies)
    assert shrunk > 0


def test_same_signature_same_kept_list(seeded_2d) -> None:
    restrict, _, full, restricted = seeded_2d
    by_signature: dict[str, tuple] = {}
    for r in restricted.nodes:
        if r.kind != "op":
            continue
        f = full.nodes[full.index[r.name]]
        if r.kind == "op":
            assert by_signature.setdefault(f.signature, r.strategies) == r.strategies
            assert restrict.signature_of[f.name] == f.signature


def test_restricted_optimum_is_never_better_than_full(seeded_2d) -> None:
    _, _, full, restricted = seeded_2d
    limit = PROFILE.device.memory_bytes
    best_full = solve_problem(to_problem(full, memory_limit=limit), time_limit=20)
    best_restricted = solve_problem(to_problem(restricted, memory_limit=limit), time_limit=20)
    assert best_full.choice and best_restricted.choice
    assert best_restricted.cost >= best_full.cost * (1 - 1e-6)
    # and the restricted choice is a valid point of the full problem with the same cost
    names = {n.name: i for i, n in enumerate(full.nodes)}
    lifted = [0] * len(full.nodes)
    for node, c in zip(restricted.nodes, best_restricted.choice):
        if node.name in names:
            lifted[names[node.name]] = full.nodes[names[node.name]].strategies.index(node.strategies[c])
    for i, node in enumerate(full.nodes):  # a copy bound the restricted graph has not: its reader's choice
        if node.kind == "memory" and node.name not in restricted.index and node.name.count(":") >= 2:
            lifted[i] = lifted[names[node.name.split(":")[2]]]
    from solver import evaluate
    assert evaluate(to_problem(full, memory_limit=limit), lifted).cost == pytest.approx(best_restricted.cost, rel=1e-9)


def test_prepare_seeds_3d_meshes() -> None:
    prep = prepare(*mlp.tiny(device="meta", batch_size=64), (2, 2, 2), time_limit=40)  # the seed: a quarter
    assert prep.options["search"] == "seeded"
    assert "seed_build_s" in prep.timings
    # a handful of single-dim choices per mesh dim survive (the seeds' and the memory-light ones'),
    # not the hundreds of the full product
    assert prep.graph.stats.strategies_max <= 100
    plan = solve_prepared(prep, time_limit=10)
    assert plan.estimate.step_s > 0


def test_seed_pins_from_the_caller_add_coarse_seeds(mlp_traced, seeded_2d) -> None:
    # the graph layer solves whatever pins the search hands it (here the expert baselines'),
    # each one more seed whose choices the restriction keeps beside the plain seed's
    from autoshard.search.baselines import baseline_seed_pins

    plain, plain_info, _, _ = seeded_2d
    asked: list[int] = []

    def pins(graph):
        for p in baseline_seed_pins(graph):
            asked.append(len(p))
            yield p

    restrict, info = seeded_restriction(mlp_traced, MeshSpec((2, 2)), PROFILE, groups=((0, 1),), time_limit=10,
                                        seed_pins=pins)
    assert asked and info.seeds == plain_info.seeds + len(asked)
    assert all(plain.allowed[sig] <= restrict.allowed[sig] for sig in plain.allowed)


def test_the_seed_solves_under_the_callers_memory_limit_and_without_one_when_it_is_infinite(mlp_traced) -> None:
    # the stage solves of a pipeline search pass "no limit" (math.inf) down to prepare's seed:
    # it must solve without a limit, not refuse the value (it did, 2026-12-06: every 3-D stage
    # layout of the 405B mesh search ended in "memory_limit: must be a non-negative number")
    import math

    from autoshard.plan.options import NO_MEMORY_LIMIT

    _, unlimited = seeded_restriction(mlp_traced, MeshSpec((2, 2)), PROFILE, groups=((0, 1),), time_limit=10,
                                      memory_limit=math.inf)
    assert not unlimited.memory_relaxed
    _, tight = seeded_restriction(mlp_traced, MeshSpec((2, 2)), PROFILE, groups=((0, 1),), time_limit=10,
                                  memory_limit=1.0)
    assert tight.memory_relaxed  # one byte: no coarse plan fits the caller's limit, so it seeds without it
    prep = prepare(*mlp.tiny(device="meta", batch_size=64), (2, 2, 2), time_limit=8, memory_limit=NO_MEMORY_LIMIT)
    assert prep.options["search"] == "seeded"


def test_every_coarse_solve_of_a_seed_is_proven_at_the_gap_the_caller_gives(mlp_traced, monkeypatch) -> None:
    # prepare passes the plan's gap (PLAN_GAP): a seed proven by toulbar2 to a few 1e-7 (its integer
    # rounding) then ran windows to its limit under the solver's default 1e-9 (tiny Mixtral 2x2x2: 10 s)
    import solver

    from autoshard.plan.options import PLAN_GAP

    gaps: list = []
    real = solver.solve

    def recording(problem, *args, **kwargs):
        gaps.append(kwargs.get("gap"))
        return real(problem, *args, **kwargs)

    monkeypatch.setattr(solver, "solve", recording)
    seeded_restriction(mlp_traced, MeshSpec((2, 2)), PROFILE, groups=((0, 1),), time_limit=10, gap=1e-4)
    assert len(gaps) >= 2 and set(gaps) == {1e-4}  # the plan's seed and the memory-light one at least
    gaps.clear()
    seeded_restriction(mlp_traced, MeshSpec((2, 2)), PROFILE, groups=((0, 1),), time_limit=10)
    assert gaps and set(gaps) == {None}  # the solver's own default
    gaps.clear()
    prepare(*mlp.tiny(device="meta", batch_size=64), (2, 2, 2), time_limit=8)
    assert gaps and set(gaps) == {PLAN_GAP}
