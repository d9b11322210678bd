r"""What TRW-S (``solver.trws``) needs of a graph and an order, built once: weights and layout.

Order and weights. A permutation pi of the variables orders them. For a pass
along pi, a neighbour j of i is *later* when pi(j) > pi(i) and *earlier*
otherwise; the backward pass walks pi in reverse, which swaps the two. With
n_i^< earlier and n_i^> later neighbours, i lies on max(n_i^<, n_i^>)
monotonic chains, and its weight is

    gamma_i = 1 / max(n_i^<, n_i^>, 1).                                    (W)

Layout. Messages are one flat array grouped by receiver (:func:`message_offsets`);
the edge matrices are copied once per orientation, [d_receiver, d_sender], in
the order the passes send (:class:`TrwsPlan`), so that a pass streams through
memory and every entry of (M) is a minimum along a contiguous row.
Each incidence sends in exactly one pass, so the sender-oriented copies hold
every edge twice, once per orientation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from solver.compiled import KernelArrays
from solver.tolerance import BIG

__all__ = ["TrwsPlan", "plan_trws", "message_offsets", "default_order"]


def message_offsets(arr: KernelArrays) -> np.ndarray:
    """Where each message starts in the flat array, plus its length at the end.

    Messages are grouped by receiver, in the CSR order of ``KernelArrays.adj_*``:
    incidence k (variable i, edge e, other end j) holds m_{j->i}, d_i values
    from ``off[k]``, so a variable's incoming messages are contiguous.

    >>> from types import SimpleNamespace as NS
    >>> message_offsets(NS(dom=np.array([2, 3]), adj_off=np.array([0, 1, 2]))).tolist()
    [0, 2, 5]
    """
    sizes = np.repeat(arr.dom, np.diff(arr.adj_off))
    off = np.zeros(sizes.shape[0] + 1, dtype=np.int64)
    np.cumsum(sizes, out=off[1:])
    return off


def default_order(arr: KernelArrays) -> np.ndarray:
    """The variables in index order (the compiled order follows the traced program).

    >>> from types import SimpleNamespace as NS
    >>> default_order(NS(dom=np.array([4, 1, 2]))).tolist()
    [0, 1, 2]
    """
    return np.arange(arr.dom.shape[0], dtype=np.int64)


@numba.njit(cache=True)
def _sender_matrices(dom, edge_off, edge_cost, adj_off, adj_edge, adj_other, adj_is_u,
                     seq, pos):  # pragma: no cover - compiled
    """Per incidence (i, j): theta_ij as a [d_j, d_i] matrix, stored in the order the passes send.

    Each incidence sends in exactly one pass (forward when j is later in
    ``seq``), so the copies hold every edge twice, once per orientation. A pass
    then streams through its matrices in order, and each message entry (M) is
    a minimum along a contiguous row; reading the shared matrices in node order
    instead costs a cache miss per edge.
    """
    n = seq.shape[0]
    total = 0
    for e in range(edge_off.shape[0] - 1):
        total += 2 * (edge_off[e + 1] - edge_off[e])
    cost = np.empty(total)
    start = np.zeros(adj_edge.shape[0], dtype=np.int64)
    at = 0
    for forward in (True, False):
        for t in range(n):
            i = seq[t] if forward else seq[n - 1 - t]
            d = dom[i]
            for k in range(adj_off[i], adj_off[i + 1]):
                j = adj_other[k]
                if (pos[j] > pos[i]) != forward:
                    continue
                dj = dom[j]
                off = edge_off[adj_edge[k]]
                start[k] = at
                if adj_is_u[k]:  # stored [d_i, d_j]: transpose
                    for b in range(dj):
                        for a in range(d):
                            cost[at + b * d + a] = edge_cost[off + a * dj + b]
                else:  # stored [d_j, d_i] already
                    for x in range(d * dj):
                        cost[at + x] = edge_cost[off + x]
                at += d * dj
    return start, cost


@dataclass(frozen=True, slots=True, eq=False)
class TrwsPlan:
    """What depends only on the graph and the order, built once for many :func:`trws` calls.

    Building copies every edge matrix twice (see ``_sender_matrices``), which
    costs a few iterations' time on large graphs; a Lagrangian loop that only
    changes the unaries builds it once.
    """

    order: np.ndarray
    """The variables in visiting order (a permutation)."""
    position: np.ndarray
    """position[order[t]] = t."""
    gamma: np.ndarray
    """Weight (W) per variable."""
    in_off: np.ndarray
    """Per incidence (CSR of ``KernelArrays.adj_*``), start of the message into the variable."""
    out_off: np.ndarray
    """Per incidence, start of the message out of the variable."""
    send_off: np.ndarray
    """Per incidence, start of its sender-oriented matrix in ``send_cost``."""
    send_cost: np.ndarray
    """Edge matrices as [d_receiver, d_sender], in sending order; forbidden = BIG."""
    num_messages: int
    """Length of the flat message array."""


def plan_trws(arr: KernelArrays, *, order: np.ndarray | None = None) -> TrwsPlan:
    """Weights, message offsets and sender-oriented matrices of ``arr`` for ``order``.

    >>> from types import SimpleNamespace as NS
    >>> arr = NS(dom=np.array([2, 3]), edge_u=np.array([0]), edge_v=np.array([1]),
    ...     edge_off=np.array([0, 6]), edge_cost=np.arange(6.0), adj_off=np.array([0, 1, 2]),
    ...     adj_edge=np.array([0, 0]), adj_other=np.array([1, 0]), adj_is_u=np.array([True, False]))
    >>> plan = plan_trws(arr)
    >>> plan.send_cost.reshape(-1, 2)[:3].tolist()  # theta transposed: x_1 rows, x_0 columns
    [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
    """
    n = arr.dom.shape[0]
    if order is None:
        seq = default_order(arr)
    else:
        seq = np.ascontiguousarray(order, dtype=np.int64)
        if seq.shape != (n,) or not np.array_equal(np.sort(seq), np.arange(n)):
            raise ValueError(f"order: expected a permutation of the {n} variables")
    pos = np.empty(n, dtype=np.int64)
    pos[seq] = np.arange(n, dtype=np.int64)
    degree = np.diff(arr.adj_off)
    owner = np.repeat(np.arange(n), degree)
    n_later = np.bincount(owner[pos[arr.adj_other] > pos[owner]], minlength=n)
    gamma = 1.0 / np.maximum(np.maximum(n_later, degree - n_later), 1)  # (W)
    offsets = message_offsets(arr)
    in_off = offsets[:-1]
    # the message out along incidence k is the one into the other end of its edge
    incidence = np.arange(in_off.shape[0])
    at_u = np.empty(arr.edge_u.shape[0], dtype=np.int64)
    at_v = np.empty(arr.edge_u.shape[0], dtype=np.int64)
    at_u[arr.adj_edge[arr.adj_is_u]] = incidence[arr.adj_is_u]
    at_v[arr.adj_edge[~arr.adj_is_u]] = incidence[~arr.adj_is_u]
    out_off = in_off[np.where(arr.adj_is_u, at_v[arr.adj_edge], at_u[arr.adj_edge])]
    edge_cost = np.ascontiguousarray(np.minimum(arr.edge_cost, BIG), dtype=np.float64)
    send_off, send_cost = _sender_matrices(arr.dom, arr.edge_off, edge_cost, arr.adj_off,
                                           arr.adj_edge, arr.adj_other, arr.adj_is_u, seq, pos)
    return TrwsPlan(order=seq, position=pos, gamma=gamma.astype(np.float64), in_off=in_off,
                    out_off=out_off, send_off=send_off, send_cost=send_cost,
                    num_messages=int(offsets[-1]))
