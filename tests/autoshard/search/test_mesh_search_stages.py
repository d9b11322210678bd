"""The mesh search tries pipeline (pp) and context-parallel (cp) layouts next to dp / tp.

Two small problems where each pays, priced on the H100 profile (CPU tracing):
stages across a slow link (two single-GPU nodes: a data-parallel layout
replicates or shards the weights across the network, two stages send one
activation per microbatch), and one long sequence on four GPUs (the solve
splits attention along it). The bounds that cut layouts are checked against
every priced step, and the gates that keep today's search where neither pays.
"""

from __future__ import annotations

import math

import pytest
from hw_profiles import load as load_profile

from autoshard.search.mesh_layouts import MeshLayout, enumerate_layouts
from autoshard.search.mesh_search import search_mesh
from autoshard.search.mesh_stages import (ModelShape, block_param_elems, context_layouts_for, context_pins,
                                          model_shape, pipeline_bound_s, pipeline_layouts_for,
                                          pipeline_memory_bound_bytes)
from autoshard.trace import trace_joint
from examples.models import llama3, mlp

H100 = {"profile": "h100-sxm-80gb", "device_type": "cpu", "jobs": 1, "cache_dir": False}


def _rows(plan):
    return plan.options["mesh_search"]["layouts"]


def _check_bounds(plan) -> None:
    for row in _rows(plan):
        if row["outcome"] == "solved":
            assert row["bound_s"] is not None and row["bound_s"] <= row["step_s"] * (1 + 1e-9), row


def test_pipeline_layouts_span_whole_nodes_and_leave_a_block_per_stage() -> None:
    texts = [(lay.text, lay.dim_names) for lay in pipeline_layouts_for(32, 8, n_blocks=2)]
    # the fewest stages first, the most tp of those (the least a stage holds); pp 4 would leave a stage without a block
    assert texts == [("2x2x8", ("pp", "dp", "tp")), ("2x4x4", ("pp", "dp", "tp")), ("2x8x2", ("pp", "dp", "tp")),
                     ("2x16", ("pp", "dp"))]
    assert {lay.shape[0] for lay in pipeline_layouts_for(32, 8, n_blocks=32)} == {2, 4}  # 4 nodes: pp | 4
    assert pipeline_layouts_for(8, 8, n_blocks=32) == []  # one node: no stages


def test_trace_gives_causal_sequence_and_its_inputs_and_none_without_attention() -> None:
    shape = model_shape(trace_joint(*llama3.tiny(device="meta", batch_size=2, seq_len=32, max_seq_len=32)))
    assert (shape.n_blocks, shape.batch, shape.causal_seq) == (2, 2, 32)
    assert dict(shape.seq_inputs) == {"tokens": 2, "labels": 2}
    assert shape.matmul_flops > 0
    plain = model_shape(trace_joint(*mlp.tiny(device="meta")))
    assert plain.causal_seq is None and context_layouts_for(4, 4, plain, always=True) == []


def test_context_layouts_need_a_dividing_sequence_and_fewer_sequences_than_devices() -> None:
    short = ModelShape(n_blocks=2, batch=2, causal_seq=6, seq_inputs=(("tokens", 2),), matmul_flops=1.0)
    assert [lay.text for lay in context_layouts_for(4, 4, short)] == []  # no cp >= 2 has 2 cp dividing 6
    long = ModelShape(n_blocks=2, batch=2, causal_seq=64, seq_inputs=(("tokens", 2),), matmul_flops=1.0)
    found = [(lay.text, lay.dim_names) for lay in context_layouts_for(8, 4, long)]
    assert ("2x4", ("dp", "cp")) in found and ("4x2", ("cp", "tp")) in found
    assert all(lay.shape[lay.dim_names.index("dp")] <= 2 for lay in context_layouts_for(8, 4, long)
               if "dp" in lay.dim_names)  # dp divides the batch of 2
    assert context_layouts_for(2, 2, long) == []  # 2 sequences on 2 devices: each takes one whole
    assert context_pins(MeshLayout((2, 2, 2), ("dp", "cp", "tp")), long) == {"tokens": "S(0)S(1)R"}


