"""Local redistribution steps on CUDA fake tensors (a CPU-only torch), as the CUDA checks run them.

On a CPU-only torch, ``contiguous()`` of a non-contiguous CUDA fake tensor and a copy into a
strided view of one fail ("not linked with support for cuda devices"); the runtime's local steps
are written with the clone and the cat they stand for, which run. Checked here for the steps a
sequence (context-parallel) split takes: a slice along a non-leading dim and a zero pad.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from costmodel.placements import parse_placements as S
from costmodel.redistribute_steps import RedistributeStep
from autoshard.runtime.steps import dense, run_step

CUDA = torch.device("cuda", 0)
SLICE = RedistributeStep("local_slice", (0,), 0, 0.0, S("R"), S("S(1)"), tensor_dim=1)
PAD = RedistributeStep("local_zero_pad", (0,), 0, 0.0, S("S(1)"), S("P(sum)"), tensor_dim=1)


def test_dense_is_contiguous_and_copies_only_what_is_not():
    x = torch.arange(12.0).reshape(3, 4)
    assert dense(x) is x
    part = x.narrow(1, 1, 2)
    out = dense(part)
    assert out.is_contiguous() and torch.equal(out, part) and out.data_ptr() != part.data_ptr()


def test_slice_and_zero_pad_of_a_non_leading_dim_equal_the_cpu_values():
    x = torch.arange(24.0).reshape(2, 6, 2)
    part = run_step(x, SLICE, (2, 6, 2), (2,), (1,), None)  # rank 1 of 2 keeps rows 3..5 of dim 1
    assert torch.equal(part, x[:, 3:])
    padded = run_step(part, PAD, (2, 6, 2), (2,), (1,), None)  # its rows back in place, zeros elsewhere
    assert padded.shape == (2, 6, 2) and torch.equal(padded[:, 3:], part) and not padded[:, :3].any()


def test_slice_and_zero_pad_run_on_cuda_fake_tensors():
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(2, 6, 2, device=CUDA, dtype=torch.bfloat16)
        part = run_step(x, SLICE, (2, 6, 2), (2,), (1,), None)
        padded = run_step(part, PAD, (2, 6, 2), (2,), (1,), None)
    assert part.device == CUDA and part.shape == (2, 3, 2) and part.is_contiguous()
    assert padded.device == CUDA and padded.shape == (2, 6, 2)
