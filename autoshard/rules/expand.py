"""Expansion of a single-dim rule to the N-D strategies of a call, with pruning.

For a mesh of sizes ``(m_0, ..., m_{n-1})`` the strategies of a call are the
product, over mesh dims, of the rule's single-dim strategies (the all-replicate
one added first, placeholders ``S*(d)`` filled with ``S(d)`` and with
``_S(d,sf=k)`` for each requested split factor ``k``). Mesh dims apply left to
right (docs/design.md, "Notation"), so the product is walked depth first while the local size
of every tensor dim is tracked; a choice for mesh dim ``i`` is checked on the
local sizes left by mesh dims ``0..i-1``. Shape-dependent rules (views) are
re-run on those local sizes, which is how a reshape of an already split tensor
gets the right strided shard.

Pruning, and why the optimum of the strategy graph is kept:

(a) Canonical form. On a mesh dim of size 1 every placement is the same layout
    as ``R`` (one rank holds the whole tensor; a partial over one rank is its
    value), so only the all-replicate choice is made there. ``_S(d,sf=1)`` is
    ``S(d)`` and negative tensor dims are made positive. Strategies that become
    equal are the same local tensors on every rank, so they cost the same
    under any cost model: keeping one loses nothing.
(b) Divisibility policy (a restriction, not a reduction): a shard must split
    its tensor dim evenly, unless ``allow_uneven`` is set *and* the rule is
    exact on uneven splits (``Rule.uneven``); strided shards are always even;
    no shard may leave a rank empty (``torch.chunk`` sizes). Strategies outside
    the policy are not runnable by the runtime, so they are not candidates.
(c) Duplicates: equal (outputs, inputs) placement tuples are kept once.
(d) Dtype: a partial must be a reduction the tensor's dtype can carry, and
    must survive the op's dtype change (:func:`partial_fits`,
    :func:`cast_keeps_partial`). Strategies outside are wrong, not costly:
    removing them removes no correct candidate.
(e) Dominance: nothing else is removed here. Two distinct strategies differ in
    the layout of some tensor, so which one is cheaper depends on compute,
    communication and memory prices that this layer does not have; the solver
    removes cost- and memory-dominated strategies exactly, once priced.

>>> import torch
>>> from autoshard.rules.core import OpCall, SingleDimStrategy, TensorMeta, S
>>> from autoshard.rules.rule import Rule
>>> from autoshard.rules.compute import elementwise
>>> x = TensorMeta((4, 6), torch.float32)
>>> neg = Rule(torch.ops.aten.neg.default, "demo", lambda c: [SingleDimStrategy(S(0), S(0)), SingleDimStrategy(S(1), S(1))], elementwise())
>>> call = OpCall(torch.ops.aten.neg.default, (x,), {}, (x,), (x,))
>>> [str(s) for s in expand_rule(neg, call, (2, 3))]
['RR <- RR', 'RS(1) <- RS(1)', 'S(0)R <- S(0)R', 'S(0)S(1) <- S(0)S(1)', 'S(1)R <- S(1)R', 'S(1)S(1) <- S(1)S(1)']
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from costmodel.shard_shapes import max_local_shape
from costmodel.placements import Partial, Placement, Replicate, Shard, StridedShard

from autoshard.rules.core import OpCall, OpStrategy, ShardPlaceholder, SingleDimStrategy, TensorMeta
from autoshard.rules.rule import Rule, RuleError, op_name

__all__ = [
    "expand_rule",
    "register_exchange",
    "register_exchange_price",
    "exchange_pricer",
    "exchange_memory",
    "expand_exchanges",
    "replicate_only",
    "local_call",
    "fill_placeholders",
    "partial_fits",
    "cast_keeps_partial",
    "monotone_cast",
]

_REPLICATE = Replicate()
Sizes = tuple[tuple[int, int], ...]
"""Per tensor dim: (smallest, largest) local size over the ranks."""
Option = tuple[Placement | None, ...]
"""One concrete single-dim choice: a placement per output, then per input."""


def _split(sizes: Sizes, p: Placement, m: int, uneven: bool) -> Sizes | None:
    """Local sizes after splitting by ``p`` over ``m`` ranks; None if the
    policy (b) forbids it."""
    d = p.dim  # type: ignore[union-attr]
    lo, hi = sizes[d]
    if isinstance(p, StridedShard):
        step = m * p.split_factor
        if lo != hi or hi % step:
            return None
        new = (hi // m, hi // m)
    elif lo == hi and hi % m == 0:
        if hi < m:
            return None
        new = (hi // m, hi // m)
    else:
        if not uneven:
            return None
        # torch.chunk: chunks of ceil(n/m), the last one smaller; none empty.
        c_lo, c_hi = -(-lo // m), -(-hi // m)
        if (m - 1) * c_lo >= lo or (m - 1) * c_hi >= hi:
            return None
        new = (min(lo - (m - 1) * c_lo, hi - (m - 1) * c_hi), c_hi)
    return sizes[:d] + (new,) + sizes[d + 1 :]


def _concrete(p: object, kind: int | None, ndim: int | None, name: str, s: SingleDimStrategy) -> Placement | None:
    """Fill a placeholder with ``S(d)`` (kind None) or ``_S(d,sf=kind)``."""
    if p is None or isinstance(p, (Replicate, Partial)):
        return p  # type: ignore[return-value]
    if isinstance(p, (ShardPlaceholder, Shard, StridedShard)):
        if ndim is None:
            raise RuleError(f"{name} ({s}): shards a tensor that does not exist")
        d = p.dim + ndim if p.dim < 0 else p.dim
        if not 0 <= d < ndim:
            raise RuleError(f"{name} ({s}): {p} names tensor dim {p.dim} of a {ndim}-D tensor")
        if isinstance(p, ShardPlaceholder):
            return Shard(d) if kind is None else StridedShard(d, kind)
        if isinstance(p, StridedShard):
            return Shard(d) if p.split_factor == 1 else StridedShard(d, p.split_factor)
        return Shard(d)
    raise RuleError(f"{name} ({s}): {p!r} is not a placement")


def _kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    if dtype.is_complex:
        return "complex"
    if dtype.is_floating_point:
        return "float"
    return "int"


def partial_fits(reduce_op: str, dtype: torch.dtype) -> bool:
    """Whether ``P(reduce_op)`` is a layout a ``dtype`` tensor can have.

    bool has no sum (``True + True`` saturates) and so no average; integer
    sums are exact (wrap-around included) but integer averages truncate;
    complex numbers have no order, so no max/min.

    >>> partial_fits("sum", torch.bool), partial_fits("avg", torch.int64), partial_fits("max", torch.complex64)
    (False, False, False)
    >>> partial_fits("sum", torch.int32), partial_fits("max", torch.bool), partial_fits("avg", torch.bfloat16)
    (True, True, True)
    """
    kind = _kind(dtype)
    if kind == "bool":
        return reduce_op in ("max", "min")
    if kind == "int":
        return reduce_op != "avg"
    if kind == "complex":
        return reduce_op in ("sum", "avg")
    return True


def monotone_cast(src: torch.dtype, dst: torch.dtype) -> bool:
    """Whether converting ``src`` values to ``dst`` is non-decreasing on the
    WHOLE range of ``src``, so that it commutes with max and min
    (``cast(max(a, b)) = max(cast(a), cast(b))``).

    Rounding to nearest is non-decreasing and saturates to +-inf, so every
    cast to a float type is (int64 to float16 included). A cast between
    integer types is when the target's range holds the source's; otherwise
    it wraps (``int64 300 -> int8 44``, ``int8 -1 -> uint8 255``). A cast from
    a float type to an integer type is not: values out of the target's range
    wrap or become the "indefinite" integer (``+inf -> int64`` gives
    ``INT64_MIN``). bool -> anything maps False < True to 0 < 1; anything ->
    bool is ``x != 0``, which is not monotone where negatives exist; complex
    values have no order.

    >>> monotone_cast(torch.int32, torch.int64), monotone_cast(torch.int64, torch.int8), monotone_cast(torch.float32, torch.int64)
    (True, False, False)
    >>> monotone_cast(torch.int64, torch.float16), monotone_cast(torch.uint8, torch.int16), monotone_cast(torch.int8, torch.uint8)
    (True, True, False)
    """
    if src == dst:
        return True
    s, d = _kind(src), _kind(dst)
    if s == "complex" or d == "complex":
        return False
    if s == "bool":
        return True
    if d == "bool":
        return False
    if d == "float":
        return True
    if s == "float":
        return False
    a, b = torch.iinfo(src), torch.iinfo(dst)
    return b.min <= a.min and a.max <= b.max


def cast_keeps_partial(src: torch.dtype, dst: torch.dtype, reduce_op: str) -> bool:
    """Whether a ``P(reduce_op)`` input of dtype ``src`` may give a partial
    output of dtype ``dst``: each rank converts its own piece, which must
    commute with the reduction.

    max/min: the cast must be non-decreasing on the whole source range
    (:func:`monotone_cast`). sum/avg: float-to-float and integer-to-float
    rounding keep them (up to rounding); integer-to-integer casts are
    reductions modulo ``2**bits``, which commute with sums; float to integer
    truncates each piece (``trunc(0.6) + trunc(0.6) != trunc(1.2)``) and
    anything to bool (``x != 0``) is not additive.

    >>> cast_keeps_partial(torch.float32, torch.int32, "sum"), cast_keeps_partial(torch.float32, torch.int32, "max")
    (False, False)
    >>> cast_keeps_partial(torch.int64, torch.float32, "sum"), cast_keeps_partial(torch.float32, torch.bool, "max")
    (True, False)
    >>> cast_keeps_partial(torch.int32, torch.int64, "max"), cast_keeps_partial(torch.int64, torch.int8, "sum")
    (True, True)
    """
    if src == dst:
        return True
    if reduce_op in ("max", "min"):
        return monotone_cast(src, dst)
    s, d = _kind(src), _kind(dst)
    if d == "bool" or (d == "int" and s in ("float", "complex")):
        return False
    return True


def _dtype_fits(opt: Option, metas: Sequence[TensorMeta | None], n_out: int) -> bool:
    """(d): every partial suits its tensor's dtype, and every partial output
    survives the cast from each partial input's dtype."""
    for p, m in zip(opt, metas):
        if isinstance(p, Partial) and m is not None and not partial_fits(p.reduce_op, m.dtype):
            return False
    for p_out, m_out in zip(opt[:n_out], metas[:n_out]):
        if not isinstance(p_out, Partial) or m_out is None:
            continue
        for p_in, m_in in zip(opt[n_out:], metas[n_out:]):
            if isinstance(p_in, Partial) and m_in is not None and not cast_keeps_partial(m_in.dtype, m_out.dtype, p_out.reduce_op):
                return False
    return True


