"""What every exact backend provides: solve a :class:`~solver.ilp.LinearProgram`.

Backends are registered by name in ``solver.backends`` and imported lazily;
nothing probes for a solver or starts a process at import time.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass

import numpy as np

from solver.ilp import LinearProgram

__all__ = ["ProgramResult", "ProgramBackend", "BackendUnavailable", "integer_costs"]


class BackendUnavailable(RuntimeError):
    """The backend's library or binary is not installed."""


@dataclass(frozen=True, slots=True)
class ProgramResult:
    """Outcome of one program solve.

    ``status``: ``optimal`` (proven), ``feasible`` (solution, no proof:
    stopped by the time limit), ``infeasible`` (proven), ``unknown`` (no
    solution and no proof). ``bound`` is a valid lower bound of the program
    (constant included), or None.
    """

    status: str
    z: np.ndarray | None
    objective: float | None
    bound: float | None
    seconds: float


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
    scale = 2.0 ** math.floor(math.log2(max_magnitude / max(total, 1e-300)))
    ints = np.round(cost * scale).astype(np.int64)
    # one rounding error of <= 0.5 per nonzero term of a solution; a solution
    # uses at most one x per variable and one y per edge, bounded by all terms
    return ints, scale, 0.5 * float(np.count_nonzero(cost)) / scale
