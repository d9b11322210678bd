"""Embedding and indexing: embedding (+backward), index_select, gather,
scatter, scatter_add, scatter_reduce, index_add, index_reduce, index, index_put, and the selection ops
topk/sort that MoE routing uses.

Two kinds of split are exact with a plain local kernel:

* *data* dims (the embedding dim, rows not indexed): split the table and the
  result alike; indices replicated;
* *index* dims: split the indices (and whatever is laid out like them) and
  the result alike, with the indexed tensor replicated, since every rank looks
  up its own indices in the whole table.

Splitting the *indexed* dim of the table (vocab-parallel embedding) is not
local: an index outside a rank's range must be masked, which a plain kernel
does not do, so there is no such rule. Scatter-like ops sum their updates, so
updates split along the index dim give ``P(sum)`` outputs when the target is
itself partial (each rank adds its updates to its piece).

>>> import torch
>>> from autoshard.rules.core import OpCall, TensorMeta
>>> w, i, o = TensorMeta((10, 8), torch.float32), TensorMeta((4, 6), torch.long), TensorMeta((4, 6, 8), torch.float32)
>>> [str(s) for s in embedding_rule(OpCall(torch.ops.aten.embedding.default, (w, i), {}, (w, i), (o,)))]
['S*(2) <- S*(1), R', 'S*(0) <- R, S*(0)', 'S*(1) <- R, S*(1)', 'P(sum) <- P(sum), R', 'P(avg) <- P(avg), R', 'P(max) <- P(max), R', 'P(min) <- P(min), R']
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from autoshard.rules.compute import (embedding_backward_compute, gather_compute, index_add_compute, index_put_compute,
                                     reduction, scatter_compute)
from autoshard.rules.core import P, P_AVG, P_MAX, P_MIN, R, OpCall, S, SingleDimStrategy
from autoshard.rules.matmul import broadcast_placement
from autoshard.rules.registry import RuleRegistry, SampleInput
from autoshard.rules.samples import Sampler

__all__ = ["embedding_rule", "register"]

aten = torch.ops.aten
ALL = (P, P_AVG, P_MAX, P_MIN)


def embedding_rule(call: OpCall) -> list[SingleDimStrategy]:
    """embedding(weight [V, D], indices [...]) -> [..., D]."""
    w, idx = call.inputs
    strategies = [SingleDimStrategy(S(idx.ndim), (S(1), R))]
    strategies += [SingleDimStrategy(S(d), (R, S(d))) for d in range(idx.ndim)]
    return strategies + [SingleDimStrategy(k, (k, R)) for k in ALL]


def embedding_backward_rule(call: OpCall) -> list[SingleDimStrategy]:
    """embedding_dense_backward(grad [..., D], indices [...]) -> [V, D]: tokens
    split -> partial rows of the table gradient (not with scale_grad_by_freq,
    whose counts would be local)."""
    grad, idx = call.inputs
    strategies = [SingleDimStrategy(S(1), (S(grad.ndim - 1), R))]
    if not call.arg("scale_grad_by_freq", False):
        strategies += [SingleDimStrategy(P, (S(d), S(d))) for d in range(idx.ndim)]
    return strategies + [SingleDimStrategy(k, (k, R)) for k in (P, P_AVG)]


def _dim(call: OpCall) -> int:
    return call.arg("dim") % max(call.inputs[0].ndim, 1)


def index_select_rule(call: OpCall) -> list[SingleDimStrategy]:
    """index_select(x, dim, index[k]): other dims of x, or the index."""
    x, idx = call.inputs
    dim = _dim(call)
    strategies = [SingleDimStrategy(S(d), (S(d), R)) for d in range(x.ndim) if d != dim]
    if x.ndim and idx.ndim:  # a 0-D x gives a 0-D result: nothing to split
        strategies.append(SingleDimStrategy(S(dim), (R, S(0))))
    return strategies + [SingleDimStrategy(k, (k, R)) for k in ALL]


def gather_rule(call: OpCall) -> list[SingleDimStrategy]:
    """gather(x, dim, index): out[..i..] = x[..index[..i..]..] along dim.
    The index can be split along ``dim`` (x replicated); other dims need x and
    index split alike (their positions are used as they are)."""
    x, idx = call.inputs
    dim = _dim(call)
    strategies = [SingleDimStrategy(S(dim), (R, S(dim)))] if idx.ndim else []  # the result is shaped like idx
    strategies += [SingleDimStrategy(S(d), (S(d), S(d))) for d in range(min(x.ndim, idx.ndim))
                   if d != dim and x.shape[d] == idx.shape[d]]
    return strategies + [SingleDimStrategy(k, (k, R)) for k in ALL]


def scatter_rule(call: OpCall) -> list[SingleDimStrategy]:
    """scatter / scatter_add (self, dim, index, src): other dims split alike;
    scatter_add (a sum) also takes updates split along ``dim`` into a partial target."""
    metas = call.inputs
    x = metas[0]
    dim = _dim(call)
    # 0-D operands (scatter_add(f32[], 0, i64[], f32[])) have no dim to split
    same = [d for d in range(x.ndim) if d != dim and all(m.ndim > d for m in metas)
            and len({m.shape[d] for m in metas}) == 1]
    strategies = [SingleDimStrategy(S(d), (S(d),) * len(metas)) for d in same]
    adds = call.op in (aten.scatter_add.default, aten.scatter_reduce.two) and call.arg("reduce", "sum") == "sum"
    if call.op is aten.scatter.value:
        kinds = (P_AVG, P_MAX, P_MIN)  # the same value on every rank
    elif adds:
        kinds = (P, P_AVG)
    else:
        kinds = ALL
    for k in kinds:
        strategies.append(SingleDimStrategy(k, (k, R) + (k,) * (len(metas) - 2)))
    if adds and len(metas) == 3 and min(m.ndim for m in metas) > dim and metas[1].shape[dim] == metas[2].shape[dim]:
        strategies.append(SingleDimStrategy(P, (P, S(dim), S(dim))))
    return strategies


def index_add_rule(call: OpCall) -> list[SingleDimStrategy]:
    """index_add(self, dim, index[k], source): dims other than ``dim`` split
    alike; sources split along ``dim`` with their indices add into a partial target."""
    x, _, src = call.inputs
    dim = _dim(call)
    strategies = [SingleDimStrategy(S(d), (S(d), R, S(d))) for d in range(x.ndim) if d != dim]
    strategies += [SingleDimStrategy(k, (k, R, k)) for k in (P, P_AVG)]
    if src.ndim and call.inputs[1].ndim:  # index_add(f32[], 0, i64[1], f32[]): nothing to split
        strategies.append(SingleDimStrategy(P, (P, S(0), S(dim))))
    return strategies


_ORDER_PARTIAL = {"amax": P_MAX, "amin": P_MIN}


def _reduce_partials(k: object, n_in: int, include_self: bool, updates_split: tuple | None) -> list[SingleDimStrategy]:
    """Partials of scatter_reduce / index_reduce with ``reduce`` amax (amin):
    a max of maxes, so ``P(max)`` on self, on the updates or on both passes
    (every rank reduces its pieces; ranks without an update at a position
    keep self's piece, which the max over ranks absorbs). Updates split along
    ``dim`` (``updates_split``: their placements) need ``include_self``:
    without it a rank with no update at a position would output its self
    piece there, which is not part of the result."""
    rows = [SingleDimStrategy(k, (k, R, k)), SingleDimStrategy(k, (k, R, R)), SingleDimStrategy(k, (R, R, k))]
    if include_self and updates_split is not None:
        rows += [SingleDimStrategy(k, (k,) + updates_split), SingleDimStrategy(k, (R,) + updates_split)]
    return rows if n_in == 3 else []


def scatter_reduce_rule(call: OpCall) -> list[SingleDimStrategy]:
    """scatter_reduce.two(self, dim, index, src, reduce, include_self): dims
    other than ``dim`` split alike where the three tensors agree; ``sum``
    keeps sum and average partials (linear), and with ``include_self`` takes
    updates split along ``dim`` into a partial target; ``amax``/``amin`` as
    in :func:`_reduce_partials`; ``prod`` and ``mean`` no partial."""
    metas = call.inputs
    x, idx, src = metas
    dim = _dim(call)
    reduce, include_self = call.arg("reduce"), bool(call.arg("include_self", True))
    same = [d for d in range(x.ndim) if d != dim and all(m.ndim > d for m in metas)
            and len({m.shape[d] for m in metas}) == 1]
    strategies = [SingleDimStrategy(S(d), (S(d),) * 3) for d in same]
    split = (S(dim), S(dim)) if min(m.ndim for m in metas) > dim and idx.shape[dim] == src.shape[dim] else None
    if reduce == "sum":
        strategies += [SingleDimStrategy(k, (k, R, k)) for k in (P, P_AVG)]
        if include_self and split is not None:
            strategies.append(SingleDimStrategy(P, (P,) + split))
    elif reduce in _ORDER_PARTIAL:
        strategies += _reduce_partials(_ORDER_PARTIAL[reduce], 3, include_self, split)
    return strategies


def index_reduce_rule(call: OpCall) -> list[SingleDimStrategy]:
    """index_reduce(self, dim, index[k], source, reduce, include_self): dims
    other than ``dim`` split on self and source alike (index replicated);
    ``amax``/``amin`` keep their order partials (:func:`_reduce_partials`);
    ``prod`` and ``mean`` none."""
    x, idx, src = call.inputs
    dim = _dim(call)
    strategies = [SingleDimStrategy(S(d), (S(d), R, S(d))) for d in range(x.ndim) if d != dim]
    reduce = call.arg("reduce")
    if reduce in _ORDER_PARTIAL:
        split = (S(0), S(dim)) if src.ndim and idx.ndim else None
        strategies += _reduce_partials(_ORDER_PARTIAL[reduce], 3, bool(call.arg("include_self", True)), split)
    return strategies


def index_reduce_reference(self: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, reduce: str,
                           *, include_self: bool = True) -> torch.Tensor:
    """``aten.index_reduce`` with half-precision operands reduced in float32
    and rounded once: torch 2.13's CPU kernel raises an internal assert for
    float16 ``prod`` when ``self`` has one row, which a shard often has.

    >>> index_reduce_reference(torch.ones(1, 4, dtype=torch.float16), 1, torch.tensor([0, 0]), torch.full((1, 2), 2.0, dtype=torch.float16), "prod")
    tensor([[4., 1., 1., 1.]], dtype=torch.float16)
    """
    if self.dtype in (torch.float16, torch.bfloat16) and source.dtype == self.dtype:
        out = torch.ops.aten.index_reduce.default(self.float(), dim, index, source.float(), reduce, include_self=include_self)
        return out.to(self.dtype)
    return torch.ops.aten.index_reduce.default(self, dim, index, source, reduce, include_self=include_self)


def _index_layout(call: OpCall) -> tuple[int, int, tuple[int, ...], bool] | None:
    """(first indexed dim ``a``, number of x dims consumed, index result shape,
    whether the indices are boolean masks) when the index tensors are
    consecutive (``x[:, i, j]``); else None. A mask consumes as many dims as
    it has and yields one dim of data-dependent size."""
    indices = call.bound.get("indices")
    pos = [n for n, t in enumerate(indices) if t is not None]
    if not pos or pos != list(range(pos[0], pos[0] + len(pos))):
        return None
    metas = [indices[n] for n in pos]
    if any(m.dtype in (torch.bool, torch.uint8) for m in metas):
        return pos[0], sum(m.ndim for m in metas), (-1,), True
    shape = torch.broadcast_shapes(*[tuple(m.shape) for m in metas])
    return pos[0], len(pos), tuple(shape), False


def index_rule(call: OpCall) -> list[SingleDimStrategy]:
    """index(x, [None.., i, j, ..]): result = x dims before, index dims, x dims after."""
    x = call.inputs[0]
    idx_metas = call.inputs[1:]
    layout = _index_layout(call)
    strategies = [SingleDimStrategy(k, (k,) + (R,) * len(idx_metas)) for k in ALL]
    if layout is None:
        return strategies
    a, k, ishape, masks = layout
    for d in range(x.ndim):
        if a <= d < a + k:
            continue
        out = d if d < a else d - k + len(ishape)
        strategies.append(SingleDimStrategy(S(out), (S(d),) + (R,) * len(idx_metas)))
    if masks:  # which rows a split mask keeps is only known at run time
        return strategies
    for j in range(len(ishape)):
        ins = tuple(broadcast_placement(S(j), ishape, m.shape) for m in idx_metas)
        strategies.append(SingleDimStrategy(S(a + j), (R,) + ins))
    return strategies


def index_put_rule(call: OpCall) -> list[SingleDimStrategy]:
    """index_put(x, indices, values, accumulate): non-indexed dims split on x
    and values alike; with accumulate, values split with their indices add
    into a partial target."""
    x, values = call.inputs[0], call.inputs[-1]
    idx_metas = call.inputs[1:-1]
    layout = _index_layout(call)
    accumulate = bool(call.arg("accumulate", False))
    kinds = (P, P_AVG) if accumulate else ALL
    strategies = [SingleDimStrategy(k, (k,) + (R,) * len(idx_metas) + (k,)) for k in kinds]
    if layout is None:
        return strategies
    a, k, ishape, masks = layout
    if masks:
        return strategies
    target = tuple(x.shape[:a]) + ishape + tuple(x.shape[a + k :])  # what values broadcast to
    for d in range(x.ndim):
        if a <= d < a + k:
            continue
        pos = d if d < a else d - k + len(ishape)
        vals = broadcast_placement(S(pos), target, values.shape)
        strategies.append(SingleDimStrategy(S(d), (S(d),) + (R,) * len(idx_metas) + (vals,)))
    if accumulate:
        for j in range(len(ishape)):
            ins = tuple(broadcast_placement(S(j), ishape, m.shape) for m in idx_metas)
            vals = broadcast_placement(S(a + j), target, values.shape)
            if vals is not R:
                strategies.append(SingleDimStrategy(P, (P,) + ins + (vals,)))
    return strategies


def selection_rule(call: OpCall) -> list[SingleDimStrategy]:
    """topk / sort / argsort along ``dim``: split any other dim."""
    n = call.inputs[0].ndim
    dim = call.arg("dim", -1) % max(n, 1)
    k = len(call.outputs)
    return [SingleDimStrategy((S(d),) * k, S(d)) for d in range(n) if d != dim]


# ------------------------------------------------------------------ samples


def _fdtype(sampler: Sampler) -> torch.dtype:
    return sampler.float_dtype((torch.float64, torch.float32))


def _embedding_samples(sampler: Sampler):
    for ndim in (1, 2):
        v, d = sampler.size(), sampler.size()
        yield SampleInput((sampler.randn((v, d), sampler.float_dtype()), sampler.index(sampler.shape(ndim), v)), {})


def _embedding_backward_samples(sampler: Sampler):
    for freq in (False, True):
        v, d = sampler.size(), sampler.size()
        idx = sampler.index(sampler.shape(2), v)
        yield SampleInput((sampler.randn(tuple(idx.shape) + (d,), _fdtype(sampler)), idx, v, -1, freq), {})


def _index_select_samples(sampler: Sampler):
    for _ in range(2):
        shape = sampler.shape(min_ndim=2)
        dim = sampler.rng.randrange(len(shape))
        idx = sampler.index((sampler.size(),), shape[dim])
        yield SampleInput((sampler.randn(shape, sampler.float_dtype()), dim, idx), {})


def _gather_samples(sampler: Sampler):
    for _ in range(2):
        shape = sampler.shape(min_ndim=2)
        dim = sampler.rng.randrange(len(shape))
        ishape = list(shape)
        ishape[dim] = sampler.size()
        yield SampleInput((sampler.randn(shape, _fdtype(sampler)), dim, sampler.index(ishape, shape[dim])), {})


def _scatter_samples(kind: str) -> Callable[[Sampler], Any]:
    def samples(sampler: Sampler):
        for _ in range(2):
            shape = sampler.shape(min_ndim=2)
            dim = sampler.rng.randrange(len(shape))
            ishape = list(shape)
            ishape[dim] = sampler.size()
            dtype = _fdtype(sampler)
            x = sampler.randn(shape, dtype)
            if kind == "scatter":
                # distinct targets per column: the winner of duplicates is unspecified
                idx = torch.stack([sampler.permutation(shape[dim])[: min(ishape[dim], shape[dim])] for _ in range(1)]).squeeze(0)
                ishape[dim] = idx.numel()
                view = [1] * len(shape)
                view[dim] = idx.numel()
                index = idx.view(view).expand(ishape).contiguous()
                yield SampleInput((x, dim, index, sampler.randn(ishape, dtype)), {})
            elif kind == "value":
                yield SampleInput((x, dim, sampler.index(ishape, shape[dim]), 0.5), {})
            else:
                yield SampleInput((x, dim, sampler.index(ishape, shape[dim]), sampler.randn(ishape, dtype)), {})

    return samples


def _index_add_samples(sampler: Sampler):
    for alpha in (1, 2):
        shape = sampler.shape(min_ndim=2)
        dim = sampler.rng.randrange(len(shape))
        n = sampler.size()
        src_shape = list(shape)
        src_shape[dim] = n
        dtype = _fdtype(sampler)
        yield SampleInput((sampler.randn(shape, dtype), dim, sampler.index((n,), shape[dim]), sampler.randn(src_shape, dtype)), {"alpha": alpha})


def _scatter_reduce_samples(sampler: Sampler):
    for reduce in ("sum", "amax", "amin", "prod", "mean"):
        shape = sampler.shape(min_ndim=2)
        dim = sampler.rng.randrange(len(shape))
        ishape = list(shape)
        ishape[dim] = sampler.size()
        dtype = _fdtype(sampler)
        index = sampler.index(ishape, shape[dim])
        yield SampleInput((sampler.randn(shape, dtype), dim, index, sampler.randn(ishape, dtype), reduce),
                          {"include_self": sampler.choice((True, False))})


def _index_reduce_samples(sampler: Sampler):
    for reduce in ("amax", "amin", "prod", "mean"):
        shape = sampler.shape(min_ndim=2)
        dim = sampler.rng.randrange(len(shape))
        n = sampler.size()
        src_shape = list(shape)
        src_shape[dim] = n
        dtype = _fdtype(sampler)
        yield SampleInput((sampler.randn(shape, dtype), dim, sampler.index((n,), shape[dim]),
                           sampler.randn(src_shape, dtype), reduce), {"include_self": sampler.choice((True, False))})


def _index_samples(sampler: Sampler):
    for lead in (0, 1):
        shape = sampler.shape(3)
        ishape = sampler.shape(sampler.randint(1, 2))
        idx = [None] * lead + [sampler.index(ishape, shape[lead])]
        if sampler.rng.random() < 0.5:
            idx.append(sampler.index(ishape[-1:], shape[lead + 1]))
        yield SampleInput((sampler.randn(shape, sampler.float_dtype()), idx), {})
    shape = sampler.shape(3)
    yield SampleInput((sampler.randn(shape, sampler.float_dtype()), [sampler.bool(shape[:1])]), {})


def _index_put_samples(sampler: Sampler):
    for accumulate in (True, False):
        shape = sampler.shape(3)
        dtype = _fdtype(sampler)
        if accumulate:
            ishape = sampler.shape(1)
            idx = [sampler.index(ishape, shape[0])]
        else:  # distinct rows: which duplicate wins is unspecified
            n = min(sampler.size(), shape[0])
            idx = [sampler.permutation(shape[0])[:n]]
            ishape = (n,)
        values = sampler.randn(tuple(ishape) + shape[1:], dtype)
        yield SampleInput((sampler.randn(shape, dtype), idx, values, accumulate), {})


def _selection_samples(kind: str) -> Callable[[Sampler], Any]:
    def samples(sampler: Sampler):
        for _ in range(2):
            shape = sampler.shape(min_ndim=2)
            dim = sampler.randint(-len(shape), len(shape) - 1)
            # distinct values: ties would make the order of indices unspecified
            x = sampler.permutation(int(torch.tensor(shape).prod())).reshape(shape).to(torch.float64)
            if kind == "topk":
                yield SampleInput((x, sampler.randint(1, shape[dim]), dim, sampler.choice((True, False))), {})
            elif kind == "stable":
                yield SampleInput((x,), {"stable": True, "dim": dim, "descending": sampler.choice((True, False))})
            else:
                yield SampleInput((x, dim, sampler.choice((True, False))), {})

    return samples


def register(registry: RuleRegistry) -> None:
    """Add the embedding and indexing rules to ``registry``."""
    rule = registry.family("indexing")
    # compute: what the kernels touch (autoshard.rules.compute), not every operand's bytes
    rule(aten.embedding.default, compute=gather_compute(), samples=_embedding_samples)(embedding_rule)
    rule(aten.embedding_dense_backward.default, compute=embedding_backward_compute,
         samples=_embedding_backward_samples)(embedding_backward_rule)
    rule(aten.index_select.default, compute=gather_compute(), samples=_index_select_samples)(index_select_rule)
    rule(aten.gather.default, compute=gather_compute(), samples=_gather_samples)(gather_rule)
    rule(aten.scatter.src, compute=scatter_compute(touch=2), samples=_scatter_samples("scatter"))(scatter_rule)
    rule(aten.scatter.value, compute=scatter_compute(touch=1), samples=_scatter_samples("value"))(scatter_rule)
    rule(aten.scatter_add.default, compute=scatter_compute(touch=3), samples=_scatter_samples("add"))(scatter_rule)
    rule(aten.index_add.default, compute=index_add_compute, samples=_index_add_samples)(index_add_rule)
    # scatter_reduce / index_reduce read and write what scatter_add / index_add do
    rule(aten.scatter_reduce.two, compute=scatter_compute(touch=3), samples=_scatter_reduce_samples)(scatter_reduce_rule)
    rule(aten.index_reduce.default, compute=index_add_compute, samples=_index_reduce_samples,
         reference=index_reduce_reference,
         note="validated on a reference: the CPU kernel asserts on float16 prod with a one-row self")(index_reduce_rule)
    rule(aten.index.Tensor, compute=gather_compute(), samples=_index_samples)(index_rule)
    rule(aten.index_put.default, compute=index_put_compute, samples=_index_put_samples)(index_put_rule)
    rule(aten.topk.default, compute=reduction(4.0), samples=_selection_samples("topk"))(selection_rule)
    rule(aten.sort.default, compute=reduction(8.0), samples=_selection_samples("sort"))(selection_rule)
    rule(aten.sort.stable, compute=reduction(8.0), samples=_selection_samples("stable"))(selection_rule)
    rule(aten.argsort.stable, compute=reduction(8.0), samples=_selection_samples("stable"))(selection_rule)
