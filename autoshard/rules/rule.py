"""A sharding rule as data: the :class:`Rule` of one aten op (its single-dim
strategies, compute, validator samples) and the :class:`NamedRule` of an op
that a library defines when imported; the errors and op names they share.

The registry (:mod:`autoshard.rules.registry`) holds rules by op; the
expansion (:mod:`autoshard.rules.expand`) turns one rule into N-D strategies.
Both build on this module, neither on the other's internals.

>>> import torch
>>> op_name(torch.ops.aten.mm.default)
'aten.mm.default'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from torch._ops import OpOverload

from autoshard.rules.core import OpCall, OpCompute, SingleDimStrategy

__all__ = ["Rule", "NamedRule", "RuleError", "SampleInput", "op_name",
           "SingleDimFn", "ComputeFn", "LocalizeFn", "SampleFn", "ContractFn"]

SingleDimFn = Callable[[OpCall], Sequence[SingleDimStrategy]]
"""A rule: the single-dim strategies of one call (placeholders allowed)."""
ComputeFn = Callable[[OpCall], OpCompute]
"""What one call costs, from the (local) shapes in the call."""
LocalizeFn = Callable[[tuple, dict, OpCall], tuple[tuple, dict]]
"""(args with local tensors, kwargs, call with local shapes) -> args and kwargs
to run the op on one rank's shards (e.g. the target shape of a view)."""
SampleFn = Callable[[Any], Iterable["SampleInput"]]
"""Random valid inputs for the validator, from a :class:`autoshard.rules.samples.Sampler`."""
ContractFn = Callable[[tuple, dict, tuple], "str | None"]
"""For random ops: (global args, kwargs, unsharded outputs) -> None if the
outputs satisfy the op's contract, else a message."""


class RuleError(ValueError):
    """A rule that does not fit its op (wrong number of placements, bad dim)."""


def op_name(op: Any) -> str:
    """``aten.mm.default`` for ``torch.ops.aten.mm.default``."""
    if isinstance(op, OpOverload):
        return f"{op.namespace}.{op._opname}.{op._overloadname}"
    return str(op)


@dataclass(frozen=True, slots=True)
class SampleInput:
    """One random, valid call of an op with real tensors, for the validator."""

    args: tuple
    kwargs: dict


@dataclass(frozen=True, slots=True)
class Rule:
    """The sharding rule of one op.

    >>> # registered through RuleRegistry.family("matmul")(aten.mm.default, ...)
    """

    op: OpOverload
    """The aten overload the rule covers."""
    family: str
    """The family module that registered it (``matmul``, ``pointwise``, ...)."""
    single_dim: SingleDimFn
    """Single-dim strategies for a call; the all-replicate one is implied."""
    compute: ComputeFn
    """Compute description for the cost model, from local shapes."""
    samples: SampleFn | None = None
    """Random valid inputs for the validator (None: not validated, see ``note``)."""
    localize: LocalizeFn | None = None
    """Adjusts non-tensor args (sizes) for local shards; None: args unchanged."""
    uneven: bool = True
    """Whether the rule stays exact when a tensor dim is split unevenly."""
    strided: bool = True
    """Whether placeholders may be filled with strided shards."""
    shape_dependent: bool = False
    """Re-run ``single_dim`` per mesh dim on local shapes (views, reshapes)."""
    contract: ContractFn | None = None
    """Random ops: checked by contract instead of values."""
    reference: Callable[..., Any] | None = None
    """A CPU implementation the validator runs in place of an op that has no
    CPU kernel (same arguments, same outputs)."""
    extremes: bool = True
    """Whether the validator feeds ``-inf`` and ``finfo.min``: False where
    the kernel's own result at those values depends on the tensor's shape
    (vectorised and scalar loops disagree), which no rule can reproduce."""
    error_bound: Callable[[Any, tuple, dict], Any] | None = None
    """Where the kernel's rounding depends on shapes (BLAS): (op, args,
    kwargs) -> per output a bound on |computed - exact| for any evaluation
    order (:mod:`autoshard.rules.error_bounds`); the validator then compares
    with the op run in float64 within it instead of a fixed tolerance."""
    note: str = ""
    """Why the rule is restricted or not validated (shown by the validator)."""


@dataclass(frozen=True, slots=True)
class NamedRule:
    """The rule of an op that exists only once a library defines it, registered by the op's name.

    >>> named = NamedRule("mylib.op.default", "demo", lambda op: None, "mylib.ops")
    >>> named.package
    'mylib'
    """

    name: str
    """The op's name as :func:`op_name` prints it (``transformers.grouped_mm_fallback.default``)."""
    family: str
    """The family module that registered it."""
    make: Callable[[OpOverload], Rule]
    """Builds the :class:`Rule` for the op once it exists."""
    module: str
    """The Python module whose import defines the op (``transformers.integrations.moe``)."""

    @property
    def package(self) -> str:
        """The top-level package of :attr:`module` (is it installed?)."""
        return self.module.split(".")[0]
