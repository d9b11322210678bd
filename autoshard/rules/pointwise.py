"""Pointwise ops: a table of ops, grouped by the partial placements they keep.

Every pointwise op can be split along any tensor dim of its (broadcast)
output: each input is split along the matching dim, or replicated where it is
broadcast. Which *partial* inputs an op accepts depends on its math, so the
ops are grouped; each group has one table of extra single-dim rules (output
first, then the tensor inputs, keyed by the number of tensor inputs) and the
one-line reason why they hold. ``P`` is ``P(sum)``.

>>> import torch
>>> from autoshard.rules.core import OpCall, TensorMeta
>>> x, b = TensorMeta((4, 8), torch.float32), TensorMeta((8,), torch.float32)
>>> call = OpCall(torch.ops.aten.add.Tensor, (x, b), {}, (x, b), (x,))
>>> [str(s) for s in pointwise_rule(ADDITIVE)(call)][:3]
['S*(0) <- S*(0), R', 'S*(1) <- S*(1), S*(0)', 'P(sum) <- P(sum), P(sum)']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from autoshard.rules.compute import elementwise, pow_scalar_compute
from autoshard.rules.core import P, P_AVG, P_MAX, P_MIN, R, OpCall, S, SingleDimStrategy
from autoshard.rules.expand import monotone_cast
from autoshard.rules.factory import constant_kinds
from autoshard.rules.registry import RuleRegistry, SampleInput
from autoshard.rules.samples import Sampler, from_spec

__all__ = ["Pointwise", "Group", "GROUPS", "pointwise_rule", "broadcast_dim", "register"]

aten = torch.ops.aten
Row = tuple  # (output placement, *input placements)
PartialTable = Mapping[int, Sequence[Row]]

# ---------------------------------------------------------------- partial tables
# Keyed by the number of tensor inputs of the call (``add(x, 2.0)`` has one).

NONE: PartialTable = {}
LINEAR: PartialTable = {1: [(P, P), (P_AVG, P_AVG)]}
IDENTITY: PartialTable = {1: [(p, p) for p in (P, P_AVG, P_MAX, P_MIN)]}
NEGATION: PartialTable = {1: [(P, P), (P_AVG, P_AVG), (P_MIN, P_MAX), (P_MAX, P_MIN)]}
ADDITIVE: PartialTable = {
    2: [(P, P, P), (P_AVG, P_AVG, P_AVG), (P_AVG, P_AVG, R), (P_AVG, R, P_AVG), (P_MAX, P_MAX, R), (P_MIN, P_MIN, R)],
    1: [(P_AVG, P_AVG), (P_MAX, P_MAX), (P_MIN, P_MIN)],
}
MULTIPLICATIVE: PartialTable = {
    2: [(P, P, R), (P_AVG, P_AVG, R), (P, R, P), (P_AVG, R, P_AVG)],
    1: [(P, P), (P_AVG, P_AVG)],
}
DIVISION: PartialTable = {2: [(P, P, R), (P_AVG, P_AVG, R)], 1: [(P, P), (P_AVG, P_AVG)]}
LINEAR_IN_FIRST: PartialTable = {
    2: [(P, P, R), (P_AVG, P_AVG, R)],
    3: [(P, P, R, R), (P_AVG, P_AVG, R, R)],
}
NON_DECREASING: PartialTable = {1: [(P_MAX, P_MAX), (P_MIN, P_MIN)]}
MAX_LIKE: PartialTable = {2: [(P_MAX, P_MAX, P_MAX), (P_MAX, P_MAX, R), (P_MAX, R, P_MAX)]}
MIN_LIKE: PartialTable = {2: [(P_MIN, P_MIN, P_MIN), (P_MIN, P_MIN, R), (P_MIN, R, P_MIN)]}
SELECT: PartialTable = {3: [(p, R, p, p) for p in (P, P_AVG, P_MAX, P_MIN)]}
FILL: PartialTable = {2: [(p, p, R) for p in (P_AVG, P_MAX, P_MIN)]}


@dataclass(frozen=True, slots=True)
class Pointwise:
    """One op of a group and how to sample it (``samples.from_spec``)."""

    op: torch._ops.OpOverload
    specs: tuple[tuple[Any, ...], ...]
    """Argument specs, one per sample variant."""
    kwargs: tuple[Mapping[str, Any], ...] = ({},)
    """Keyword-argument variants."""
    float_only: tuple[torch.dtype, ...] | None = None
    """Float dtypes to sample (None: all)."""
    flops: float = 1.0
    """FLOPs per output element (a rough count for the roofline)."""
    extremes: bool = True
    """See :attr:`autoshard.rules.registry.Rule.extremes`."""


def pw(op: torch._ops.OpOverload, *specs: tuple, kwargs: Sequence[Mapping[str, Any]] = ({},), dtypes=None,
       flops: float = 1.0, extremes: bool = True) -> Pointwise:
    return Pointwise(op, tuple(specs), tuple(kwargs), dtypes, flops, extremes)


@dataclass(frozen=True, slots=True)
class Group:
    """Pointwise ops that keep the same partial placements, and why."""

    why: str
    partials: PartialTable
    ops: tuple[Pointwise, ...] = field(default_factory=tuple)


F64_F32 = (torch.float64, torch.float32)
X, XY, XS = ("x",), ("x", "y"), ("x", "s")

GROUPS: tuple[Group, ...] = (
    Group("f(a+b) = f(a)+f(b) and f commutes with averaging: scaling by a replicated constant", LINEAR, (
        pw(aten.mul.Scalar, XS), pw(aten.div.Scalar, ("x", 1.5)),
        pw(aten.deg2rad.default, X), pw(aten.rad2deg.default, X),
    )),
    Group("values pass through unchanged, so every partial stays the same partial", IDENTITY, (
        pw(aten.clone.default, X), pw(aten.alias.default, X), pw(aten.positive.default, X),
        pw(aten.lift_fresh_copy.default, X),
        pw(aten.copy.default, ("x", "x")),
    )),
    Group("-(a+b) = -a + -b, and negation swaps max and min", NEGATION, (pw(aten.neg.default, X),)),
    Group("pieces of both operands add up; a replicated term shifts every piece equally, "
          "which commutes with avg, max and min but would be counted once per rank under sum", ADDITIVE, (
        pw(aten.add.Tensor, XY, XS, kwargs=({}, {"alpha": 0.5})),
        pw(aten.sub.Tensor, XY, XS, kwargs=({}, {"alpha": 2})),
        pw(aten.add.Scalar, XS), pw(aten.sub.Scalar, XS),
    )),
    Group("a*(b+c) = a*b + a*c: one partial factor times a replicated one", MULTIPLICATIVE, (
        pw(aten.mul.Tensor, XY, XS),
    )),
    Group("(a+b)/c = a/c + b/c: a partial numerator over a replicated divisor", DIVISION, (
        pw(aten.div.Tensor, ("x", "q"), ("x", 1.5)),
    )),
    Group("backward of a pointwise op: linear in grad_output for a fixed replicated input", LINEAR_IN_FIRST, (
        pw(aten.threshold_backward.default, ("x", "x", 0.0)),
        pw(aten.gelu_backward.default, ("x", "x"), kwargs=({}, {"approximate": "tanh"}), flops=12),
        pw(aten.silu_backward.default, ("x", "x"), flops=6),
        pw(aten.sigmoid_backward.default, ("x", "x")),
        pw(aten.tanh_backward.default, ("x", "x")),
        pw(aten.native_dropout_backward.default, ("x", "b", 2.0)),
        pw(aten.leaky_relu_backward.default, ("x", "x", 0.01, False)),
        pw(aten.hardtanh_backward.default, ("x", "x", -1.0, 1.0)),
        pw(aten.softplus_backward.default, ("x", "x", 1.0, 20.0)),
        pw(aten.mish_backward.default, ("x", "x"), flops=10),
        pw(aten.hardswish_backward.default, ("x", "x")),
        pw(aten.elu_backward.default, ("x", 1.0, 1.0, 1.0, False, "x")),
        pw(aten.hardsigmoid_backward.default, ("x", "x")),
        pw(aten.softshrink_backward.default, ("x", "x", 0.5)), pw(aten.hardshrink_backward.default, ("x", "x", 0.5)),
    )),
    Group("f(max(a,b)) = max(f(a),f(b)) for f non-decreasing on the whole real line", NON_DECREASING, (
        pw(aten.relu.default, X), pw(aten.exp.default, X, flops=4), pw(aten.expm1.default, X, flops=4),
        pw(aten.sigmoid.default, X, flops=4), pw(aten.tanh.default, X, flops=4),
        pw(aten.erf.default, X, flops=4), pw(aten.atan.default, X, flops=4), pw(aten.asinh.default, X, flops=4),
        pw(aten.sinh.default, X, flops=4), pw(aten.floor.default, X), pw(aten.ceil.default, X),
        pw(aten.round.default, X), pw(aten.trunc.default, X), pw(aten.sign.default, X),
        pw(aten.hardtanh.default, X), pw(aten.relu6.default, X), pw(aten.hardsigmoid.default, X),
        pw(aten.leaky_relu.default, X, ("x", 0.2)), pw(aten.elu.default, X, flops=4),
        pw(aten.softplus.default, X, flops=4), pw(aten.clamp.default, ("x", -0.5, 0.5), ("x", None, 0.3)),
        pw(aten.clamp_min.default, ("x", 0.1)), pw(aten.clamp_max.default, ("x", 0.1)),
        pw(aten.nan_to_num.default, X),
    )),
    Group("max(max(a,b), c) = max(max(a,c), max(b,c)): maximum keeps P(max)", MAX_LIKE, (
        pw(aten.maximum.default, XY),
    )),
    Group("min(min(a,b), c) = min(min(a,c), min(b,c)): minimum keeps P(min)", MIN_LIKE, (
        pw(aten.minimum.default, XY),
    )),
    Group("where picks elementwise from two partial operands with a replicated condition", SELECT, (
        pw(aten.where.self, ("c", "x", "y")),
    )),
    Group("the filled value is the same on every rank: avg, max and min of equal values are that value", FILL, (
        pw(aten.masked_fill.Scalar, ("x", "c", -1.5)),
    )),
    Group("non-linear or non-monotone: shards only", NONE, (
        pw(aten.abs.default, X), pw(aten.gelu.default, X, kwargs=({}, {"approximate": "tanh"}), flops=12),
        pw(aten.silu.default, X, flops=5), pw(aten.mish.default, X, flops=10), pw(aten.hardswish.default, X),
        pw(aten.sin.default, X, flops=4), pw(aten.cos.default, X, flops=4),
        pw(aten.sqrt.default, ("p",), flops=2), pw(aten.rsqrt.default, ("p",), flops=2),
        pw(aten.log.default, ("p",), flops=4), pw(aten.log1p.default, ("p",), flops=4),
        pw(aten.log2.default, ("p",), flops=4), pw(aten.reciprocal.default, ("p",)),
        pw(aten.square.default, X), pw(aten.erfinv.default, ("x",), flops=8),
        pw(aten.pow.Tensor_Scalar, ("x", 2), ("x", 3), ("p", 0.5), ("p", -0.5), flops=4),
        pw(aten.pow.Tensor_Tensor, ("p", "y"), flops=8), pw(aten.atan2.default, XY, flops=8),
        pw(aten.div.Tensor_mode, ("x", "q"), kwargs=({"rounding_mode": "floor"}, {"rounding_mode": "trunc"})),
        pw(aten.floor_divide.default, ("i", 3)), pw(aten.remainder.Scalar, ("i", 3)),
        # remainder(finfo.min, y): NaN in the vectorised loop, finite in the scalar one
        pw(aten.remainder.Tensor, ("x", "q"), extremes=False),
        pw(aten.lerp.Scalar, ("x", "y", 0.3)), pw(aten.lerp.Tensor, ("x", "y", "y")),
        pw(aten.addcmul.default, ("x", "y", "y"), kwargs=({}, {"value": 0.5}), flops=2),
        pw(aten.addcdiv.default, ("x", "y", "q"), kwargs=({}, {"value": 0.5}), flops=2),
        pw(aten.logaddexp.default, XY, flops=6),
        pw(aten.eq.Tensor, XY), pw(aten.ne.Tensor, XY), pw(aten.lt.Tensor, XY), pw(aten.le.Tensor, XY),
        pw(aten.gt.Tensor, XY), pw(aten.ge.Tensor, XY),
        pw(aten.eq.Scalar, ("i", 3)), pw(aten.ne.Scalar, ("i", 3)), pw(aten.lt.Scalar, XS), pw(aten.le.Scalar, XS),
        pw(aten.gt.Scalar, XS), pw(aten.ge.Scalar, XS),
        pw(aten.logical_not.default, ("b",)), pw(aten.logical_and.default, ("b", "c")),
        pw(aten.logical_or.default, ("b", "c")), pw(aten.logical_xor.default, ("b", "c")),
        pw(aten.bitwise_not.default, ("b",)), pw(aten.bitwise_and.Tensor, ("b", "c")),
        pw(aten.bitwise_or.Tensor, ("b", "c")), pw(aten.bitwise_xor.Tensor, ("b", "c")),
        pw(aten.isnan.default, X), pw(aten.isinf.default, X), pw(aten.isfinite.default, X),
        pw(aten.masked_fill.Tensor, ("x", "c", "z")),
        pw(aten.where.ScalarOther, ("c", "x", 0.0)), pw(aten.where.ScalarSelf, ("c", 0.0, "x")),
        pw(aten.sgn.default, X), pw(aten.frac.default, X), pw(aten.exp2.default, X, flops=4),
        pw(aten.log10.default, ("p",), flops=4), pw(aten.tan.default, X, flops=4),
        pw(aten.xlogy.Tensor, ("p", "q"), flops=4), pw(aten.rsub.Tensor, XY),
    )),
    Group("special functions, domain-limited inverses and other non-linear or non-monotone maps: shards only", NONE, (
        pw(aten.cosh.default, X, flops=4), pw(aten.acos.default, X, flops=4), pw(aten.asin.default, X, flops=4),
        pw(aten.acosh.default, ("p",), flops=4), pw(aten.atanh.default, X, flops=4), pw(aten.sinc.default, X, flops=4),
        pw(aten.erfc.default, X, flops=4), pw(aten.lgamma.default, ("p",), flops=8), pw(aten.digamma.default, ("p",), flops=8),
        pw(aten.polygamma.default, (1, "p"), (2, "p"), flops=16), pw(aten.logit.default, ("p",), flops=4),
        pw(aten.i0.default, X, flops=8), pw(aten.special_i1.default, X, flops=8), pw(aten.special_i0e.default, X, flops=8),
        pw(aten.special_i1e.default, X, flops=8), pw(aten.special_entr.default, ("p",), flops=4),
        pw(aten.special_ndtri.default, ("p",), dtypes=F64_F32, flops=8), pw(aten.special_log_ndtr.default, X, dtypes=F64_F32, flops=8),
        pw(aten.special_erfcx.default, X, dtypes=F64_F32, flops=8), pw(aten.special_xlog1py.default, ("x", "q"), flops=4),
        pw(aten.celu.default, X, flops=4), pw(aten.threshold.default, ("x", 0.1, -2.0)),
        pw(aten.signbit.default, X), pw(aten.isposinf.default, X), pw(aten.isneginf.default, X),
        pw(aten.angle.default, X), pw(aten.round.decimals, X, kwargs=({"decimals": 2},)),
        pw(aten.pow.Scalar, (2.0, "x"), flops=4), pw(aten.rsub.Scalar, ("x", 1.5)),
        pw(aten.copysign.Tensor, XY), pw(aten.fmax.default, XY), pw(aten.fmin.default, XY),
        pw(aten.heaviside.default, XY), pw(aten.fmod.Tensor, ("x", "q"), extremes=False), pw(aten.hypot.default, XY, flops=4),
        pw(aten.nextafter.default, XY), pw(aten.igamma.default, ("p", "q"), flops=16),
        pw(aten.igammac.default, ("p", "q"), flops=16), pw(aten.ldexp.Tensor, ("x", "i")),
        pw(aten.clamp_min.Tensor, XY), pw(aten.clamp_max.Tensor, XY), pw(aten.clamp.Tensor, ("x", "y", "y")),
        pw(aten.gcd.default, ("i", "i")), pw(aten.lcm.default, ("i", "i")),
        pw(aten.bitwise_left_shift.Tensor, ("i", "i")), pw(aten.bitwise_right_shift.Tensor, ("i", "i")),
    )),
)


def broadcast_dim(out_shape: tuple[int, ...], arg_shape: tuple[int, ...], d: int) -> int | None:
    """The dim of a broadcast argument matching output dim ``d``, or None
    where the argument is broadcast along it."""
    ad = d - (len(out_shape) - len(arg_shape))
    if ad < 0 or (arg_shape[ad] == 1 and out_shape[d] != 1):
        return None
    return ad


WRAPPING_ORDER = (NEGATION, ADDITIVE)
"""Tables whose max/min rows hold because ``-x`` and ``x + c`` are monotone,
which is false on integers: they wrap (uint8 ``-1 = 255``, int8 ``127 + 1 = -128``)."""


def _order_row(row: Row) -> bool:
    return any(p in (P_MAX, P_MIN) for p in row)


def pointwise_rule(partials: PartialTable) -> Callable[[OpCall], list[SingleDimStrategy]]:
    """Single-dim rule of a pointwise op: a shard per output dim (inputs split
    alike, replicated where broadcast), then the group's partial rows (the
    max/min rows of :data:`WRAPPING_ORDER` tables only on floating tensors)."""
    wraps = any(partials is table for table in WRAPPING_ORDER)

    def rule(call: OpCall) -> list[SingleDimStrategy]:
        n_out = len(call.outputs)
        out = next(m for m in call.outputs if m is not None).shape
        strategies = []
        for d in range(len(out)):
            ins = []
            for meta in call.inputs:
                ad = broadcast_dim(out, meta.shape, d)
                ins.append(R if ad is None else S(ad))
            strategies.append(SingleDimStrategy((S(d),) * n_out, tuple(ins)))
        integral = wraps and any(not (m.dtype.is_floating_point or m.dtype.is_complex)
                                 for m in list(call.inputs) + [o for o in call.outputs if o is not None])
        # every rank writes the fill value: an average all-reduce sums m copies,
        # which overflow near the dtype's range (masks of finfo.min)
        huge_fill = partials is FILL and P_AVG not in constant_kinds(call.arg("value"), call.outputs[0].dtype)
        for row in partials.get(len(call.inputs), ()):
            if (integral and _order_row(row)) or (huge_fill and P_AVG in row):
                continue
            strategies.append(SingleDimStrategy((row[0],) * n_out, tuple(row[1:])))
        return strategies

    return rule


def _samples(entry: Pointwise) -> Callable[[Sampler], Any]:
    def samples(sampler: Sampler):
        for spec in entry.specs:
            for kwargs in entry.kwargs:
                dtype = sampler.float_dtype(entry.float_only or (torch.float64, torch.float32, torch.bfloat16))
                shape = sampler.shape()
                yield SampleInput(from_spec(sampler, spec, shape=shape, dtype=dtype), dict(kwargs))

    return samples


def _to_copy_rule(call: OpCall) -> list[SingleDimStrategy]:
    """A cast keeps shards. Max and min stay only where the cast is
    non-decreasing on the whole source range (:func:`monotone_cast`: not
    float -> int, not a narrowing int -> int, never -> bool); sums and
    averages where the cast is additive up to rounding (to a float type;
    the registry's dtype check drops the others)."""
    src, dst = call.inputs[0].dtype, call.outputs[0].dtype
    strategies = pointwise_rule(NONE)(call)
    kinds = [P_MAX, P_MIN] if monotone_cast(src, dst) else []
    if dst.is_floating_point or dst.is_complex:
        kinds += [P, P_AVG]
    return strategies + [SingleDimStrategy(k, k) for k in kinds]


def _to_copy_samples(sampler: Sampler):
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int64):
        src = sampler.float_dtype()
        yield SampleInput((sampler.randn(sampler.shape(), src) * 4,), {"dtype": dtype})
    # integer sources with values outside the narrow targets' ranges: a
    # narrowing or sign-changing cast wraps, so it must not keep P(max)
    for src, dst in ((torch.int64, torch.int8), (torch.int64, torch.uint8), (torch.int32, torch.int64),
                     (torch.int64, torch.float32), (torch.bool, torch.int64)):
        values = sampler.randn(sampler.shape(), torch.float64) * 200
        x = values > 0 if src == torch.bool else values.round().to(src)
        yield SampleInput((x,), {"dtype": dst})


def register(registry: RuleRegistry) -> None:
    """Add the pointwise rules to ``registry``."""
    rule = registry.family("pointwise")
    for group in GROUPS:
        for entry in group.ops:
            # pow by a constant: FLOPs by exponent (x*x for 2), not the table's 4
            compute = pow_scalar_compute if entry.op == aten.pow.Tensor_Scalar else elementwise(entry.flops)
            rule(entry.op, compute=compute, samples=_samples(entry), note=group.why,
                 extremes=entry.extremes)(
                pointwise_rule(group.partials)
            )
    rule(aten._to_copy.default, compute=elementwise(), samples=_to_copy_samples)(_to_copy_rule)
