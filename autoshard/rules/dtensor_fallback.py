"""Optional fallback: rules derived from PyTorch DTensor's single-dim strategies,
for ops that have no rule of ours (``load_rules(dtensor_fallback=check)``).

DTensor's built-in expansion is made for run-time dispatch: it fills shard
placeholders only with the shard kinds already present in the inputs and
wants one placement per input (docs/design.md, "What torch offers"). So we call the *raw* single-dim
strategy function of an op and convert its result to our
:class:`~autoshard.rules.core.SingleDimStrategy` list; our own expansion
(:mod:`autoshard.rules.expand`) then enumerates the N-D strategies.

Before a derived rule is used it passes a check, a :data:`RuleCheck` its caller
gives: the rules sit below their validation and never import it, so the layer
above hands the check down. The library's is
:func:`autoshard.validation.validator.check_derived_rule` (the same validator as
ours, on meshes ``(2,)`` and ``(2, 2)``), run on random tensors of the shapes of
the first call that needs the rule (its samples; at most ``max_numel`` elements
per tensor: larger calls are validated on nothing and the op stays replicated).
A rule with any failing strategy is rejected as a whole and the op keeps the
replicate-only strategy. Every adoption and rejection is logged (warning), and
the registry counts each enumeration that used a derived rule
(``RuleRegistry.fallback_uses``).

Every private torch API this needs is touched in this module only.

>>> import torch
>>> from autoshard.rules import load_rules, TensorMeta
>>> from autoshard.validation.validator import check_derived_rule
>>> rules = load_rules(dtensor_fallback=check_derived_rule)
>>> x = TensorMeta((4, 8), torch.float32)
>>> len(rules.strategies(torch.ops.aten.hypot.default, (x, x), {}, (2,))) > 1
True
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Protocol, Sequence

import torch
from torch._ops import OpOverload

from costmodel.placements import Partial, Replicate, Shard, StridedShard

from autoshard.rules.compute import elementwise
from autoshard.rules.core import OpCall, S, SingleDimStrategy, TensorMeta
from autoshard.rules.registry import Rule, RuleRegistry, SampleInput, op_name

__all__ = ["CheckReport", "DTensorFallback", "RuleCheck", "dtensor_single_dim_ops"]

log = logging.getLogger(__name__)


class CheckReport(Protocol):
    """What a check of a derived rule says (``autoshard.validation.validator.RuleReport`` is one)."""

    @property
    def ok(self) -> bool: ...

    @property
    def failures(self) -> Sequence[Any]:
        """The failing strategies, the first one logged as the reason of a rejection."""

    @property
    def strategies_checked(self) -> int: ...


RuleCheck = Callable[[Rule, RuleRegistry], CheckReport]
"""A check a derived rule must pass before it is used: ``check(rule, registry)``, the rule's
``samples`` drawing the call that asked for it (module docstring)."""


def _strategy_table() -> dict[OpOverload, Any]:
    """DTensor's registered single-dim strategies, by op (private API)."""
    from torch.distributed.tensor import DTensor

    return DTensor._op_dispatcher.sharding_propagator.op_single_dim_strategy_funcs


def dtensor_single_dim_ops() -> list[OpOverload]:
    """Every op DTensor has a single-dim strategy for."""
    return list(_strategy_table())


def _to_dtensor_meta(obj: Any) -> Any:
    from torch.distributed.tensor._dtensor_spec import TensorMeta as DTensorMeta

    if isinstance(obj, TensorMeta):
        stride, acc = [], 1
        for size in reversed(obj.shape):
            stride.append(acc)
            acc *= max(size, 1)
        return DTensorMeta(torch.Size(obj.shape), tuple(reversed(stride)), obj.dtype)
    if isinstance(obj, tuple):
        return tuple(_to_dtensor_meta(o) for o in obj)
    if isinstance(obj, list):
        return [_to_dtensor_meta(o) for o in obj]
    return obj


