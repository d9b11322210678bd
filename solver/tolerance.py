"""The solver's numerical conventions: the forbidden sentinel and the tolerances, each defined once.

Forbidden. A forbidden value or pair costs ``inf`` in a
:class:`~solver.compiled.CompiledGraph` (``inf`` propagates through sums, so a
labelling's cost says whether it is allowed). The numba kernels need finite
numbers instead: there a forbidden cost is :data:`BIG`, so that the
difference of two forbidden costs is 0, not NaN, and any total at or above
:data:`FORBIDDEN` means "uses a forbidden cost" (BIG plus any finite sum of
real costs stays above BIG / 2). :func:`kernel_costs` is the one conversion.
(On input, ``solver.problem.FORBIDDEN_COST`` = 1e18 is the file format's
threshold for "forbidden"; it becomes ``inf`` when a problem is read.)

Tolerances. Costs are sums of many floating-point terms, and bounds come from
LP solvers with their own tolerances, so two tolerances are needed:

* :data:`REL_TOL` (1e-9, relative): what counts as a real difference. A bound
  within it proves a cost optimal (:func:`is_proven`, the default ``gap``); a
  search accepts a new incumbent only when it is better by more
  (:func:`improves`), so it never churns on noise; memory over the limit by
  less is not a violation (:func:`over_limit`). The solver's answers on
  integer-valued problems (IOPDDL) are exact at this tolerance.
* :data:`ROUND_OFF` (1e-12, relative): rounding noise of a sum of costs. A
  local-search move must lower the cost by more (:func:`descent_target`), so
  every accepted move is a strict decrease and descent terminates; column
  generation keeps any candidate better by more (``improves(..., rel=ROUND_OFF)``),
  since even a small gain is a new column for its master.

:data:`TINY` guards divisions by a magnitude that may be 0.

>>> is_proven(1.0, 1.0 - 1e-12)
True
>>> is_proven(0.5, 0.5 - 5e-9), is_proven(0.5, 0.5 - 5e-9, rel_gap=1e-6)
(False, True)
>>> improves(1.0 - 1e-6, 1.0), improves(1.0 - 1e-10, 1.0), improves(1.0 - 1e-10, 1.0, rel=ROUND_OFF)
(True, False, True)
>>> kernel_costs(np.array([1.0, np.inf])).tolist()
[1.0, 1e+30]
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["BIG", "FORBIDDEN", "REL_TOL", "DEFAULT_GAP", "ROUND_OFF", "LP_ZERO", "TINY", "kernel_costs",
           "is_proven", "improves", "descent_target", "over_limit", "fits_limit", "not_ruled_out",
           "floor_tolerant"]

BIG = 1e30
"""A forbidden cost inside the numba kernels (see the module docstring)."""

FORBIDDEN = BIG / 2
"""Kernel costs at or above this are forbidden; BIG plus any finite sum stays above it."""

REL_TOL = 1e-9
"""Relative size of a real difference between two costs (or memory amounts)."""

DEFAULT_GAP = REL_TOL
"""Default relative gap at which a bound proves a cost optimal."""

ROUND_OFF = 1e-12
"""Relative rounding noise of a sum of floating-point costs."""

LP_ZERO = 1e-9
"""An LP solution value at or below this is zero (LP solvers' primal tolerances are 1e-9..1e-7)."""

TINY = 1e-300
"""Floor of a magnitude used as a divisor (costs may all be 0)."""


def kernel_costs(costs: np.ndarray) -> np.ndarray:
    """``costs`` with every forbidden (non-finite) entry as :data:`BIG`, for the numba kernels."""
    return np.where(np.isfinite(costs), costs, BIG)


def is_proven(cost: float, bound: float, rel_gap: float = DEFAULT_GAP) -> bool:
    """Whether ``bound`` proves ``cost`` optimal within ``rel_gap`` (relative, with an absolute
    floor of ``rel_gap`` for costs below 1)."""
    return bound >= cost - rel_gap * max(1.0, abs(cost))


def improves(new: float, old: float, *, rel: float = REL_TOL) -> bool:
    """Whether cost ``new`` is better than ``old`` by more than ``rel`` of ``|old|``."""
    return new < old - rel * abs(old)


def descent_target(cost: float) -> float:
    """What a local move must get below to lower ``cost`` by more than rounding noise.

    Plain Python, compiled into the kernels of ``solver.localsearch``."""
    return cost - ROUND_OFF * (abs(cost) + 1.0)


def over_limit(excess, limit: float):
    """Whether memory ``excess`` over the limit (array or number) is a violation: more than
    :data:`REL_TOL` of ``limit`` (of 1 byte for limits below 1 byte)."""
    return excess > REL_TOL * max(1.0, abs(limit))


def fits_limit(usage: np.ndarray, limit: float) -> bool:
    """Whether every point's ``usage`` is within ``limit`` up to rounding noise (a solution
    read back from another solver)."""
    return bool(np.all(usage <= limit * (1 + ROUND_OFF)))


def not_ruled_out(lower: np.ndarray, upper: float) -> np.ndarray:
    """Where a lower bound ``lower`` does not exceed the cost ``upper`` of a known solution
    by more than :data:`REL_TOL` (relative): what reduced-cost fixing must keep."""
    return lower <= upper + REL_TOL * max(abs(upper), TINY)


def floor_tolerant(value: float) -> int:
    """``floor(value)``, counting a value within :data:`REL_TOL` below an integer as that
    integer (a capacity ``limit - base`` computed in floating point)."""
    return math.floor(value + REL_TOL * max(1.0, abs(value)))
