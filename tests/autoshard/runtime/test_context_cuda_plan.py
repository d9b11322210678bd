"""A whole context-parallel plan steps on CUDA fake tensors: every tensor on the device, no host sync.

The example LLaMA in bf16, its attention nodes restricted to one exchange kind on a mesh of 2
(``cp``: ``context_gather``, ``context_ring``, or ``context_whole_kv_balanced``, whole K/V in and
partial dK/dV out with the rows moved to the head-and-tail layout), solved for the H100 profile,
then run by the runtime for two steps on CUDA fake tensors (a CPU-only torch, a fake process
group), under ``DeviceAudit``: no tensor made off
the device, no CPU kernel, no host sync. The exchange's kernels are CUDA flash attention's, the
redistributions those of a sequence split (slices and pads along a non-leading dim, a strided
shard's reorder), which a CPU-only torch's CUDA fake tensors used to refuse. The per-node CUDA
kernels alone: test_context_cuda_fake.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.device_mesh import DeviceMesh

from costmodel.mesh import MeshSpec
from hw_profiles import load
from autoshard.graph.builder import build_graph
from autoshard.runtime import local_slice
from autoshard.runtime.collectives import MeshComm
from autoshard.runtime.device_audit import DeviceAudit
from autoshard.runtime.execute import JointRunner, placements_of
from autoshard.search.solve import prepare, solve_prepared
from examples.models import llama3

CUDA = torch.device("cuda", 0)


def _context_only(kind):
    def restrict(node, strategies):
        if "attention" not in str(node.target):
            return strategies
        return [s for s in strategies if s.exchange == (kind, 0)] or strategies
    return restrict


@pytest.fixture()
def fake_group(fake_world):
    yield DeviceMesh("cpu", [0, 1], mesh_dim_names=("cp",))


@pytest.mark.parametrize("kind", ["context_gather", "context_ring", "context_whole_kv_balanced"])
def test_a_context_parallel_plan_steps_on_cuda_fake_tensors_without_leaving_the_device(fake_group, kind):
    model, inputs = llama3.tiny(device="meta", dtype="bfloat16", seq_len=64)
    prep = prepare(model, inputs, (2,), ("cp",), profile="h100-sxm-80gb", recompute="none")
    graph = build_graph(prep.traced, MeshSpec((2,), ("cp",)), load("h100-sxm-80gb"), optimizer=prep.graph.optimizer,
                        recompute=False, restrict=_context_only(kind))
    plan = solve_prepared(dataclasses.replace(prep, graph=graph), time_limit=10)
    assert sum(n.exchange == (kind, 0) for n in plan.nodes) == 4  # 2 layers, forward and backward
    traced = prep.traced

    def local(value, text):
        full = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=CUDA)
        return local_slice(full, placements_of(text, 1), (2,), (0,))

    with FakeTensorMode(allow_non_fake_inputs=True):
        params = {f: local(n.meta["val"], plan.params[f]) for f, n in traced.params.items()}
        buffers = {f: local(n.meta["val"], plan.buffers[f]) for f, n in traced.buffers.items()}
        batch = [local(n.meta["val"], plan.inputs[f]) for f, n in traced.inputs.items()]
        runner = JointRunner(traced, plan, (2,), (0,), comm=MeshComm(fake_group), device=CUDA)
        with DeviceAudit(CUDA) as audit:
            for _ in range(2):
                result = runner.run(params, buffers, batch)
    assert audit.problems == []
    assert result.loss.device == CUDA and all(g.device == CUDA for g in result.grads.values())
    assert runner.step_graph is None  # an exchange is interpreted every step, never traced
