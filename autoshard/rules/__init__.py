"""Op sharding rules: one module per op family, registered on an explicit
:class:`RuleRegistry` by :func:`load_rules`, expanded to N-D strategies and
checked numerically by :mod:`autoshard.validation` (which rule families never
import: a rule carries its ``samples`` and ``error_bound``, the validation runs them).

>>> import torch
>>> rules = load_rules()
>>> x = TensorMeta((8, 16), torch.float32)
>>> len(rules.strategies(torch.ops.aten.relu.default, (x,), {}, (2, 2))) > 1
True
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from autoshard.rules.core import (
    COMPUTE_KINDS,
    OpCall,
    OpCompute,
    OpStrategy,
    P,
    P_AVG,
    P_MAX,
    P_MIN,
    R,
    S,
    ShardPlaceholder,
    SingleDimStrategy,
    TensorMeta,
    to_meta,
)
from autoshard.rules.registry import NamedRule, Rule, RuleError, RuleRegistry, SampleInput, op_name

if TYPE_CHECKING:
    from autoshard.rules.dtensor_fallback import RuleCheck

__all__ = [
    "FAMILIES",
    "load_rules",
    "RuleRegistry",
    "Rule",
    "NamedRule",
    "RuleError",
    "SampleInput",
    "TensorMeta",
    "to_meta",
    "OpStrategy",
    "OpCompute",
    "OpCall",
    "COMPUTE_KINDS",
    "SingleDimStrategy",
    "ShardPlaceholder",
    "S",
    "R",
    "P",
    "P_AVG",
    "P_MAX",
    "P_MIN",
    "op_name",
]

FAMILIES: tuple[str, ...] = (
    "matmul",
    "pointwise",
    "reductions",
    "views",
    "slicing",
    "normalization",
    "attention",
    "cuda_attention",
    "indexing",
    "losses",
    "convolution",
    "factory",
    "hf_ops",
    "diagonal",
    "fft",
    "experts",
)
"""Family modules under ``autoshard.rules``, each with ``register(registry)``."""


def load_rules(*, dtensor_fallback: RuleCheck | None = None) -> RuleRegistry:
    """A fresh registry with every family's rules.

    ``dtensor_fallback``: for ops with no rule of ours, derive one from
    PyTorch's DTensor single-dim strategies, adopted only when it passes this
    check and logged (:mod:`autoshard.rules.dtensor_fallback`; the rules never
    import their validation, so the caller hands the check down:
    ``autoshard.validation.validator.check_derived_rule``). Off by default.
    """
    if dtensor_fallback is not None and not callable(dtensor_fallback):
        raise TypeError("load_rules: dtensor_fallback is the check a derived rule must pass "
                        f"(autoshard.validation.validator.check_derived_rule), got {dtensor_fallback!r}")
    registry = RuleRegistry()
    for family in FAMILIES:
        module = importlib.import_module(f"autoshard.rules.{family}")
        module.register(registry)
    if dtensor_fallback is not None:
        from autoshard.rules.dtensor_fallback import DTensorFallback

        registry.set_fallback(DTensorFallback(registry, dtensor_fallback))
    return registry
