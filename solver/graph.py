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

Arrays are replaced, never modified in place: the graph may share them with
the problem (edge matrices) and slices of one buffer (unary costs, usages),
and the reductions' flat views may share their buffers.

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
from typing import Sequence

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
        nodes = problem.nodes
        if n == 0:
            return cls(0, {}, {}, {}, {}, {}, problem.memory_limit)
        # One copy of all costs and usages; each node gets a slice of it.
        sizes = np.fromiter((node.cost.shape[0] for node in nodes), dtype=np.int64, count=n)
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        spans = list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))
        costs = np.concatenate([node.cost for node in nodes]).astype(np.float64, copy=False)
        usage = np.concatenate([node.memory_bytes for node in nodes]).astype(np.float64, copy=False)
        used = np.maximum.reduceat(usage, bounds[:-1]) > 0  # usage >= 0, so any() is max > 0
        identity = np.arange(int(sizes.max()))
        graph = cls(
            num_original_nodes=n,
            unary={i: costs[a:b] for i, (a, b) in enumerate(spans)},
            edges={},
            neighbours={i: set() for i in range(n)},
            memory={i: [] for i in range(n)},
            members={i: [Member(i, identity[: b - a])] for i, (a, b) in enumerate(spans)},
            memory_limit=problem.memory_limit,
        )
        for i in np.flatnonzero(used).tolist():
            live, (a, b) = nodes[i].live, spans[i]
            if live is None:
                graph.memory[i].append(MemoryTerm(None, None, usage[a:b]))
            elif live[0] < live[1]:
                graph.memory[i].append(MemoryTerm(live[0], live[1], usage[a:b]))
        edges, neighbours = graph.edges, graph.neighbours
        for edge in problem.edges:
            u, w, mat = edge.src, edge.dst, edge.cost
            if u == w:
                graph.add_edge(u, w, mat)
                continue
            key = (u, w) if u < w else (w, u)
            if u > w:
                mat = mat.T
            existing = edges.get(key)
            # The problem's own matrix is shared (nothing modifies it in place);
            # a transposed one is copied so that stored matrices stay row-major
            # float64 (the reduction kernels are compiled for that).
            edges[key] = np.ascontiguousarray(mat, dtype=np.float64) if existing is None else existing + mat
            neighbours[u].add(w)
            neighbours[w].add(u)
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
        return sum(map(len, self.unary.values()))

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
        self.unary[var] = self.unary[var].take(keep)
        for term in self.memory[var]:
            term.usage = term.usage.take(keep)
        for member in self.members[var]:
            member.table = member.table.take(keep)
        edges = self.edges
        for other in self.neighbours[var]:
            # take() keeps the matrix C-contiguous (mat[:, keep] would not), so views ravel for free
            if var < other:
                edges[(var, other)] = edges[(var, other)].take(keep, axis=0)
            else:
                edges[(other, var)] = edges[(other, var)].take(keep, axis=1)
        for record in self.dependents.get(var, ()):
            for axis, dep in enumerate(record.deps):
                if dep == var:
                    record.argmin = np.take(record.argmin, keep, axis=axis)

    def restrict_many(self, keeps: dict[int, np.ndarray], unary: dict[int, np.ndarray],
                      edges: dict[tuple[int, int], np.ndarray]) -> None:
        """:meth:`restrict` several variables at once, given their restricted costs.

        ``unary[var]`` is ``self.unary[var][keeps[var]]`` and ``edges`` holds,
        for every edge with a restricted end, the matrix restricted at both
        ends (the reductions compute both in one pass over a flat view);
        memory terms, members and elimination records are restricted here.
        """
        for var, keep in keeps.items():
            self.unary[var] = unary[var]
            for term in self.memory[var]:
                term.usage = term.usage.take(keep)
            for member in self.members[var]:
                member.table = member.table.take(keep)
            for record in self.dependents.get(var, ()):
                for axis, dep in enumerate(record.deps):
                    if dep == var:
                        record.argmin = np.take(record.argmin, keep, axis=axis)
        self.edges.update(edges)

    def merge_into(self, var: int, into: int, mapping: np.ndarray, *, identity: bool = False) -> None:
        """Replace ``var`` by a function of ``into``: value of var = ``mapping[value of into]``.

        Exact when every feasible solution satisfies that relation (ties,
        followers): costs, memory terms and members of ``var`` are re-indexed
        by ``into``'s values. ``identity``: ``mapping`` is ``arange`` (ties of
        equal strategy lists): nothing is re-indexed, arrays are shared (no
        array of the working graph is changed in place).
        """
        unary, edges, neighbours = self.unary, self.edges, self.neighbours
        identity = identity and unary[var].shape[0] == mapping.shape[0]
        near_var, near_into = neighbours[var], neighbours[into]
        if var in near_into:
            mat = self.remove_edge(into, var)  # [into value, var value]
            unary[into] = unary[into] + mat[np.arange(mapping.shape[0]), mapping]
        unary[into] = unary[into] + (unary.pop(var) if identity else unary.pop(var).take(mapping))
        for other in list(near_var):
            # remove_edge(var, other) then add_edge(into, other, mat[mapping, :]),
            # with the matrix taken straight into its stored orientation
            stored = edges.pop((var, other) if var < other else (other, var))
            near_var.discard(other)
            near_other = neighbours[other]
            near_other.discard(var)
            mat = stored if var < other else stored.T  # [var value, other value]
            if into < other:
                key, moved = (into, other), mat if identity else mat.take(mapping, axis=0)
            else:
                key, moved = (other, into), mat.T if identity else mat.T.take(mapping, axis=1)
            if identity and not moved.flags.c_contiguous:  # stored matrices are C-ordered, as take makes them
                moved = np.ascontiguousarray(moved)
            existing = edges.get(key)
            edges[key] = moved if existing is None else existing + moved
            near_into.add(other)
            near_other.add(into)
        terms = self.memory[into]
        members = self.members[into]
        if identity:
            terms.extend(self.memory.pop(var))
            members.extend(self.members.pop(var))
        else:
            for term in self.memory.pop(var):
                terms.append(MemoryTerm(term.start, term.end, term.usage.take(mapping)))
            for member in self.members.pop(var):
                members.append(Member(member.node, member.table.take(mapping)))
        if var in self.dependents:
            for record in self.dependents.pop(var):
                self._redirect(record, var, into, mapping)
        del neighbours[var]
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
    def project(self, choice: Sequence[int]) -> dict[int, int | None]:
        """Per remaining variable, the value that gives its original nodes ``choice``
        (a warm start), or None where the reductions removed a strategy it uses
        (forbidden or dominated) or merged nodes it chooses differently.
        Eliminated and fixed variables take their recorded values on the way
        back (:meth:`reconstruct`)."""
        values: dict[int, int | None] = {}
        for var, members in self.members.items():
            ok = np.ones(self.domain_size(var), dtype=bool)
            for member in members:
                ok &= member.table[: ok.size] == choice[member.node]
            hits = np.flatnonzero(ok)
            values[var] = int(hits[0]) if hits.size else None
        return values

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
