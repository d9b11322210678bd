r"""Memory as prices: the priced pairwise problem and the bound it gives.

For multipliers lambda_p >= 0 on the kept time points p (zero where no
price is set), the Lagrangian relaxation of the memory rows is

    D(lambda) = min_x  F(x) + sum_p lambda_p (mem_p(x) - L)
              = min_x  F_lambda(x) + K - sum_p lambda_p (L - base_p)

with K the graph's constant and F_lambda a pairwise problem without memory:
every memory segment s of variable v (usage m_s, points [t0_s, t1_s)) adds

    W_s m_s(a),   W_s = sum_{t0_s <= p < t1_s} lambda_p                    (P)

to the unary cost of value a of v (:func:`segment_prices`,
:func:`priced_unary`). By weak duality D(lambda) is a lower bound of the
constrained optimum for any lambda >= 0, and so is any lower bound of
min F_lambda put in its place (:func:`dual_bound`). The Lagrangian rounds
(``solver.lagrangian``) and column generation (``solver.colgen``) price the
memory this way; reduced-cost fixing (``solver.colgen``) applies the same
bound to the min-marginals of F_lambda.

>>> from solver.compiled import assemble_graph
>>> g = assemble_graph(var_ids=np.arange(1), unary=[np.array([1.0, 0.0])], edge_u=[], edge_v=[],
...     edge_costs=[], term_var=[0], term_t0=[0], term_t1=[2], term_usage=[np.array([0.0, 2.0])],
...     base=np.zeros(2), time_points=np.arange(2), limit=1.0, constant=0.0)
>>> lam = np.array([0.25, 0.5])
>>> priced_unary(g, lam).tolist()         # value 1 uses 2 at both points: 0 + 2 * (0.25 + 0.5)
[1.0, 1.5]
>>> dual_bound(g, lam, 1.0)               # min F_lambda = 1, minus the prices of the capacity
0.25
"""

from __future__ import annotations

import numpy as np

from solver.compiled import CompiledGraph

__all__ = ["segment_prices", "priced_unary", "dual_bound"]


def segment_prices(graph: CompiledGraph, lam: np.ndarray) -> np.ndarray:
    """W_s of (P) for every segment, from multipliers ``lam`` on all points."""
    cum = np.concatenate([[0.0], np.cumsum(lam)])
    return cum[graph.term_t1] - cum[graph.term_t0]


def priced_unary(graph: CompiledGraph, lam: np.ndarray) -> np.ndarray:
    """The unary costs of F_lambda: the graph's plus W_s m_s(a) for every segment (P)."""
    prices = segment_prices(graph, lam)
    unary = graph.unary.copy()
    if graph.term_var.size:
        lengths = np.diff(graph.term_off)
        seg_of = np.repeat(np.arange(graph.term_var.size), lengths)
        value = np.arange(graph.term_usage.size) - graph.term_off[seg_of]
        target = graph.unary_off[graph.term_var[seg_of]] + value
        np.add.at(unary, target, prices[seg_of] * graph.term_usage)
    return unary


def dual_bound(graph: CompiledGraph, lam: np.ndarray, priced_min):
    """The lower bound given by ``priced_min``, a lower bound of min F_lambda (a number, or
    an array of them such as min-marginals): ``priced_min + K - lam . (L - base)``."""
    # points with lam = 0 add nothing, whatever their capacity (with no limit it is inf, and inf x 0 is nan)
    priced = lam > 0
    return priced_min + graph.constant - float(lam[priced] @ (graph.limit - graph.base[priced]))
