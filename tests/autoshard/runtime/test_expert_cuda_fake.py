"""The experts ops run expert-parallel on CUDA fake tensors: on the device, one declared sync per call.

A CPU-only torch cannot run a CUDA kernel, but ``FakeTensorMode`` runs the kernels' shape
functions on CUDA fake tensors, refuses tensors on two devices, and (in a CPU-only torch) refuses
Python indexing and in-place copies of CUDA tensors, which the dispatch and the grouped experts
avoid. Each experts node (forward, backward) of a Mixtral-shaped layer (4 experts, top-2, on a fake
process group of 2 ranks, as rank 0) runs through ``run_expert_op`` inside ``DeviceAudit``: its
outputs have the local op's shapes, dtypes and device, no op makes a tensor off the device or runs
a CPU-only kernel, and the only host read is the dispatch's declared one (its split sizes), whose
values ``fake_routing.fake_counts`` stands in for: an uneven routing with an expert that gets no
row, and one where this rank's experts get no row at all. The whole plan: test_expert_cuda_plan.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode

from fake_routing import fake_counts

from autoshard.runtime import expert_dispatch
from autoshard.runtime.device_audit import DeviceAudit
from autoshard.runtime.expert_ops import run_expert_op
from autoshard.trace.experts import EXPERTS_BACKWARD_OP, EXPERTS_OP

CUDA = torch.device("cuda", 0)
EP, EXPERTS, TOP_K, TOKENS, DIM, HIDDEN = 2, 4, 2, 16, 64, 128
ROUTINGS = {"uneven": (2, 0, 1, 1), "none-here": (0, 0, 1, 1)}  # proportions of copies per expert


@pytest.fixture(scope="module")
def fake_group(fake_world):
    """The fake 2-rank group of this folder's ``conftest.py``."""
    assert dist.get_world_size(fake_world) == EP
    return fake_world


def _shapes(values) -> list[tuple]:
    return [(tuple(t.shape), t.dtype, t.device) for t in values]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("routing", sorted(ROUTINGS))
def test_experts_nodes_stay_on_the_device_with_one_declared_sync_each(fake_group, monkeypatch, routing, dtype):
    reads: list[tuple] = []
    monkeypatch.setattr(expert_dispatch, "_host_counts",
                        fake_counts(TOKENS * TOP_K, ROUTINGS[routing], world=EP, rank=0, reads=reads))
    local = EXPERTS // EP
    with FakeTensorMode():
        hidden = torch.empty(TOKENS, DIM, dtype=dtype, device=CUDA)
        index = torch.empty(TOKENS, TOP_K, dtype=torch.int64, device=CUDA)
        weights = torch.empty(TOKENS, TOP_K, dtype=dtype, device=CUDA)
        gate_up = torch.empty(local, 2 * HIDDEN, DIM, dtype=dtype, device=CUDA)
        down = torch.empty(local, DIM, HIDDEN, dtype=dtype, device=CUDA)
        args = (hidden, index, weights, gate_up, down)
        with DeviceAudit(CUDA) as audit:
            out = run_expert_op(EXPERTS_OP, (*args, "silu"), group=fake_group)
            grads = run_expert_op(EXPERTS_BACKWARD_OP, (torch.empty_like(hidden), *args, "silu"), group=fake_group)
    assert audit.problems == []
    assert audit.declared_syncs == ["expert dispatch: the all-to-all's run-time split sizes"] * 2
    assert reads == [((2 * EXPERTS + 1,), torch.int64, CUDA)] * 2  # one read of device counts per call
    assert _shapes([out]) == _shapes([hidden])
    assert _shapes(grads) == _shapes([hidden, weights, gate_up, down])
