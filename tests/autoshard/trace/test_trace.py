"""Tracing the joint forward+backward graph: names, gradients, loss, no real memory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from autoshard.trace import (DataDependentError, TensorMeta, TraceError, constant_value, run_joint, trace_joint,
                             traced_ops)
from examples.models import convnet, gpt2, llama3, mlp

aten = torch.ops.aten


def test_every_parameter_is_a_placeholder_named_by_fqn_with_a_gradient(traced_tiny):
    model, _ = llama3.tiny(device="meta")
    traced = traced_tiny("llama3")
    expected = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert {fqn: TensorMeta.of(node.meta["val"]).shape for fqn, node in traced.params.items()} == expected
    for fqn, grad in traced.grads.items():
        assert grad is not None, fqn
        assert tuple(grad.meta["val"].shape) == expected[fqn], fqn


def test_user_inputs_are_named_after_forward_arguments(traced_tiny):
    traced = traced_tiny("llama3")
    assert list(traced.inputs) == ["tokens", "labels"]
    assert all(node.op == "placeholder" for node in traced.inputs.values())


def test_loss_is_a_scalar_graph_output_with_a_tangent(traced_tiny):
    traced = traced_tiny("gpt2")
    output = next(n for n in traced.graph_module.graph.nodes if n.op == "output")
    assert traced.loss in output.args[0]
    assert traced.loss_meta.shape == ()
    assert traced.tangent.op == "placeholder"


def test_tied_embedding_is_one_parameter_with_one_gradient(traced_tiny):
    traced = traced_tiny("gpt2")
    assert "tok_embeddings.weight" in traced.params
    assert not any("lm_head" in fqn or fqn.startswith("output") for fqn in traced.params)
    assert traced.grads["tok_embeddings.weight"] is not None


def test_untied_llama_has_an_output_weight_and_tied_llama_does_not():
    untied = trace_joint(*llama3.tiny(device="meta", n_layers=1))
    tied = trace_joint(*llama3.tiny(device="meta", n_layers=1, tie_embeddings=True))
    assert "output.weight" in untied.params
    assert "output.weight" not in tied.params


def test_buffers_are_named_and_batchnorm_statistics_are_buffer_updates(traced_tiny):
    traced = traced_tiny("convnet")
    stats = {f"stages.{i}.bn.{name}" for i in range(2) for name in ("running_mean", "running_var", "num_batches_tracked")}
    assert set(traced.buffers) == stats
    assert set(traced.buffer_updates) == stats
    rope = traced_tiny("llama3")
    assert set(rope.buffers) == {"rope_cos", "rope_sin"} and not rope.buffer_updates


def test_detach_nodes_are_removed(traced_tiny):
    for name in ("mlp", "llama3"):
        assert aten.detach.default not in traced_ops(traced_tiny(name)), name


def test_node_info_replaces_tensors_by_tensor_meta(traced_tiny):
    traced = traced_tiny("mlp")
    mm = next(info for info in traced.nodes.values() if info.op is aten.mm.default)
    assert all(isinstance(a, TensorMeta) for a in mm.args)
    assert mm.inputs == mm.args
    (a, b), (out,) = mm.args, mm.outputs
    assert out.shape == (a.shape[0], b.shape[1])


def test_tracing_leaves_a_real_model_untouched():
    model, inputs = mlp.tiny()
    before = {name: (p, p.detach().clone()) for name, p in model.named_parameters()}
    trace_joint(model, inputs)
    for name, p in model.named_parameters():
        assert p is before[name][0], name
        assert type(p) is nn.Parameter and torch.equal(p, before[name][1]), name


@pytest.mark.parametrize("module", [mlp, llama3, convnet, gpt2])
def test_joint_graph_run_on_real_tensors_matches_eager_loss_and_grads(module):
    model, inputs = module.tiny()
    traced = trace_joint(model, inputs)
    values = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    result = run_joint(traced, {fqn: t.clone() for fqn, t in values.items()}, inputs)

    loss = model(*inputs)
    loss.backward()
    torch.testing.assert_close(result.loss, loss.detach())
    for fqn, param in model.named_parameters():
        torch.testing.assert_close(result.grads[fqn], param.grad, msg=fqn)
    # the eager step updated the real BatchNorm statistics in place; the graph must agree
    for fqn, new_value in result.buffer_updates.items():
        torch.testing.assert_close(new_value, values[fqn], msg=fqn)


def test_non_scalar_output_is_rejected():
    class Vector(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x)

    with pytest.raises(ValueError, match="scalar loss"):
        trace_joint(Vector(), (torch.randn(2, 4),))


def test_non_tensor_input_is_rejected():
    model, (x, y) = mlp.tiny(device="meta")
    with pytest.raises(ValueError, match="'target' must be a tensor"):
        trace_joint(model, (x, 3))


_TRACE_8B_LAYER = """
from autoshard.trace import TensorMeta, trace_joint
from examples.models import llama3
model, inputs = llama3.llama3_8b(n_layers=1, batch_size=8, seq_len=1024)
traced = trace_joint(model, inputs)
print(TensorMeta.of(traced.params["tok_embeddings.weight"].meta["val"]).shape)
# VmHWM is this address space's own high-water mark; getrusage's ru_maxrss survives exec, so under a
# vfork-spawned child it reports the parent's (the test process's) peak instead
peak_kib = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(peak_kib / 2**20)
"""


def test_8b_shaped_layer_traces_on_fake_tensors_without_allocating():
    # one layer of LLaMA-3-8B: the embedding and head alone would take 4.2 GB if allocated. In a fresh
    # process, its own address space's peak (the test process's grows with the suite).
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", _TRACE_8B_LAYER], capture_output=True, text=True, cwd=root,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    shape, peak = done.stdout.strip().splitlines()[-2:]
    assert shape == "(128256, 4096)"
    assert float(peak) < 3.0, f"peak RSS {float(peak):.1f} GiB: tensors were materialised"


class _TiedHead(nn.Module):
    """Embedding and head share one Parameter under two module paths (as transformers ties them)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.head(self.embed(tokens))
        return {"logits": logits, "loss": nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())}


