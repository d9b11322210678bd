"""autoshard.graph.access: the innermost contiguous run of an op's kernel from
real strides (transposes, strided slices, broadcasts inside the row, middle
dim reductions, expanded inputs), the scalar-operand flag, and the graph
builder pricing them through the profile's run curve and scalar floor."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from autoshard.graph.access import has_scalar_operand, inner_run, reduced_dims
from costmodel.compute import op_time_s, run_efficiency

aten = torch.ops.aten


@pytest.mark.parametrize(
    "kind,inputs,outputs,reduced,run",
    [
        ("elementwise", [torch.empty(8, 64), torch.empty(8, 64)], [torch.empty(8, 64)], None, math.inf),
        ("elementwise", [torch.empty(4, 128, 4, 32), torch.empty(1, 128, 1, 32)], [torch.empty(4, 128, 4, 32)], None, 32),
        ("elementwise", [torch.empty(4, 128, 256), torch.empty(256)], [torch.empty(4, 128, 256)], None, 256),
        # an expanded input alone in the inner loop: no vectorised path
        ("elementwise", [torch.empty(4, 128, 1).expand(4, 128, 256)], [torch.empty(4, 128, 256)], None, 1),
        # a strided slice (rotary halves): runs of 16
        ("elementwise", [torch.empty(4, 128, 8, 32)[..., :16]], [torch.empty(4, 128, 8, 16)], None, 16),
        # a permuted tensor walked in its own order is contiguous
        ("elementwise", [torch.empty(8, 4, 16).permute(2, 0, 1)], [torch.empty(8, 4, 16).permute(2, 0, 1)], None, math.inf),
        ("copy", [torch.empty(900, 700).t()], [torch.empty(700, 900)], None, 1),
        ("copy", [torch.empty(4, 128, 4, 1, 32).expand(4, 128, 4, 2, 32)], [torch.empty(4, 128, 4, 2, 32)], None, 32),
        ("copy", [torch.empty(4, 128, 4, 16), torch.empty(4, 128, 4, 32)[..., 16:]], [torch.empty(4, 128, 4, 32)], None, 16),
        ("reduction", [torch.empty(4, 128, 4, 2, 32)], [torch.empty(4, 128, 4, 32)], [3], 32),
        ("reduction", [torch.empty(4096, 300)], [torch.empty(4096)], [1], 300),
        ("reduction", [torch.empty(700, 1000)], [torch.empty(1000)], [0], 1000),
        ("reduction", [torch.empty(700, 1000)], [torch.empty(())], None, math.inf),
        ("matmul", [torch.empty(64, 32).t(), torch.empty(64, 16)], [torch.empty(32, 16)], None, math.inf),
    ],
)
def test_inner_run_of_common_layouts(kind, inputs, outputs, reduced, run):
    assert inner_run(kind, inputs, outputs, reduced=reduced) == run


def test_scalar_operands_are_wrapped_numbers_not_exponents_or_dims():
    x = torch.ones(4)
    assert has_scalar_operand(aten.mul.Tensor, (x, 0.5))
    assert has_scalar_operand(aten.add.Scalar, (x, 1.0))
    assert not has_scalar_operand(aten.mul.Tensor, (x, x))
    assert not has_scalar_operand(aten.pow.Tensor_Scalar, (x, 2))
    assert not has_scalar_operand(aten.sum.dim_IntList, (x, [0]))


def test_reduced_dims_reads_the_dim_argument():
    from autoshard.rules import load_rules
    from autoshard.rules.core import TensorMeta

    rules = load_rules()
    x = TensorMeta((4, 8, 16), torch.float32)
    assert reduced_dims(rules.op_call(aten.sum.dim_IntList, (x, [1]), {})) == [1]
    assert reduced_dims(rules.op_call(aten.sum.default, (x,), {})) is None


def _with(profile, **device_fields):
    eff = device_fields.pop("efficiency", {})
    device = dataclasses.replace(profile.device, efficiency=dataclasses.replace(profile.device.efficiency, **eff),
                                 **device_fields)
    return dataclasses.replace(profile, device=device)


def test_builder_prices_a_strided_op_by_the_run_curve_and_a_scalar_op_by_its_floor():
    from autoshard.graph.builder import build_graph
    from autoshard.trace import trace_joint
    from costmodel.mesh import MeshSpec
    from hw_profiles import load

    class Strided(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(64, 64))

        def forward(self, x):
            y = (x @ self.w).t() * 0.5  # a Python-scalar operand
            return (y.t().contiguous() + torch.neg(x @ self.w).t().contiguous().t()).sum()

    base = load("cpu-gloo")
    slow = _with(base, launch_scalar_s=1e-3, efficiency={"run": ((1.0, 0.01), (1024.0, 1.0))})
    traced = trace_joint(Strided(), (torch.ones(64, 64),))
    fast_graph, slow_graph = build_graph(traced, MeshSpec((1,)), base), build_graph(traced, MeshSpec((1,)), slow)
    by_op = {}
    for a, b in zip(fast_graph.nodes, slow_graph.nodes):
        by_op.setdefault(a.target, []).append((float(a.compute_s[0]), float(b.compute_s[0])))
    mul = by_op["aten.mul.Tensor"][0]
    assert mul[1] >= 1e-3 > mul[0]  # the scalar floor replaces the launch floor
    clone = by_op["aten.clone.default"][0]  # a transposed copy: run 1, at 1 % of the contiguous speed
    busy = [c - base.device.launch_s for c in clone]  # the same bytes at 1 % instead of the profile's run-1 speed
    assert busy[1] == pytest.approx(busy[0] * run_efficiency(base, 1.0) / 0.01, rel=1e-6)
    mm = by_op["aten.mm.default"][0]
    assert mm[0] == mm[1]  # matmuls walk their own layouts: no run penalty


def test_run_curve_scales_elementwise_reduction_and_copy_not_matmul():
    from hw_profiles import load

    profile = _with(load("h100-sxm-80gb"), efficiency={"run": ((1.0, 0.1), (32.0, 0.5), (1024.0, 1.0))})
    launch = profile.device.launch_s
    for kind in ("elementwise", "reduction", "copy"):
        contiguous = op_time_s(kind, flops=0, bytes_accessed=1e8, dtype="bf16", profile=profile) - launch
        strided = op_time_s(kind, flops=0, bytes_accessed=1e8, dtype="bf16", profile=profile, run_elems=32) - launch
        assert strided == pytest.approx(contiguous / 0.5)
    mm = op_time_s("matmul", flops=1e12, bytes_accessed=1e8, dtype="bf16", profile=profile)
    assert op_time_s("matmul", flops=1e12, bytes_accessed=1e8, dtype="bf16", profile=profile, run_elems=1) == mm


def test_calibration_access_patterns_have_the_run_they_are_measured_as():
    """The calibration fits the run curve on these ops: autoshard.graph.access must
    find the same run in them as it finds in a traced graph's layouts."""
    from autoshard.calibrate.measure_compute import ACCESS_PATTERNS, _access_tensors

    for pattern, (kind, runs) in ACCESS_PATTERNS.items():
        for run in runs:
            fn, twin, *_ = _access_tensors(pattern, 2**12, run, torch.device("cpu"))
            tensors = []
            for cell in fn.__closure__:
                value = cell.cell_contents
                tensors += value if isinstance(value, list) else [value] if isinstance(value, torch.Tensor) else []
            reduced = [3] if kind == "reduction" else None
            assert inner_run(kind, tensors, [fn()], reduced=reduced) == run, (pattern, run)
            twin_tensors = [c.cell_contents for c in twin.__closure__ if isinstance(c.cell_contents, torch.Tensor)]
            assert inner_run(kind, twin_tensors, [twin()], reduced=[0] if reduced else None) >= 256, pattern  # long runs
