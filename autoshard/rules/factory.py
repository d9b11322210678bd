"""Factory and random ops: zeros/ones/full/empty (+ ``_like``, ``new_``),
scalar_tensor, arange, rand/randn (+ ``_like``), native_dropout.

A constant tensor can be created already split on any dim (each rank makes
its local shape, the size argument localised) or as a partial whose pieces
reduce to the constant: zeros are ``P(sum)`` (and every other partial); a
non-zero constant ``c`` is ``P(avg)``, ``P(max)``, ``P(min)`` (the same value on
every rank), never ``P(sum)`` (``m * c``). ``empty`` has no values to keep.
``_like`` ops read only the shape of their input, which must then be split
like the output (so the local shape matches), or replicated/partial when the
output is whole. ``arange`` stays replicated: a split needs the rank's offset,
which a plain call does not get.

Random ops cannot match an unsharded run value for value; the validator
checks their *contract* instead (shape, dtype, value range, and for dropout
``out == x * mask / (1 - p)``), with ranks along replicated mesh dims drawing
the same numbers (the runtime must seed them alike). Random ops never take or
give partials.

>>> constant_kinds(0.0) == (P, P_AVG, P_MAX, P_MIN)
True
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from autoshard.rules.compute import allocation, elementwise
from autoshard.rules.core import P, P_AVG, P_MAX, P_MIN, R, OpCall, S, SingleDimStrategy
from autoshard.rules.registry import RuleRegistry, SampleInput
from autoshard.rules.samples import Sampler

__all__ = ["constant_kinds", "register"]

aten = torch.ops.aten


AVG_HEADROOM = 2.0**20
"""An average all-reduce sums first: ``m`` copies of a constant near
``finfo.max`` overflow (``m * finfo(float32).min = -inf``). A constant is
created as ``P(avg)`` only below ``finfo.max / AVG_HEADROOM`` (mesh dims up
to 2**20 ranks)."""


def constant_kinds(value: Any, dtype: torch.dtype | None = None) -> tuple[Any, ...]:
    """Partials a constant tensor of ``value`` (of ``dtype``) can be created as (None: empty).

    >>> [str(k) for k in constant_kinds(torch.finfo(torch.float32).min, torch.float32)]
    ['P(max)', 'P(min)']
    """
    if value is None or value == 0:
        return (P, P_AVG, P_MAX, P_MIN)
    if dtype is not None and (dtype.is_floating_point or dtype.is_complex):
        real = dtype.to_real() if dtype.is_complex else dtype
        try:
            size = abs(complex(value))
        except (TypeError, ValueError):
            size = 0.0
        if torch.finfo(real).max / AVG_HEADROOM < size < float("inf"):
            return (P_MAX, P_MIN)
    return (P_AVG, P_MAX, P_MIN)


def _fill_value(call: OpCall) -> Any:
    op = call.op
    if op in (aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default, aten.empty.memory_format,
              aten.empty_like.default, aten.new_empty.default, aten.empty_strided.default, aten.new_empty_strided.default):
        return 0
    if op in (aten.ones.default, aten.ones_like.default, aten.new_ones.default):
        return 1
    return call.arg("fill_value", call.arg("value", 1))


def sized_rule(call: OpCall) -> list[SingleDimStrategy]:
    """zeros/ones/full/empty(size) and new_*(x, size): x's data is unread (None)."""
    n_in = len(call.inputs)
    ins = (None,) * n_in
    out = call.outputs[0]
    strategies = [SingleDimStrategy(S(d), ins) for d in range(out.ndim)]
    return strategies + [SingleDimStrategy(k, ins) for k in constant_kinds(_fill_value(call), call.outputs[0].dtype)]


def like_rule(call: OpCall) -> list[SingleDimStrategy]:
    """zeros_like(x) and friends: x only gives the (local) shape."""
    n = call.inputs[0].ndim
    strategies = [SingleDimStrategy(S(d), S(d)) for d in range(n)]
    for k in constant_kinds(_fill_value(call), call.outputs[0].dtype):
        strategies += [SingleDimStrategy(k, R), SingleDimStrategy(k, k), SingleDimStrategy(R, k)]
    return strategies


def fill_tensor_rule(call: OpCall) -> list[SingleDimStrategy]:
    """fill.Tensor(x, value): x gives the (local) shape, the 0-d ``value`` the
    data. A replicated value is a constant (:func:`constant_kinds`, no sum:
    the value is not known to be zero); a partial value fills every element
    with its piece, so the output is that partial."""
    n = call.inputs[0].ndim
    strategies = [SingleDimStrategy(S(d), (S(d), R)) for d in range(n)]
    for k in (P_AVG, P_MAX, P_MIN):
        strategies += [SingleDimStrategy(k, (R, R)), SingleDimStrategy(k, (k, R))]
    for k in (P, P_AVG, P_MAX, P_MIN):
        strategies += [SingleDimStrategy(k, (R, k)), SingleDimStrategy(k, (k, k)), SingleDimStrategy(R, (k, R))]
    return strategies


