"""The same problem over fewer values per variable, and the value maps both ways.

Given per variable v a sorted, non-empty set A_v of its values, the
restricted problem has domain {0..|A_v|-1}, where value i stands for
A_v[i]: unary costs, edge matrices and memory usages are the rows and
columns of A, nothing else changes. A solution of the restricted problem is
therefore a solution of the full one with the same cost and memory, and the
restricted optimum is an upper bound of the full one (its lower bounds are
not bounds of the full problem, unless the dropped values are proven useless,
as reduced-cost fixing in ``solver.colgen`` does). Column generation's
restricted program and the exact stage after reduced-cost fixing solve such
problems.

>>> from solver.compiled import assemble_graph
>>> g = assemble_graph(var_ids=np.arange(2), unary=[np.array([3.0, 1.0, 2.0]), np.array([0.0, 5.0])],
...     edge_u=[0], edge_v=[1], edge_costs=[np.arange(6.0).reshape(3, 2)], term_var=[], term_t0=[],
...     term_t1=[], term_usage=[], base=np.zeros(0), time_points=np.zeros(0, np.int64), limit=np.inf,
...     constant=0.0)
>>> allowed = [np.array([1, 2]), np.array([0, 1])]
>>> sub = restrict_values(g, allowed)
>>> sub.dom.tolist(), sub.cost(to_restricted(allowed, np.array([2, 1]))), g.cost(np.array([2, 1]))
([2, 2], 12.0, 12.0)
>>> from_restricted(allowed, np.array([0, 1])).tolist()
[1, 1]
"""

from __future__ import annotations

import numpy as np

from solver.compiled import CompiledGraph, assemble_graph

__all__ = ["restrict_values", "to_restricted", "from_restricted"]


def restrict_values(graph: CompiledGraph, allowed: list[np.ndarray]) -> CompiledGraph:
    """The same problem with variable v limited to the values ``allowed[v]`` (sorted, non-empty).

    Value i of v in the result is ``allowed[v][i]`` in ``graph``; costs, edges
    and memory are unchanged otherwise, so a solution of the result maps back
    to a solution of ``graph`` with the same cost and memory.
    """
    unary = [graph.unary_of(v)[allowed[v]] for v in range(graph.num_vars)]
    edge_costs = [graph.edge_matrix(e)[np.ix_(allowed[int(graph.edge_u[e])], allowed[int(graph.edge_v[e])])]
                  for e in range(graph.num_edges)]
    usage = [graph.term_usage_of(s)[allowed[int(graph.term_var[s])]] for s in range(graph.term_var.size)]
    return assemble_graph(
        var_ids=graph.var_ids, unary=unary, edge_u=graph.edge_u, edge_v=graph.edge_v, edge_costs=edge_costs,
        term_var=graph.term_var, term_t0=graph.term_t0, term_t1=graph.term_t1, term_usage=usage,
        base=graph.base, time_points=graph.time_points, limit=graph.limit, constant=graph.constant)


def to_restricted(allowed: list[np.ndarray], values: np.ndarray) -> np.ndarray:
    """Values of the full problem (each in ``allowed[v]``) as indices of :func:`restrict_values`' result."""
    return np.array([int(np.searchsorted(a, x)) for a, x in zip(allowed, values)], dtype=np.int64)


def from_restricted(allowed: list[np.ndarray], values: np.ndarray) -> np.ndarray:
    """Values of :func:`restrict_values`' result as values of the full problem."""
    return np.array([a[x] for a, x in zip(allowed, values)], dtype=np.int64)
