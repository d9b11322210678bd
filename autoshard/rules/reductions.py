"""Reductions: sum, mean, amax/amin, max/min, arg-reductions, norms, scans (cumsum, cumprod).

A tensor dim that is kept can stay split (it moves to its new position when
``keepdim`` is false). A reduced dim that is split leaves each rank with the
reduction of its slice, which is a partial value when the reduction is
associative: ``sum`` -> ``P(sum)``, ``mean`` -> ``P(avg)`` (slices of equal
size only), ``amax`` -> ``P(max)``. A partial input passes through when the
reduction commutes with the partial's own reduction (sum of sums, max of
maxes). Index-returning reductions (argmax, max.dim) never reduce a split dim:
local indices are not global ones.

>>> import torch
>>> from autoshard.rules.core import OpCall, TensorMeta
>>> x, y = TensorMeta((4, 8), torch.float32), TensorMeta((4,), torch.float32)
>>> [str(s) for s in reduction_rule(P_SUM_RULES, reduced_kind=P)(OpCall(torch.ops.aten.sum.dim_IntList, (x, [1]), {}, (x,), (y,), {"dim": [1], "keepdim": False}))]
['S*(0) <- S*(0)', 'P(sum) <- S*(1)', 'P(sum) <- P(sum)', 'P(avg) <- P(avg)']
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from autoshard.rules.compute import reduction
from autoshard.rules.core import P, P_AVG, P_MAX, P_MIN, R, OpCall, S, SingleDimStrategy
from autoshard.rules.registry import RuleRegistry, SampleInput
from autoshard.rules.samples import Sampler

__all__ = ["reduced_dims", "reduction_rule", "register"]

aten = torch.ops.aten

# Partial inputs that pass through each reduction, as (output, input).
P_SUM_RULES = ((P, P), (P_AVG, P_AVG))  # sum and mean are linear
P_MAX_RULES = ((P_MAX, P_MAX),)  # max of maxes
P_MIN_RULES = ((P_MIN, P_MIN),)  # min of mins


def reduced_dims(call: OpCall, name: str = "dim") -> set[int]:
    """Dims reduced by the call (all when the dim argument is absent or empty)."""
    n = call.inputs[0].ndim
    dims = call.bound.get(name)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return set(range(n))
    if isinstance(dims, int):
        dims = [dims]
    return {d + n if d < 0 else d for d in dims} if n else set()


def _keeps(call: OpCall) -> bool:
    return bool(call.bound.get("keepdim", False))


def reduction_rule(
    partials: Sequence[tuple[Any, Any]] = (),
    *,
    reduced_kind: Any = None,
    dim_arg: str = "dim",
    n_outputs: int | None = None,
) -> Callable[[OpCall], list[SingleDimStrategy]]:
    """Rule of a reduction: kept dims stay split; a split reduced dim gives
    ``reduced_kind`` (None: not allowed); ``partials`` pass through."""

    def rule(call: OpCall) -> list[SingleDimStrategy]:
        n = call.inputs[0].ndim
        red = reduced_dims(call, dim_arg)
        keep = _keeps(call)
        k = n_outputs or len(call.outputs)
        extra = (R,) * (len(call.inputs) - 1)
        strategies = []
        for d in range(n):
            if d in red:
                if reduced_kind is not None:
                    strategies.append(SingleDimStrategy((reduced_kind,) * k, (S(d),) + extra))
                continue
            out = d if keep else d - sum(1 for r in red if r < d)
            strategies.append(SingleDimStrategy((S(out),) * k, (S(d),) + extra))
        for out_p, in_p in partials:
            strategies.append(SingleDimStrategy((out_p,) * k, (in_p,) + extra))
        return strategies

    return rule


def _scan_rule(call: OpCall) -> list[SingleDimStrategy]:
    """cumsum: independent along every other dim; linear, so sums pass."""
    n = call.inputs[0].ndim
    dim = call.arg("dim") % max(n, 1)
    return [SingleDimStrategy(S(d), S(d)) for d in range(n) if d != dim] + [
        SingleDimStrategy(p, p) for p in (P, P_AVG)
    ]


def _scan_only_rule(call: OpCall) -> list[SingleDimStrategy]:
    """cumprod, logcumsumexp, cummax/cummin (values and indices):
    independent along every other dim; not linear, so no partial passes."""
    n = call.inputs[0].ndim
    dim = call.arg("dim") % max(n, 1)
    k = len(call.outputs)
    return [SingleDimStrategy((S(d),) * k, S(d)) for d in range(n) if d != dim]


def _histc_rule(call: OpCall) -> list[SingleDimStrategy]:
    """histc: counts of the elements of each slice add up to the counts of
    the whole, but only over a fixed range: with ``min == max`` each rank
    would take its own slice's data range as the bins."""
    lo, hi = call.arg("min", 0), call.arg("max", 0)
    if not lo < hi:
        return []
    return [SingleDimStrategy(P, S(d)) for d in range(call.inputs[0].ndim)]


