"""The copies a bucket's flat buffer costs, as the runtime makes them: the bytes
``costmodel.buckets.grouping`` prices for packing and unpacking a gradient bucket or a
gather bucket are the bytes of the tensors ``autoshard.runtime.steps`` allocates
around the one collective (views, in-place ops and the collective itself excluded)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from costmodel.buckets.grouping import bucket_copy_bytes, gather_copy_bytes
from costmodel.placements import parse_placements as pp
from costmodel.redistribute_steps import RedistributeStep

from autoshard.runtime.steps import run_bucket, run_gather

GROUP = 2


class _Allocations(TorchDispatchMode):
    """Bytes of every tensor an aten op makes that shares no storage with its inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.paused or not isinstance(out, torch.Tensor):
            return out
        inputs = {a.untyped_storage().data_ptr() for a in torch.utils._pytree.tree_leaves((args, kwargs))
                  if isinstance(a, torch.Tensor)}
        if out.untyped_storage().data_ptr() not in inputs and out.numel():
            self.sizes.append(out.numel() * out.element_size())
        return out


class _Comm:
    """Rank 0 of a group of two whose peer holds what it holds; the collective's own buffer is not counted."""

    def __init__(self, allocations: _Allocations) -> None:
        self.allocations = allocations

    def _unrecorded(self, fn):
        self.allocations.paused = True
        try:
            return fn()
        finally:
            self.allocations.paused = False

    def all_gather(self, x, mesh_dims, nbytes):
        return self._unrecorded(lambda: torch.cat([x, x]))

    def all_reduce(self, x, op, mesh_dims, nbytes):
        return self._unrecorded(lambda: x * GROUP)

    def reduce_scatter(self, x, op, mesh_dims, nbytes):
        return self._unrecorded(lambda: (x * GROUP).reshape(GROUP, -1)[0].clone())


def _run(run):
    allocations = _Allocations()
    with allocations:
        out = run(_Comm(allocations))
    return sorted(allocations.sizes), out


def test_a_gather_bucket_allocates_what_is_priced_its_shards_packed_then_each_member_copied_out():
    # (a shard of one row is viewed, not copied, out of the result: priced as a copy, a few bytes)
    shapes = [(6, 4), (4, 8), (4, 3)]
    steps = [RedistributeStep("all_gather", (0,), 4 * s[0] * s[1], 0.0, pp("S(0)"), pp("R"), tensor_dim=0)
             for s in shapes]
    shards = [torch.randn(s[0] // GROUP, s[1]) for s in shapes]
    sizes, out = _run(lambda comm: run_gather(shards, steps, shapes, (GROUP,), (0,), comm))
    assert [tuple(o.shape) for o in out] == shapes
    pack, unpack = gather_copy_bytes([st.bytes for st in steps], GROUP)
    assert sizes == sorted(int(b) for b in pack + unpack)


@pytest.mark.parametrize("kind,dims", [("all_reduce", (None, None)), ("reduce_scatter", (0, 0)),
                                       ("reduce_scatter", (0, 1))])
def test_a_gradient_bucket_allocates_what_is_priced(kind, dims):
    shapes = [(6, 4), (4, 8)]
    dst = ["R" if d is None else f"S({d})" for d in dims]
    steps = [RedistributeStep(kind, (0,), 4 * s[0] * s[1], 0.0, pp("P(sum)"), pp(p), tensor_dim=d, reduce_op="sum")
             for s, p, d in zip(shapes, dst, dims)]
    grads = [torch.randn(s) for s in shapes]
    sizes, out = _run(lambda comm: run_bucket(grads, steps, (GROUP,), (0,), comm))
    assert len(out) == len(shapes)
    pack, unpack = bucket_copy_bytes(kind, [(st.bytes, bool(d)) for st, d in zip(steps, dims)], GROUP)
    assert sizes == sorted(int(b) for b in pack + unpack)
