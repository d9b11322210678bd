"""Context-parallel attention nodes on CUDA fake tensors: the CUDA kernels, no CPU kernel, no host sync.

A CPU-only torch cannot run a CUDA kernel, but ``FakeTensorMode`` runs the kernels' shape
functions on CUDA fake tensors and refuses tensors on two devices. Each CUDA attention node a
plan may hold (flash in bf16 with GQA, causal, contiguous and load-balanced; efficient in fp32
with a Hugging Face mask split on its query rows, its logsumexp padded to 32 rows; whole K/V for
the ``context_whole_kv`` kinds) runs through
``run_context_op`` on a fake process group of 2 ranks (collectives are their shape functions)
inside ``DeviceAudit``: every output has the local op's shape, dtype and device, no op runs a
CPU-only kernel or makes a tensor off the device, and nothing reads a value on the host.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode

from autoshard.runtime.context_ops import run_context_op
from autoshard.runtime.device_audit import DeviceAudit

aten = torch.ops.aten
CUDA = torch.device("cuda", 0)
CP, ROWS = 2, 64
CASES = {
    "flash-bf16-gqa": ("flash", torch.bfloat16, 2, "context_gather", None),
    "flash-bf16-balanced": ("flash", torch.bfloat16, 4, "context_gather_balanced", None),
    "efficient-fp32-mask": ("efficient", torch.float32, 4, "context_gather", "rows"),
    "efficient-fp32-padding": ("efficient", torch.float32, 4, "context_gather", "broadcast"),
    "flash-bf16-whole-kv-balanced": ("flash", torch.bfloat16, 2, "context_whole_kv_balanced", None),
    "efficient-fp32-whole-kv-mask": ("efficient", torch.float32, 4, "context_whole_kv", "rows"),
}
"""``context_whole_kv*``: K/V of the whole sequence in, dK/dV of every key row out."""


@pytest.fixture(scope="module")
def fake_group(fake_world):
    """The fake 2-rank group of this folder's ``conftest.py``."""
    assert dist.get_world_size(fake_world) == CP
    return fake_world


def _empty(shape, dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=CUDA)


def _nodes(kernel: str, dtype: torch.dtype, kv_heads: int, mask_kind: str | None, whole: bool = False):
    """(forward op, its args, kwargs, its local-op outputs; backward op, args builder, local-op outputs);
    ``whole``: K/V of the whole sequence (``CP`` ranks' rows)."""
    keys = CP * ROWS if whole else ROWS
    q, k = _empty((2, 4, ROWS, 16), dtype), _empty((2, kv_heads, keys, 16), dtype)
    if kernel == "flash":
        fwd = aten._scaled_dot_product_flash_attention.default
        args, kwargs = (q, k, k, 0.0, True), {"scale": None}
        local = fwd(q, k.repeat_interleave(4 // kv_heads, 1), k.repeat_interleave(4 // kv_heads, 1), *args[3:])
        return fwd, args, kwargs, local
    mask = _empty((2, 1, ROWS if mask_kind == "rows" else 1, CP * ROWS), dtype)
    fwd = aten._scaled_dot_product_efficient_attention.default
    args = (q, k, k, mask, True, 0.0, False)
    local = fwd(q, k, k, mask.expand(2, 4, ROWS, CP * ROWS).narrow(3, 0, keys), True, 0.0, False)
    return fwd, args, {"scale": None}, local


def _backward(kernel: str, fwd_args: tuple, out: tuple) -> tuple:
    q, k, v = fwd_args[:3]
    if kernel == "flash":
        op = aten._scaled_dot_product_flash_attention_backward.default
        return op, (out[0], q, k, v, out[0], out[1], out[2], out[3], out[4], out[5], 0.0, True, out[6], out[7])
    op = aten._scaled_dot_product_efficient_attention_backward.default
    return op, (out[0], q, k, v, fwd_args[3], out[0], out[1], out[2], out[3], 0.0, [True, True, True, False], False)


def _shape(x):
    return (tuple(x.shape), x.dtype, x.device.type) if isinstance(x, torch.Tensor) else x


@pytest.mark.parametrize("case", sorted(CASES))
def test_cuda_node_runs_its_cuda_kernels_on_the_device_without_host_sync(fake_group, case) -> None:
    kernel, dtype, kv_heads, kind, mask_kind = CASES[case]
    with FakeTensorMode(allow_non_fake_inputs=True):
        fwd, args, kwargs, local = _nodes(kernel, dtype, kv_heads, mask_kind, kind.startswith("context_whole_kv"))
        with DeviceAudit(CUDA) as audit:
            out = run_context_op(fwd, args, kwargs, kind=kind, group=fake_group)
            bwd, bwd_args = _backward(kernel, args, out)
            grads = run_context_op(bwd, bwd_args, {"scale": None}, kind=kind, group=fake_group)
    assert audit.problems == [], case
    # the local op's outputs: what the plan's shapes and the backward node expect
    want = [_shape(x) for x in local]
    got = [_shape(x) for x in out]
    assert got[:2] == want[:2], case
    assert len(got) == len(want), case
    for g, w in zip(out[2:], local[2:]):  # random state and debug mask: tensors on the rank's device
        if isinstance(w, torch.Tensor):
            assert isinstance(g, torch.Tensor) and g.dtype == w.dtype and g.device == CUDA, case
        else:
            assert g == w, case
    q, k = args[0], args[1]
    assert [_shape(g) for g in grads[:3]] == [_shape(q), _shape(k), _shape(k)], case
    if kernel == "efficient":
        assert len(grads) == 4 and grads[3] is None  # no gradient of the mask
