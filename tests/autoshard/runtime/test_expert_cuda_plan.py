"""A whole expert-parallel plan steps on CUDA fake tensors: every tensor on the device, only the declared syncs.

A tiny Hugging Face Mixtral (one decoder layer, 4 experts, top-2) in bf16, its experts nodes
restricted to the ``expert_dispatch`` exchange on a mesh of 2 (``ep``), solved for the H100
profile, then run by the runtime for two steps on CUDA fake tensors (a CPU-only torch, a fake
process group) under ``DeviceAudit``: no tensor made off the device, no CPU kernel, and no host
sync but the ones the dispatch declares, one per exchange call as ``planned_host_syncs`` counts
them (the all-to-all's run-time split sizes, ``autoshard.runtime.expert_dispatch``).

Fake tensors hold no values, so the dispatch's one host read (``expert_dispatch._host_counts``)
is replaced by counts the fake group could deliver: every rank routes as this one does, half its
copies to expert 0, none to expert 1 (an expert with no row, on this rank), a quarter to each of
experts 2 and 3. The experts ops alone, forward and backward: test_expert_cuda_fake.py.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.device_mesh import DeviceMesh

from fake_routing import fake_counts

from costmodel.mesh import MeshSpec
from hw_profiles import load
from autoshard.graph.builder import build_graph
from autoshard.runtime import expert_dispatch, local_slice
from autoshard.runtime.collectives import MeshComm
from autoshard.runtime.device_audit import DeviceAudit
from autoshard.runtime.execute import JointRunner, placements_of
from autoshard.runtime.expert_ops import planned_host_syncs
from autoshard.search.solve import prepare, solve_prepared
from benchmarks.common.models import load as load_model

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")

CUDA = torch.device("cuda", 0)
EP, TOP_K = 2, 2
SHARE = (2, 0, 1, 1)  # quarters of a rank's copies routed to each of the 4 experts


def _only_expert_parallel(node, strategies):
    if not str(node.target).startswith("autoshard.experts"):
        return strategies
    return [s for s in strategies if s.exchange is not None and all(
        str(p) == "S(0)" for p in s.input_placements[0])] or strategies


@pytest.fixture()
def fake_group(fake_world):
    assert dist.get_world_size(fake_world) == EP
    yield DeviceMesh("cpu", list(range(EP)), mesh_dim_names=("ep",))


def test_an_expert_parallel_plan_steps_on_cuda_fake_tensors_with_only_the_declared_syncs(fake_group, monkeypatch):
    model, inputs = load_model("hf.hf_mixtral", {"num_hidden_layers": 1}, dtype="bfloat16", device="meta")
    assert model.config.num_local_experts == len(SHARE) and model.config.num_experts_per_tok == TOP_K
    prep = prepare(model, inputs, (EP,), ("ep",), profile="h100-sxm-80gb", recompute="none")
    graph = build_graph(prep.traced, MeshSpec((EP,), ("ep",)), load("h100-sxm-80gb"), optimizer=prep.graph.optimizer,
                        recompute=False, restrict=_only_expert_parallel)
    plan = solve_prepared(dataclasses.replace(prep, graph=graph), time_limit=10)
    assert [n.exchange for n in plan.nodes if n.exchange] == [("expert_dispatch", 0)] * 2  # forward, backward
    traced = prep.traced

    def local(value, text):
        full = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=CUDA)
        return local_slice(full, placements_of(text, 1), (EP,), (0,))

    reads: list[tuple] = []
    with FakeTensorMode(allow_non_fake_inputs=True):
        params = {f: local(n.meta["val"], plan.params[f]) for f, n in traced.params.items()}
        buffers = {f: local(n.meta["val"], plan.buffers[f]) for f, n in traced.buffers.items()}
        batch = [local(n.meta["val"], plan.inputs[f]) for f, n in traced.inputs.items()]
        copies = batch[0].numel() * TOP_K  # this rank's tokens, each routed to TOP_K experts
        monkeypatch.setattr(expert_dispatch, "_host_counts", fake_counts(copies, SHARE, world=EP, rank=0, reads=reads))
        runner = JointRunner(traced, plan, (EP,), (0,), comm=MeshComm(fake_group), device=CUDA)
        with DeviceAudit(CUDA) as audit:
            for _ in range(2):
                result = runner.run(params, buffers, batch)
    assert audit.problems == []
    assert len(audit.declared_syncs) == 2 * planned_host_syncs(plan) == 4
    assert reads == [((2 * len(SHARE) + 1,), torch.int64, CUDA)] * 4  # one read of device counts per declaration
    assert result.loss.device == CUDA and all(g.device == CUDA for g in result.grads.values())
    assert {g.dtype for g in result.grads.values()} == {torch.bfloat16}
    assert runner.step_graph is None  # run-time split sizes: interpreted every step, never traced
