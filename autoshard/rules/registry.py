"""The rule registry: which sharding rule covers which aten op, and the one
entry point that enumerates an op's N-D strategies on a mesh.

A :class:`Rule` is written for ONE mesh dim (see :mod:`autoshard.rules.core`):
it returns single-dim strategies with shard placeholders ``S*(d)``. The
registry adds the all-replicate strategy, fills placeholders with ``S(d)`` and
the strided shards asked for, takes the product over mesh dims and prunes it
(:mod:`autoshard.rules.expand` states the pruning and why it keeps the optimum).

Rules are registered with a decorator on an explicit registry, one family
module at a time; :func:`autoshard.rules.load_rules` builds a fresh registry by
calling every family's ``register(registry)``. Nothing is registered at import.

Ops that a library defines when it is imported (``transformers``' custom op
``transformers.grouped_mm_fallback.default``) are registered by *name*
(:class:`NamedRule`): the registry binds the rule to the op the first time it
is asked about an op of that name, so registering imports no library, and a
graph that holds the op (its library was imported to build the model) finds
the rule. :meth:`RuleRegistry.define_named` imports the defining modules of
the libraries that are installed (for the validator, which needs the ops).

>>> import torch
>>> from autoshard.rules import load_rules, TensorMeta
>>> rules = load_rules()
>>> mm = torch.ops.aten.mm.default
>>> a, b = TensorMeta((64, 32), torch.float32), TensorMeta((32, 16), torch.float32)
>>> [str(s) for s in rules.strategies(mm, (a, b), {}, (2,))]
['R <- R, R', 'S(0) <- S(0), R', 'S(1) <- R, S(1)', 'P(sum) <- S(1), S(0)', 'P(sum) <- P(sum), R', 'P(sum) <- R, P(sum)']
>>> rules.compute_kind(mm, (a, b)).kind
'matmul'

An op with no rule gets the replicate-only strategy and one warning per
registry naming the op; it never fails.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
from torch._ops import OpOverload

from autoshard.rules.core import OpCall, OpCompute, OpStrategy, TensorMeta
from autoshard.rules.expand import expand_rule, local_call, replicate_only
from autoshard.rules.rule import ComputeFn, NamedRule, Rule, RuleError, SampleInput, SingleDimFn, op_name

__all__ = [
    "Rule",
    "NamedRule",
    "RuleError",
    "RuleRegistry",
    "SampleInput",
    "op_name",
    "describe_call",
]

log = logging.getLogger(__name__)

def _defined_op(name: str) -> OpOverload | None:
    """The op ``namespace.op.overload`` if some import has defined it already (nothing is imported here)."""
    parts = name.split(".")
    if len(parts) != 3:
        return None
    namespace, op, overload = parts
    try:
        found = getattr(getattr(getattr(torch.ops, namespace), op), overload)
    except (AttributeError, RuntimeError):
        return None
    return found if isinstance(found, OpOverload) else None


def _freeze(obj: Any) -> Any:
    """A hashable form of an args structure, for cache keys."""
    if isinstance(obj, (list, tuple)):
        return (type(obj) is list, tuple(_freeze(o) for o in obj))
    if isinstance(obj, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in obj.items()))
    if isinstance(obj, torch.Tensor):
        raise RuleError("args_meta: pass TensorMeta (autoshard.rules.to_meta), not tensors")
    return obj


def _tensor_metas(args_meta: Sequence[Any], kwargs: Mapping[str, Any] | None) -> list[TensorMeta]:
    from autoshard.rules.calls import flatten_tensors

    return flatten_tensors((tuple(args_meta), tuple((kwargs or {}).values())))


def _replicate_from_schema(op: OpOverload, args_meta: Sequence[Any], kwargs: Mapping[str, Any], mesh: tuple[int, ...]) -> OpStrategy:
    """Replicate-only strategy when the outputs cannot be inferred: one output
    per ``Tensor``/``Tensor?`` return (a ``Tensor[]`` return counts as one)."""
    from costmodel.placements import Replicate

    rep = (Replicate(),) * len(mesh)
    n_out = sum(1 for r in op._schema.returns if "Tensor" in str(r.type))
    n_in = len(_tensor_metas(args_meta, kwargs))
    return OpStrategy((rep,) * n_out, (rep,) * n_in)


_DTYPE_SHORT = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
                torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
                torch.bool: "b8"}


def describe_call(call: OpCall, *, short_dtypes: bool = False) -> str:
    """One op call in one line for error messages (the one wording of a call: the rules'
    errors, the validator's findings, the strategy graph's build errors): tensors as
    dtype and shape, lists and tuples and keywords as Python writes them;
    ``short_dtypes`` writes ``f32`` for ``float32`` (``autoshard.graph.build_state``).
    ``call``: anything with an ``op``, ``args`` and ``kwargs`` (an :class:`OpCall`).

    >>> call = OpCall(torch.ops.aten.index_select.default, (TensorMeta((8, 4), torch.float32), 0,
    ...               TensorMeta((1,), torch.int64)), {}, (), ())
    >>> describe_call(call)
    'aten.index_select.default(float32[8, 4], 0, int64[1])'
    >>> describe_call(call, short_dtypes=True)
    'aten.index_select.default(f32[8, 4], 0, i64[1])'
    """

    def one(value: Any) -> str:
        if isinstance(value, TensorMeta):
            if not short_dtypes:
                return str(value)
            return f"{_DTYPE_SHORT.get(value.dtype, str(value.dtype).replace('torch.', ''))}{list(value.shape)}"
        if isinstance(value, (list, tuple)):
            inner = ", ".join(one(v) for v in value)
            return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
        return repr(value)

    parts = [one(a) for a in call.args] + [f"{k}={one(v)}" for k, v in call.kwargs.items()]
    return f"{op_name(call.op)}({', '.join(parts)})"


def _expand_or_explain(rule: Rule, call: OpCall, mesh: tuple[int, ...], allow_uneven: bool,
                       factors: tuple[int, ...]) -> tuple[OpStrategy, ...]:
    """:func:`~autoshard.rules.expand.expand_rule`, with any failure of the
    rule turned into one :class:`RuleError` that names the op and the call
    (a rule bug must read as one, not as an ``IndexError`` deep in a rule)."""
    try:
        return expand_rule(rule, call, mesh, allow_uneven=allow_uneven, strided_factors=factors)
    except Exception as exc:  # noqa: BLE001 - re-raised with the call named
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise RuleError(
            f"the {rule.family} rule of {op_name(call.op)} failed on {describe_call(call)} "
            f"for mesh {mesh}: {type(exc).__name__}: {text}"
        ) from exc


class RuleRegistry:
    """Rules by op, and strategy enumeration with a cache per call signature.

    >>> registry = RuleRegistry()
    >>> registry.ops()
    []
    """

    def __init__(self) -> None:
        self._rules: dict[OpOverload, Rule] = {}
        self._named: dict[str, NamedRule] = {}
        self._warned: set[OpOverload] = set()
        self._strategy_cache: dict[tuple, tuple[OpStrategy, ...]] = {}
        self._call_cache: dict[tuple, OpCall] = {}
        self._fallback: Any = None  # autoshard.rules.dtensor_fallback.DTensorFallback
        self.fallback_uses: dict[OpOverload, int] = {}
        """How many enumerations used a DTensor-derived rule, per op."""
        self.enumerate_s = 0.0
        """Seconds spent expanding strategies (cache misses only)."""

    # ------------------------------------------------------------------ registration

    def family(self, name: str) -> Callable[..., Callable[[SingleDimFn], SingleDimFn]]:
        """The decorator of one family module.

        >>> registry = RuleRegistry()
        >>> rule = registry.family("demo")
        >>> from autoshard.rules.core import SingleDimStrategy, S, R
        >>> from autoshard.rules.compute import elementwise
        >>> @rule(torch.ops.aten.neg.default, compute=elementwise())
        ... def neg(call):
        ...     return [SingleDimStrategy(S(d), S(d)) for d in range(call.inputs[0].ndim)]
        >>> registry.rule_for(torch.ops.aten.neg.default).family
        'demo'
        """

        def rule(
            ops: OpOverload | str | Sequence[OpOverload | str], *, compute: ComputeFn, defined_by: str | None = None,
            **options: Any
        ) -> Callable[[SingleDimFn], SingleDimFn]:
            # an op given by name (a library's custom op) is bound when it exists; defined_by names its module
            op_list = [ops] if isinstance(ops, (OpOverload, str)) else list(ops)

            def decorate(fn: SingleDimFn) -> SingleDimFn:
                for op in op_list:
                    if isinstance(op, OpOverload):
                        self.add(Rule(op=op, family=name, single_dim=fn, compute=compute, **options))
                        continue
                    if defined_by is None:
                        raise RuleError(f"{op}: a rule registered by name needs defined_by (the module that defines the op)")
                    self.add_named(NamedRule(
                        str(op), name,
                        lambda found, fn=fn: Rule(op=found, family=name, single_dim=fn, compute=compute, **options),
                        defined_by,
                    ))
                return fn

            return decorate

        return rule

    def add(self, rule: Rule) -> None:
        """Register one rule; an op may have one rule only."""
        if not isinstance(rule.op, OpOverload):
            raise RuleError(f"rule.op: expected an OpOverload, got {rule.op!r}")
        if rule.op in self._rules:
            raise RuleError(
                f"{op_name(rule.op)}: already has a rule from family "
                f"{self._rules[rule.op].family!r} (new one from {rule.family!r})"
            )
        if op_name(rule.op) in self._named:
            raise RuleError(f"{op_name(rule.op)}: already has a rule by name from family "
                            f"{self._named[op_name(rule.op)].family!r} (new one from {rule.family!r})")
        self._rules[rule.op] = rule
        self._strategy_cache.clear()

    def add_named(self, named: NamedRule) -> None:
        """Register the rule of an op by its name (:class:`NamedRule`); nothing is imported."""
        if named.name in self._named or any(op_name(op) == named.name for op in self._rules):
            raise RuleError(f"{named.name}: already has a rule (new one by name from {named.family!r})")
        self._named[named.name] = named

    def named_rules(self) -> list[NamedRule]:
        """Rules registered by name whose op no lookup has met yet, sorted by name."""
        return [self._named[name] for name in sorted(self._named)]

    def define_named(self) -> list[str]:
        """Import the module that defines each op registered by name, where its
        library is installed, and bind the rules; the names left unbound (library
        missing, or its import failed: logged) are returned."""
        missing = []
        for named in self.named_rules():
            op = _defined_op(named.name)
            if op is None and importlib.util.find_spec(named.package) is not None:
                try:
                    importlib.import_module(named.module)
                except Exception as exc:  # a broken optional library must not stop the other rules
                    log.warning("%s: importing %s failed (%s)", named.name, named.module, exc)
                op = _defined_op(named.name)
            if op is None:
                missing.append(named.name)
            else:
                self._bind(named, op)
        return missing

    def _bind(self, named: NamedRule, op: OpOverload) -> Rule:
        rule = named.make(op)
        del self._named[named.name]
        self._rules[op] = rule
        return rule

    def set_fallback(self, fallback: Any) -> None:
        """Use ``fallback.rule_for(op, call) -> Rule | None`` for ops without a rule."""
        self._fallback = fallback

    # ------------------------------------------------------------------ lookup

    def rule_for(self, op: OpOverload) -> Rule | None:
        """The registered rule of ``op`` (not the DTensor fallback), or None;
        a rule registered by the op's name is bound to it here."""
        rule = self._rules.get(op)
        if rule is None and self._named and isinstance(op, OpOverload):
            named = self._named.get(op_name(op))
            if named is not None:
                rule = self._bind(named, op)
        return rule

    def ops(self) -> list[OpOverload]:
        """Every op with a registered rule, sorted by name (those registered by
        name once their library has defined them)."""
        for named in self.named_rules():
            op = _defined_op(named.name)
            if op is not None:
                self._bind(named, op)
        return sorted(self._rules, key=op_name)

    def families(self) -> dict[str, list[OpOverload]]:
        """Ops per family, sorted by name."""
        out: dict[str, list[OpOverload]] = {}
        for op in self.ops():
            out.setdefault(self._rules[op].family, []).append(op)
        for named in self.named_rules():
            out.setdefault(named.family, [])
        return out

    # ------------------------------------------------------------------ calls

    def op_call(
        self,
        op: OpOverload,
        args_meta: Sequence[Any],
        kwargs: Mapping[str, Any] | None = None,
        *,
        out_meta: Any = None,
    ) -> OpCall:
        """The :class:`OpCall` of ``op`` on ``args_meta``: schema-bound arguments,
        flattened tensor inputs and outputs (from ``out_meta`` when given, else
        by running the op on meta tensors)."""
        from autoshard.rules.calls import make_call

        kwargs = dict(kwargs or {})
        key = (op, _freeze(tuple(args_meta)), _freeze(kwargs), _freeze(out_meta))
        call = self._call_cache.get(key)
        if call is None:
            call = make_call(op, tuple(args_meta), kwargs, out_meta)
            self._call_cache[key] = call
        return call

    def _resolve(self, op: OpOverload, call: OpCall) -> Rule | None:
        rule = self.rule_for(op)
        if rule is None and self._fallback is not None:
            rule = self._fallback.rule_for(op, call)
            if rule is not None:
                self.fallback_uses[op] = self.fallback_uses.get(op, 0) + 1
                log.info("%s: using a rule derived from DTensor's single-dim strategy", op_name(op))
        if rule is None:
            self._warn_no_rule(op)
        return rule

    def _warn_no_rule(self, op: OpOverload) -> None:
        if op not in self._warned:
            self._warned.add(op)
            log.warning("no sharding rule for %s: using the replicate-only strategy", op_name(op))

    # ------------------------------------------------------------------ enumeration

    def strategies(
        self,
        op: OpOverload,
        args_meta: Sequence[Any],
        kwargs: Mapping[str, Any] | None,
        mesh_shape: Sequence[int],
        *,
        allow_uneven: bool = False,
        strided_factors: Iterable[int] = (),
        out_meta: Any = None,
    ) -> list[OpStrategy]:
        """Every N-D strategy of one call of ``op`` on a mesh of ``mesh_shape``,
        after pruning; the all-replicate strategy comes first.

        ``args_meta``: the op's positional args with :class:`TensorMeta` in place
        of tensors (lists of them for ``Tensor[]``), other values as they are.
        ``allow_uneven``: let rules that stay exact on uneven splits shard a
        tensor dim not divisible by the mesh dim size (never into empty shards).
        ``strided_factors``: split factors of ``_S(d,sf=k)`` placements that the
        producers of the inputs may hand over (from views); placeholders are
        also filled with those. ``out_meta``: the outputs' metadata, when
        known (needed for ops whose output shape depends on data).

        Results are cached per (op, shapes, dtypes, args, mesh, options).
        """
        mesh = tuple(int(m) for m in mesh_shape)
        if not mesh or any(m < 1 for m in mesh):
            raise RuleError(f"mesh_shape: expected positive sizes, got {tuple(mesh_shape)}")
        factors = tuple(sorted({int(f) for f in strided_factors if int(f) > 1}))
        kw = dict(kwargs or {})
        key = (op, _freeze(tuple(args_meta)), _freeze(kw), mesh, bool(allow_uneven), factors, _freeze(out_meta))
        cached = self._strategy_cache.get(key)
        if cached is not None:
            return list(cached)
        start = time.perf_counter()
        from autoshard.rules.calls import OutputsUnknown

        try:
            call = self.op_call(op, args_meta, kw, out_meta=out_meta)
        except OutputsUnknown:
            if self.rule_for(op) is not None:
                raise
            # No rule and no output shapes (data-dependent): still never fail.
            self._warn_no_rule(op)
            result: tuple[OpStrategy, ...] = (_replicate_from_schema(op, args_meta, kw, mesh),)
        else:
            rule = self._resolve(op, call)
            if rule is None:
                result = (replicate_only(call, mesh),)
            else:
                result = _expand_or_explain(rule, call, mesh, allow_uneven, factors)
        self._strategy_cache[key] = result
        self.enumerate_s += time.perf_counter() - start
        return list(result)

    def compute_kind(
        self,
        op: OpOverload,
        args_meta: Sequence[Any],
        kwargs: Mapping[str, Any] | None = None,
        *,
        out_meta: Any = None,
    ) -> OpCompute:
        """Kind, FLOPs and bytes of one call, for the shapes in ``args_meta``
        (pass local shard shapes to price one rank; see :meth:`strategy_compute`).
        An op with no rule is priced as an elementwise pass over its tensors."""
        from autoshard.rules.compute import elementwise

        from autoshard.rules.calls import OutputsUnknown

        try:
            call = self.op_call(op, args_meta, kwargs, out_meta=out_meta)
        except OutputsUnknown:
            if self.rule_for(op) is not None:
                raise
            call = OpCall(op, tuple(args_meta), dict(kwargs or {}), tuple(_tensor_metas(args_meta, kwargs)), ())
            return elementwise()(call)
        rule = self.rule_for(op)
        if rule is None and self._fallback is not None:
            rule = self._fallback.rule_for(op, call)
        return (rule.compute if rule is not None else elementwise())(call)

    def strategy_compute(
        self,
        op: OpOverload,
        args_meta: Sequence[Any],
        kwargs: Mapping[str, Any] | None,
        mesh_shape: Sequence[int],
        strategy: OpStrategy,
        *,
        out_meta: Any = None,
    ) -> OpCompute:
        """Compute of the busiest rank when ``op`` runs with ``strategy``: the
        rule's compute on the largest local shard of every tensor."""
        call = self.op_call(op, args_meta, kwargs, out_meta=out_meta)
        local = local_call(call, strategy, tuple(mesh_shape))
        rule = self.rule_for(op)
        if rule is None and self._fallback is not None:
            rule = self._fallback.rule_for(op, call)
        from autoshard.rules.compute import elementwise

        return (rule.compute if rule is not None else elementwise())(local)

    def clear_cache(self) -> None:
        """Forget cached strategies and calls (rules stay)."""
        self._strategy_cache.clear()
        self._call_cache.clear()
