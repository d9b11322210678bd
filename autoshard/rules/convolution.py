"""Convolution and pooling, forward and backward.

A convolution is a matmul over channels repeated at every position, so it
splits like one: ``x [N, C_in, *], w [C_out, C_in/g, *k]``

* batch ``N``: x and output split, weight and bias replicated;
* output channels: weight and bias split on ``C_out``, output on dim 1;
* input channels (``groups == 1``): x and weight split on ``C_in``, each rank
  sums its channels, ``P(sum)`` (a bias must then be ``P(sum)`` too: each
  rank adds its piece once).

Spatial dims need halos (the kernel reads neighbours), so they are not split.
Transposed and grouped convolutions keep the batch split only. Pooling acts
per (sample, channel) plane: split N and C. Every backward is linear in
``grad_output``.

>>> conv_letters(transposed=False)
('batch', 'out_channels', 'in_channels')
"""

from __future__ import annotations

from typing import Any

import torch

from autoshard.rules.compute import OpCompute, elementwise, io_bytes
from autoshard.rules.core import P, P_AVG, R, OpCall, S, SingleDimStrategy
from autoshard.rules.registry import RuleRegistry, SampleInput
from autoshard.rules.samples import Sampler

__all__ = ["conv_letters", "conv_compute", "register"]

aten = torch.ops.aten


def conv_letters(*, transposed: bool) -> tuple[str, ...]:
    """The splits a convolution supports (module docstring)."""
    return ("batch",) if transposed else ("batch", "out_channels", "in_channels")


def _plain(call: OpCall) -> bool:
    return not call.arg("transposed", False) and int(call.arg("groups", 1)) == 1


def conv_rule(call: OpCall) -> list[SingleDimStrategy]:
    """convolution(input, weight, bias?, ...)."""
    strategies = [SingleDimStrategy(S(0), call.place(R, input=S(0)))]
    if _plain(call):
        strategies.append(SingleDimStrategy(S(1), call.place(R, weight=S(0), bias=S(0))))
        strategies.append(SingleDimStrategy(P, call.place(R, input=S(1), weight=S(1), bias=P)))
    strategies.append(SingleDimStrategy(P, call.place(R, input=P, bias=P)))
    strategies.append(SingleDimStrategy(P, call.place(R, weight=P, bias=P)))
    return strategies


def conv_backward_rule(call: OpCall) -> list[SingleDimStrategy]:
    """convolution_backward -> (grad_input, grad_weight, grad_bias)."""
    strategies = [SingleDimStrategy((S(0), P, P), call.place(R, grad_output=S(0), input=S(0)))]
    if _plain(call):
        strategies.append(SingleDimStrategy((P, S(0), S(0)), call.place(R, grad_output=S(1), weight=S(0))))
        strategies.append(SingleDimStrategy((S(1), S(1), R), call.place(R, input=S(1), weight=S(1))))
    for k in (P, P_AVG):
        strategies.append(SingleDimStrategy((k, k, k), call.place(R, grad_output=k)))
    return strategies


def _localize_bias_sizes(args: tuple, kwargs: dict, local: OpCall) -> tuple[tuple, dict]:
    """bias_sizes (position 3) becomes the local grad_bias shape."""
    if local.outputs[2] is None or args[3] is None:
        return args, kwargs
    return args[:3] + (list(local.outputs[2].shape),) + args[4:], kwargs


def conv_compute(*, backward: bool) -> Any:
    """2 FLOPs per multiply-add: output elements x (C_in/g x kernel size); the
    backward computes two such products (grad_input and grad_weight)."""

    def compute(call: OpCall) -> OpCompute:
        w = call.inputs[2] if backward else call.inputs[1]
        out = call.inputs[0] if backward else call.outputs[0]
        per_output = 1
        for s in w.shape[1:]:
            per_output *= s
        flops = 2.0 * out.numel * per_output * (2 if backward else 1)
        return OpCompute("matmul", flops, io_bytes(call))

    return compute


def pool_rule(call: OpCall) -> list[SingleDimStrategy]:
    """Pooling forward: per (sample, channel) plane; averaging is linear."""
    x = call.inputs[0]
    lead = x.ndim - 2  # N, C (or C alone) before the two spatial dims
    k = len(call.outputs)
    strategies = [SingleDimStrategy((S(d),) * k, S(d)) for d in range(lead)]
    if call.op is not aten.max_pool2d_with_indices.default and _exact_division(x.dtype):
        strategies += [SingleDimStrategy(p, p) for p in (P, P_AVG)]
    return strategies


def _exact_division(dtype: torch.dtype) -> bool:
    """Averaging is linear for floats; integer averages round each piece."""
    return dtype.is_floating_point or dtype.is_complex


def pool_backward_rule(call: OpCall) -> list[SingleDimStrategy]:
    """Pooling backward: per plane; linear in grad_output."""
    n_in = len(call.inputs)
    lead = call.inputs[0].ndim - 2
    strategies = [SingleDimStrategy(S(d), (S(d),) * n_in) for d in range(lead)]
    if not _exact_division(call.inputs[0].dtype):
        return strategies
    return strategies + [SingleDimStrategy(p, (p,) + (R,) * (n_in - 1)) for p in (P, P_AVG)]


