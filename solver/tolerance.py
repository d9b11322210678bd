"""When a bound proves a cost optimal: the one tolerance of the solver.

Costs are sums of many floating-point terms and bounds come from LP solvers
with their own tolerances, so ``bound == cost`` is never exact. A cost is
proven optimal when the bound is within ``rel_gap`` of it (relative, with an
absolute floor of ``rel_gap`` for costs below 1).

>>> is_proven(1.0, 1.0 - 1e-12)
True
>>> is_proven(0.5, 0.5 - 5e-9), is_proven(0.5, 0.5 - 5e-9, rel_gap=1e-6)
(False, True)
"""

from __future__ import annotations

__all__ = ["DEFAULT_GAP", "is_proven"]

DEFAULT_GAP = 1e-9
"""Default relative gap: the solver's answers on integer-valued problems (IOPDDL)
are exact at this tolerance."""


def is_proven(cost: float, bound: float, rel_gap: float = DEFAULT_GAP) -> bool:
    """Whether ``bound`` proves ``cost`` optimal within ``rel_gap``."""
    return bound >= cost - rel_gap * max(1.0, abs(cost))
