"""The optimizer priced as it runs: each implementation (foreach, fused, for-loop) has its
own kernels (time) and temporaries (memory), and ``auto`` is torch.optim's own default."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from autoshard.graph.memory import OptimizerMemory, optimizer_implementation
from costmodel.compute import op_time_s
from hw_profiles import load

H100 = load("h100-sxm-80gb")
CPU = load("cpu-gloo")


def test_auto_is_torchs_default_for_the_device() -> None:
    assert optimizer_implementation("auto", H100) == "foreach"
    assert optimizer_implementation("auto", CPU) == "for-loop"
    assert optimizer_implementation("fused", CPU) == "fused"


def test_only_foreach_adamw_holds_a_parameter_sized_temporary() -> None:
    assert OptimizerMemory("adamw", implementation="foreach").step_temp_bytes(torch.bfloat16) == 2
    assert OptimizerMemory("adamw", True, "foreach").step_temp_bytes(torch.bfloat16) == 4  # fp32 state
    assert OptimizerMemory("adamw", implementation="fused").step_temp_bytes(torch.bfloat16) == 0
    assert OptimizerMemory("adamw", implementation="for-loop").step_temp_bytes(torch.bfloat16) == 0
    assert OptimizerMemory("sgd", implementation="foreach").step_temp_bytes(torch.float32) == 0


def test_an_unknown_implementation_is_refused_naming_the_option() -> None:
    with pytest.raises(ValueError, match="optimizer_impl: unknown 'apex'"):
        OptimizerMemory("adamw", implementation="apex")


def _stream_s(element_passes: int, numel: int, itemsize: int, profile) -> float:
    """Kernel time of ``element_passes`` passes over ``numel`` elements, without launches."""
    nbytes = float(element_passes * numel * itemsize)
    return op_time_s("copy", flops=0, bytes_accessed=nbytes, dtype="fp32", profile=profile) - profile.device.launch_s


def test_large_adamw_update_streams_its_bytes_at_the_implementations_rate() -> None:
    """A 1 GiB-per-pass parameter: every kernel is memory-bound on the flat end of the memory
    curve, so the update is (bytes of its kernels) / (bandwidth x efficiency x the implementation's
    fraction): foreach 21 element passes (8 kernels), fused 7 (one kernel reading p, g, m, v and
    writing p, m, v)."""
    numel, item = 2**29, 2
    frac = dict(H100.device.efficiency.optimizer)
    foreach = OptimizerMemory("adamw", implementation="foreach").update_time_s(numel, torch.bfloat16, H100)
    fused = OptimizerMemory("adamw", implementation="fused").update_time_s(numel, torch.bfloat16, H100)
    # each kernel at its own working set; these are all past the memory curve's last point
    per_pass = _stream_s(1, numel, item, H100)
    assert foreach == pytest.approx(21 * per_pass / frac["foreach"], rel=0.02)
    assert fused == pytest.approx(7 * per_pass / frac["fused"], rel=0.02)
    assert fused < foreach


def test_for_loop_launches_hide_behind_gpu_kernels_but_add_up_on_cpu() -> None:
    opt = OptimizerMemory("adamw", implementation="for-loop")
    tiny = opt.update_time_s(16, torch.float32, H100)
    assert tiny == pytest.approx(8 * H100.device.launch_s)  # 8 kernels, each shorter than its launch
    cpu_tiny = opt.update_time_s(16, torch.float32, CPU)
    assert cpu_tiny > 8 * CPU.device.launch_s  # launch and kernel one after the other
    big = opt.update_time_s(2**27, torch.bfloat16, H100)
    assert big == pytest.approx(
        sum(_stream_s(n, 2**27, 2, H100) for n in (2, 3, 2, 4, 2, 2, 2, 4)), rel=0.05)


def test_a_profile_without_optimizer_fractions_prices_at_the_elementwise_rate() -> None:
    plain = dataclasses.replace(H100, device=dataclasses.replace(
        H100.device, efficiency=dataclasses.replace(H100.device.efficiency, optimizer=())))
    opt = OptimizerMemory("adamw", implementation="fused")
    assert opt.update_time_s(2**28, torch.bfloat16, plain) < opt.update_time_s(2**28, torch.bfloat16, H100)


def test_the_plan_records_the_implementation_it_priced() -> None:
    """``plan.options["optimizer_impl"]``: ``auto`` resolved for the profile's device, so a
    reader of the plan knows which optimizer its step time assumes."""
    from autoshard.search.solve import prepare, solve_prepared
    from examples.models import mlp

    model, inputs = mlp.tiny()
    auto_cpu = prepare(model, inputs, (2,), profile="cpu-gloo")
    assert auto_cpu.options["optimizer_impl"] == "for-loop"
    fused = prepare(model, inputs, (2,), profile="h100-sxm-80gb", optimizer_impl="fused", traced=auto_cpu.traced)
    assert solve_prepared(fused, time_limit=20).options["optimizer_impl"] == "fused"
