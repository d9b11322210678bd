"""OR-tools CP-SAT: the same program with integer coefficients, multi-threaded.

CP-SAT needs integers: costs go through :func:`~solver.backends.base.integer_costs`
(exact when they are integral, else a power-of-two scale whose rounding error
widens the reported bound). Memory coefficients that are not integral are
rounded up and the right-hand side down, which keeps every solution within
the real limit. ``y`` variables are 0/1 integers here (CP-SAT has no
continuous variables); constraints (B) and (C) make them integral anyway.
"""

from __future__ import annotations

import math
import time

import numpy as np

from solver.backends.base import BackendUnavailable, ProgramBackend, ProgramResult, integer_costs
from solver.ilp import LinearProgram

__all__ = ["CpSatBackend"]


class CpSatBackend(ProgramBackend):
    """Google OR-tools CP-SAT."""

    name = "cpsat"

    @classmethod
    def available(cls) -> bool:
        try:
            from ortools.sat.python import cp_model  # noqa: F401
        except ImportError:
            return False
        return True

    def solve_program(
        self,
        program: LinearProgram,
        *,
        time_limit: float,
        threads: int,
        warm_start: np.ndarray | None = None,
        seed: int = 0,
    ) -> ProgramResult:
        try:
            from ortools.sat.python import cp_model
        except ImportError as exc:
            raise BackendUnavailable(str(exc)) from None
        start = time.perf_counter()
        model = cp_model.CpModel()
        z = [model.NewBoolVar(f"z{j}") for j in range(program.num_vars)]
        for r in range(program.num_rows):
            lo, hi = program.row_off[r], program.row_off[r + 1]
            cols = program.row_col[lo:hi].tolist()
            vals = program.row_val[lo:hi]
            if program.sense[r] == ord("E"):
                coefs = np.round(vals).astype(np.int64).tolist()
                model.Add(sum(c * z[j] for c, j in zip(coefs, cols)) == int(round(program.rhs[r])))
            else:
                coefs = np.ceil(vals).astype(np.int64).tolist()
                model.Add(sum(c * z[j] for c, j in zip(coefs, cols)) <= int(math.floor(program.rhs[r])))
        ints, scale, error = integer_costs(program.cost)
        nz = np.flatnonzero(ints)
        model.Minimize(sum(int(ints[j]) * z[j] for j in nz.tolist()))
        if warm_start is not None:
            for j, value in enumerate(warm_start.tolist()):
                model.AddHint(z[j], int(round(value)))
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(time_limit - (time.perf_counter() - start), 0.1)
        solver.parameters.num_workers = max(1, threads)
        solver.parameters.random_seed = seed
        code = solver.Solve(model)
        seconds = time.perf_counter() - start
        if code == cp_model.INFEASIBLE:
            return ProgramResult("infeasible", None, None, None, seconds)
        bound = solver.BestObjectiveBound() / scale - error + program.constant
        if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return ProgramResult("unknown", None, None, bound, seconds)
        values = np.array([solver.Value(v) for v in z], dtype=np.float64)
        objective = float(program.cost @ values) + program.constant
        status = "optimal" if code == cp_model.OPTIMAL and error == 0.0 else "feasible"
        if status == "optimal":
            bound = objective
        return ProgramResult(status, values, objective, min(bound, objective), seconds)
