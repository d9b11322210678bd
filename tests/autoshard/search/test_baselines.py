"""Expert baselines' pins: ``fsdp+tp`` stores each weight so that FSDP's gather over ``dp``
yields the TP shard a matmul reads in one collective (no all-to-all, no permute)."""

from __future__ import annotations

import pytest
from costmodel.placements import Replicate, parse_placements

from autoshard.graph.liveness import is_view_name
from autoshard.search.baselines import baseline_pins
from autoshard.search.solve import prepare, solve_prepared
from examples.models import llama3

# wide enough that the stage solve keeps the weights' TP shards (at dim 64 it gathers them whole)
WIDE = {"dim": 512, "batch_size": 4, "seq_len": 128, "max_seq_len": 128}


@pytest.fixture(scope="module")
def llama_2x2():
    model, inputs = llama3.tiny(device="meta", **WIDE)
    return prepare(model, inputs, (2, 2), ("dp", "tp"), profile="h100-sxm-80gb")


def test_fsdp_tp_splits_a_tensor_dim_tp_leaves_whole(llama_2x2) -> None:
    pins = baseline_pins(llama_2x2.graph, "fsdp+tp")
    # column weights (out, in): tp on out, fsdp on in; row weights: tp on in, fsdp on out
    for name in ("wq", "wk", "wv"):
        assert pins[f"layers.0.attention.{name}.weight"] == "S(1)S(0)"
    assert pins["layers.1.feed_forward.w1.weight"] == "S(1)S(0)"
    assert pins["layers.0.attention.wo.weight"] == "S(0)S(1)"
    assert pins["layers.0.feed_forward.w2.weight"] == "S(0)S(1)"
    # a norm weight tp leaves replicated: fsdp on its only dim
    assert pins["layers.0.attention_norm.weight"] == "S(0)R"


def test_fsdp_alone_still_splits_dim_0_on_every_mesh_dim(llama_2x2) -> None:
    pins = baseline_pins(llama_2x2.graph, "fsdp")
    assert pins["layers.0.attention.wq.weight"] == "S(0)S(0)"
    assert pins["layers.0.attention.wo.weight"] == "S(0)S(0)"


def _from_param(graph, name: str) -> bool:
    """True for a parameter or a view (``t``, ``view``) of one."""
    src_of = {e.dst: e.src for e in graph.edges}
    params = set(graph.params.values())
    i = graph.index.get(name)
    while i is not None and i not in params and is_view_name(graph.nodes[i].target):
        i = src_of.get(i)
    return i in params


def test_fsdp_tp_gathers_each_tp_shard_with_one_all_gather_on_dp(llama_2x2) -> None:
    graph = llama_2x2.graph
    plan = solve_prepared(llama_2x2, baseline="fsdp+tp", time_limit=30)
    weights = [r for r in plan.redistributions if r.tensor.startswith("param:") or _from_param(graph, r.tensor)]
    assert not [r for r in weights if any(s.collective == "all_to_all" for s in r.steps)]
    # the gathers that keep the tp layout and undo dp's split: FSDP's own
    fsdp_gathers = []
    for r in weights:
        (src_dp, src_tp), (dst_dp, dst_tp) = parse_placements(r.src), parse_placements(r.dst)
        if isinstance(dst_dp, Replicate) and not isinstance(src_dp, Replicate) and src_tp == dst_tp:
            fsdp_gathers.append(r)
    tp_shards = [r for r in fsdp_gathers if not r.dst.endswith("R")]
    assert len(tp_shards) >= 8, [(r.tensor, r.src, r.dst) for r in weights]
    for r in fsdp_gathers:
        assert [(s.collective, s.mesh_dims) for s in r.steps] == [("all_gather", (0,))], (r.tensor, r.src, r.steps)