# ------------------------------------------------------------------ samples


def _conv_inputs(sampler: Sampler, *, transposed: bool = False, groups: int = 1, bias: bool = True):
    dtype = sampler.float_dtype((torch.float64, torch.float32))
    n, cin, cout = sampler.size(), sampler.size() * groups, sampler.size() * groups
    hw = (sampler.choice((5, 6)), sampler.choice((5, 6)))
    k = (sampler.choice((1, 3)), 3)
    x = sampler.randn((n, cin) + hw, dtype)
    if transposed:
        w = sampler.randn((cin, cout // groups) + k, dtype)
    else:
        w = sampler.randn((cout, cin // groups) + k, dtype)
    b = sampler.randn((cout,), dtype) if bias else None
    return x, w, b


def _conv_samples(sampler: Sampler):
    for transposed, groups, bias in ((False, 1, True), (False, 1, False), (False, 2, True), (True, 1, True)):
        x, w, b = _conv_inputs(sampler, transposed=transposed, groups=groups, bias=bias)
        stride = [sampler.choice((1, 2)), 1]
        yield SampleInput((x, w, b, stride, [1, 0], [1, 1], transposed, [0, 0], groups), {})


def _conv_backward_samples(sampler: Sampler):
    for transposed, groups, mask in ((False, 1, [True, True, True]), (False, 1, [False, True, True]), (True, 1, [True, True, False]), (False, 2, [True, True, True])):
        x, w, b = _conv_inputs(sampler, transposed=transposed, groups=groups)
        args = ([1, 1], [1, 0], [1, 1], transposed, [0, 0], groups)
        out = aten.convolution.default(x, w, b, *args)
        g = sampler.randn(out.shape, x.dtype)
        yield SampleInput((g, x, w, [b.shape[0]], *args, mask), {})


def _pool_x(sampler: Sampler, dtype: torch.dtype | None = None) -> torch.Tensor:
    shape = (sampler.size(), sampler.size(), sampler.choice((6, 8)), sampler.choice((6, 8)))
    if sampler.rng.random() < 0.3:
        shape = shape[1:]
    return sampler.randn(shape, dtype or sampler.float_dtype((torch.float64, torch.float32)))


def _maxpool_samples(sampler: Sampler):
    for kernel, stride, pad in (([2, 2], [2, 2], [0, 0]), ([3, 3], [2, 1], [1, 1])):
        yield SampleInput((_pool_x(sampler, torch.float64), kernel, stride, pad, [1, 1], False), {})


def _maxpool_backward_samples(sampler: Sampler):
    x = _pool_x(sampler, torch.float64)
    args = ([3, 3], [2, 2], [1, 1], [1, 1], False)
    out, idx = aten.max_pool2d_with_indices.default(x, *args)
    yield SampleInput((sampler.randn(out.shape, x.dtype), x, *args, idx), {})


def _avgpool_samples(sampler: Sampler):
    for kernel, stride, pad in (([2, 2], [2, 2], [0, 0]), ([3, 3], [2, 1], [1, 1])):
        yield SampleInput((_pool_x(sampler), kernel, stride, pad, False, True, None), {})


def _avgpool_backward_samples(sampler: Sampler):
    x = _pool_x(sampler)
    args = ([3, 3], [2, 2], [1, 1], False, True, None)
    out = aten.avg_pool2d.default(x, *args)
    yield SampleInput((sampler.randn(out.shape, x.dtype), x, *args), {})


def _adaptive_samples(sampler: Sampler):
    for size in ([1, 1], [2, 3]):
        yield SampleInput((_pool_x(sampler), size), {})


def _adaptive_backward_samples(sampler: Sampler):
    x = _pool_x(sampler)
    out = aten._adaptive_avg_pool2d.default(x, [2, 3])
    yield SampleInput((sampler.randn(out.shape, x.dtype), x), {})


def register(registry: RuleRegistry) -> None:
    """Add the convolution and pooling rules to ``registry``."""
    rule = registry.family("convolution")
    rule(aten.convolution.default, compute=conv_compute(backward=False), samples=_conv_samples)(conv_rule)
    rule(aten.convolution_backward.default, compute=conv_compute(backward=True), samples=_conv_backward_samples,
         localize=_localize_bias_sizes)(conv_backward_rule)
    rule(aten.max_pool2d_with_indices.default, compute=elementwise(9), samples=_maxpool_samples)(pool_rule)
    rule(aten.max_pool2d_with_indices_backward.default, compute=elementwise(1), samples=_maxpool_backward_samples)(
        pool_backward_rule)
    rule(aten.avg_pool2d.default, compute=elementwise(9), samples=_avgpool_samples)(pool_rule)
    rule(aten.avg_pool2d_backward.default, compute=elementwise(9), samples=_avgpool_backward_samples)(pool_backward_rule)
    rule(aten._adaptive_avg_pool2d.default, compute=elementwise(1), samples=_adaptive_samples)(pool_rule)
    rule(aten._adaptive_avg_pool2d_backward.default, compute=elementwise(1), samples=_adaptive_backward_samples)(
        pool_backward_rule)