def fill_placeholders(
    rule: Rule, call: OpCall, strategies: Sequence[SingleDimStrategy], kinds: Sequence[int | None]
) -> list[Option]:
    """Concrete single-dim options of one call, all-replicate first, no duplicates."""
    name = op_name(call.op)
    n_out, n_in = len(call.outputs), len(call.inputs)
    metas: list[TensorMeta | None] = list(call.outputs) + list(call.inputs)
    ndims = [None if m is None else m.ndim for m in metas]
    unread = None
    options: list[Option] = []
    seen: set[Option] = set()
    for s in strategies:
        if len(s.outputs) != n_out or len(s.inputs) != n_in:
            raise RuleError(
                f"{name}: rule gave {len(s.outputs)} outputs / {len(s.inputs)} inputs "
                f"({s}), the call has {n_out} / {n_in}"
            )
        none_inputs = tuple(p is None for p in s.inputs)
        if unread is None:
            unread = none_inputs
        elif unread != none_inputs:
            raise RuleError(f"{name}: an input is None (unread) in some strategies only ({s})")
        raw = s.outputs + s.inputs
        has_placeholder = any(isinstance(p, ShardPlaceholder) for p in raw)
        for kind in kinds if has_placeholder else (None,):
            opt = tuple(
                None if (i < n_out and metas[i] is None) else _concrete(p, kind, ndims[i], name, s)
                for i, p in enumerate(raw)
            )
            if opt not in seen:
                seen.add(opt)
                if _dtype_fits(opt, metas, n_out):
                    options.append(opt)
    unread = unread or (False,) * n_in
    all_r: Option = tuple(None if metas[i] is None else _REPLICATE for i in range(n_out)) + tuple(
        None if unread[i] else _REPLICATE for i in range(n_in)
    )
    if all_r in seen:
        options.remove(all_r)
    return [all_r] + options


