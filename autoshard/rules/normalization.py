"""Normalization: layer norm, RMS norm, batch norm, forward and backward.

A normalization computes statistics over some dims and applies them
elementwise, so the dims it does *not* reduce over can be split freely:
the leading (batch/sequence) dims for layer and RMS norm, the channel dim for
batch norm (plus every dim in eval mode, where running statistics are used).
The statistics outputs (mean, rstd) split like the batch dims. In the
backward, a split batch dim leaves each rank with the part of the weight and
bias gradients from its rows: ``P(sum)``. Every backward is linear in
``grad_out``, so ``grad_out = P(sum)`` with the rest replicated gives partial
gradients.

>>> import torch
>>> from autoshard.rules.core import OpCall, TensorMeta
>>> x, w = TensorMeta((4, 6, 8), torch.float32), TensorMeta((8,), torch.float32)
>>> stat = TensorMeta((4, 6, 1), torch.float32)
>>> call = OpCall(torch.ops.aten.native_layer_norm.default, (x, [8], w, None, 1e-5), {}, (x, w), (x, stat, stat),
...               {"input": x, "normalized_shape": [8], "weight": w, "bias": None})
>>> [str(s) for s in layer_norm_rule(call)]
['S*(0), S*(0), S*(0) <- S*(0), R', 'S*(1), S*(1), S*(1) <- S*(1), R']
"""

from __future__ import annotations

from typing import Any

import torch

from autoshard.rules.compute import elementwise
from autoshard.rules.core import P, P_AVG, R, OpCall, S, SingleDimStrategy
from autoshard.rules.registry import RuleRegistry, SampleInput
from autoshard.rules.samples import Sampler

__all__ = ["layer_norm_rule", "register"]

aten = torch.ops.aten


def _batch_dims(call: OpCall) -> range:
    """Leading dims not normalized over (``normalized_shape`` gives the rest)."""
    x = call.inputs[0] if call.tensor_names()[0] == "input" else call.inputs[1]
    return range(x.ndim - len(call.arg("normalized_shape")))


def layer_norm_rule(call: OpCall) -> list[SingleDimStrategy]:
    """native_layer_norm / _fused_rms_norm: (out, stats...) split like the input's batch dims."""
    n_out = len(call.outputs)
    return [SingleDimStrategy((S(d),) * n_out, call.place(R, input=S(d))) for d in _batch_dims(call)]


def layer_norm_backward_rule(call: OpCall) -> list[SingleDimStrategy]:
    """grad_input splits like the rows; weight/bias gradients become partial sums."""
    rows = ("grad_out", "input", "mean", "rstd")
    strategies = []
    for d in _batch_dims(call):
        ins = call.place(R, **{name: S(d) for name in rows})
        outs = (S(d),) + (P,) * (len(call.outputs) - 1)
        strategies.append(SingleDimStrategy(outs, ins))
    for k in (P, P_AVG):
        strategies.append(SingleDimStrategy((k,) * len(call.outputs), call.place(R, grad_out=k)))
    return strategies


_PER_CHANNEL = ("weight", "bias", "running_mean", "running_var", "save_mean", "save_invstd")


def _training(call: OpCall) -> bool:
    if call.op is aten._native_batch_norm_legit_no_training.default:
        return False
    return bool(call.bound.get("training", call.bound.get("train", True)))


def _channel_placement(out: Any, ndim: int) -> Any:
    """The main output splits on channels (dim 1), per-channel outputs on
    their only dim; empty statistics (eval mode) stay replicated."""
    if out is None:
        return None
    if out.ndim == ndim:
        return S(1)
    return S(0) if out.numel else R


def batch_norm_rule(call: OpCall) -> list[SingleDimStrategy]:
    """Channel split: per-channel tensors split on their only dim. Eval mode:
    any other dim too (statistics are the replicated running ones)."""
    ndim = call.inputs[0].ndim
    outs = tuple(_channel_placement(o, ndim) for o in call.outputs)
    strategies = [SingleDimStrategy(outs, call.place(S(0), input=S(1)))]
    if not _training(call):
        for d in range(ndim):
            if d != 1:
                out_p = tuple(S(d) if (o is not None and o.ndim == ndim) else R for o in call.outputs)
                strategies.append(SingleDimStrategy(out_p, call.place(R, input=S(d))))
    return strategies


def batch_norm_backward_rule(call: OpCall) -> list[SingleDimStrategy]:
    """Channel split everywhere; in eval mode batch/spatial splits give partial
    weight/bias gradients; linear in grad_out."""
    strategies = [SingleDimStrategy((S(1), S(0), S(0)), call.place(S(0), grad_out=S(1), input=S(1)))]
    if not _training(call):
        for d in range(call.inputs[0].ndim):
            if d != 1:
                strategies.append(SingleDimStrategy((S(d), P, P), call.place(R, grad_out=S(d), input=S(d))))
    for k in (P, P_AVG):
        strategies.append(SingleDimStrategy((k, k, k), call.place(R, grad_out=k)))
    return strategies


def rms_norm_backward_reference(grad_out, input, normalized_shape, rstd, weight, output_mask):
    """CPU stand-in for ``_fused_rms_norm_backward`` (CUDA-only kernel), equal
    to autograd through the CPU ``_fused_rms_norm`` (checked in the tests)."""
    dims = tuple(range(input.ndim - len(normalized_shape), input.ndim))
    x_hat = input * rstd
    g = grad_out * weight if weight is not None else grad_out
    grad_input = rstd * (g - x_hat * (g * x_hat).mean(dims, keepdim=True)) if output_mask[0] else None
    grad_weight = None
    if output_mask[1] and weight is not None:
        grad_weight = (grad_out * x_hat).sum(tuple(range(input.ndim - len(normalized_shape)))).to(weight.dtype)
    return grad_input, grad_weight