def test_parameter_shared_by_two_modules_is_one_input_with_the_summed_gradient():
    torch.manual_seed(0)
    model = _TiedHead()
    inputs = {"tokens": torch.randint(0, 16, (2, 5)), "labels": torch.randint(0, 16, (2, 5))}
    traced = trace_joint(model, inputs)
    assert list(traced.params) == ["embed.weight"]
    assert traced.param_aliases == {"embed.weight": ("head.weight",)}
    model(**inputs)["loss"].backward()
    for values in (dict(model.named_parameters()), dict(model.named_parameters(remove_duplicate=False))):
        result = run_joint(traced, values, inputs)
        torch.testing.assert_close(result.grads["embed.weight"], model.embed.weight.grad)


def test_dict_inputs_are_keyword_arguments_named_by_their_keys():
    model, (x, y) = mlp.tiny()
    traced = trace_joint(model, {"target": y, "x": x})
    assert list(traced.inputs) == ["target", "x"]
    by_name = run_joint(traced, dict(model.named_parameters()), {"x": x, "target": y})
    in_order = run_joint(traced, dict(model.named_parameters()), [y, x])
    torch.testing.assert_close(by_name.loss, model(x, y).detach())
    torch.testing.assert_close(in_order.loss, by_name.loss)


def test_output_without_a_loss_is_a_one_line_error():
    class Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.lin(x).sum(), x

    with pytest.raises(TraceError, match="scalar loss, or an object or dict with a 'loss' entry; got tuple"):
        trace_joint(Pair(), (torch.randn(2, 4),))


class _ValueBranch(nn.Module):
    """Reads a tensor's value unless it is being traced, as transformers' mask code does."""

    def __init__(self, *, check_tracing: bool) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.check_tracing = check_tracing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.lin(x)
        if self.check_tracing and torch.compiler.is_compiling():
            return out.sum()
        if (x > 0).all():  # the line the error must name
            out = out * 2
        return out.sum()


def test_value_read_is_one_line_naming_the_op_and_the_model_line():
    with pytest.raises(DataDependentError) as info:
        trace_joint(_ValueBranch(check_tracing=False), (torch.randn(2, 4),))
    message = str(info.value)
    assert "\n" not in message
    assert "aten._local_scalar_dense.default" in message
    assert "test_trace.py:" in message and "if (x > 0).all():" in message
    assert not torch.compiler.is_compiling()  # the flag is put back after a failed trace too


def test_libraries_see_a_tracer_while_tracing_and_skip_value_reads():
    trace_joint(_ValueBranch(check_tracing=True), (torch.randn(2, 4),))
    assert not torch.compiler.is_compiling()


class _WithConstants(nn.Module):
    """``x @ w``, scaled by a tensor made from Python data, then two columns picked by a list
    index (two tensor constants), and a plain tensor attribute (a third)."""

    def __init__(self, scale_len: int = 8) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8, generator=torch.Generator().manual_seed(0)))
        self.shift = torch.full((8,), 0.5)  # neither parameter nor buffer
        self.scale_len = scale_len

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.tensor([float(i + 1) for i in range(self.scale_len)])
        return ((x @ self.w + self.shift) * scale)[:, [0, 3]].sum()


def test_tensor_constants_are_listed_with_their_values_and_run():
    model, x = _WithConstants(), torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    traced = trace_joint(model, (x,))
    values = {name: constant_value(traced, name) for name in traced.constants}
    assert sorted(v.tolist() for v in values.values()) == sorted(
        [[0.5] * 8, [float(i) for i in range(1, 9)], [0, 3]])
    assert all(node.op == "get_attr" for node in traced.constants.values())
    result = run_joint(traced, dict(model.named_parameters()), (x,))
    loss = model(x)
    loss.backward()
    torch.testing.assert_close(result.loss, loss.detach())
    torch.testing.assert_close(result.grads["w"], model.w.grad)


def test_a_constant_of_a_model_on_meta_has_no_values_and_says_so():
    with torch.device("meta"):
        model = nn.Linear(8, 8)
    traced = trace_joint(_Picked(model), (torch.empty(4, 8, device="meta"),))
    assert list(traced.constants) == ["_tensor_constant0"]  # made from Python data: it has values
    assert constant_value(traced, "_tensor_constant0").tolist() == [1, 2]
    with torch.device("meta"):
        attribute = _WithConstants()
    with pytest.raises(TraceError, match=r"neither a parameter nor a buffer is read at .*test_trace.py:\d+ \(forward\)"):
        trace_joint(attribute, (torch.empty(4, 8, device="meta"),))


class _Picked(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)[:, [1, 2]].sum()
