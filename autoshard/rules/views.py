"""View ops: reshape/view, transpose/permute, squeeze/unsqueeze, expand, and the
complex/real reinterpretations (and ``_conj``). Views only move data around, so every partial
passes through unchanged; what a rule must get right is where a shard goes.

Reshapes are shape-dependent: the rule is evaluated per mesh dim on the local
shapes left by the mesh dims before it. The input and output dims are cut into
groups of equal size product (``[B, S, H] -> [B*S, H]``: ``{B,S}->{B*S}``,
``{H}->{H}``; size-1 dims are ignored), and within a group:

* ``S(first in dim)`` <-> ``S(first out dim)``: both split the group's flat
  range into the same contiguous chunks (sizes divisible by the mesh dim);
* merge (k dims -> 1): a shard of a later input dim ``i_t`` becomes a strided
  shard ``_S(out, sf=prod(sizes before i_t))``: each rank holds one chunk of
  every row of the outer dims (``S(1)`` of ``[B,S,H]`` -> ``_S(0,sf=B)``);
  a strided input ``_S(i_t, sf=s)`` multiplies the factor by ``s``;
* split (1 dim -> l): the inverse, ``_S(in, sf=prod(sizes before o_t) * s)`` ->
  ``_S(o_t, sf=s)`` (``S(o_t)`` when ``s == 1``).

Views are exact only on even splits (``uneven=False``).

>>> groups = reshape_groups((2, 3, 4), (6, 4))
>>> groups
[((0, 1), (0,)), ((2,), (1,))]
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch

from costmodel.placements import Shard, StridedShard

from autoshard.rules.compute import copy, view
from autoshard.rules.core import P, P_AVG, P_MAX, P_MIN, R, OpCall, S, SingleDimStrategy
from autoshard.rules.registry import RuleRegistry, SampleInput
from autoshard.rules.samples import Sampler

__all__ = ["reshape_groups", "reshape_rule", "register", "ALL_PARTIALS", "identity_partials"]

aten = torch.ops.aten
ALL_PARTIALS = (P, P_AVG, P_MAX, P_MIN)


def identity_partials(n_in: int = 1, n_out: int = 1, kinds: Sequence[Any] = ALL_PARTIALS) -> list[SingleDimStrategy]:
    """``P(k)`` in, ``P(k)`` out for each kind: the op moves values, never combines them."""
    return [SingleDimStrategy((k,) * n_out, (k,) * n_in) for k in kinds]


def reshape_groups(src: Sequence[int], dst: Sequence[int]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Groups of (input dims, output dims) with equal size products, size-1 dims left out."""
    a = [i for i, s in enumerate(src) if s != 1]
    b = [j for j, s in enumerate(dst) if s != 1]
    groups = []
    i = j = 0
    while i < len(a) and j < len(b):
        gi, gj = [a[i]], [b[j]]
        pa, pb = src[a[i]], dst[b[j]]
        i += 1
        j += 1
        while pa != pb:
            if pa < pb:
                if i >= len(a):
                    raise ValueError(f"reshape {tuple(src)} -> {tuple(dst)}: sizes do not match")
                pa *= src[a[i]]
                gi.append(a[i])
                i += 1
            else:
                if j >= len(b):
                    raise ValueError(f"reshape {tuple(src)} -> {tuple(dst)}: sizes do not match")
                pb *= dst[b[j]]
                gj.append(b[j])
                j += 1
        groups.append((tuple(gi), tuple(gj)))
    return groups


def _shard(dim: int, sf: int) -> Shard | StridedShard:
    return Shard(dim) if sf == 1 else StridedShard(dim, sf)


