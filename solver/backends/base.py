"""What every exact backend provides: solve a :class:`~solver.ilp.LinearProgram`, or its LP relaxation.

Backends are registered by name in ``solver.backends`` and imported lazily;
nothing probes for a solver or starts a process at import time. Every
integer program and every LP the solver solves goes through a backend:
``solve_program`` (branch and bound) and ``solve_relaxation`` (the LP with
every variable in [0, 1]: the LP-guided incumbent of ``solver.exact``, the
master LP of ``solver.colgen``).
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass

import numpy as np

from solver.ilp import LinearProgram
from solver.tolerance import TINY

__all__ = ["ProgramResult", "ProgramBackend", "BackendUnavailable", "integer_costs", "objective_scale",
           "LP_BOUND_SHADE"]

LP_BOUND_SHADE = 1e-7
"""An LP solver's optimum is exact up to its tolerances (about 1e-7 relative): the
bound a relaxation reports is its objective shaded down by this much (relative)."""


class BackendUnavailable(RuntimeError):
    """The backend's library or binary is not installed."""


@dataclass(frozen=True, slots=True)
class ProgramResult:
    """Outcome of one program solve.

    ``status``: ``optimal`` (proven), ``feasible`` (solution, no proof:
    stopped by the time limit), ``infeasible`` (proven), ``unknown`` (no
    solution and no proof). ``bound`` is a valid lower bound of the program
    (constant included), or None. ``duals`` (LP relaxations only, when the
    solver reports them) holds one dual value per row: the rate at which the
    optimum changes with the row's right-hand side (<= 0 on an ``L`` row).
    """

    status: str
    z: np.ndarray | None
    objective: float | None
    bound: float | None
    seconds: float
    duals: np.ndarray | None = None


class ProgramBackend(abc.ABC):
    """A solver for mixed binary linear programs."""

    name: str = ""

    @classmethod
    @abc.abstractmethod
    def available(cls) -> bool:
        """True when the backend can run here."""

    @abc.abstractmethod
    def solve_program(
        self,
        program: LinearProgram,
        *,
        time_limit: float,
        threads: int,
        warm_start: np.ndarray | None = None,
        seed: int = 0,
    ) -> ProgramResult:
        """Minimise ``program``; never longer than ``time_limit`` seconds (plus start-up)."""

    @abc.abstractmethod
    def solve_relaxation(self, program: LinearProgram, *, time_limit: float) -> ProgramResult:
        """The LP relaxation of ``program`` (every variable in [0, 1]): status ``optimal`` with
        the fractional solution, its objective and a valid lower bound (and the row duals
        when the solver gives them), else ``infeasible`` or ``unknown`` without a solution."""


def objective_scale(cost: np.ndarray) -> float:
    """A power of two bringing the median nonzero cost near 1e3.

    LP and MIP solvers' tolerances are absolute (cut-off increments, reduced
    costs around 1e-7): with costs in seconds (1e-6..1e-2) CBC declared
    non-optimal solutions optimal. A power of two rescales without rounding
    error.
    """
    nonzero = np.abs(cost[cost != 0])
    if nonzero.size == 0:
        return 1.0
    return float(2.0 ** round(np.log2(1e3 / float(np.median(nonzero)))))


def integer_costs(cost: np.ndarray, *, max_magnitude: float = 2.0**50) -> tuple[np.ndarray, float, float]:
    """Costs as integers for solvers that need them: ``(ints, scale, max_total_error)``.

    Integral costs are kept as they are (scale 1, no error) when their sum fits;
    otherwise they are multiplied by a power of two chosen so the total stays
    below ``max_magnitude`` and rounded. The rounding can change the order of
    solutions whose costs differ by less than ``max_total_error`` (in original
    units); callers widen the bound by it so it stays valid.
    """
    total = float(np.abs(cost).sum())
    if np.all(cost == np.round(cost)) and total <= max_magnitude:
        return cost.astype(np.int64), 1.0, 0.0
    scale = 2.0 ** math.floor(math.log2(max_magnitude / max(total, TINY)))
    ints = np.round(cost * scale).astype(np.int64)
    # one rounding error of <= 0.5 per nonzero term of a solution; a solution
    # uses at most one x per variable and one y per edge, bounded by all terms
    return ints, scale, 0.5 * float(np.count_nonzero(cost)) / scale