def _start_sizes(metas: Sequence[TensorMeta | None]) -> list[Sizes | None]:
    return [None if m is None else tuple((s, s) for s in m.shape) for m in metas]


def _walk(
    mesh: tuple[int, ...],
    metas: Sequence[TensorMeta | None],
    options_at: Callable[[list[Sizes | None]], list[Option]],
    uneven: bool,
) -> list[tuple[Option, ...]]:
    """Depth-first product over mesh dims, checking policy (b) on local sizes."""
    results: list[tuple[Option, ...]] = []
    chosen: list[Option] = []
    n_mesh = len(mesh)

    def rec(i: int, sizes: list[Sizes | None]) -> None:
        if i == n_mesh:
            results.append(tuple(chosen))
            return
        m = mesh[i]
        opts = options_at(sizes)
        if m == 1:  # (a): only the all-replicate choice on a size-1 mesh dim
            opts = opts[:1]
        for opt in opts:
            new = sizes
            for t, p in enumerate(opt):
                if p is None or isinstance(p, (Replicate, Partial)):
                    continue
                cur = new[t]
                if cur is None:
                    break
                split = _split(cur, p, m, uneven)
                if split is None:
                    break
                if new is sizes:
                    new = list(sizes)
                new[t] = split
            else:
                chosen.append(opt)
                rec(i + 1, new)
                chosen.pop()

    rec(0, _start_sizes(metas))
    return results