def reshape_rule(call: OpCall) -> list[SingleDimStrategy]:
    """Single-dim rule of a reshape on the (local) shapes in ``call`` (module docstring)."""
    src, dst = call.inputs[0].shape, call.outputs[0].shape
    strategies: list[SingleDimStrategy] = []
    for ins, outs in reshape_groups(src, dst):
        if len(ins) == 1 and len(outs) == 1:
            strategies.append(SingleDimStrategy(S(outs[0]), S(ins[0])))
            continue
        strategies.append(SingleDimStrategy(Shard(outs[0]), Shard(ins[0])))
        if len(outs) == 1:  # merge
            for t in range(1, len(ins)):
                before = math.prod(src[d] for d in ins[:t])
                for s in _factors(src[ins[t]]):
                    strategies.append(SingleDimStrategy(StridedShard(outs[0], before * s), _shard(ins[t], s)))
            for s in _factors(src[ins[0]]):
                if s > 1:
                    strategies.append(SingleDimStrategy(StridedShard(outs[0], s), StridedShard(ins[0], s)))
        if len(ins) == 1:  # split
            for t in range(1, len(outs)):
                before = math.prod(dst[d] for d in outs[:t])
                for s in _factors(dst[outs[t]]):
                    strategies.append(SingleDimStrategy(_shard(outs[t], s), StridedShard(ins[0], before * s)))
            for s in _factors(dst[outs[0]]):
                if s > 1:
                    strategies.append(SingleDimStrategy(StridedShard(outs[0], s), StridedShard(ins[0], s)))
    return strategies + identity_partials()


def _factors(n: int) -> list[int]:
    """Extra split factors ``s`` of an input that is itself strided within a
    merged or split dim. Only ``s = 1`` is enumerated: the strided shards that
    reshapes of real models produce are the direct ones (``S(1)`` of
    ``[B, S, H]`` -> ``_S(0, sf=B)`` and back), and each factor adds a
    strategy to every reshape node."""
    return [1]


def _localize_size(args: tuple, kwargs: dict, local: OpCall) -> tuple[tuple, dict]:
    """The size argument (position 1) becomes the local output shape."""
    return (args[0], list(local.outputs[0].shape)) + tuple(args[2:]), kwargs


def _map_rule(mapping: Callable[[OpCall], list[tuple[int, int]]], kinds: Sequence[Any] = ALL_PARTIALS) -> Callable[[OpCall], list[SingleDimStrategy]]:
    """A rule from (input dim, output dim) pairs that keep their shard."""

    def rule(call: OpCall) -> list[SingleDimStrategy]:
        pairs = mapping(call)
        return [SingleDimStrategy(S(o), S(i)) for i, o in pairs] + identity_partials(kinds=kinds)

    return rule


def _norm(d: int, n: int) -> int:
    return d + n if d < 0 else d


def _transpose_pairs(call: OpCall) -> list[tuple[int, int]]:
    n = call.inputs[0].ndim
    if call.op in (aten.t.default, aten.t_copy.default):
        d0, d1 = 0, min(1, max(n - 1, 0))
    else:
        d0, d1 = _norm(call.arg("dim0"), n), _norm(call.arg("dim1"), n)
    swap = {d0: d1, d1: d0}
    return [(d, swap.get(d, d)) for d in range(n)]


def _permute_pairs(call: OpCall) -> list[tuple[int, int]]:
    n = call.inputs[0].ndim
    dims = [_norm(d, n) for d in call.arg("dims")]
    return [(src, out) for out, src in enumerate(dims)]


def _unsqueeze_pairs(call: OpCall) -> list[tuple[int, int]]:
    n = call.inputs[0].ndim
    dim = _norm(call.arg("dim"), n + 1)
    return [(d, d if d < dim else d + 1) for d in range(n)]


def _squeeze_pairs(call: OpCall) -> list[tuple[int, int]]:
    """Dims that stay, with their new position. A named dim that is not of
    size 1 stays but is never split: a split could leave a local size of 1,
    which the local squeeze would remove."""
    shape = call.inputs[0].shape
    n = len(shape)
    dims = call.arg("dim")
    named = {_norm(d, max(n, 1)) for d in (dims if isinstance(dims, (list, tuple)) else [dims])} if n else set()
    pairs, out = [], 0
    for d in range(n):
        if d in named and shape[d] == 1:
            continue
        if d not in named:
            pairs.append((d, out))
        out += 1
    return pairs


