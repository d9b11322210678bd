"""Random ops on shards: each rank's slice of the draw equals the same slice of the
single-device draw from the same generator state (bit for bit), dropout and
rand run sharded, and a random op the runtime cannot slice is refused at load
unless it is replicated."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch
import torch.fx as fx

from costmodel.placements import parse_placements
from autoshard.search.solve import prepare, solve_prepared
from autoshard.rules.core import TensorMeta
from autoshard.runtime.execute import JointRunner, RuntimeLoadError, local_slice
from autoshard.runtime.random_ops import random_kind, run_random
from examples.models import mlp

aten = torch.ops.aten


def _node(target, args, kwargs=None) -> fx.Node:
    graph = fx.Graph()
    x = graph.placeholder("x")
    return graph.call_function(target, tuple(x if a == "x" else a for a in args), kwargs or {})


def _coords(mesh):
    return list(itertools.product(*(range(m) for m in mesh)))


@pytest.mark.parametrize("mesh, text", [((2,), "S(0)"), ((2,), "S(1)"), ((2, 2), "S(0)S(1)"), ((2, 2), "RS(1)"),
                                        ((4,), "S(1)")])
def test_each_rank_drops_its_slice_of_the_single_device_mask(mesh, text):
    x = torch.randn(8, 12)
    torch.manual_seed(5)
    want_out, want_mask = aten.native_dropout(x, 0.3, True)
    node = _node(aten.native_dropout.default, ("x", 0.3, True))
    assert random_kind(node, None) == "dropout"
    pl = parse_placements(text)
    metas = (TensorMeta((8, 12), torch.float32), TensorMeta((8, 12), torch.bool))
    for coord in _coords(mesh):
        torch.manual_seed(5)  # every rank holds the same generator state
        out, mask = run_random("dropout", node, [local_slice(x, pl, mesh, coord)], metas, (pl, pl), mesh, coord)
        assert torch.equal(out, local_slice(want_out, pl, mesh, coord))
        assert torch.equal(mask, local_slice(want_mask, pl, mesh, coord))


def test_a_partial_input_is_dropped_term_by_term():
    x = torch.randn(6, 4)
    torch.manual_seed(2)
    want, _ = aten.native_dropout(x, 0.5, True)
    node = _node(aten.native_dropout.default, ("x", 0.5, True))
    terms = [x * 0.25, x * 0.75]  # P(sum) over 2 ranks
    metas = (TensorMeta((6, 4), torch.float32), TensorMeta((6, 4), torch.bool))
    outs = []
    for r in range(2):
        torch.manual_seed(2)
        outs.append(run_random("dropout", node, [terms[r]], metas, (parse_placements("P(sum)"), parse_placements("R")),
                               (2,), (r,))[0])
    torch.testing.assert_close(outs[0] + outs[1], want)


def test_rand_is_sliced_from_the_global_draw():
    torch.manual_seed(9)
    want = torch.rand(6, 10)
    node = _node(aten.rand.default, ([6, 10],), {"dtype": torch.float32, "device": torch.device("cpu"),
                                                 "pin_memory": False})
    assert random_kind(node, None) == "sized"
    pl = parse_placements("S(1)")
    for r in range(2):
        torch.manual_seed(9)
        got = run_random("sized", node, [], (TensorMeta((6, 10), torch.float32),), (pl,), (2,), (r,))
        assert torch.equal(got, local_slice(want, pl, (2,), (r,)))


def test_dropout_off_is_not_random():
    assert random_kind(_node(aten.native_dropout.default, ("x", 0.0, True)), None) is None
    assert random_kind(_node(aten.native_dropout.default, ("x", 0.5, False)), None) is None


def test_a_plan_with_sharded_dropout_loads():
    model, inputs = mlp.tiny(dropout=0.25)
    prep = prepare(model, inputs, (2,), ("dp",), profile="h100-sxm-80gb", device_type="cpu")
    plan = solve_prepared(prep, baseline="tp", time_limit=10)  # the hidden activations, dropout included, split
    assert any(n.op == "aten.native_dropout.default" and "S(" in n.out[0] for n in plan.nodes)
    runner = JointRunner(prep.traced, plan, (2,), (0,), comm=object())
    assert runner.has_random


class _Sampled(torch.nn.Module):
    """A bernoulli draw: no sharding rule, so it runs replicated."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        return (h * torch.bernoulli(torch.sigmoid(h.detach()))).sum()


def test_an_unsliceable_random_op_runs_replicated_and_is_refused_sharded():
    model, x = _Sampled(), torch.randn(8, 4)
    prep = prepare(model, (x,), (2,), ("dp",), profile="h100-sxm-80gb", device_type="cpu")
    plan = solve_prepared(prep, time_limit=10)
    [draw] = [n for n in plan.nodes if n.op.startswith("aten.bernoulli")]
    assert set(draw.out + draw.inputs) <= {"R", None}
    assert JointRunner(prep.traced, plan, (2,), (0,), comm=object()).has_random
    nodes = tuple(replace(n, out=("S(0)",), inputs=("S(0)",)) if n is draw else n for n in plan.nodes)
    with pytest.raises(RuntimeLoadError, match="random op that only runs replicated"):
        JointRunner(prep.traced, replace(plan, nodes=nodes), (2,), (0,), comm=object())