def _assemble(results: list[tuple[Option, ...]], n_out: int, n_in: int) -> tuple[OpStrategy, ...]:
    out: dict[OpStrategy, None] = {}
    for per_dim in results:
        cols = list(zip(*per_dim))
        outs = tuple(None if cols[j][0] is None else tuple(cols[j]) for j in range(n_out))
        ins = tuple(None if cols[n_out + j][0] is None else tuple(cols[n_out + j]) for j in range(n_in))
        out.setdefault(OpStrategy(outs, ins), None)  # (c) duplicates
    return tuple(out)


def expand_rule(
    rule: Rule,
    call: OpCall,
    mesh_shape: tuple[int, ...],
    *,
    allow_uneven: bool = False,
    strided_factors: tuple[int, ...] = (),
) -> tuple[OpStrategy, ...]:
    """The pruned N-D strategies of ``call`` under ``rule`` (module docstring)."""
    kinds: tuple[int | None, ...] = (None,) + (strided_factors if rule.strided else ())
    metas = list(call.outputs) + list(call.inputs)
    uneven = allow_uneven and rule.uneven
    if not rule.shape_dependent:
        options = fill_placeholders(rule, call, rule.single_dim(call), kinds)
        results = _walk(mesh_shape, metas, lambda sizes: options, uneven)
    else:
        n_out = len(call.outputs)
        memo: dict[tuple, list[Option]] = {}

        def options_at(sizes: list[Sizes | None]) -> list[Option]:
            key = tuple(sizes)
            if key not in memo:
                local = [None if s is None else TensorMeta(tuple(hi for _, hi in s), m.dtype) for s, m in zip(sizes, metas)]  # type: ignore[union-attr]
                lcall = call.with_shapes(tuple(local[n_out:]), tuple(local[:n_out]))  # type: ignore[arg-type]
                memo[key] = fill_placeholders(rule, lcall, rule.single_dim(lcall), kinds)
            return memo[key]

        results = _walk(mesh_shape, metas, options_at, uneven)
    local = _assemble(results, len(call.outputs), len(call.inputs))
    entry = _EXCHANGES.get(rule.single_dim)
    if entry is None:
        return local
    provider, admits = entry
    return local + expand_exchanges(rule, call, mesh_shape, *provider(call), admits=admits)


