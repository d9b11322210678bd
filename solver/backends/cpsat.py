"""OR-tools CP-SAT: the same program with integer coefficients, multi-threaded.

CP-SAT needs integers: costs go through :func:`~solver.backends.base.integer_costs`
(exact when they are integral, else a power-of-two scale whose rounding error
widens the reported bound). Memory coefficients that are not integral are
rounded up and the right-hand side down, which keeps every solution within
the real limit. ``y`` variables are 0/1 integers here (CP-SAT has no
continuous variables); constraints (B) and (C) make them integral anyway.
LP relaxations go to GLOP, OR-tools' simplex, in the same process.
"""

from __future__ import annotations

import math
import time

import numpy as np

from solver.backends.base import (
    LP_BOUND_SHADE,
    BackendUnavailable,
    ProgramBackend,
    ProgramResult,
    integer_costs,
)
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
            # WeightedSum builds the row in C++; a Python sum of terms took 0.9 s on a
            # 37,000-variable program (IOPDDL A), this 0.5 s
            terms = [z[j] for j in cols]
            if program.sense[r] == ord("E"):
                coefs = np.round(vals).astype(np.int64).tolist()
                model.Add(cp_model.LinearExpr.WeightedSum(terms, coefs) == int(round(program.rhs[r])))
            else:
                coefs = np.ceil(vals).astype(np.int64).tolist()
                model.Add(cp_model.LinearExpr.WeightedSum(terms, coefs) <= int(math.floor(program.rhs[r])))
        ints, scale, error = integer_costs(program.cost)
        nz = np.flatnonzero(ints).tolist()
        model.Minimize(cp_model.LinearExpr.WeightedSum([z[j] for j in nz], ints[nz].tolist()))
        if warm_start is not None:
            for j, value in enumerate(warm_start.tolist()):
                model.AddHint(z[j], int(round(value)))
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(time_limit - (time.perf_counter() - start), 0.1)
        solver.parameters.num_workers = max(1, threads)
        solver.parameters.random_seed = seed
        # The bound must come from the whole local polytope, as CBC's LP does.
        # Presolve turns each linking row (B)/(C) into an exactly-one constraint,
        # which CP-SAT's default linearization (level 1) leaves out of its LP:
        # on the example transformer's 1,462-variable program the LP kept 12 of
        # 659 rows, its bound stuck at 0.65 of the optimum and the solve ran
        # into its time limit (6.0 s; CBC: 0.17 s). Level 2 puts them back for
        # a single worker; with several workers the full-problem worker that
        # runs level 2 ("max_lp") is only in the default portfolio from 8
        # workers on, so it is asked for (from 8 on it runs twice, seeded
        # differently). Now 0.15 s.
        solver.parameters.linearization_level = 2
        solver.parameters.extra_subsolvers.append("max_lp")
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

    def solve_relaxation(self, program: LinearProgram, *, time_limit: float) -> ProgramResult:
        """The LP relaxation with GLOP, OR-tools' simplex (so that this backend runs no CBC),
        with the row duals.

        Costs go in as they are: GLOP scales them itself (its default
        ``cost_scaling`` makes their range contain 1), which is what CBC needs
        :func:`~solver.backends.base.objective_scale` for.
        """
        try:
            from ortools.linear_solver import pywraplp
        except ImportError as exc:
            raise BackendUnavailable(str(exc)) from None
        start = time.perf_counter()
        lp = pywraplp.Solver.CreateSolver("GLOP")
        z = [lp.NumVar(0.0, 1.0, "") for _ in range(program.num_vars)]
        rows = []
        for r in range(program.num_rows):
            rhs = float(program.rhs[r])
            row = lp.Constraint(rhs if program.sense[r] == ord("E") else -lp.infinity(), rhs)
            lo, hi = program.row_off[r], program.row_off[r + 1]
            for j, value in zip(program.row_col[lo:hi].tolist(), program.row_val[lo:hi].tolist()):
                row.SetCoefficient(z[j], value)
            rows.append(row)
        objective = lp.Objective()
        for j in np.flatnonzero(program.cost).tolist():
            objective.SetCoefficient(z[j], float(program.cost[j]))
        objective.SetMinimization()
        lp.SetTimeLimit(max(int(1000 * (time_limit - (time.perf_counter() - start))), 1))
        code = lp.Solve()
        seconds = time.perf_counter() - start
        if code != pywraplp.Solver.OPTIMAL:
            status = "infeasible" if code == pywraplp.Solver.INFEASIBLE else "unknown"
            return ProgramResult(status, None, None, None, seconds)
        values = np.array([v.solution_value() for v in z], dtype=np.float64)
        value = objective.Value() + program.constant
        duals = np.array([row.dual_value() for row in rows], dtype=np.float64)
        return ProgramResult("optimal", values, value, value - LP_BOUND_SHADE * abs(value), seconds, duals)
