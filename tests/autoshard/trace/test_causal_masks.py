"""Causal masks recognised by value (``autoshard.trace.causal_masks``) and the kernel they map to."""

from __future__ import annotations

import math

import pytest
import torch
import torch.fx as fx

from autoshard.trace import causal_masks
from autoshard.trace.causal_masks import CausalMasks, _set_vals

aten = torch.ops.aten


def _mask_graph(length: int, *, offset: int = 0, additive: bool = False, batch: int = 3,
                from_input: bool = False) -> tuple[fx.Graph, fx.Node]:
    """``k <= q + offset`` over ``(batch, 1, length, length)``, as Hugging Face builds it: positions from
    ``arange`` (or from an input), expanded over the batch, compared, optionally made additive."""
    g = fx.Graph()
    pos = (g.placeholder("positions") if from_input
           else g.call_function(aten.arange.default, (length,)))
    rows = g.call_function(aten.expand.default, (g.call_function(aten.unsqueeze.default, (pos, 0)), [batch, -1]))
    q = g.call_function(aten.unsqueeze.default, (g.call_function(aten.unsqueeze.default, (rows, 1)), 3))
    k = g.call_function(aten.unsqueeze.default, (g.call_function(aten.unsqueeze.default, (rows, 1)), 2))
    q = g.call_function(aten.add.Tensor, (q, offset))
    mask = g.call_function(aten.le.Tensor, (k, q))
    if additive:
        zero = g.call_function(aten.scalar_tensor.default, (0.0,), {"dtype": torch.bfloat16})
        low = g.call_function(aten.scalar_tensor.default, (-math.inf,), {"dtype": torch.bfloat16})
        mask = g.call_function(aten.where.self, (mask, zero, low))
    return g, mask


def _fill(g: fx.Graph, length: int) -> None:
    for node in g.nodes:
        if node.op == "placeholder":
            node.meta["val"] = torch.arange(length)
    env = {}
    for node in g.nodes:
        if node.op == "placeholder":
            env[node] = node.meta["val"]
            continue
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda a: env[a])
        env[node] = node.meta["val"] = node.target(*args, **kwargs)


@pytest.mark.parametrize("additive", [False, True])
def test_a_causal_mask_made_from_constants_is_recognised(additive) -> None:
    g, mask = _mask_graph(16, additive=additive)
    _set_vals(g)
    assert CausalMasks().is_causal(mask)


@pytest.mark.parametrize("offset", [1, -1])
def test_a_shifted_mask_is_not_causal(offset) -> None:
    g, mask = _mask_graph(16, offset=offset)
    _set_vals(g)
    assert not CausalMasks().is_causal(mask)


def test_a_mask_that_reads_an_input_is_left_as_it_is() -> None:
    """Its value is the causal one for these positions, but another batch may bring others."""
    g, mask = _mask_graph(16, from_input=True)
    _fill(g, 16)
    assert not CausalMasks().is_causal(mask)


def test_an_additive_mask_of_zeros_is_not_causal() -> None:
    g = fx.Graph()
    mask = g.call_function(aten.zeros.default, ([2, 1, 8, 8],), {"dtype": torch.bfloat16})
    _set_vals(g)
    assert not CausalMasks().is_causal(mask)


def test_a_mask_past_the_size_cap_is_left_as_it_is(monkeypatch) -> None:
    g, mask = _mask_graph(16)
    _set_vals(g)
    monkeypatch.setattr(causal_masks, "MAX_ELEMENTS", 100)
    assert not CausalMasks().is_causal(mask)


def test_a_large_factory_mask_is_refused_before_it_is_allocated(monkeypatch) -> None:
    """``ones(...).tril()`` would be causal; past the cap it is not evaluated at all."""
    g = fx.Graph()
    mask = g.call_function(aten.tril.default, (g.call_function(aten.ones.default, ([2, 1, 16, 16],),
                                                                {"dtype": torch.bool}),))
    _set_vals(g)
    assert CausalMasks().is_causal(mask)
    calls = []
    monkeypatch.setattr(causal_masks, "MAX_ELEMENTS", 100)
    monkeypatch.setattr(causal_masks, "_compress", lambda value: calls.append(value) or value)
    assert not CausalMasks().is_causal(mask)
    assert calls == []  # not even the ones were made


def test_the_batch_dim_of_expanded_positions_is_evaluated_once() -> None:
    """The (batch, 1, q, k) mask is held as one (1, 1, q, k) plane: the batch costs nothing."""
    g, mask = _mask_graph(16, batch=64)
    _set_vals(g)
    masks = CausalMasks()
    assert masks.is_causal(mask)
    assert tuple(masks._values[mask].shape) == (1, 1, 16, 16)


def _hf_attention_targets(factory) -> set[str]:
    from autoshard.trace import trace_joint

    traced = trace_joint(*factory(device="meta", dtype="bfloat16"), target_device="cuda")
    return {str(n.target) for n in traced.graph_module.graph.nodes if n.op == "call_function"}


def test_hugging_face_llama_runs_the_causal_flash_kernel_as_in_eager() -> None:
    """``create_causal_mask`` materialises its mask while tracing; eager passes is_causal instead."""
    pytest.importorskip("transformers")
    from examples.models.hf import hf_llama

    targets = _hf_attention_targets(hf_llama)
    assert "aten._scaled_dot_product_flash_attention.default" in targets
    assert "aten._scaled_dot_product_flash_attention_backward.default" in targets
    assert not {t for t in targets if "efficient" in t}
    assert "aten.cumsum.default" not in targets and "aten.where.self" not in targets  # the mask's ops are gone


def test_a_sliding_window_mask_keeps_its_kernel() -> None:
    """Mistral's window (8) is shorter than the sequence (16): not the causal mask."""
    pytest.importorskip("transformers")
    from examples.models.hf import hf_mistral

    targets = _hf_attention_targets(hf_mistral)
    assert "aten._scaled_dot_product_efficient_attention.default" in targets
    assert not {t for t in targets if "flash_attention" in t}