ExchangeProvider = Callable[[OpCall], tuple[list[tuple[SingleDimStrategy, str]], list[SingleDimStrategy]]]
"""A rule's strategies that are not local ops: ``call -> ([(single-dim strategy, exchange kind)],
companions)``, the companions the local single-dim strategies allowed on the other mesh dims."""

ExchangeAdmits = Callable[[OpCall, str, int], bool]
"""``(call, exchange kind, ranks of the mesh dim) -> bool``: whether the exchange is exact on a
mesh dim of that size beyond the even split of its tensors (context parallelism's load-balanced
chunks need ``2 ranks`` to divide the sequence)."""

ExchangePricer = Callable[..., tuple[Any, float]]
"""``(call, strategy, *, mesh, profile, imbalance) -> (work, seconds)``: an exchange strategy of a
call (global shapes) priced as it runs; ``work`` (an ``OpCompute`` the strategy graph prices with
``costmodel.compute``, or None) plus ``seconds`` that ``work`` does not cover."""

ExchangeMemory = Callable[..., int]
"""``(call, strategy, *, mesh, profile, imbalance) -> bytes``: what a rank holds beside the op
while the exchange runs (context parallelism: the gathered K/V; experts: the dispatched tokens at
the imbalanced capacity), the pricer's arguments."""

_EXCHANGES: dict[Callable[..., Any], tuple[ExchangeProvider, ExchangeAdmits | None]] = {}
_EXCHANGE_PRICES: dict[str, ExchangePricer] = {}
_EXCHANGE_MEMORY: dict[str, ExchangeMemory] = {}


def register_exchange(single_dim: Callable[..., Any], provider: ExchangeProvider, *,
                      admits: ExchangeAdmits | None = None) -> None:
    """Offer ``provider``'s exchange strategies with every expansion of the rule whose
    single-dim function is ``single_dim`` (``autoshard.rules.experts``: expert parallelism;
    ``autoshard.rules.context_parallel``: sequence-split attention), on the mesh dims
    ``admits`` accepts (every dim of size > 1 when None)."""
    _EXCHANGES[single_dim] = (provider, admits)


def register_exchange_price(kind: str, pricer: ExchangePricer, *, memory: ExchangeMemory | None = None) -> None:
    """Price every strategy with exchange ``kind`` with ``pricer``, and the bytes it holds while it
    runs with ``memory`` (none when None) (``autoshard.graph.builder`` looks both up by kind:
    :func:`exchange_pricer`, :func:`exchange_memory`)."""
    _EXCHANGE_PRICES[kind] = pricer
    if memory is not None:
        _EXCHANGE_MEMORY[kind] = memory


def exchange_memory(kind: str) -> ExchangeMemory | None:
    """The temporary-bytes function registered for exchange ``kind`` (None: it holds nothing extra)."""
    return _EXCHANGE_MEMORY.get(kind)


def exchange_pricer(kind: str) -> ExchangePricer:
    """The price function registered for exchange ``kind``.

    >>> exchange_pricer("no_such_exchange")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    KeyError: "exchange kind 'no_such_exchange' has no price function (registered: ...)"
    """
    pricer = _EXCHANGE_PRICES.get(kind)
    if pricer is None:
        known = ", ".join(sorted(_EXCHANGE_PRICES)) or "none"
        raise KeyError(f"exchange kind {kind!r} has no price function (registered: {known})")
    return pricer


