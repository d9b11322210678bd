"""The working graph that reductions transform, and the way back to a choice.

A :class:`~solver.problem.Problem` talks about *nodes*; the solver works on
*variables*. At first there is one variable per node; reductions merge
variables (ties, followers), shrink their domains (pins, dominated or
infeasible strategies) and eliminate some (single-strategy folding, exact
elimination of memory-free variables). Throughout:

* variable ``v`` has a domain of ``d_v`` values, a unary cost vector
  ``unary[v]`` (``inf`` = forbidden) and a list of memory terms
  ``(start, end, usage)`` (``usage`` indexed by v's values; ``start=None`` for
  "always live");
* pairwise costs live on ``edges[(u, w)]`` with ``u < w``, a ``d_u x d_w``
  matrix; parallel edges are summed on insertion;
* every original node is a *member* of exactly one variable, with a table
  giving the node's strategy for each value of the variable, or it belongs to
  an eliminated variable whose value is a function of other variables
  (an *elimination record*);
* ``constant`` collects costs that no longer depend on any choice and
  ``fixed_memory`` the memory terms of variables that have one value left.

Invariant kept by every operation: for every assignment of the remaining
variables, ``total(graph) + constant`` equals the original objective of the
reconstructed choice, and the memory at every time equals the original
memory (that is what makes each reduction exact; see ``solver.reductions``).

>>> from solver.problem import Problem
>>> p = Problem.from_dict({"nodes": [{"cost": [1, 2]}, {"cost": [3, 0]}],
...     "edges": [{"src": 0, "dst": 1, "cost": [[0, 5], [5, 0]]}]})
>>> g = WorkingGraph.from_problem(p)
>>> g.reconstruct({0: 1, 1: 0})
[1, 0]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from solver.problem import Problem

__all__ = ["MemoryTerm", "Member", "Elimination", "WorkingGraph"]


@dataclass(slots=True)
class MemoryTerm:
    """Memory ``usage[value]`` counted at times ``start <= t < end`` (always if start is None)."""

    start: int | None
    end: int | None
    usage: np.ndarray


@dataclass(slots=True)
class Member:
    """Original node ``node`` takes strategy ``table[value of its variable]``."""

    node: int
    table: np.ndarray


@dataclass(slots=True)
class Elimination:
    """Variable ``var`` was eliminated: its value is ``argmin[values of deps]``.

    ``argmin`` has one axis per dependency (0, 1 or 2 of them); ``members`` are
    the original nodes that hung on ``var``.
    """

    var: int
    deps: tuple[int, ...]
    argmin: np.ndarray
    members: list[Member]


@dataclass(slots=True)
class WorkingGraph:
    """Mutable variable graph; see the module docstring for the invariant."""

    num_original_nodes: int
    unary: dict[int, np.ndarray]
    edges: dict[tuple[int, int], np.ndarray]
    neighbours: dict[int, set[int]]
    memory: dict[int, list[MemoryTerm]]
    members: dict[int, list[Member]]
    memory_limit: float | None
    constant: float = 0.0
    fixed_memory: list[MemoryTerm] = field(default_factory=list)
    eliminations: list[Elimination] = field(default_factory=list)
    # var -> elimination records whose argmin is indexed by var's values; kept
    # in step with var's domain by restrict() and merge_into().
    dependents: dict[int, list[Elimination]] = field(default_factory=dict)
    # var -> the variable it was merged into, path-compressed on lookup.
    merged_into: dict[int, int] = field(default_factory=dict)

    # -- construction ------------------------------------------------------
    @classmethod
    def from_problem(cls, problem: Problem) -> "WorkingGraph":
        n = problem.num_nodes
        graph = cls(
            num_original_nodes=n,
            unary={i: node.cost.copy() for i, node in enumerate(problem.nodes)},
            edges={},
            neighbours={i: set() for i in range(n)},
            memory={},
            members={i: [Member(i, np.arange(node.num_strategies))] for i, node in enumerate(problem.nodes)},
            memory_limit=problem.memory_limit,
        )
        for i, node in enumerate(problem.nodes):
            terms = []
            if node.memory_bytes.any():
                if node.live is None:
                    terms.append(MemoryTerm(None, None, node.memory_bytes.copy()))
                elif node.live[0] < node.live[1]:
                    terms.append(MemoryTerm(node.live[0], node.live[1], node.memory_bytes.copy()))
            graph.memory[i] = terms
        for edge in problem.edges:
            graph.add_edge(edge.src, edge.dst, edge.cost)
        return graph

    # -- queries -----------------------------------------------------------
    @property
    def variables(self) -> list[int]:
        return sorted(self.unary)

    def domain_size(self, var: int) -> int:
        return int(self.unary[var].shape[0])

    def edge_matrix(self, u: int, w: int) -> np.ndarray:
        """Matrix indexed ``[value of u, value of w]`` (a transposed view if stored the other way)."""
        if u < w:
            return self.edges[(u, w)]
        return self.edges[(w, u)].T

    def representative(self, var: int) -> int | None:
        """The variable that now stands for ``var`` (itself, or what it was merged
        into, transitively); None if that one was fixed or eliminated."""
        path = []
        while var not in self.unary and var in self.merged_into:
            path.append(var)
            var = self.merged_into[var]
        for step in path[:-1]:  # path compression
            self.merged_into[step] = var
        return var if var in self.unary else None

    def num_choices(self) -> int:
        return sum(int(c.shape[0]) for c in self.unary.values())

    # -- edits (each keeps the invariant) ----------------------------------
    def add_edge(self, u: int, w: int, matrix: np.ndarray) -> None:
        """Add a pairwise cost, summing with an existing edge between u and w."""
        if u == w:
            self.unary[u] = self.unary[u] + np.diagonal(matrix)
            return
        key, mat = ((u, w), matrix) if u < w else ((w, u), matrix.T)
        existing = self.edges.get(key)
        self.edges[key] = mat.copy() if existing is None else existing + mat
        self.neighbours[u].add(w)
        self.neighbours[w].add(u)

    def remove_edge(self, u: int, w: int) -> np.ndarray:
        """Remove and return the matrix indexed ``[value of u, value of w]``."""
        key = (u, w) if u < w else (w, u)
        mat = self.edges.pop(key)
        self.neighbours[u].discard(w)
        self.neighbours[w].discard(u)
        return mat if u < w else mat.T

    def restrict(self, var: int, keep: np.ndarray) -> None:
        """Keep only the values ``keep`` (indices into the current domain) of ``var``."""
        self.unary[var] = self.unary[var][keep]
        for term in self.memory[var]:
            term.usage = term.usage[keep]
        for member in self.members[var]:
            member.table = member.table[keep]
        for other in self.neighbours[var]:
            key = (var, other) if var < other else (other, var)
            mat = self.edges[key]
            self.edges[key] = mat[keep, :] if var < other else mat[:, keep]
        for record in self.dependents.get(var, ()):
            for axis, dep in enumerate(record.deps):
                if dep == var:
                    record.argmin = np.take(record.argmin, keep, axis=axis)

    def merge_into(self, var: int, into: int, mapping: np.ndarray) -> None:
        """Replace ``var`` by a function of ``into``: value of var = ``mapping[value of into]``.

        Exact when every feasible solution satisfies that relation (ties,
        followers): costs, memory terms and members of ``var`` are re-indexed
        by ``into``'s values.
        """
        if var in self.neighbours[into]:
            mat = self.remove_edge(into, var)  # [into value, var value]
            self.unary[into] = self.unary[into] + mat[np.arange(mapping.shape[0]), mapping]
        self.unary[into] = self.unary[into] + self.unary.pop(var)[mapping]
        for other in list(self.neighbours[var]):
            mat = self.remove_edge(var, other)  # [var value, other value]
            self.add_edge(into, other, mat[mapping, :])
        for term in self.memory.pop(var):
            self.memory[into].append(MemoryTerm(term.start, term.end, term.usage[mapping]))
        for member in self.members.pop(var):
            self.members[into].append(Member(member.node, member.table[mapping]))
        for record in self.dependents.pop(var, ()):
            self._redirect(record, var, into, mapping)
        del self.neighbours[var]
        self.merged_into[var] = into

    def _redirect(self, record: Elimination, var: int, into: int, mapping: np.ndarray) -> None:
        """Re-index a record that depended on ``var`` by the values of ``into``."""
        argmin, deps = record.argmin, list(record.deps)
        for axis, dep in enumerate(deps):
            if dep == var:
                argmin = np.take(argmin, mapping, axis=axis)
                deps[axis] = into
        if len(deps) == 2 and deps[0] == deps[1]:  # both axes now index `into`
            argmin, deps = np.diagonal(argmin).copy(), deps[:1]
        record.argmin, record.deps = argmin, tuple(deps)
        if record not in self.dependents.setdefault(into, []):
            self.dependents[into].append(record)

    def fix(self, var: int) -> None:
        """Fold a variable with a single value: costs to constant, memory to fixed memory."""
        if self.domain_size(var) != 1:
            raise ValueError(f"variable {var} has {self.domain_size(var)} values, cannot fix")
        self.constant += float(self.unary.pop(var)[0])
        for other in list(self.neighbours[var]):
            mat = self.remove_edge(var, other)  # [1, d_other]
            self.unary[other] = self.unary[other] + mat[0]
        for term in self.memory.pop(var):
            if term.usage[0]:
                self.fixed_memory.append(MemoryTerm(term.start, term.end, term.usage[:1].copy()))
        self._record(Elimination(var, (), np.zeros((), dtype=np.int64), self.members.pop(var)))
        del self.neighbours[var]

    def eliminate(self, var: int, deps: tuple[int, ...], argmin: np.ndarray) -> None:
        """Record that ``var`` (already disconnected, costs moved) is ``argmin[deps]``."""
        if self.neighbours.get(var):
            raise ValueError(f"variable {var} still has neighbours")
        self.unary.pop(var)
        self.memory.pop(var, None)
        self.neighbours.pop(var, None)
        self._record(Elimination(var, deps, argmin, self.members.pop(var)))

    def _record(self, record: Elimination) -> None:
        self.eliminations.append(record)
        for dep in record.deps:
            self.dependents.setdefault(dep, []).append(record)
        # Records that depended on the eliminated variable stay valid: its
        # value is resolved (reverse order) before theirs.

    # -- the way back ------------------------------------------------------
    def reconstruct(self, values: dict[int, int]) -> list[int]:
        """Strategy per original node, from one value per remaining variable."""
        choice = [-1] * self.num_original_nodes
        known = dict(values)
        for var, members in self.members.items():
            value = known[var]
            for member in members:
                choice[member.node] = int(member.table[value])
        for record in reversed(self.eliminations):
            if record.deps:
                value = int(record.argmin[tuple(known[d] for d in record.deps)])
            else:
                value = int(record.argmin)
            known[record.var] = value
            for member in record.members:
                choice[member.node] = int(member.table[value])
        missing = [i for i, c in enumerate(choice) if c < 0]
        if missing:
            raise RuntimeError(f"reconstruction left nodes {missing[:5]} without a strategy")
        return choice

    def total_cost(self, values: dict[int, int]) -> float:
        """Objective of the remaining graph plus the constant (for tests and checks)."""
        total = self.constant
        for var, unary in self.unary.items():
            total += float(unary[values[var]])
        for (u, w), mat in self.edges.items():
            total += float(mat[values[u], values[w]])
        return total if not math.isnan(total) else math.inf