# ------------------------------------------------------------------ samples


def _ln_shapes(sampler: Sampler) -> tuple[tuple[int, ...], int]:
    shape = sampler.shape(min_ndim=2)
    return shape, sampler.randint(1, 2) if len(shape) > 2 else 1


def _layer_norm_samples(sampler: Sampler):
    for affine in (True, False):
        shape, k = _ln_shapes(sampler)
        dtype = sampler.float_dtype()
        norm = list(shape[-k:])
        w = sampler.randn(norm, dtype) if affine else None
        b = sampler.randn(norm, dtype) if affine else None
        yield SampleInput((sampler.randn(shape, dtype), norm, w, b, 1e-5), {})


def _layer_norm_backward_samples(sampler: Sampler):
    for mask in ([True, True, True], [True, False, True]):
        shape, k = _ln_shapes(sampler)
        dtype = sampler.float_dtype((torch.float64, torch.float32))
        norm = list(shape[-k:])
        x, w, b = sampler.randn(shape, dtype), sampler.randn(norm, dtype), sampler.randn(norm, dtype)
        _, mean, rstd = torch.ops.aten.native_layer_norm.default(x, norm, w, b, 1e-5)
        yield SampleInput((sampler.randn(shape, dtype), x, norm, mean, rstd, w, b, mask), {})


def _rms_samples(sampler: Sampler):
    for affine in (True, False):
        shape, k = _ln_shapes(sampler)
        dtype = sampler.float_dtype()
        norm = list(shape[-k:])
        yield SampleInput((sampler.randn(shape, dtype), norm, sampler.randn(norm, dtype) if affine else None, 1e-6), {})


def _rms_backward_samples(sampler: Sampler):
    shape, k = _ln_shapes(sampler)
    dtype = sampler.float_dtype((torch.float64, torch.float32))
    norm = list(shape[-k:])
    x, w = sampler.randn(shape, dtype), sampler.randn(norm, dtype)
    _, rstd = torch.ops.aten._fused_rms_norm.default(x, norm, w, 1e-6)
    yield SampleInput((sampler.randn(shape, dtype), x, norm, rstd, w, [True, True]), {})


def _bn_tensors(sampler: Sampler, dtype: torch.dtype) -> tuple[Any, ...]:
    shape = (sampler.size(), sampler.size()) + sampler.shape(sampler.randint(0, 2)) if sampler.rng.random() < 0.7 else (sampler.size(), sampler.size())
    c = shape[1]
    return (
        sampler.randn(shape, dtype),
        sampler.randn((c,), dtype),
        sampler.randn((c,), dtype),
        sampler.randn((c,), dtype),
        sampler.positive((c,), dtype),
    )


def _bn_functional_samples(sampler: Sampler):
    for training in (True, False):
        x, w, b, rm, rv = _bn_tensors(sampler, sampler.float_dtype((torch.float64, torch.float32)))
        yield SampleInput((x, w, b, rm, rv, training, 0.1, 1e-5), {})


def _bn_no_training_samples(sampler: Sampler):
    x, w, b, rm, rv = _bn_tensors(sampler, sampler.float_dtype((torch.float64, torch.float32)))
    yield SampleInput((x, w, b, rm, rv, 0.1, 1e-5), {})


def _bn_backward_samples(sampler: Sampler):
    for train in (True, False):
        dtype = sampler.float_dtype((torch.float64, torch.float32))
        x, w, b, rm, rv = _bn_tensors(sampler, dtype)
        if train:
            _, mean, invstd, _, _ = torch.ops.aten._native_batch_norm_legit_functional.default(x, w, b, rm, rv, True, 0.1, 1e-5)
        else:
            mean, invstd = rm, 1 / torch.sqrt(rv + 1e-5)
        yield SampleInput((sampler.randn(x.shape, dtype), x, w, rm, rv, mean, invstd, train, 1e-5, [True, True, True]), {})


def register(registry: RuleRegistry) -> None:
    """Add the normalization rules to ``registry``."""
    rule = registry.family("normalization")
    rule(aten.native_layer_norm.default, compute=elementwise(8), samples=_layer_norm_samples)(layer_norm_rule)
    rule(aten.native_layer_norm_backward.default, compute=elementwise(12), samples=_layer_norm_backward_samples)(
        layer_norm_backward_rule)
    rule(aten._fused_rms_norm.default, compute=elementwise(6), samples=_rms_samples)(layer_norm_rule)
    rule(aten._fused_rms_norm_backward.default, compute=elementwise(10), samples=_rms_backward_samples,
         reference=rms_norm_backward_reference)(
        layer_norm_backward_rule)
    rule(aten._native_batch_norm_legit_functional.default, compute=elementwise(8), samples=_bn_functional_samples)(
        batch_norm_rule)
    rule(aten._native_batch_norm_legit_no_training.default, compute=elementwise(4), samples=_bn_no_training_samples)(
        batch_norm_rule)
    rule(aten.native_batch_norm_backward.default, compute=elementwise(12), samples=_bn_backward_samples)(
        batch_norm_backward_rule)