def _identity_pairs(call: OpCall) -> list[tuple[int, int]]:
    return [(d, d) for d in range(call.inputs[0].ndim)]


def _view_as_real_pairs(call: OpCall) -> list[tuple[int, int]]:
    return [(d, d) for d in range(call.inputs[0].ndim)]


def _view_as_complex_pairs(call: OpCall) -> list[tuple[int, int]]:
    return [(d, d) for d in range(call.inputs[0].ndim - 1)]


def expand_rule(call: OpCall) -> list[SingleDimStrategy]:
    """Kept dims keep their shard; an expanded (or new) output dim can be split
    with a replicated input, since every slice of a broadcast holds the same values."""
    src, dst = call.inputs[0].shape, call.outputs[0].shape
    lead = len(dst) - len(src)
    strategies = []
    for o in range(len(dst)):
        i = o - lead
        if i >= 0 and src[i] == dst[o]:
            strategies.append(SingleDimStrategy(S(o), S(i)))
        else:
            strategies.append(SingleDimStrategy(S(o), R))
    return strategies + identity_partials()


# ------------------------------------------------------------------ samples


def _regroup(sampler: Sampler, atoms: list[int]) -> tuple[int, ...]:
    """Consecutive atoms multiplied into dims, with a size-1 dim sometimes."""
    dims, cur = [], 1
    for k, a in enumerate(atoms):
        cur *= a
        if k == len(atoms) - 1 or sampler.rng.random() < 0.5:
            dims.append(cur)
            cur = 1
    if sampler.rng.random() < 0.2:
        dims.insert(sampler.rng.randrange(len(dims) + 1), 1)
    return tuple(dims)


def _reshape_samples(sampler: Sampler):
    for _ in range(3):
        atoms = [sampler.choice((2, 3, 4, 6)) for _ in range(sampler.randint(2, 4))]
        src, dst = _regroup(sampler, atoms), _regroup(sampler, atoms)
        size = list(dst)
        if sampler.rng.random() < 0.3:
            size[sampler.rng.randrange(len(size))] = -1
        yield SampleInput((sampler.randn(src, sampler.float_dtype()), size), {})


def _one_tensor(extra: Callable[[Sampler, tuple[int, ...]], tuple]) -> Callable[[Sampler], Any]:
    def samples(sampler: Sampler):
        for _ in range(2):
            shape = sampler.shape(min_ndim=2)
            yield SampleInput((sampler.randn(shape, sampler.float_dtype()),) + extra(sampler, shape), {})

    return samples


def _t_samples(sampler: Sampler):
    for ndim in (1, 2):
        yield SampleInput((sampler.randn(sampler.shape(ndim), sampler.float_dtype()),), {})


def _unsqueeze_extra(s: Sampler, shape: tuple[int, ...]) -> tuple:
    return (s.randint(-len(shape) - 1, len(shape)),)


def _squeeze_samples(kind: str) -> Callable[[Sampler], Any]:
    def samples(sampler: Sampler):
        for _ in range(2):
            shape = list(sampler.shape(min_ndim=2))
            d = sampler.rng.randrange(len(shape) + 1)
            shape.insert(d, 1)
            x = sampler.randn(shape, sampler.float_dtype())
            if kind == "dim":
                yield SampleInput((x, d), {})
            elif kind == "dims":
                yield SampleInput((x, [d, (d + 1) % len(shape)]), {})
            else:
                yield SampleInput((x,), {})

    return samples


def _expand_samples(sampler: Sampler):
    for _ in range(3):
        shape = list(sampler.shape(min_ndim=1))
        d = sampler.rng.randrange(len(shape))
        target = list(shape)
        shape[d] = 1
        lead = [sampler.size()] if sampler.rng.random() < 0.5 else []
        size = lead + [(-1 if sampler.rng.random() < 0.3 and i != d else t) for i, t in enumerate(target)]
        yield SampleInput((sampler.randn(shape, sampler.float_dtype()), size), {})