def scalar_rule(call: OpCall) -> list[SingleDimStrategy]:
    """scalar_tensor(s): a 0-d constant."""
    return [SingleDimStrategy(k, ()) for k in constant_kinds(call.arg("s"), call.outputs[0].dtype)]


def replicate_rule(call: OpCall) -> list[SingleDimStrategy]:
    """Only the implied all-replicate strategy."""
    return []


def random_sized_rule(call: OpCall) -> list[SingleDimStrategy]:
    """rand/randn(size): each rank draws its own shard."""
    return [SingleDimStrategy(S(d), ()) for d in range(call.outputs[0].ndim)]


def random_like_rule(call: OpCall) -> list[SingleDimStrategy]:
    """rand_like(x), native_dropout(x): shards of x, drawn per rank."""
    k = len(call.outputs)
    return [SingleDimStrategy((S(d),) * k, S(d)) for d in range(call.inputs[0].ndim)]


def _localize_size(position: int) -> Callable[[tuple, dict, OpCall], tuple[tuple, dict]]:
    """The size argument at ``position`` becomes the local output shape."""

    def localize(args: tuple, kwargs: dict, local: OpCall) -> tuple[tuple, dict]:
        shape = list(local.outputs[0].shape)
        if len(args) > position:
            args = args[:position] + (shape,) + args[position + 1 :]
        else:
            kwargs = dict(kwargs, size=shape)
        if local.op in (aten.empty_strided.default, aten.new_empty_strided.default):
            # the local tensor is laid out contiguously
            stride = [1] * len(shape)
            for d in range(len(shape) - 2, -1, -1):
                stride[d] = stride[d + 1] * shape[d + 1]
            args = args[: position + 1] + (stride,) + args[position + 2 :]
        return args, kwargs

    return localize


# ------------------------------------------------------------------ contracts


def _shape_contract(args: tuple, kwargs: dict, outputs: tuple) -> str | None:
    """Values are arbitrary: the unsharded shapes were already checked."""
    return None


def _repeats(out: torch.Tensor) -> bool:
    """Far fewer distinct values than elements: ranks drew the same numbers.
    Only meaningful where the dtype has many values (not bfloat16/half)."""
    if out.dtype not in (torch.float32, torch.float64) or out.numel() <= 8:
        return False
    return len(torch.unique(out)) < out.numel() // 2


def _rand_contract(args: tuple, kwargs: dict, outputs: tuple) -> str | None:
    out = torch.view_as_real(outputs[0]) if outputs[0].is_complex() else outputs[0]
    if out.numel() and not (0 <= float(out.min()) and float(out.max()) < 1):
        return "rand values outside [0, 1)"
    if _repeats(out):
        return "rand values repeat across ranks (ranks drew the same numbers)"
    return None


def _randn_contract(args: tuple, kwargs: dict, outputs: tuple) -> str | None:
    out = outputs[0]
    if not bool(torch.isfinite(out).all()):
        return "randn gave non-finite values"
    if _repeats(out):
        return "randn values repeat across ranks (ranks drew the same numbers)"
    return None


def _dropout_contract(args: tuple, kwargs: dict, outputs: tuple) -> str | None:
    x, p, train = args[0], args[1], args[2]
    out, mask = outputs
    if mask.dtype != torch.bool or mask.shape != x.shape:
        return f"mask: {mask.dtype} {tuple(mask.shape)}, expected bool {tuple(x.shape)}"
    if train is False:
        return None if torch.equal(out, x) else "eval-mode dropout changed its input"
    expected = torch.where(mask, x / (1 - p), torch.zeros_like(x))
    # a dropped -inf is -inf * 0 = NaN in the kernel: only finite x are checked
    finite = torch.isfinite(x)
    wide = torch.complex128 if x.is_complex() else torch.float64
    if not torch.allclose(out[finite].to(wide), expected[finite].to(wide), rtol=1e-2, atol=1e-2):
        return "out != x * mask / (1 - p)"
    kept = float(mask.double().mean())
    if mask.numel() >= 32 and abs(kept - (1 - p)) > 0.35:
        return f"kept fraction {kept:.2f} far from 1 - p = {1 - p:.2f}"
    return None


# ------------------------------------------------------------------ samples


def _dtype(sampler: Sampler) -> torch.dtype:
    return sampler.float_dtype()


def _sized_samples(extra: Sequence[Any] = ()) -> Callable[[Sampler], Any]:
    def samples(sampler: Sampler):
        for _ in range(2):
            yield SampleInput((list(sampler.shape()), *extra), {"dtype": _dtype(sampler), "device": torch.device("cpu")})

    return samples


def _new_samples(extra: Sequence[Any] = ()) -> Callable[[Sampler], Any]:
    def samples(sampler: Sampler):
        for _ in range(2):
            x = sampler.randn(sampler.shape(), _dtype(sampler))
            yield SampleInput((x, list(sampler.shape()), *extra), {})

    return samples