def expand_exchanges(rule: Rule, call: OpCall, mesh_shape: tuple[int, ...],
                     exchanges: Sequence[tuple[SingleDimStrategy, str]],
                     companions: Sequence[SingleDimStrategy], *,
                     admits: ExchangeAdmits | None = None) -> tuple[OpStrategy, ...]:
    """The N-D strategies with one exchange: each exchange strategy on one mesh dim of size > 1
    that ``admits`` accepts (tagged ``(kind, mesh_dim)``), all-replicate or a companion on every
    other dim; even splits only.

    An exchange runs over one mesh dim's process group, so only one dim carries it; the
    companions (a token split) are local ops on the other dims' shards.
    """
    metas = list(call.outputs) + list(call.inputs)
    n_out, n_in = len(call.outputs), len(call.inputs)
    others = fill_placeholders(rule, call, list(companions), (None,))  # all-replicate first
    out: dict[OpStrategy, None] = {}
    for single, kind in exchanges:
        for opt in fill_placeholders(rule, call, [single], (None,))[1:]:
            for dim, size in enumerate(mesh_shape):
                if size == 1 or (admits is not None and not admits(call, kind, size)):
                    continue
                per_dim = [[opt] if i == dim else (others if m > 1 else others[:1])
                           for i, m in enumerate(mesh_shape)]
                for chosen in _product(mesh_shape, metas, per_dim):
                    cols = list(zip(*chosen))
                    outs = tuple(None if cols[j][0] is None else tuple(cols[j]) for j in range(n_out))
                    ins = tuple(None if cols[n_out + j][0] is None else tuple(cols[n_out + j]) for j in range(n_in))
                    out.setdefault(OpStrategy(outs, ins, (kind, dim)), None)
    return tuple(out)


def _product(mesh: tuple[int, ...], metas: Sequence[TensorMeta | None],
             per_dim: Sequence[Sequence[Option]]) -> list[tuple[Option, ...]]:
    """The product of ``per_dim`` options that split every tensor evenly (policy (b), even)."""
    results: list[tuple[Option, ...]] = []

    def rec(i: int, sizes: list[Sizes | None], chosen: tuple[Option, ...]) -> None:
        if i == len(mesh):
            results.append(chosen)
            return
        for opt in per_dim[i]:
            new = list(sizes)
            for t, p in enumerate(opt):
                if p is None or isinstance(p, (Replicate, Partial)):
                    continue
                split = None if new[t] is None else _split(new[t], p, mesh[i], False)  # type: ignore[arg-type]
                if split is None:
                    break
                new[t] = split
            else:
                rec(i + 1, new, chosen + (opt,))

    rec(0, _start_sizes(metas), ())
    return results


def replicate_only(call: OpCall, mesh_shape: tuple[int, ...]) -> OpStrategy:
    """The one strategy of an op without a rule: every tensor replicated."""
    rep = (_REPLICATE,) * len(mesh_shape)
    return OpStrategy(
        tuple(None if o is None else rep for o in call.outputs), tuple(rep for _ in call.inputs)
    )


def local_call(call: OpCall, strategy: OpStrategy, mesh_shape: tuple[int, ...]) -> OpCall:
    """``call`` with the largest local shard shape of every tensor."""

    def shrink(meta: TensorMeta | None, placements: tuple[Placement, ...] | None) -> TensorMeta | None:
        if meta is None or placements is None:
            return meta
        return TensorMeta(max_local_shape(meta.shape, placements, mesh_shape), meta.dtype)

    ins = tuple(shrink(m, p) for m, p in zip(call.inputs, strategy.input_placements))
    outs = tuple(shrink(m, p) for m, p in zip(call.outputs, strategy.output_placements))
    return call.with_shapes(ins, outs)  # type: ignore[arg-type]
