"""Strategy-graph solver (torch-free).

Reads and writes ``autoshard.problem/1`` / ``autoshard.solution/1`` (and the
IOPDDL contest format), reduces the problem exactly, then solves it with an
integer program (PuLP's CBC by default, OR-tools CP-SAT second) or, for large
graphs, an anytime large-neighbourhood search whose windows are solved
exactly.

>>> from solver import Problem, solve
>>> p = Problem.from_dict({"nodes": [{"cost": [1, 2]}]})
>>> solve(p, time_limit=5).choice
(0,)
"""

from solver.clock import PROCESS_START  # first: the clock starts before heavy imports
from solver.evaluate import Evaluation, evaluate
from solver.io import load_problem
from solver.pipeline import solve
from solver.problem import Edge, Node, Problem, ProblemError
from solver.solution import Solution, Status

__all__ = ["Problem", "Node", "Edge", "ProblemError", "Solution", "Status", "solve", "evaluate",
           "Evaluation", "load_problem", "PROCESS_START"]