def _like_samples(extra: Sequence[Any] = ()) -> Callable[[Sampler], Any]:
    def samples(sampler: Sampler):
        for _ in range(2):
            yield SampleInput((sampler.randn(sampler.shape(), _dtype(sampler)), *extra), {})

    return samples


def _fill_tensor_samples(sampler: Sampler):
    for value_dtype in (None, torch.float64, torch.int64):
        dtype = _dtype(sampler)
        value = sampler.randn((), value_dtype or dtype) if value_dtype is not torch.int64 else sampler.index((), 5)
        yield SampleInput((sampler.randn(sampler.shape(), dtype), value), {})


def _empty_strided_samples(sampler: Sampler):
    shape = list(sampler.shape(2))
    yield SampleInput((shape, [shape[1], 1]), {"dtype": torch.float32, "device": torch.device("cpu")})


def _scalar_samples(sampler: Sampler):
    for s in (0.0, 2.5):
        yield SampleInput((s,), {"dtype": torch.float64})


def _arange_samples(kind: str) -> Callable[[Sampler], Any]:
    def samples(sampler: Sampler):
        if kind == "default":
            yield SampleInput((sampler.size(),), {"dtype": torch.int64})
        elif kind == "start":
            yield SampleInput((2, 2 + sampler.size()), {"dtype": torch.int64})
        else:
            yield SampleInput((0, sampler.size(), 2), {"dtype": torch.float32})

    return samples


def _dropout_samples(sampler: Sampler):
    for p, train in ((0.3, True), (0.5, None), (0.2, False)):
        shape = sampler.shape(min_ndim=2)
        yield SampleInput((sampler.randn(shape, sampler.float_dtype((torch.float64, torch.float32))), p, train), {})


def register(registry: RuleRegistry) -> None:
    """Add the factory and random rules to ``registry``."""
    rule = registry.family("factory")
    # made from sizes: the output written (zeros, full, fill) or only allocated (empty); the tensor a
    # new_* or *_like op takes its dtype from is not read
    mem, empty = allocation(written=True), allocation(written=False)
    rule([aten.zeros.default, aten.ones.default], compute=mem, samples=_sized_samples(), localize=_localize_size(0))(
        sized_rule)
    rule(aten.empty.memory_format, compute=empty, samples=_sized_samples(), localize=_localize_size(0),
         contract=_shape_contract)(sized_rule)
    rule(aten.full.default, compute=mem, samples=_sized_samples((1.5,)), localize=_localize_size(0))(sized_rule)
    rule(aten.empty_strided.default, compute=empty, samples=_empty_strided_samples, localize=_localize_size(0),
         contract=_shape_contract)(sized_rule)
    rule([aten.new_zeros.default, aten.new_ones.default], compute=mem, samples=_new_samples(),
         localize=_localize_size(1))(sized_rule)
    rule(aten.new_empty.default, compute=empty, samples=_new_samples(), localize=_localize_size(1),
         contract=_shape_contract)(sized_rule)
    rule(aten.new_full.default, compute=mem, samples=_new_samples((2.0,)), localize=_localize_size(1))(sized_rule)
    rule([aten.zeros_like.default, aten.ones_like.default], compute=mem, samples=_like_samples())(like_rule)
    rule(aten.full_like.default, compute=mem, samples=_like_samples((-3.0,)))(like_rule)
    rule(aten.fill.Scalar, compute=mem, samples=_like_samples((0.5,)))(like_rule)
    rule(aten.fill.Tensor, compute=mem, samples=_fill_tensor_samples)(fill_tensor_rule)
    rule(aten.empty_like.default, compute=empty, samples=_like_samples(), contract=_shape_contract)(like_rule)
    rule(aten.scalar_tensor.default, compute=mem, samples=_scalar_samples)(scalar_rule)
    rule(aten.arange.default, compute=mem, samples=_arange_samples("default"))(replicate_rule)
    rule(aten.arange.start, compute=mem, samples=_arange_samples("start"))(replicate_rule)
    rule(aten.arange.start_step, compute=mem, samples=_arange_samples("step"))(replicate_rule)
    rule(aten.rand.default, compute=elementwise(2), samples=_sized_samples(), localize=_localize_size(0),
         contract=_rand_contract)(random_sized_rule)
    rule(aten.randn.default, compute=elementwise(4), samples=_sized_samples(), localize=_localize_size(0),
         contract=_randn_contract)(random_sized_rule)
    rule(aten.rand_like.default, compute=elementwise(2), samples=_like_samples(), contract=_rand_contract)(random_like_rule)
    rule(aten.randn_like.default, compute=elementwise(4), samples=_like_samples(), contract=_randn_contract)(random_like_rule)
    rule(aten.native_dropout.default, compute=elementwise(3), samples=_dropout_samples, contract=_dropout_contract)(
        random_like_rule)
