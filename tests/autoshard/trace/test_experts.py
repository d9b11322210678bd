"""The experts stand-in: HF MoE experts traced to one node per layer and direction, computing
what transformers' own implementation computes; layouts it does not cover keep their trace."""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("transformers")

from autoshard.trace import run_joint, trace_joint  # noqa: E402
from autoshard.trace.experts import (  # noqa: E402
    EXPERTS_BACKWARD_OP, EXPERTS_OP, expert_stand_ins, experts_backward_reference, experts_reference,
    unsupported_reason)
from examples.models import hf  # noqa: E402


@pytest.mark.parametrize("name", ["hf_mixtral", "hf_qwen3_moe"])
def test_one_experts_node_per_layer_and_the_graph_computes_what_hf_does(name):
    model, inputs = getattr(hf, name)()
    assert model.config._experts_implementation == "grouped_mm"  # the reference: transformers' own kernel
    traced = trace_joint(model, inputs)
    ops = [info.op for info in traced.nodes.values()]
    layers = model.config.num_hidden_layers
    assert ops.count(EXPERTS_OP) == layers and ops.count(EXPERTS_BACKWARD_OP) == layers
    assert not any("grouped_mm" in str(op) or "histc" in str(op) for op in ops)  # the dispatch is inside the node
    values = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    result = run_joint(traced, values, inputs)
    model.zero_grad()
    loss = model(**inputs).loss
    loss.backward()
    torch.testing.assert_close(result.loss, loss.detach())
    for fqn, param in model.named_parameters():
        torch.testing.assert_close(result.grads[fqn], param.grad, msg=fqn)
    assert torch.count_nonzero(result.grads["model.layers.0.mlp.experts.gate_up_proj"]) > 0


def test_op_equals_the_hf_eager_loop_with_an_unpicked_expert_and_sentinels():
    model, _ = hf.hf_mixtral(num_hidden_layers=1, experts_implementation="eager")
    experts = model.model.layers[0].mlp.experts
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, experts.down_proj.shape[1], generator=g)
    index = torch.tensor([[0, 1], [1, 0], [2, 1], [0, 2], [4, 0], [1, 2], [2, 0]])  # expert 3 unpicked, 4 = sentinel
    weights = torch.rand(7, 2, generator=g)
    want = experts(hidden, index, weights)
    got = EXPERTS_OP(hidden, index, weights, experts.gate_up_proj, experts.down_proj, "silu")
    torch.testing.assert_close(got, want)
    grads = experts_backward_reference(torch.ones_like(got), hidden, index, weights, experts.gate_up_proj,
                                       experts.down_proj, "silu")
    assert torch.count_nonzero(grads[2][3]) == 0 and torch.count_nonzero(grads[3][3]) == 0
    leaves = [t.detach().clone().requires_grad_() for t in (hidden, weights, experts.gate_up_proj, experts.down_proj)]
    experts_reference(leaves[0], index, leaves[1], leaves[2], leaves[3], "silu").sum().backward()
    for leaf, grad in zip(leaves, grads):
        torch.testing.assert_close(grad, leaf.grad)  # the written-out backward equals autograd's


def test_a_layout_the_op_does_not_cover_keeps_its_own_implementation_and_says_so(caplog):
    model, _ = hf.hf_mixtral(num_hidden_layers=1)
    experts = model.model.layers[0].mlp.experts
    hidden = torch.randn(3, experts.down_proj.shape[1])
    index, weights = torch.tensor([[0, 1], [2, 3], [1, 2]]), torch.rand(3, 2)
    want = experts(hidden, index, weights)
    assert unsupported_reason(experts) is None
    experts.has_post_expert_norm = False
    experts.is_transposed = True  # as gpt-oss: the op does not cover it
    assert "is_transposed=True" in unsupported_reason(experts)
    experts.is_transposed = False
    experts.config.hidden_act = "tanh"
    assert unsupported_reason(experts) == "activation 'tanh'"
    with caplog.at_level(logging.WARNING, logger="autoshard.trace.experts"), expert_stand_ins():
        experts(hidden, index, weights)
        experts(hidden, index, weights)
    lines = [r.getMessage() for r in caplog.records if "MixtralExperts" in r.getMessage()]
    assert len(lines) == 1 and "kept as traced (activation 'tanh')" in lines[0]
    experts.config.hidden_act = "silu"
    with expert_stand_ins():
        torch.testing.assert_close(experts(hidden, index, weights), want)
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    assert "get_interface" not in vars(ALL_EXPERTS_FUNCTIONS)  # restored
