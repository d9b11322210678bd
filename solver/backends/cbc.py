"""CBC (the binary that comes with PuLP), fed a free-MPS file written with numpy.

PuLP's modelling objects cost several microseconds per variable and per term;
our programs have 10^5-10^6 of each, so the MPS file is written directly from
the sparse arrays of :class:`~solver.ilp.LinearProgram`; the binary is the one
``pulp[cbc]`` installs (cbcbox), or the one older PuLP releases bundle. The lower bound at a time limit is
read from CBC's closing summary (``Lower bound:``).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
import warnings

import numpy as np

from solver.backends.base import LP_BOUND_SHADE, BackendUnavailable, ProgramBackend, ProgramResult, objective_scale
from solver.ilp import LinearProgram

__all__ = ["CbcBackend", "write_mps"]

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def _cbc_path() -> str | None:
    """The CBC binary: ``pulp[cbc]``'s cbcbox build (PuLP's choice from 3.3 on), else
    the binary older PuLP releases bundle, else one on PATH."""
    candidates = []
    try:
        import cbcbox

        candidates.append(cbcbox.cbc_bin_path())
    except Exception:  # not installed, or no build for this platform
        pass
    try:
        import pulp

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            candidates.append(pulp.PULP_CBC_CMD().path)
    except Exception:
        pass
    candidates.append(shutil.which("cbc"))
    for path in candidates:
        if path and os.path.exists(path) and os.access(path, os.X_OK):
            return path
    return None


def _num(values: np.ndarray) -> np.ndarray:
    return np.char.mod("%.17g", values)


_DIGITS = np.array(list("0123456789abcdefghijklmnopqrstuvwxyz"))


def _names(prefix: str, indices: np.ndarray) -> np.ndarray:
    """Base-36 names (``C1z``), short enough for the 8-character fields of fixed MPS."""
    rest = np.asarray(indices, dtype=np.int64).copy()
    out = _DIGITS[rest % 36]
    rest //= 36
    while rest.any():
        more = rest > 0
        out = np.where(more, np.char.add(_DIGITS[rest % 36], out), out)
        rest //= 36
    return np.char.add(prefix, out)


def write_mps(program: LinearProgram, path: str, scale: float = 1.0) -> None:
    """Fixed-layout MPS (as PuLP writes it): rows R<i>, columns C<j> in base 36,
    objective OBJ, binaries as integer columns bounded by 1.

    CBC reads the BOUNDS section by column position, so every name field is
    padded to 8 characters.
    """
    col_names = np.char.ljust(_names("C", np.arange(program.num_vars)), 8)
    row_names = np.char.ljust(_names("R", np.arange(program.num_rows)), 8)
    lines = ["NAME          autoshard", "ROWS", " N  OBJ"]
    sense = np.where(program.sense == ord("E"), " E  ", " L  ")
    lines += np.char.add(sense, row_names).tolist()
    lines.append("COLUMNS")
    rows = np.repeat(np.arange(program.num_rows), np.diff(program.row_off))
    ncols = program.num_vars
    all_col = np.concatenate([np.arange(ncols), program.row_col])
    all_row = np.concatenate([np.full(ncols, "OBJ     "), row_names[rows]])
    all_val = np.concatenate([program.cost * scale, program.row_val])
    keep = (all_val != 0) | (np.arange(all_col.size) < ncols)  # every column appears once at least
    all_col, all_row, all_val = all_col[keep], all_row[keep], all_val[keep]
    order = np.argsort(all_col, kind="stable")
    all_col, all_row, all_val = all_col[order], all_row[order], all_val[order]
    entries = np.char.add(
        np.char.add(np.char.add("    ", col_names[all_col]), "  "), np.char.add(np.char.add(all_row, "  "), _num(all_val))
    ).tolist()
    boundary = int(np.searchsorted(all_col, program.num_binary))
    lines.append("    MARK      'MARKER'                 'INTORG'")
    lines += entries[:boundary]
    lines.append("    MARK      'MARKER'                 'INTEND'")
    lines += entries[boundary:]
    lines.append("RHS")
    nz = np.flatnonzero(program.rhs)
    lines += np.char.add(np.char.add("    RHS       ", row_names[nz]), np.char.add("  ", _num(program.rhs[nz]))).tolist()
    lines.append("BOUNDS")
    # integer columns with upper bound 1 are binary; y columns are in [0, 1]
    lines += np.char.add(np.char.add(" UP BND       ", col_names), "  1").tolist()
    lines.append("ENDATA")
    with open(path, "w") as handle:
        handle.write("\n".join(lines) + "\n")


class CbcBackend(ProgramBackend):
    """COIN-OR CBC (branch and cut); its LP solver Clp for relaxations."""

    name = "cbc"

    @classmethod
    def available(cls) -> bool:
        return _cbc_path() is not None

    def solve_program(
        self,
        program: LinearProgram,
        *,
        time_limit: float,
        threads: int,
        warm_start: np.ndarray | None = None,
        seed: int = 0,
    ) -> ProgramResult:
        def options(tmp: str, budget: float) -> list[str]:
            # CBC checks its -sec limit only between phases (its root cuts and
            # heuristics can overrun it by minutes), so it gets most of the time
            # as -sec and is killed at the real limit.
            args = ["-sec", f"{max(0.85 * budget, 0.2):.3f}", "-timeMode", "elapsed",
                    "-threads", str(max(1, threads)), "-randomSeed", str(seed + 1),
                    "-ratioGap", "0", "-allowableGap", "0"]
            if warm_start is not None:
                mst = os.path.join(tmp, "start.mst")
                nz = np.flatnonzero(warm_start)
                with open(mst, "w") as handle:
                    handle.write("Stopped on time - objective value 0\n")
                    handle.writelines(f"{i:>7} {name} {warm_start[j]:>15} 0\n"
                                      for i, (j, name) in enumerate(zip(nz, _names("C", nz))))
                args += ["-mips", mst]
            return args + ["-solve"]

        return _run_cbc(program, options, time_limit,
                        lambda sol, log_text, scale, seconds: _read_solution(sol, log_text, program, seconds, scale))

    def solve_relaxation(self, program: LinearProgram, *, time_limit: float) -> ProgramResult:
        """The LP relaxation (Clp, inside the CBC binary), without duals: the ones
        the binary prints are not those of the optimal basis. Before its LP, CBC
        tightens the bounds of binary columns by their integrality, so its value
        may lie above the pure LP optimum (still a valid bound of the program)."""
        def read(sol: str, log_text: str, scale: float, seconds: float) -> ProgramResult:
            with open(sol) as handle:
                header = handle.readline().lower()
                if not header.startswith("optimal"):
                    status = "infeasible" if "infeasible" in header else "unknown"
                    return ProgramResult(status, None, None, None, seconds)
                z = _read_columns(handle, program.num_vars)
            objective = float(program.cost @ z) + program.constant
            return ProgramResult("optimal", z, objective, objective - LP_BOUND_SHADE * abs(objective), seconds)

        options = lambda tmp, budget: ["-sec", f"{max(budget, 0.2):.3f}", "-timeMode", "elapsed",  # noqa: E731
                                       "-initialSolve"]
        return _run_cbc(program, options, time_limit, read)


def _run_cbc(program: LinearProgram, options, time_limit: float, read) -> ProgramResult:
    """Write the program, run CBC with ``options(tmpdir, budget)`` and return
    ``read(solution path, log, objective scale, seconds)`` while the temporary
    folder still exists; ``unknown`` when CBC failed or was killed at the limit."""
    path = _cbc_path()
    if path is None:
        raise BackendUnavailable("CBC binary not found (install pulp[cbc])")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="autoshard-cbc-") as tmp:
        mps = os.path.join(tmp, "model.mps")
        sol = os.path.join(tmp, "model.sol")
        scale = objective_scale(program.cost)
        write_mps(program, mps, scale)
        budget = time_limit - (time.perf_counter() - start)
        args = [path, mps, *options(tmp, budget), "-printingOptions", "all", "-solution", sol]
        log.debug("running %s", " ".join(args))
        try:
            proc = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  stdin=subprocess.DEVNULL, check=False,
                                  timeout=max(time_limit - (time.perf_counter() - start), 0.1))
        except subprocess.TimeoutExpired:
            log.info("cbc killed at its time limit")
            return ProgramResult("unknown", None, None, None, time.perf_counter() - start)
        seconds = time.perf_counter() - start
        if proc.returncode != 0 or not os.path.exists(sol):
            log.warning("cbc failed (exit %s): %s", proc.returncode, proc.stdout[-500:])
            return ProgramResult("unknown", None, None, None, seconds)
        return read(sol, proc.stdout, scale, seconds)


def _read_columns(handle, num_vars: int) -> np.ndarray:
    z = np.zeros(num_vars)
    for line in handle:
        parts = line.split()
        if parts and parts[0] == "**":  # CBC marks some entries (e.g. infeasibilities)
            parts = parts[1:]
        if len(parts) >= 3 and parts[1].startswith("C"):
            z[int(parts[1][1:], 36)] = float(parts[2])
    return z


_BOUND = re.compile(r"Lower bound:\s*([-+0-9.eE]+)")
_OBJ = re.compile(r"Objective value:\s*([-+0-9.eE]+)")


def _read_solution(path: str, log_text: str, program: LinearProgram, seconds: float,
                   scale: float) -> ProgramResult:
    with open(path) as handle:
        header = handle.readline()
        z = _read_columns(handle, program.num_vars)
    head = header.lower()
    # e.g. "Optimal - objective value 4", "Integer infeasible - objective value 0",
    # "Infeasible - ...", "Stopped on time - objective value 9",
    # "Stopped on time (no integer solution - continuous used) - ..."
    if head.startswith("optimal"):
        status = "optimal"
    elif "no integer" in head or "unbounded" in head:
        status = "unknown"
    elif "infeasible" in head and not head.startswith("stopped"):
        status = "infeasible"
    elif head.startswith("stopped"):
        status = "feasible"
    else:
        status = "unknown"
    bound_match = _BOUND.search(log_text)
    # CBC prints the bound to 6 significant digits: shade it down by 1e-5
    # (relative) so that rounding can never lift it above the true bound.
    bound = None
    if bound_match:
        printed = float(bound_match.group(1))
        bound = (printed - 1e-5 * abs(printed)) / scale + program.constant
    if status in ("infeasible", "unknown"):
        return ProgramResult(status, None, None, bound, seconds)
    # a stopped run may report a point that is not integral: treat it as no solution
    if not np.allclose(z[: program.num_binary], np.round(z[: program.num_binary]), atol=1e-6):
        return ProgramResult("unknown", None, None, bound, seconds)
    objective = float(program.cost @ z) + program.constant
    if status == "optimal":
        bound = objective
    return ProgramResult(status, z, objective, bound, seconds)