def _complex_samples(to_complex: bool) -> Callable[[Sampler], Any]:
    def samples(sampler: Sampler):
        for _ in range(2):
            shape = sampler.shape(min_ndim=1)
            if to_complex:
                yield SampleInput((sampler.randn(shape + (2,), sampler.choice((torch.float32, torch.float64))),), {})
            else:
                yield SampleInput((torch.view_as_complex(sampler.randn(shape + (2,), torch.float64)),), {})

    return samples


def _conj_samples(sampler: Sampler):
    for dtype in (torch.complex64, torch.complex128):
        shape = sampler.shape(min_ndim=1)
        yield SampleInput((torch.complex(sampler.randn(shape, torch.float64), sampler.randn(shape, torch.float64)).to(dtype),), {})


def register(registry: RuleRegistry) -> None:
    """Add the view rules to ``registry``."""
    rule = registry.family("views")
    for op in (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default):
        rule(op, compute=view(), samples=_reshape_samples, localize=_localize_size, uneven=False,
             shape_dependent=True, note="reshape: shards follow the dim groups; merges give strided shards")(reshape_rule)
    # each view and its *_copy form (the same values, materialized: a copy's cost)
    for op, copied in ((aten.transpose.int, aten.transpose_copy.int), (aten.t.default, aten.t_copy.default)):
        samples = _t_samples if op is aten.t.default else _one_tensor(
            lambda s, shape: (s.randint(-len(shape), len(shape) - 1), s.randint(0, len(shape) - 1)))
        rule(op, compute=view(), samples=samples)(_map_rule(_transpose_pairs))
        rule(copied, compute=copy(), samples=samples)(_map_rule(_transpose_pairs))
    for op in (aten.permute.default, aten.permute_copy.default):
        rule(op, compute=view() if op is aten.permute.default else copy(),
             samples=_one_tensor(lambda s, shape: ([int(i) for i in s.permutation(len(shape))],)))(_map_rule(_permute_pairs))
    for op in (aten.unsqueeze.default, aten.unsqueeze_copy.default):
        rule(op, compute=view() if op is aten.unsqueeze.default else copy(),
             samples=_one_tensor(_unsqueeze_extra))(_map_rule(_unsqueeze_pairs))
    for op, kind in ((aten.squeeze.dim, "dim"), (aten.squeeze.dims, "dims"), (aten.squeeze_copy.dim, "dim"),
                     (aten.squeeze_copy.dims, "dims")):
        rule(op, compute=view() if op._opname == "squeeze" else copy(), samples=_squeeze_samples(kind))(
            _map_rule(_squeeze_pairs))
    # squeeze() removes every dim of local size 1, which a split can create:
    # it stays whole (the graph's squeeze.dim/.dims forms are split freely).
    rule(aten.squeeze.default, compute=view(), samples=_squeeze_samples("all"))(_map_rule(lambda call: []))
    rule(aten.squeeze_copy.default, compute=copy(), samples=_squeeze_samples("all"))(_map_rule(lambda call: []))
    rule(aten.detach.default, compute=view(), samples=_one_tensor(lambda s, shape: ()))(_map_rule(_identity_pairs))
    rule(aten.alias_copy.default, compute=copy(), samples=_one_tensor(lambda s, shape: ()))(_map_rule(_identity_pairs))
    rule(aten.expand.default, compute=view(), samples=_expand_samples, localize=_localize_size)(expand_rule)
    rule(aten.expand_copy.default, compute=copy(), samples=_expand_samples, localize=_localize_size)(expand_rule)
    # Complex values have no order: only sums and averages pass through.
    rule(aten.view_as_real.default, compute=view(), samples=_complex_samples(False))(
        _map_rule(_view_as_real_pairs, kinds=(P, P_AVG)))
    rule(aten.view_as_complex.default, compute=view(), samples=_complex_samples(True))(
        _map_rule(_view_as_complex_pairs, kinds=(P, P_AVG)))
    # conj(a + b) = conj(a) + conj(b); _conj accepts complex tensors only.
    rule(aten._conj.default, compute=view(), samples=_conj_samples)(_map_rule(_identity_pairs, kinds=(P, P_AVG)))
