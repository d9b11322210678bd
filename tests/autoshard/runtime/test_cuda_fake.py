"""A plan for GPUs, run on a machine without one: the per-rank step on CUDA fake tensors.

A CPU-only torch cannot run a CUDA kernel, but ``FakeTensorMode`` makes CUDA
fake tensors and refuses an op whose tensors are on two devices, which is how
the runtime failed on its first H100 (../shared/gpu/README.md: a CPU loss
tangent reaching ``mm`` and ``mse_loss_backward`` in the backward, the CPU
flash-attention kernel baked into a plan meant for CUDA). Each step here runs
the plan the way a GPU rank runs it (plan solved for ``h100-sxm-80gb``, the
runner on ``cuda``) inside :class:`~autoshard.runtime.device_audit.DeviceAudit`,
which also records every host synchronisation (``.item()``, copies to the CPU).
"""

from __future__ import annotations

import importlib.util
import operator

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from autoshard.search.solve import prepare, solve_prepared
from autoshard.runtime.device_audit import DeviceAudit
from autoshard.runtime.execute import JointRunner
from autoshard.runtime.module import scale_grads
from autoshard.trace.device import CPU_ONLY_OPS, CUDA_ONLY_OPS
from examples.models import llama3, mlp

CUDA = torch.device("cuda", 0)
CASES = {
    "llama-bf16": (llama3.tiny, {"dtype": "bfloat16"}, "none"),
    "llama-fp32": (llama3.tiny, {}, "none"),
    "mlp-bf16": (mlp.tiny, {"dtype": "bfloat16"}, "none"),
    "llama-bf16-full-recompute": (llama3.tiny, {"dtype": "bfloat16"}, "full"),
}
if importlib.util.find_spec("transformers") is not None:  # a model nobody here wrote: masks, arange(device=...)
    from examples.models import hf

    CASES["hf-mistral"] = (hf.hf_mistral, {}, "none")


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request: pytest.FixtureRequest) -> tuple[str, object, object]:
    factory, kwargs, recompute = CASES[request.param]
    model, inputs = factory(device="meta", **kwargs)
    prep = prepare(model, inputs, (1,), ("dp",), profile="h100-sxm-80gb", recompute=recompute)
    return request.param, prep.traced, solve_prepared(prep, time_limit=30)


def _fake_like(value: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=CUDA)


def _run_steps(traced, plan, steps: int) -> tuple[DeviceAudit, JointRunner, list]:
    """``steps`` training steps of ``plan`` on one CUDA rank, on fake tensors, audited."""
    results = []
    with FakeTensorMode(allow_non_fake_inputs=True):
        params = {fqn: _fake_like(n.meta["val"]) for fqn, n in traced.params.items()}
        buffers = {fqn: _fake_like(n.meta["val"]) for fqn, n in traced.buffers.items()}
        inputs = [_fake_like(n.meta["val"]) for n in traced.inputs.values()]
        runner = JointRunner(traced, plan, (1,), (0,), device=CUDA)
        with DeviceAudit(CUDA) as audit:
            for _ in range(steps):
                results.append(runner.run(params, buffers, inputs))
    return audit, runner, results


def test_a_plan_solved_for_h100_holds_the_cuda_attention_kernels(case) -> None:
    name, traced, plan = case
    ops = {n.op for n in plan.nodes}
    assert not {o for o in ops if "_for_cpu" in o}, name
    if name.startswith(("llama", "hf")):
        kernel = "flash" if "bf16" in name else "efficient"  # fp32 (and a mask) has no flash kernel on CUDA
        assert f"aten._scaled_dot_product_{kernel}_attention.default" in ops
        assert f"aten._scaled_dot_product_{kernel}_attention_backward.default" in ops
    assert not CPU_ONLY_OPS & {n.target for n in traced.graph_module.graph.nodes}
    assert {n.target for n in traced.graph_module.graph.nodes} & CUDA_ONLY_OPS or name.startswith("mlp")


def test_the_step_keeps_every_tensor_on_the_rank_device_and_never_waits_on_the_host(case) -> None:
    """Step 1 interpreted, step 2 traced into the per-rank graph and run: no op
    sees a CPU tensor (fake tensors refuse two devices), none makes one, no
    CPU-only kernel, no host synchronisation."""
    name, traced, plan = case
    audit, runner, results = _run_steps(traced, plan, steps=2)
    assert audit.problems == [], name
    assert runner.step_graph is not None, name  # the second step ran the traced program
    for result in results:
        assert result.loss.device == CUDA
        assert all(g.device == CUDA for g in result.grads.values() if g is not None)


def test_the_traced_per_rank_program_makes_its_tensors_on_the_rank_device(case) -> None:
    name, traced, plan = case
    _, runner, _ = _run_steps(traced, plan, steps=2)
    graph = runner.step_graph.module.graph
    for node in graph.nodes:
        device = node.kwargs.get("device") if node.op == "call_function" else None
        assert device is None or torch.device(device) == CUDA, (name, node.format_node())
        assert node.target is not torch.ops.aten._local_scalar_dense.default, name
    assert any(n.target is operator.getitem or n.op == "call_function" for n in graph.nodes)


def test_loss_scaling_of_the_gradients_does_not_read_the_loss_gradient_on_the_host() -> None:
    with FakeTensorMode(allow_non_fake_inputs=True):
        grads = [torch.ones(4, device=CUDA), None]
        with DeviceAudit(CUDA) as audit:
            scaled = scale_grads(grads, torch.full((), 0.5, device=CUDA))
    assert audit.problems == [] and scaled[1] is None and scaled[0].device == CUDA


def test_loss_scaling_on_cpu_scales_and_skips_a_unit_gradient() -> None:
    grads = [torch.ones(3), None]
    assert scale_grads(grads, torch.ones(()))[0] is grads[0]
    assert torch.equal(scale_grads(grads, torch.full((), 2.0))[0], torch.full((3,), 2.0))
