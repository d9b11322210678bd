"""Data parallelism over more ranks than sequences, on 4 gloo ranks: equal to one device.

The example LLaMA with a batch of 2 sequences, and of 1, on mesh ``(4,)``: the mesh dim cannot
split the batch, so the tokens are split along the sequence (``S(1)``, pinned) and every attention
node runs context-parallel on it (restricted, as ``test_context_parallel_gloo`` does). Each flatten
of the tokens (``[B, S, D] -> [B*S, D]`` before every linear layer, the logits and labels before the
loss) gives, for 2 sequences, the strided row shard ``_S(0, sf=2)``, which the linear layers and the
loss now read as it is (``autoshard.graph.token_splits``) instead of moving the rows to ``S(0)``;
for 1 sequence the contiguous rows ``S(0)``. Through ``autoshard.runtime.shard`` (both plans in one
job of 4 ranks): the loss and every gradient equal one device on two SGD steps, and each rank issues
exactly the plan's collectives.
"""

from __future__ import annotations

import dataclasses

import pytest
from costmodel.placements import StridedShard
from equivalence import assert_steps_match_one_device
from gloo_ranks import planned_collectives_issued, spawn

from autoshard.graph.builder import build_graph
from autoshard.search.solve import prepare, solve_prepared
from benchmarks.common.models import load as load_model

pytestmark = [pytest.mark.slow]

PROFILE = "a100-sxm-80gb"
FACTORY, OVERRIDES = "llama3.tiny", {"n_layers": 1}
MESH, NAMES = (4,), ("dp",)
ATTENTION = "aten._scaled_dot_product_flash_attention_for_cpu"
PINS = {"tokens": "S(1)", "labels": "S(1)"}
STRIDED = "_S(0,sf=2)"
STEPS, LR = 2, 0.1


def context_parallel_attention(node, strategies):
    """Restrict: attention keeps its context-parallel strategies on mesh dim 0, and the loss reads
    its strided rows (on a model this small the solver would rather replicate the loss's scalar)."""
    target = str(node.target)
    if target.startswith(ATTENTION):
        return [s for s in strategies if s.exchange == ("context_gather", 0)] or strategies
    if target.startswith("aten.nll_loss_forward"):
        return [s for s in strategies if s.input_placements[0] == (StridedShard(0, 2),)] or strategies
    return strategies


BATCHES = {"two_sequences": 2, "one_sequence": 1}


def token_split_plan(batch: int):
    """The solver's plan for the LLaMA with ``batch`` sequences split over 4 ranks."""
    model, inputs = load_model(FACTORY, {**OVERRIDES, "batch_size": batch})
    assert inputs[0].shape[0] == batch < MESH[0]  # fewer sequences than ranks: the case under test
    prep = prepare(model, inputs, MESH, NAMES, profile=PROFILE, device_type="cpu", recompute="none")
    graph = build_graph(prep.traced, prep.graph.mesh, prep.graph.profile, optimizer=prep.graph.optimizer,
                        recompute=False, restrict=context_parallel_attention)
    return solve_prepared(dataclasses.replace(prep, graph=graph), pins=PINS, time_limit=10)


def run_plans(rank: int, world: int, paths: dict[str, str]) -> dict:
    """Two SGD steps of each plan, sharded and on one device (``equivalence.sgd_steps``)."""
    from equivalence import sgd_steps
    from torch.distributed.device_mesh import init_device_mesh

    from benchmarks.common.models import load as load_model

    mesh = init_device_mesh("cpu", MESH, mesh_dim_names=NAMES)
    out = {}
    for label, path in paths.items():
        model, inputs = load_model(FACTORY, {**OVERRIDES, "batch_size": BATCHES[label]})
        out[label] = sgd_steps(model, inputs, mesh, path, steps=STEPS, lr=LR)
    return out


def test_sequence_split_of_fewer_sequences_than_ranks_equals_one_device(tmp_path) -> None:
    plans = {label: token_split_plan(batch) for label, batch in BATCHES.items()}
    for label, rows in (("two_sequences", STRIDED), ("one_sequence", "S(0)")):
        plan = plans[label]
        assert any(n.op == "aten.mm.default" and rows in n.inputs for n in plan.nodes), label
        assert any(n.exchange == ("context_gather", 0) for n in plan.nodes), label
    loss = [n for n in plans["two_sequences"].nodes if n.op.startswith("aten.nll_loss_forward")]
    assert loss and loss[0].inputs[:2] == (STRIDED, STRIDED)
    paths = {}
    for label, plan in plans.items():
        paths[label] = str(tmp_path / f"{label}.json")
        plan.save(paths[label])
    results = spawn(4, run_plans, (paths,), tmp_path / "ranks", timeout=600)
    for label, plan in plans.items():
        assert_steps_match_one_device(results, label, steps=STEPS, grad_atol=1e-5)
        planned_collectives_issued(plan, results, label)