def _assert_rule(call: OpCall) -> list[SingleDimStrategy]:
    """_assert_async reads one flag; it has no output and nothing to split."""
    return []


# ------------------------------------------------------------------ samples


def _dims_samples(kind: str, *, dtypes=None, values=None) -> Callable[[Sampler], Any]:
    """Samples with a dim list (``kind="list"``), one dim (``"int"``) or none (``"none"``)."""

    def samples(sampler: Sampler):
        for variant in range(3):
            shape = sampler.shape(min_ndim=2)
            dtype = sampler.float_dtype(dtypes or (torch.float64, torch.float32, torch.bfloat16))
            x = values(sampler, shape) if values else sampler.randn(shape, dtype)
            n = len(shape)
            if kind == "none":
                yield SampleInput((x,), {})
                continue
            keep = bool(variant % 2)
            if kind == "int":
                yield SampleInput((x, sampler.randint(-n, n - 1), keep), {})
            else:
                dims = sorted(sampler.rng.sample(range(n), sampler.randint(1, n)))
                if variant == 2:
                    dims = [d - n for d in dims]
                yield SampleInput((x, dims, keep), {})

    return samples


def _bool_values(sampler: Sampler, shape: tuple[int, ...]) -> torch.Tensor:
    return sampler.bool(shape, p_true=0.9)


def _norm_samples(sampler: Sampler):
    for ord_ in (2, 1):
        shape = sampler.shape(min_ndim=2)
        yield SampleInput((sampler.randn(shape, sampler.float_dtype()), ord_, [len(shape) - 1], False), {})


def _norm_dim_samples(sampler: Sampler):
    """norm.ScalarOpt_dim(x, p, dim, keepdim): a p-norm over some dims."""
    for p, keep in ((2, False), (1, True), (float("inf"), False), (3.0, True)):
        shape = sampler.shape(min_ndim=2)
        dims = sorted(sampler.rng.sample(range(len(shape)), sampler.randint(1, len(shape) - 1)))
        yield SampleInput((sampler.randn(shape, sampler.float_dtype()), p, dims, keep), {})


def _count_samples(kind: str) -> Callable[[Sampler], Any]:
    """count_nonzero(x, dims) / count_nonzero(x, dim=None): no keepdim; zeros among the values."""

    def samples(sampler: Sampler):
        for variant in range(3):
            shape = sampler.shape(min_ndim=2)
            x = sampler.randn(shape, sampler.float_dtype()).round()  # about a third are zero
            n = len(shape)
            if kind == "list":
                yield SampleInput((x, sorted(sampler.rng.sample(range(n), sampler.randint(1, n)))), {})
            else:
                yield SampleInput((x,) if variant == 2 else (x, sampler.randint(-n, n - 1)), {})

    return samples


def _kth_samples(sampler: Sampler):
    for keep in (False, True):
        shape = sampler.shape(min_ndim=2)
        dim = sampler.randint(-len(shape), len(shape) - 1)
        x = sampler.permutation(int(torch.tensor(shape).prod())).reshape(shape).to(torch.float64)  # no ties
        yield SampleInput((x, sampler.randint(1, shape[dim]), dim, keep), {})


def _var_samples(sampler: Sampler):
    for keep in (False, True):
        shape = sampler.shape(min_ndim=2)
        yield SampleInput((sampler.randn(shape, torch.float64), [len(shape) - 1]), {"correction": 1, "keepdim": keep})


def _cumsum_samples(sampler: Sampler):
    for _ in range(2):
        shape = sampler.shape(min_ndim=2)
        yield SampleInput((sampler.randn(shape, sampler.float_dtype()), sampler.randint(-len(shape), len(shape) - 1)), {})


def _histc_samples(sampler: Sampler):
    for lo, hi in ((0, 3), (-1.5, 1.5), (0, 0)):
        x = sampler.randn(sampler.shape(), sampler.float_dtype((torch.float64, torch.float32)))
        # integers in [lo, hi] as in MoE token counts, exactly on bin edges too
        values = x.round().clamp(-2, 4) if lo == 0 else x
        yield SampleInput((values, sampler.choice((2, 4, 5)), lo, hi), {})


def _assert_samples(sampler: Sampler):
    yield SampleInput((torch.tensor(True), "never raised"), {})


