"""Exact copy nodes (``autoshard.graph.tied_memory``) tie a reader's copy to its choice through
edges that carry no tensor: the assembled plan redistributes nothing along them, so its
collectives, step time and schedule are those of the real producer -> reader edges only."""

from __future__ import annotations

from dataclasses import replace

from hw_profiles import load

from autoshard.search.solve import prepare, solve_prepared
from examples.models import llama3


def test_edges_into_exact_copy_nodes_are_not_redistributed() -> None:
    # a small device memory makes every reader's copy bound large enough for an exact copy node
    base = load("h100-sxm-80gb")
    profile = replace(base, device=replace(base.device, memory_bytes=4 * 2**20))
    model, inputs = llama3.tiny(device="meta", n_layers=2, batch_size=8, seq_len=64)
    prep = prepare(model, inputs, (4,), ("dp",), profile=profile)
    copy_nodes = {n.name for n in prep.graph.nodes if n.name.startswith("memory:copy:")}
    assert copy_nodes  # the case under test exists in this graph
    plan = solve_prepared(prep, baseline="fsdp", memory_limit=1e30, time_limit=20, recompute="none")
    assert plan.redistributions  # FSDP gathers parameters and reduces gradients
    assert not [r for r in plan.redistributions if r.to in copy_nodes]
    assert plan.estimate.comm_s >= 0 and plan.estimate.step_s >= plan.estimate.compute_s