def _convert(p: Any) -> Any:
    """One DTensor placement (or placeholder) as ours; raises ValueError if it has no equivalent."""
    from torch.distributed.tensor._ops.single_dim_strategy import _ShardingPlaceholder
    from torch.distributed.tensor.placement_types import Partial as DPartial
    from torch.distributed.tensor.placement_types import Replicate as DReplicate
    from torch.distributed.tensor.placement_types import Shard as DShard
    from torch.distributed.tensor.placement_types import _StridedShard as DStrided

    if p is None:
        return None
    if isinstance(p, _ShardingPlaceholder):
        return S(p.dim)
    if isinstance(p, DReplicate):
        return Replicate()
    if isinstance(p, DStrided):
        return StridedShard(p.dim, p.split_factor)
    if isinstance(p, DShard):
        return Shard(p.dim)
    if type(p) is DPartial and p.reduce_op in ("sum", "avg", "max", "min"):
        return Partial(p.reduce_op)
    raise ValueError(f"no equivalent for DTensor placement {p!r}")


def _random_like(meta: TensorMeta, gen: torch.Generator) -> torch.Tensor:
    if meta.dtype.is_floating_point or meta.dtype.is_complex:
        return torch.randn(meta.shape, generator=gen, dtype=torch.float64).to(meta.dtype)
    if meta.dtype == torch.bool:
        return torch.rand(meta.shape, generator=gen) < 0.5
    return torch.randint(0, 2, meta.shape, generator=gen, dtype=meta.dtype)


def _materialize(obj: Any, gen: torch.Generator) -> Any:
    if isinstance(obj, TensorMeta):
        return _random_like(obj, gen)
    if isinstance(obj, tuple):
        return tuple(_materialize(o, gen) for o in obj)
    if isinstance(obj, list):
        return [_materialize(o, gen) for o in obj]
    return obj


class DTensorFallback:
    """Derives, checks and caches rules for ops without one of ours.

    ``registry.set_fallback(DTensorFallback(registry, check))`` (``load_rules`` does it).
    """

    def __init__(self, registry: RuleRegistry, check: RuleCheck, *, max_numel: int = 1 << 16) -> None:
        self.registry = registry
        self.check = check
        self.max_numel = max_numel
        self._rules: dict[OpOverload, Rule | None] = {}
        self.rejected: dict[OpOverload, str] = {}
        """Ops whose derived rule was not used, and why."""

    def rule_for(self, op: OpOverload, call: OpCall) -> Rule | None:
        """The validated derived rule of ``op`` (None if there is none)."""
        if op in self._rules:
            return self._rules[op]
        rule = self._derive(op, call)
        self._rules[op] = rule
        return rule

    def _derive(self, op: OpOverload, call: OpCall) -> Rule | None:
        table = _strategy_table()
        info = table.get(op)
        if info is None:
            return None
        func = getattr(info, "func", info)

        def single_dim(c: OpCall) -> list[SingleDimStrategy]:
            raw = func(op, _to_dtensor_meta(tuple(c.args)), _to_dtensor_meta(dict(c.kwargs)))
            n_out = len(c.outputs)
            out: list[SingleDimStrategy] = []
            for row in raw:
                try:
                    conv = [_convert(p) for p in row]
                except ValueError:
                    continue  # a placement we cannot express (e.g. a masked partial)
                out.append(SingleDimStrategy(tuple(conv[:n_out]), tuple(conv[n_out:])))
            return out

        if any(m is not None and m.numel > self.max_numel for m in call.outputs + call.inputs):
            self.rejected[op] = f"first call too large to validate (> {self.max_numel} elements)"
            log.warning("%s: DTensor-derived rule not used: %s", op_name(op), self.rejected[op])
            return None
        args, kwargs = call.args, dict(call.kwargs)

        def samples(sampler: Any):
            yield SampleInput(_materialize(args, sampler.gen), _materialize(kwargs, sampler.gen))

        rule = Rule(
            op=op,
            family="dtensor",
            single_dim=single_dim,
            compute=elementwise(),
            samples=samples,
            uneven=bool(getattr(info, "allow_uneven_sharding", False)),
            note="derived from DTensor's single-dim strategy",
        )
        report = self.check(rule, self.registry)
        if not report.ok:
            self.rejected[op] = str(report.failures[0])
            log.warning("%s: DTensor-derived rule rejected by the validator: %s", op_name(op), self.rejected[op])
            return None
        log.warning(
            "%s: using a rule derived from DTensor's single-dim strategy (validated: %d strategies)",
            op_name(op), report.strategies_checked,
        )
        return rule
