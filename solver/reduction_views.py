r"""Flat views of the working graph, for the numba kernels of the reductions.

A stage of ``solver.reductions`` gathers a :class:`GraphView` of the
variables it visits; one kernel call (``solver.reduction_kernels``) takes the
decisions of the reduction on it. Layout (``L`` = local index of a variable,
``E`` = local index of an edge):

* ``var_ids[L]`` is the variable, ``local[var]`` its local index (-1 if not
  in the view). Locals ``0 .. num_loaded - 1`` have their adjacency loaded;
  the others are their neighbours (values and unary costs only);
* values: ``val_off[L] .. val_off[L + 1]`` index ``unary`` and the ``alive``
  flags the kernels keep; ``dom[L]`` is the domain size;
* adjacency of loaded locals, in the iteration order of
  ``graph.neighbours[var]``: ``adj_off[L] .. adj_off[L + 1]`` index
  ``adj_other`` (local index of the neighbour), ``adj_edge`` and ``adj_row``
  (True when L is the row side of the stored matrix, i.e. has the smaller id);
* edge ``E`` joins variables ``edge_lo[E] < edge_hi[E]`` and is stored
  row-major at ``costs[edge_off[E] :]`` with ``edge_rows[E] x edge_cols[E]``
  entries, as ``graph.edges[(edge_lo[E], edge_hi[E])]``.

A view is a copy: it describes the graph as it was when gathered. Arrays of
the working graph are replaced, never modified in place, so the graph may
take slices of the buffers the kernels return.

>>> from solver.problem import Problem
>>> g = WorkingGraph.from_problem(Problem.from_dict({"nodes": [{"cost": [1, 2]}, {"cost": [0, 0, 1]}],
...     "edges": [{"src": 0, "dst": 1, "cost": [[0, 1, 2], [1, 1, 2]]}]}))
>>> view = gather_view(g, [1, 0])
>>> view.var_ids.tolist(), view.dom.tolist(), view.adj_other.tolist(), view.adj_row.tolist()
([1, 0], [3, 2], [1, 0], [False, True])
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import numpy as np

from solver.graph import WorkingGraph

__all__ = ["GraphView", "gather_view", "gather_terms"]


class GraphView(NamedTuple):
    """Flat arrays of part of a working graph (layout in the module docstring)."""

    var_ids: np.ndarray
    local: np.ndarray
    num_loaded: int
    dom: np.ndarray
    val_off: np.ndarray
    unary: np.ndarray
    adj_off: np.ndarray
    adj_other: np.ndarray
    adj_edge: np.ndarray
    adj_row: np.ndarray
    edge_lo: np.ndarray
    edge_hi: np.ndarray
    edge_off: np.ndarray
    edge_rows: np.ndarray
    edge_cols: np.ndarray
    costs: np.ndarray


def _offsets(sizes: np.ndarray) -> np.ndarray:
    off = np.zeros(sizes.shape[0] + 1, dtype=np.int64)
    np.cumsum(sizes, out=off[1:])
    return off


def _flat(arrays: list[np.ndarray]) -> np.ndarray:
    # each array flattened row-major, one after the other
    return np.concatenate(arrays, axis=None).astype(np.float64, copy=False) if arrays else np.zeros(0)


def gather_view(graph: WorkingGraph, loaded: list[int]) -> GraphView:
    """View of the variables ``loaded`` (in this order, with their adjacency), their neighbours and edges."""
    num_loaded = len(loaded)
    sets = [graph.neighbours[v] for v in loaded]
    degree = np.fromiter(map(len, sets), dtype=np.int64, count=num_loaded)
    adj_off = _offsets(degree)
    other_ids = np.fromiter(itertools.chain.from_iterable(sets), dtype=np.int64, count=int(adj_off[-1]))
    loaded_ids = np.array(loaded, dtype=np.int64)
    local = np.full(graph.num_original_nodes, -1, dtype=np.int64)
    local[loaded_ids] = np.arange(num_loaded)
    outside = np.unique(other_ids[local[other_ids] < 0])
    local[outside] = np.arange(num_loaded, num_loaded + outside.shape[0])
    var_ids = np.concatenate([loaded_ids, outside])
    unary_list = [graph.unary[v] for v in var_ids.tolist()]
    dom = np.fromiter(map(len, unary_list), dtype=np.int64, count=var_ids.shape[0])

    # One local edge per stored edge, found by its (smaller id, larger id) code.
    owner = np.repeat(loaded_ids, degree)
    low, high = np.minimum(owner, other_ids), np.maximum(owner, other_ids)
    codes, adj_edge = np.unique(low * graph.num_original_nodes + high, return_inverse=True)
    edge_lo, edge_hi = np.divmod(codes, graph.num_original_nodes)
    edge_rows, edge_cols = dom[local[edge_lo]], dom[local[edge_hi]]
    edges = graph.edges
    return GraphView(
        var_ids=var_ids,
        local=local,
        num_loaded=num_loaded,
        dom=dom,
        val_off=_offsets(dom),
        unary=_flat(unary_list),
        adj_off=adj_off,
        adj_other=local[other_ids],
        adj_edge=adj_edge.astype(np.int64).reshape(-1),
        adj_row=owner < other_ids,
        edge_lo=edge_lo,
        edge_hi=edge_hi,
        edge_off=_offsets(edge_rows * edge_cols),
        edge_rows=edge_rows,
        edge_cols=edge_cols,
        costs=_flat([edges[key] for key in zip(edge_lo.tolist(), edge_hi.tolist())]),
    )


def gather_terms(graph: WorkingGraph, variables: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Memory terms of ``variables``: ``term_off[i] .. term_off[i + 1]`` index
    ``usage_off`` for the i-th variable, and term t has ``usage[usage_off[t] + value]``."""
    term_lists = [graph.memory[v] for v in variables]
    term_count = np.fromiter(map(len, term_lists), dtype=np.int64, count=len(variables))
    usages = [t.usage for t in itertools.chain.from_iterable(term_lists)]
    usage_size = np.fromiter(map(len, usages), dtype=np.int64, count=len(usages))
    return _offsets(term_count), _offsets(usage_size), _flat(usages)