def test_one_node_with_a_sequence_per_device_searches_todays_layouts_only() -> None:
    # 8B on 8 GPUs in one node (batch 8): neither stages (one node) nor cp (B = N) are tried
    shape = ModelShape(n_blocks=32, batch=8, causal_seq=2048, seq_inputs=(("tokens", 2),), matmul_flops=1.0)
    assert pipeline_layouts_for(8, 8, n_blocks=shape.n_blocks) == []
    assert context_layouts_for(8, 8, shape) == []
    assert len(enumerate_layouts(8, 8)) == 4


def test_search_picks_stages_across_a_slow_link() -> None:
    model, inputs = llama3.tiny(device="meta", batch_size=4, seq_len=64, max_seq_len=64, dim=512, n_layers=4,
                                n_heads=8, n_kv_heads=8, vocab_size=256)
    # one trace for the search and the bound below (the search traces the same graph when given none);
    # 10 s: both layouts solve to optimal within it (measured: dp 1.7 s and pp 4.7 s of an 8 s limit,
    # the same pp step as at 20 s); more only lengthens the dp layout's stages that run to a share of
    # the limit (4.5 s at 20 s)
    traced = trace_joint(model, inputs, target_device="cpu")
    plan = search_mesh(model, inputs, devices=2, devices_per_node=1, time_limit=10, traced=traced, **H100)
    rows = {tuple(r["dim_names"]): r for r in _rows(plan)}
    assert set(rows) == {("dp",), ("pp",)} and all(r["outcome"] == "solved" for r in rows.values())
    assert rows[("pp",)]["step_s"] < rows[("dp",)]["step_s"]  # the stages pay over the network
    assert plan.fingerprint.dim_names == ("pp",) and plan.pipeline is not None
    assert plan.pipeline.step_s == pytest.approx(rows[("pp",)]["step_s"])
    assert rows[("pp",)]["bound_s"] == pytest.approx(
        pipeline_bound_s(model_shape(traced), 2, load_profile("h100-sxm-80gb")))
    _check_bounds(plan)


@pytest.mark.parametrize("seq, splits", [(16384, True), (256, False)])
def test_search_splits_one_long_sequence_along_a_cp_dim_and_not_a_short_one(seq: int, splits: bool) -> None:
    model, inputs = llama3.tiny(device="meta", batch_size=1, seq_len=seq, max_seq_len=seq, dim=128, n_heads=2,
                                n_kv_heads=2)
    plan = search_mesh(model, inputs, devices=4, time_limit=20, recompute="none", **H100)
    kinds = {tuple(r["dim_names"]) for r in _rows(plan)}
    assert {("cp",), ("cp", "tp")} <= kinds  # tried next to dp / tp
    exchanges = {n.exchange for n in plan.nodes if n.exchange}
    names = plan.fingerprint.dim_names
    if splits:
        assert exchanges and all(kind.startswith("context") for kind, _ in exchanges)
        (dim,) = {d for _, d in exchanges}
        assert names[dim] == "cp" and plan.fingerprint.mesh_shape[dim] > 1
    else:
        assert not exchanges and "cp" not in names
    _check_bounds(plan)
    assert all(math.isfinite(r["bound_s"]) for r in _rows(plan) if r["outcome"] == "solved")


def test_the_dim_that_splits_attention_is_named_cp_and_a_cp_dim_that_does_not_sp(dp_mlp) -> None:
    from dataclasses import replace

    from autoshard.search.mesh_stages import name_context_dim
    from autoshard.search.solve import solve_prepared

    plan = solve_prepared(dp_mlp, time_limit=30)  # 2x2 (dp, tp), no exchanges
    assert name_context_dim(plan) is plan
    unused = replace(plan, fingerprint=replace(plan.fingerprint, dim_names=("dp", "cp")))
    assert name_context_dim(unused).fingerprint.dim_names == ("dp", "sp")
    nodes = list(plan.nodes)
    nodes[0] = replace(nodes[0], exchange=("context_gather_balanced", 1))
    split = replace(plan, nodes=tuple(nodes))
    assert name_context_dim(split).fingerprint.dim_names == ("dp", "cp")
    moved = replace(split, fingerprint=replace(plan.fingerprint, dim_names=("cp", "tp")))
    assert name_context_dim(moved).fingerprint.dim_names == ("sp", "cp")


