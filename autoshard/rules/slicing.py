"""Joining, splitting and slicing: cat, stack, split, unbind, slice, select, their
backward and scatter ops, padding, repeat, flip, roll, tril/triu.

All of them act along some tensor dims (the cat dim, the sliced dim, ...) and
copy every other dim through unchanged, so any *other* dim can stay split on
every tensor. None of them combines values, so partials pass through: a sum
of pieces stays a sum after rows are moved, copied or dropped. Ops that write
zeros (the backward of slice/select, tril, zero padding) keep every partial
too: zeros add, average, max and min to zero. Only a non-zero fill value
breaks ``P(sum)`` (each rank would add it once).

>>> import torch
>>> from autoshard.rules.core import OpCall, TensorMeta
>>> a, b = TensorMeta((4, 6), torch.float32), TensorMeta((4, 2), torch.float32)
>>> out = TensorMeta((4, 8), torch.float32)
>>> [str(s) for s in cat_rule(OpCall(torch.ops.aten.cat.default, ([a, b], 1), {}, (a, b), (out,), {"dim": 1}))][:2]
['S*(0) <- S*(0), S*(0)', 'P(sum) <- P(sum), P(sum)']
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from autoshard.rules.compute import copy, fill_copy_compute, scatter_into_compute, view
from autoshard.rules.core import P, P_AVG, P_MAX, P_MIN, OpCall, S, SingleDimStrategy
from autoshard.rules.registry import RuleRegistry, SampleInput
from autoshard.rules.samples import Sampler

__all__ = ["cat_rule", "register"]

aten = torch.ops.aten
ALL = (P, P_AVG, P_MAX, P_MIN)
NO_SUM = (P_AVG, P_MAX, P_MIN)


def _norm(d: int, n: int) -> int:
    return d + n if d < 0 else d


def _other_dims_rule(
    touched: Callable[[OpCall], set[int]],
    *,
    out_dim: Callable[[OpCall, int], int] = lambda call, d: d,
    kinds: Callable[[OpCall], Sequence[Any]] = lambda call: ALL,
) -> Callable[[OpCall], list[SingleDimStrategy]]:
    """Every tensor keeps its split on dims the op does not touch (``out_dim``
    maps an input dim to the outputs'); ``kinds`` of partial pass through."""

    def rule(call: OpCall) -> list[SingleDimStrategy]:
        n_in, n_out = len(call.inputs), len(call.outputs)
        ndim = call.inputs[0].ndim
        skip = touched(call)
        strategies = [
            SingleDimStrategy((S(out_dim(call, d)),) * n_out, (S(d),) * n_in) for d in range(ndim) if d not in skip
        ]
        strategies += [SingleDimStrategy((k,) * n_out, (k,) * n_in) for k in kinds(call)]
        return strategies

    return rule


def _dim_arg(call: OpCall) -> set[int]:
    return {_norm(call.arg("dim", 0), max(call.inputs[0].ndim, 1))}


def cat_rule(call: OpCall) -> list[SingleDimStrategy]:
    """cat: inputs of rank 1 with 0 elements (legacy empty) may be mixed in; the
    rule shards the dims other than ``dim``."""
    return _other_dims_rule(_dim_arg)(call)


def _stack_out(call: OpCall, d: int) -> int:
    dim = _norm(call.arg("dim", 0), call.inputs[0].ndim + 1)
    return d if d < dim else d + 1


def _unbind_out(call: OpCall, d: int) -> int:
    dim = next(iter(_dim_arg(call)))
    return d if d < dim else d - 1


def _select_touched(call: OpCall) -> set[int]:
    return _dim_arg(call)


def _backward_rule(call: OpCall) -> list[SingleDimStrategy]:
    """slice_backward/select_backward: grad written into zeros of input_sizes."""
    dim = _norm(call.arg("dim"), len(call.arg("input_sizes")))
    out_nd = call.outputs[0].ndim
    strategies = []
    for o in range(out_nd):
        if o == dim:
            continue
        if call.op is aten.select_backward.default:
            g = o if o < dim else o - 1
        else:
            g = o
        strategies.append(SingleDimStrategy(S(o), S(g)))
    return strategies + [SingleDimStrategy(k, k) for k in ALL]


def _scatter_rule(call: OpCall) -> list[SingleDimStrategy]:
    """select_scatter/slice_scatter: ``src`` written into a copy of ``self`` at
    a global index of ``dim``, so ``dim`` stays whole; every other dim splits
    ``self``, ``src`` and the output alike. Partials pass when both operands
    carry the same one: each element comes from exactly one of them."""
    n = call.inputs[0].ndim
    dim = _norm(call.arg("dim", 0), max(n, 1))
    drop = call.op is aten.select_scatter.default  # src has no ``dim``
    strategies = [
        SingleDimStrategy(S(d), (S(d), S(d - 1 if drop and d > dim else d))) for d in range(n) if d != dim
    ]
    return strategies + [SingleDimStrategy(k, (k, k)) for k in ALL]


def _localize_input_sizes(args: tuple, kwargs: dict, local: OpCall) -> tuple[tuple, dict]:
    """input_sizes (position 1) becomes the local output shape."""
    return (args[0], list(local.outputs[0].shape)) + tuple(args[2:]), kwargs


def _pad_touched(call: OpCall) -> set[int]:
    pad = call.arg("pad")
    n = call.inputs[0].ndim
    return {n - 1 - i // 2 for i, p in enumerate(pad) if p != 0}


def _pad_kinds(call: OpCall) -> Sequence[Any]:
    return ALL if call.arg("value", 0) == 0 else NO_SUM


def _repeat_touched(call: OpCall) -> set[int]:
    reps = call.arg("repeats")
    lead = len(reps) - call.inputs[0].ndim
    return {d for d in range(call.inputs[0].ndim) if reps[d + lead] != 1}


def _repeat_out(call: OpCall, d: int) -> int:
    return d + len(call.arg("repeats")) - call.inputs[0].ndim


def _flip_touched(call: OpCall) -> set[int]:
    n = call.inputs[0].ndim
    return {_norm(d, n) for d in call.arg("dims")}


def _roll_touched(call: OpCall) -> set[int]:
    n = call.inputs[0].ndim
    dims = call.arg("dims") or range(n)  # no dims: the flattened tensor rolls
    return {_norm(d, n) for d in dims}


def _last_two(call: OpCall) -> set[int]:
    n = call.inputs[0].ndim
    return {n - 2, n - 1}


# ------------------------------------------------------------------ samples


def _x(sampler: Sampler, shape: Sequence[int]) -> torch.Tensor:
    return sampler.randn(tuple(shape), sampler.float_dtype())


def _cat_samples(sampler: Sampler):
    for _ in range(3):
        shape = list(sampler.shape(min_ndim=1))
        dim = sampler.randint(-len(shape), len(shape) - 1)
        dtype = sampler.float_dtype()
        parts = []
        for _ in range(sampler.randint(2, 3)):
            s = list(shape)
            s[dim] = sampler.choice((1, 2, 3))
            parts.append(sampler.randn(s, dtype))
        yield SampleInput((parts, dim), {})


def _stack_samples(sampler: Sampler):
    for _ in range(2):
        shape = sampler.shape(min_ndim=1)
        dtype = sampler.float_dtype()
        parts = [sampler.randn(shape, dtype) for _ in range(sampler.randint(2, 3))]
        yield SampleInput((parts, sampler.randint(-len(shape) - 1, len(shape))), {})


def _split_samples(kind: str) -> Callable[[Sampler], Any]:
    def samples(sampler: Sampler):
        for _ in range(2):
            shape = sampler.shape(min_ndim=2)
            d = sampler.rng.randrange(len(shape))
            x = _x(sampler, shape)
            if kind == "size":
                yield SampleInput((x, sampler.choice((1, 2, 3)), d), {})
            elif kind == "sizes":
                first = sampler.randint(1, shape[d] - 1)
                yield SampleInput((x, [first, shape[d] - first], d), {})
            else:
                yield SampleInput((x, d), {})

    return samples


def _slice_samples(sampler: Sampler):
    for _ in range(3):
        shape = sampler.shape(min_ndim=1)
        d = sampler.rng.randrange(len(shape))
        start = sampler.randint(0, shape[d] - 1)
        yield SampleInput((_x(sampler, shape), d, start, sampler.choice((shape[d], start + 1, 2**62)), sampler.choice((1, 2))), {})


def _narrow_samples(sampler: Sampler):
    for _ in range(2):
        shape = sampler.shape(min_ndim=2)
        dim = sampler.randint(-len(shape), len(shape) - 1)
        start = sampler.randint(0, shape[dim] - 1)
        yield SampleInput((_x(sampler, shape), dim, start, sampler.randint(0, shape[dim] - start)), {})


def _select_samples(sampler: Sampler):
    for _ in range(2):
        shape = sampler.shape(min_ndim=2)
        d = sampler.rng.randrange(len(shape))
        yield SampleInput((_x(sampler, shape), d - len(shape) * sampler.randint(0, 1), sampler.randint(-1, shape[d] - 1)), {})


def _slice_backward_samples(sampler: Sampler):
    for _ in range(2):
        full = sampler.shape(min_ndim=2)
        d = sampler.rng.randrange(len(full))
        start, step = sampler.randint(0, 1), sampler.choice((1, 2))
        n = len(range(start, full[d], step))
        g = list(full)
        g[d] = n
        yield SampleInput((_x(sampler, g), list(full), d, start, full[d], step), {})


def _select_backward_samples(sampler: Sampler):
    for _ in range(2):
        full = sampler.shape(min_ndim=2)
        d = sampler.rng.randrange(len(full))
        g = list(full[:d]) + list(full[d + 1 :])
        yield SampleInput((_x(sampler, g), list(full), d, sampler.randint(0, full[d] - 1)), {})


def _select_scatter_samples(sampler: Sampler):
    for _ in range(2):
        shape = sampler.shape(min_ndim=1)
        d = sampler.rng.randrange(len(shape))
        dtype = sampler.float_dtype()
        src = sampler.randn(shape[:d] + shape[d + 1 :], dtype)
        yield SampleInput((sampler.randn(shape, dtype), src, d - len(shape) * sampler.randint(0, 1), sampler.randint(-1, shape[d] - 1)), {})


def _slice_scatter_samples(sampler: Sampler):
    for _ in range(3):
        shape = sampler.shape(min_ndim=1)
        d = sampler.rng.randrange(len(shape))
        start, step = sampler.randint(0, shape[d] - 1), sampler.choice((1, 2))
        end = sampler.choice((shape[d], start + 1, None))
        n = len(range(start, shape[d] if end is None else end, step))
        dtype = sampler.float_dtype()
        src = sampler.randn(shape[:d] + (n,) + shape[d + 1 :], dtype)
        yield SampleInput((sampler.randn(shape, dtype), src, d, start, end, step), {})


def _pad_samples(sampler: Sampler):
    for value in (0.0, 1.5):
        shape = sampler.shape(min_ndim=2)
        pad = [sampler.randint(0, 2) for _ in range(2 * sampler.randint(1, len(shape)))]
        yield SampleInput((_x(sampler, shape), pad, value), {})


def _repeat_samples(sampler: Sampler):
    for _ in range(2):
        shape = sampler.shape(min_ndim=1)
        reps = [sampler.choice((1, 1, 2)) for _ in shape]
        if sampler.rng.random() < 0.5:
            reps = [2] + reps
        yield SampleInput((_x(sampler, shape), reps), {})


def _flip_samples(sampler: Sampler):
    shape = sampler.shape(min_ndim=2)
    yield SampleInput((_x(sampler, shape), [sampler.rng.randrange(len(shape))]), {})


def _roll_samples(sampler: Sampler):
    shape = sampler.shape(min_ndim=2)
    yield SampleInput((_x(sampler, shape), [1], [sampler.rng.randrange(len(shape))]), {})
    yield SampleInput((_x(sampler, shape), [2], []), {})


def _tri_samples(sampler: Sampler):
    for diagonal in (0, -1, 1):
        yield SampleInput((_x(sampler, sampler.shape(min_ndim=2)), diagonal), {})


def register(registry: RuleRegistry) -> None:
    """Add the join/split/slice rules to ``registry``."""
    rule = registry.family("slicing")
    rule(aten.cat.default, compute=copy(), samples=_cat_samples)(cat_rule)
    rule(aten.stack.default, compute=copy(), samples=_stack_samples)(_other_dims_rule(lambda call: set(), out_dim=_stack_out))
    # unsafe_split* are split* without the autograd view tracking; *_copy materialize the views
    for op in (aten.split.Tensor, aten.unsafe_split.Tensor):
        rule(op, compute=view(), samples=_split_samples("size"))(_other_dims_rule(_dim_arg))
    for op in (aten.split_with_sizes.default, aten.unsafe_split_with_sizes.default, aten.split_with_sizes_copy.default):
        rule(op, compute=view() if op is not aten.split_with_sizes_copy.default else copy(),
             samples=_split_samples("sizes"))(_other_dims_rule(_dim_arg))
    rule(aten.unbind.int, compute=view(), samples=_split_samples("unbind"))(_other_dims_rule(_dim_arg, out_dim=_unbind_out))
    rule(aten.unbind_copy.int, compute=copy(), samples=_split_samples("unbind"))(_other_dims_rule(_dim_arg, out_dim=_unbind_out))
    rule(aten.narrow_copy.default, compute=copy(), samples=_narrow_samples)(_other_dims_rule(_dim_arg))
    rule(aten.slice.Tensor, compute=view(), samples=_slice_samples)(_other_dims_rule(_dim_arg))
    rule(aten.select.int, compute=view(), samples=_select_samples)(_other_dims_rule(_select_touched, out_dim=_unbind_out))
    # *_backward and constant_pad_nd fill their output, then copy the input in: out + 2 * in
    grad_in = fill_copy_compute(source="grad_output")
    rule(aten.slice_backward.default, compute=grad_in, samples=_slice_backward_samples, localize=_localize_input_sizes)(
        _backward_rule)
    rule(aten.select_backward.default, compute=grad_in, samples=_select_backward_samples, localize=_localize_input_sizes)(
        _backward_rule)
    rule(aten.select_scatter.default, compute=scatter_into_compute, samples=_select_scatter_samples)(_scatter_rule)
    rule(aten.slice_scatter.default, compute=scatter_into_compute, samples=_slice_scatter_samples)(_scatter_rule)
    rule(aten.constant_pad_nd.default, compute=fill_copy_compute(source="self"), samples=_pad_samples)(
        _other_dims_rule(_pad_touched, kinds=_pad_kinds))
    rule(aten.repeat.default, compute=copy(), samples=_repeat_samples)(
        _other_dims_rule(_repeat_touched, out_dim=_repeat_out))
    rule(aten.flip.default, compute=copy(), samples=_flip_samples)(_other_dims_rule(_flip_touched))
    rule(aten.roll.default, compute=copy(), samples=_roll_samples)(_other_dims_rule(_roll_touched))
    rule(aten.tril.default, compute=copy(), samples=_tri_samples)(_other_dims_rule(_last_two))
    rule(aten.triu.default, compute=copy(), samples=_tri_samples)(_other_dims_rule(_last_two))