def register(registry: RuleRegistry) -> None:
    """Add the reduction rules to ``registry``."""
    rule = registry.family("reductions")
    red = reduction()
    rule(aten.sum.default, compute=red, samples=_dims_samples("none"))(reduction_rule(P_SUM_RULES, reduced_kind=P))
    rule(aten.sum.dim_IntList, compute=red, samples=_dims_samples("list"))(reduction_rule(P_SUM_RULES, reduced_kind=P))
    # mean of slices averages to the mean only when the slices are equal in size.
    rule(aten.mean.default, compute=red, samples=_dims_samples("none"), uneven=False)(
        reduction_rule(P_SUM_RULES, reduced_kind=P_AVG))
    rule(aten.mean.dim, compute=red, samples=_dims_samples("list"), uneven=False)(
        reduction_rule(P_SUM_RULES, reduced_kind=P_AVG))
    rule(aten.amax.default, compute=red, samples=_dims_samples("list"))(reduction_rule(P_MAX_RULES, reduced_kind=P_MAX))
    rule(aten.amin.default, compute=red, samples=_dims_samples("list"))(reduction_rule(P_MIN_RULES, reduced_kind=P_MIN))
    rule(aten.max.default, compute=red, samples=_dims_samples("none"))(reduction_rule(P_MAX_RULES, reduced_kind=P_MAX))
    rule(aten.min.default, compute=red, samples=_dims_samples("none"))(reduction_rule(P_MIN_RULES, reduced_kind=P_MIN))
    # values with indices: a split reduced dim would give local indices.
    rule(aten.max.dim, compute=red, samples=_dims_samples("int", dtypes=(torch.float64,)))(reduction_rule())
    rule(aten.min.dim, compute=red, samples=_dims_samples("int", dtypes=(torch.float64,)))(reduction_rule())
    rule(aten.argmax.default, compute=red, samples=_dims_samples("int", dtypes=(torch.float64,)))(reduction_rule())
    rule(aten.argmin.default, compute=red, samples=_dims_samples("int", dtypes=(torch.float64,)))(reduction_rule())
    # all = min over booleans, any = max over booleans.
    rule(aten.all.default, compute=red, samples=_dims_samples("none", values=_bool_values))(
        reduction_rule(P_MIN_RULES, reduced_kind=P_MIN))
    rule(aten.any.default, compute=red, samples=_dims_samples("none", values=_bool_values))(
        reduction_rule(P_MAX_RULES, reduced_kind=P_MAX))
    rule(aten.all.dim, compute=red, samples=_dims_samples("int", values=_bool_values))(
        reduction_rule(P_MIN_RULES, reduced_kind=P_MIN))
    rule(aten.any.dim, compute=red, samples=_dims_samples("int", values=_bool_values))(
        reduction_rule(P_MAX_RULES, reduced_kind=P_MAX))
    rule(aten.logsumexp.default, compute=reduction(4.0), samples=_dims_samples("list"))(reduction_rule())
    rule(aten.linalg_vector_norm.default, compute=reduction(2.0), samples=_norm_samples)(reduction_rule())
    rule(aten.var.correction, compute=reduction(3.0), samples=_var_samples)(reduction_rule())
    rule(aten.std.correction, compute=reduction(3.0), samples=_var_samples)(reduction_rule())
    rule(aten.cumsum.default, compute=red, samples=_cumsum_samples)(_scan_rule)
    for op in (aten.cumprod.default, aten.logcumsumexp.default, aten.cummax.default, aten.cummin.default):
        rule(op, compute=red, samples=_cumsum_samples)(_scan_only_rule)
    # counts and nan-skipping sums of slices add up (no pass-through: pieces of
    # a partial input are not the values whose zeros or NaNs are counted)
    rule(aten.count_nonzero.dim_IntList, compute=red, samples=_count_samples("list"))(reduction_rule(reduced_kind=P))
    rule(aten.count_nonzero.default, compute=red, samples=_count_samples("int"))(reduction_rule(reduced_kind=P))
    rule(aten.nansum.default, compute=red, samples=_dims_samples("list"))(reduction_rule(reduced_kind=P))
    # two outputs, or a product or an order statistic of slices: kept dims only
    rule(aten.prod.dim_int, compute=red, samples=_dims_samples("int"))(reduction_rule())
    for op in (aten.var_mean.correction, aten.std_mean.correction):
        rule(op, compute=reduction(3.0), samples=_var_samples)(reduction_rule())
    for op in (aten.mode.default, aten.median.dim, aten.nanmedian.dim, aten.kthvalue.default):
        rule(op, compute=reduction(8.0), samples=_kth_samples if op is aten.kthvalue.default else _dims_samples(
            "int", dtypes=(torch.float64,)))(reduction_rule())
    # a norm of slices is not a piece of the norm (not additive): kept dims only
    rule(aten.norm.ScalarOpt_dim, compute=reduction(2.0), samples=_norm_dim_samples)(reduction_rule())
    rule(aten.histc.default, compute=red, samples=_histc_samples)(_histc_rule)
    rule(aten._assert_async.msg, compute=red, samples=_assert_samples)(_assert_rule)