@pytest.fixture(scope="module")
def llama_256():
    """(model, inputs, traced) of a 4-block LLaMA of width 256 on 8 sequences of 64 tokens, traced
    once for the module's pp-layout tests: the pricing reads the traced graph and the model and
    changes neither (the mesh search hands one trace to every layout it prices, the same way)."""
    model, inputs = llama3.tiny(device="meta", batch_size=8, seq_len=64, max_seq_len=64, dim=256, n_layers=4)
    return model, inputs, trace_joint(model, inputs, target_device="cpu")


@pytest.mark.parametrize("layout", [MeshLayout((2, 2), ("pp", "dp")), MeshLayout((2, 2), ("pp", "tp")),
                                    MeshLayout((4,), ("pp",))])
def test_the_matmul_bound_is_below_the_priced_pipeline_step(layout: MeshLayout, llama_256) -> None:
    from autoshard.plan.options import solve_options
    from autoshard.search.mesh_stages import solve_pipeline_layout

    model, inputs, traced = llama_256
    options = solve_options(None, {"profile": "h100-sxm-80gb", "device_type": "cpu"})
    priced = solve_pipeline_layout(model, inputs, traced, layout, options, time_limit=8, incumbent_s=0.0)
    assert priced.plan is None  # slower than an incumbent of 0 s: priced, no plan built
    bound = pipeline_bound_s(model_shape(traced), layout.devices, load_profile("h100-sxm-80gb"))
    assert 0 < bound <= priced.step_s
    # and the held-state bound (p3) is below the busiest rank the pricing found
    elems, itemsize = block_param_elems(model, traced.blocks)
    assert 0 < pipeline_memory_bound_bytes(elems, layout, mixed_precision=False,
                                           param_itemsize=itemsize) <= priced.peak_memory_bytes


def test_a_pp_layout_whose_held_weights_exceed_the_limit_is_refused_unpriced(llama_256) -> None:
    from autoshard.plan.options import solve_options
    from autoshard.search.mesh_stages import held_memory_refusal

    model, _, traced = llama_256
    elems, _ = block_param_elems(model, traced.blocks)
    layout, profile = MeshLayout((2, 2), ("pp", "dp")), load_profile("h100-sxm-80gb")
    held = elems * 4 * 2 / 2  # fp32 weights and gradients, half the blocks a stage
    for limit, refused in ((held * 0.9, True), (held * 1.1, False)):
        options = solve_options(None, {"profile": "h100-sxm-80gb", "device_type": "cpu", "memory_limit": limit})
        why = held_memory_refusal(model, traced.blocks, layout, options, profile)
        assert (why is not None) == refused
        assert why is None or "held weights and gradients bound" in why


def test_a_pp_layout_reads_the_search_best_after_its_pricing_not_before(monkeypatch, llama_256) -> None:
    # the best may improve while a layout is priced (405B: a minute); read before, a slower layout
    # would build its record (minutes) for nothing
    from types import SimpleNamespace

    from autoshard.plan.options import solve_options
    from autoshard.search import pipeline_model
    from autoshard.search.mesh_stages import solve_pipeline_layout

    model, inputs, traced = llama_256
    events = []

    def priced(*args, **kwargs):
        events.append("priced")
        return None, SimpleNamespace(step_s=2.0, rank_memory_bytes=(1.0,), schedule="1F1B")

    def best() -> float:
        events.append("best read")
        return 1.0  # improved to below this layout's 2.0 during its pricing

    monkeypatch.setattr(pipeline_model, "choose_pipeline", priced)
    options = solve_options(None, {"profile": "h100-sxm-80gb", "device_type": "cpu"})
    out = solve_pipeline_layout(model, inputs, traced, MeshLayout((2, 2), ("pp", "dp")), options, time_limit=8,
                                incumbent_s=best)
    assert events == ["priced", "best read"]
    assert out.plan is None and out.step_s == 2.0  # no record built
