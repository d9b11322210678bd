"""Diagonals: ``diagonal`` (and ``diagonal_copy``), its backward,
``diagonal_scatter`` and ``diag_embed``.

``diagonal(x, offset, dim1, dim2)`` drops ``dim1`` and ``dim2`` and appends
the diagonal as the last dim; every other dim of ``x`` is copied through in
order (*batch dims*). Splitting a batch dim is exact: each rank takes the
diagonals of its own batch slice. The diagonal dim itself would need ``x``
split along ``dim1`` and ``dim2`` at once (a 2-D block layout), so it stays
whole. The backward writes a gradient into zeros of the input's shape,
``diagonal_scatter`` writes ``src`` into a copy of ``x``, ``diag_embed``
writes the last dim of its input into zeros: all split along batch dims
only. Nothing is combined and the fill is zero, so every partial passes
(zeros add, average, max and min to zero on every rank).

>>> import torch
>>> from autoshard.rules.core import OpCall, TensorMeta
>>> x, out = TensorMeta((2, 4, 4), torch.float32), TensorMeta((4, 2), torch.float32)
>>> [str(s) for s in diagonal_rule(OpCall(torch.ops.aten.diagonal.default, (x, 0, 1, 2), {}, (x,), (out,), {"offset": 0, "dim1": 1, "dim2": 2}))][:2]
['S*(0) <- S*(0)', 'P(sum) <- P(sum)']
"""

from __future__ import annotations

import torch

from autoshard.rules.compute import copy, view
from autoshard.rules.core import P, P_AVG, P_MAX, P_MIN, OpCall, S, SingleDimStrategy
from autoshard.rules.registry import RuleRegistry, SampleInput
from autoshard.rules.samples import Sampler

__all__ = ["batch_dims", "diagonal_rule", "diagonal_backward_rule", "diagonal_scatter_rule", "diag_embed_rule", "register"]

aten = torch.ops.aten
ALL = (P, P_AVG, P_MAX, P_MIN)


def batch_dims(ndim: int, dim1: int, dim2: int) -> list[int]:
    """Dims of an ``ndim``-D tensor other than ``dim1``/``dim2``, in order:
    the ``i``-th of them is dim ``i`` of the diagonal view.

    >>> batch_dims(4, 1, -1)
    [0, 2]
    """
    d1, d2 = dim1 % ndim, dim2 % ndim
    return [d for d in range(ndim) if d not in (d1, d2)]


def _partials(n_in: int) -> list[SingleDimStrategy]:
    return [SingleDimStrategy(k, (k,) * n_in) for k in ALL]


def diagonal_rule(call: OpCall) -> list[SingleDimStrategy]:
    """diagonal / diagonal_copy(x, offset, dim1, dim2): batch dims split."""
    n = call.inputs[0].ndim
    dims = batch_dims(n, call.arg("dim1", 0), call.arg("dim2", 1))
    return [SingleDimStrategy(S(i), S(d)) for i, d in enumerate(dims)] + _partials(1)


def diagonal_backward_rule(call: OpCall) -> list[SingleDimStrategy]:
    """diagonal_backward(grad, input_sizes, offset, dim1, dim2): the output
    (``input_sizes``) and the gradient split alike along batch dims."""
    n = call.outputs[0].ndim
    dims = batch_dims(n, call.arg("dim1"), call.arg("dim2"))
    return [SingleDimStrategy(S(d), S(i)) for i, d in enumerate(dims)] + _partials(1)


def diagonal_scatter_rule(call: OpCall) -> list[SingleDimStrategy]:
    """diagonal_scatter(x, src, offset, dim1, dim2): x, src and the output
    split alike along batch dims."""
    n = call.inputs[0].ndim
    dims = batch_dims(n, call.arg("dim1", 0), call.arg("dim2", 1))
    return [SingleDimStrategy(S(d), (S(d), S(i))) for i, d in enumerate(dims)] + _partials(2)


def diag_embed_rule(call: OpCall) -> list[SingleDimStrategy]:
    """diag_embed(x, offset, dim1, dim2): the last dim of x becomes the
    diagonal of output dims ``dim1``/``dim2``; the others are batch dims."""
    n_out = call.outputs[0].ndim
    dims = batch_dims(n_out, call.arg("dim1", -2), call.arg("dim2", -1))
    return [SingleDimStrategy(S(d), S(i)) for i, d in enumerate(dims)] + _partials(1)


def _localize_input_sizes(args: tuple, kwargs: dict, local: OpCall) -> tuple[tuple, dict]:
    """input_sizes (position 1) becomes the local output shape."""
    return (args[0], list(local.outputs[0].shape)) + tuple(args[2:]), kwargs


# ------------------------------------------------------------------ samples


def _dims(sampler: Sampler, n: int) -> tuple[int, int]:
    d1, d2 = sampler.rng.sample(range(n), 2)
    return (d1 - n if sampler.rng.random() < 0.3 else d1), d2


def _diagonal_samples(sampler: Sampler):
    for _ in range(3):
        shape = sampler.shape(sampler.randint(2, 4))
        d1, d2 = _dims(sampler, len(shape))
        yield SampleInput((sampler.randn(shape, sampler.float_dtype()), sampler.randint(-2, 2), d1, d2), {})


def _diagonal_backward_samples(sampler: Sampler):
    for _ in range(3):
        shape = sampler.shape(sampler.randint(2, 4))
        d1, d2 = _dims(sampler, len(shape))
        offset = sampler.randint(-2, 2)
        grad = torch.diagonal(torch.empty(shape), offset, d1, d2)
        yield SampleInput((sampler.randn(tuple(grad.shape), sampler.float_dtype()), list(shape), offset, d1, d2), {})


def _diagonal_scatter_samples(sampler: Sampler):
    for _ in range(3):
        shape = sampler.shape(sampler.randint(2, 4))
        d1, d2 = _dims(sampler, len(shape))
        offset = sampler.randint(-2, 2)
        dtype = sampler.float_dtype()
        src_shape = tuple(torch.diagonal(torch.empty(shape), offset, d1, d2).shape)
        yield SampleInput((sampler.randn(shape, dtype), sampler.randn(src_shape, dtype), offset, d1, d2), {})


def _diag_embed_samples(sampler: Sampler):
    for _ in range(3):
        shape = sampler.shape(sampler.randint(1, 3))
        d1, d2 = _dims(sampler, len(shape) + 1)
        yield SampleInput((sampler.randn(shape, sampler.float_dtype()), sampler.randint(-2, 2), d1, d2), {})


def register(registry: RuleRegistry) -> None:
    """Add the diagonal rules to ``registry``."""
    rule = registry.family("diagonal")
    rule(aten.diagonal.default, compute=view(), samples=_diagonal_samples)(diagonal_rule)
    rule(aten.diagonal_copy.default, compute=copy(), samples=_diagonal_samples)(diagonal_rule)
    rule(aten.diagonal_backward.default, compute=copy(), samples=_diagonal_backward_samples,
         localize=_localize_input_sizes)(diagonal_backward_rule)
    rule(aten.diagonal_scatter.default, compute=copy(), samples=_diagonal_scatter_samples)(diagonal_scatter_rule)
    rule(aten.diag_embed.default, compute=copy(), samples=_diag_embed_samples)(diag_embed_rule)
