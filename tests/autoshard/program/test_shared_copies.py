"""Readers of one tensor that want it in one placement share one redistribution (autoshard.program.shared_copies)."""

from __future__ import annotations

from types import SimpleNamespace as NS

from costmodel.placements import parse_placements as pp
from costmodel.redistribute_steps import RedistributeStep

from autoshard.plan.format import Plan, Redistribution
from autoshard.program.shared_copies import share_copies

AR = (RedistributeStep("all_reduce", (0,), 4, 1e-3, pp("P(sum)"), pp("R"), reduce_op="sum"),)


def _case(copies, kinds=None, targets=None):
    """A producer p read by readers r0, r1, ... whose copies live over ``copies``."""
    names = ["p"] + [f"r{k}" for k in range(len(copies))]
    kinds = kinds or ["op"] * len(names)
    targets = targets or ["aten.mul.Tensor"] * len(names)
    nodes = [NS(name=n, kind=k, target=t) for n, k, t in zip(names, kinds, targets)]
    edges = [NS(src=0, dst=k + 1, dst_input=0, copy_live=(c,)) for k, c in enumerate(copies)]
    rs = [Redistribution("p", f"r{k}", 0, 0, "P(sum)", "R", AR, 1e-3) for k in range(len(copies))]
    times = {k + 1: c[0] for k, c in enumerate(copies)}
    return NS(nodes=nodes, edges=edges), rs, times


def test_overlapping_copies_chain_onto_the_first_and_a_late_one_starts_again():
    graph, rs, times = _case([(3, 5), (4, 6), (6, 8), (20, 22)])
    out, saved, local = share_copies(graph, rs, times, set())
    assert [r.reuses for r in out] == [None, ("r0", 0), ("r0", 0), None]
    assert [len(r.steps) for r in out] == [1, 0, 0, 1] and saved == 2e-3 and local == 0.0


def test_leaves_in_place_readers_and_recomputed_readers_do_not_share():
    graph, rs, times = _case([(3, 5), (4, 6)], kinds=["param", "op", "op"])
    assert all(r.reuses is None for r in share_copies(graph, rs, times, set())[0])
    graph, rs, times = _case([(3, 5), (4, 6)], targets=["aten.mul.Tensor", "aten.mul.Tensor", "aten.add_.Tensor"])
    assert all(r.reuses is None for r in share_copies(graph, rs, times, set())[0])
    graph, rs, times = _case([(3, 5), (4, 6)])
    assert all(r.reuses is None for r in share_copies(graph, rs, times, {2})[0])


def test_other_placements_do_not_share():
    graph, rs, times = _case([(3, 5), (4, 6)])
    rs[1] = Redistribution("p", "r1", 0, 0, "P(sum)", "S(0)", AR, 1e-3)
    assert all(r.reuses is None for r in share_copies(graph, rs, times, set())[0])


def test_a_reusing_redistribution_round_trips_and_a_bad_one_is_refused():
    import pytest

    from autoshard.plan.format import PlanError

    r = Redistribution("p", "r1", 0, 0, "P(sum)", "R", (), 0.0, ("r0", 0))
    data = r.to_dict()
    assert data["reuses"] == {"to": "r0", "input": 0}
    assert Redistribution.from_dict(data, "r") == r
    with pytest.raises(PlanError, match="reuses"):
        Redistribution.from_dict({**Redistribution("p", "r1", 0, 0, "P(sum)", "R", AR, 1e-3).to_dict(),
                                  "reuses": {"to": "r0"}}, "r")


def test_the_ddp_loss_reduces_its_total_weight_once():
    from autoshard.search.solve import prepare, solve_prepared
    from examples.models import llama3

    model, inputs = llama3.tiny(device="meta", batch_size=4)
    prep = prepare(model, inputs, (4,), ("dp",), profile="cpu-gloo", recompute="none", profile_correction="off")
    plan = solve_prepared(prep, baseline="ddp", time_limit=10)
    reused = [r for r in plan.redistributions if r.reuses is not None]
    assert [(r.tensor, r.to) for r in reused] == [("nll_loss_forward", "nll_loss_backward")]
    assert Plan.from_dict(plan.to_dict()).redistributions == plan.redistributions
