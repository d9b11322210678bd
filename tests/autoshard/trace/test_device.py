"""The joint graph for the device type a plan runs on (``autoshard.trace.device``)."""

from __future__ import annotations

import operator

import pytest
import torch
from torch import nn

from autoshard.trace import TraceError, trace_joint
from autoshard.trace.device import CPU_ONLY_OPS, device_kernel_problems
from examples.models import llama3

aten = torch.ops.aten


def _targets(traced) -> set:
    return {n.target for n in traced.graph_module.graph.nodes if n.op == "call_function"}


class _Positions(nn.Module):
    """A forward that makes a tensor from a size on a device (``arange(..., device=)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.shape[-1], device=x.device, dtype=x.dtype)
        return ((x + pos) * self.w).sum()


def test_a_cpu_target_keeps_the_cpu_kernels() -> None:
    traced = trace_joint(*llama3.tiny(device="meta"))
    assert aten._scaled_dot_product_flash_attention_for_cpu.default in _targets(traced)


@pytest.mark.parametrize(("dtype", "kernel"), [("bfloat16", "flash"), (None, "efficient")])
def test_cuda_attention_is_the_kernel_sdpa_picks_for_the_dtype(dtype, kernel) -> None:
    kwargs = {"dtype": dtype} if dtype else {}
    traced = trace_joint(*llama3.tiny(device="meta", **kwargs), target_device="cuda")
    targets = _targets(traced)
    assert not targets & CPU_ONLY_OPS
    forward = getattr(aten, f"_scaled_dot_product_{kernel}_attention").default
    backward = getattr(aten, f"_scaled_dot_product_{kernel}_attention_backward").default
    assert forward in targets and backward in targets
    assert device_kernel_problems(traced.graph_module.graph, "cuda") == []
    assert device_kernel_problems(traced.graph_module.graph, "cpu")  # and it no longer runs on a CPU


def test_tuple_accesses_of_the_mapped_kernel_carry_its_output_shapes() -> None:
    """The efficient kernel pads its logsumexp's rows to a multiple of 32 (16 query rows here)."""
    traced = trace_joint(*llama3.tiny(device="meta"), target_device="cuda")
    forward = aten._scaled_dot_product_efficient_attention.default
    for node in traced.graph_module.graph.nodes:
        if node.target is operator.getitem and node.args[0].target is forward:
            want = node.args[0].meta["val"][node.args[1]]
            assert tuple(node.meta["val"].shape) == tuple(want.shape)
            if node.args[1] == 1:
                assert node.meta["val"].shape[-1] == 32
    # and the node descriptions every later stage reads are rebuilt from the mapped graph
    infos = [i for i in traced.nodes.values() if i.op is forward]
    assert infos and all(i.outputs[1].shape[-1] == 32 for i in infos)


def test_the_backward_reads_the_random_state_of_its_own_forward() -> None:
    traced = trace_joint(*llama3.tiny(device="meta", dtype="bfloat16"), target_device="cuda")
    for node in traced.graph_module.graph.nodes:
        if node.target is aten._scaled_dot_product_flash_attention_backward.default:
            out, seed, offset = node.args[4], node.args[12], node.args[13]
            assert out.args[0] is seed.args[0] is offset.args[0]
            assert (out.args[1], seed.args[1], offset.args[1]) == (0, 6, 7)
            assert node.args[8:10] == (16, 16)  # sequence lengths as numbers, as a GPU trace has them


def test_device_arguments_point_at_the_target_device_type() -> None:
    model, x = _Positions(), torch.ones(4, 8)
    cpu = trace_joint(model, (x,))
    cuda = trace_joint(model, (x,), target_device="cuda")
    devices = [n.kwargs["device"] for n in cuda.graph_module.graph.nodes if "device" in n.kwargs]
    assert devices and all(torch.device(d).type == "cuda" for d in devices)
    assert all(torch.device(n.kwargs["device"]).type == "cpu" for n in cpu.graph_module.graph.nodes
               if "device" in n.kwargs)


def test_an_unknown_device_type_is_one_clear_error() -> None:
    with pytest.raises(TraceError, match="device type 'tpu'"):
        trace_joint(_Positions(), (torch.ones(4, 8),), target_device="tpu")


def test_rms_norm_is_the_fused_kernel_a_gpu_runs_and_the_cpu_decomposition_on_a_cpu() -> None:
    """nn.RMSNorm: one aten._fused_rms_norm (and backward) per norm on CUDA, as eager torch runs it there."""
    model, inputs = llama3.tiny(device="meta", dtype="bfloat16")
    norms = sum(isinstance(m, nn.RMSNorm) for m in model.modules())
    cuda = trace_joint(model, inputs, target_device="cuda")
    targets = [n.target for n in cuda.graph_module.graph.nodes]
    assert targets.count(aten._fused_rms_norm.default) == norms
    assert targets.count(aten._fused_rms_norm_backward.default) == norms
    assert not any("autoshard" in str(t) for t in targets)  # no stand-in left
    assert aten._fused_rms_norm.default not in _targets(trace_joint(model, inputs))
    assert torch.nn.functional.rms_norm.__module__ == "torch.nn.functional"  # the patch is undone
