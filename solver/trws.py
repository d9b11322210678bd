r"""TRW-S: sequential tree-reweighted message passing (Kolmogorov 2006) on a compiled graph.

Problem. Variables i with values a in D_i, unary costs theta_i(a), edges (i, j)
with matrices theta_ij(a, b); minimise

    E(x) = sum_i theta_i(x_i) + sum_(i,j) theta_ij(x_i, x_j)

(the energy of a graph's :class:`~solver.compiled.KernelArrays`, without ``CompiledGraph.constant``
and without the memory limit, which the caller prices into the unaries).

Order and weights. A permutation pi of the variables orders them; gamma_i is
the weight (W) of ``solver.trws_plan``, and a neighbour of i is *later* when
it comes after i in the pass.

Messages. Every edge carries two normalised messages, m_{i->j} (a vector over
D_j) and m_{j->i} (over D_i). One pass visits the variables in order; at i:

    A_i(a)     = theta_i(a) + sum_{j ~ i} m_{j->i}(a)                        (A)
    delta_i    = min_a A_i(a),        Ahat_i = A_i - delta_i >= 0            (N)
    for every later neighbour j:
      m'(b)    = min_a [ gamma_i Ahat_i(a) - m_{j->i}(a) + theta_ij(a, b) ]  (M)
      c_ij     = min_b m'(b),         m_{i->j} = m' - c_ij                   (C)

An iteration is a forward pass along pi and a backward pass against it.

Bound. After a pass,

    LB = sum_i delta_i + sum_(i,j) c_ij  <=  min_x E(x).                     (B)

Proof: by (M)-(C), for the edge (i, j) at i's visit and every (a, b),

    theta_ij(a, b) >= c_ij + m_{i->j}(b) + m_{j->i}(a) - gamma_i Ahat_i(a).

Both messages here are the ones in (A): m_{j->i} entered A_i and is only
rewritten in the opposite pass; m_{i->j} is final when j is visited, later.
Summing over the edges, each message of the final state is counted once, in
the A of its receiver, so for every labelling x

    E(x) >= sum c_ij + sum_i [ delta_i + (1 - n_i^> gamma_i) Ahat_i(x_i) ] >= LB,

since Ahat_i >= 0 and n_i^> gamma_i <= 1 by (W) (n_i^> counts the neighbours
later in this pass). Nothing is assumed about the messages a pass starts
from, so the bound is valid after any number of passes, from warm-started
messages and with other unary costs. (B) is the quantity Kolmogorov's TRW-S
evaluates in its backward pass, the dual objective of the current
reparametrisation over the monotonic chains, which TRW-S never decreases from
one iteration to the next (the tests check it, up to rounding). Each pass
yields one bound; the result keeps the best.

Forbidden costs (``solver.tolerance``). Any cost >= FORBIDDEN (= BIG / 2) stands for +inf, and so does
an entry of A_i or of a message marked BIG: such a value appears in no finite
labelling (invariant: a message entry is BIG only when every term of its
minimum (M) is forbidden). Minima range over finite terms only, so (B) holds
for every finite labelling, and an infinite quantity is never subtracted from
another (no NaN, no cancellation of BIG against BIG). When a whole A_i or
m' is forbidden no finite labelling exists, and the bound is BIG (with
non-negative costs every labelling then costs at least BIG). Finite values
stay small: messages and A are normalised by their minimum, so costs of 1e12
per entry keep their precision.

Layout. Messages and the sender-oriented edge matrices are laid out once per
graph and order by :func:`~solver.trws_plan.plan_trws`.

Primal labels. During each pass, i takes

    x_i = argmin_a theta_i(a) + sum_{j earlier} theta_ij(x_j, a) + sum_{j later} m_{j->i}(a),

the sequential labelling of TRW-S (optimal on a tree once messages converge);
its true energy is summed on the way, and the best labelling over all passes
is returned.

Stopping. After ``iterations`` iterations, at ``deadline`` (checked between
iterations), when the best labelling is within ``tol`` (relative) of the
bound, or when one iteration raises the bound by less than ``tol`` (relative).

>>> from solver.compiled import assemble_graph
>>> graph = assemble_graph(var_ids=np.arange(2), unary=[np.array([0.0, 1.0]), np.array([3.0, 0.0])],
...     edge_u=[0], edge_v=[1], edge_costs=[np.array([[0.0, 5.0], [5.0, 0.0]])], term_var=[], term_t0=[],
...     term_t1=[], term_usage=[], base=np.zeros(0), time_points=np.zeros(0, np.int64), limit=np.inf,
...     constant=0.0)
>>> res = trws(graph.arrays, iterations=5)
>>> res.lower_bound, res.labels_energy, res.labels.tolist()
(1.0, 1.0, [1, 1])
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numba
import numpy as np

from solver.compiled import KernelArrays
from solver.tolerance import BIG, FORBIDDEN, REL_TOL
from solver.trws_plan import TrwsPlan, plan_trws

__all__ = ["TrwsResult", "trws"]


@dataclass(frozen=True, slots=True, eq=False)
class TrwsResult:
    """What :func:`trws` found; energies exclude ``CompiledGraph.constant``."""

    lower_bound: float
    """Best bound (B) over all passes, <= the minimum energy; BIG when no finite labelling exists."""
    labels: np.ndarray
    """int64 value per variable: the best sequential labelling seen."""
    labels_energy: float
    """Energy of ``labels`` under the unary costs used (>= BIG if it uses a forbidden cost)."""
    messages: np.ndarray
    """Flat float64 messages (layout of :func:`solver.trws_plan.message_offsets`), for a warm start."""
    iterations: int
    """Iterations run (forward + backward pass each)."""
    seconds: float
    """Wall time of the call."""
    bound_history: np.ndarray
    """Bound after each iteration (the better of its two passes)."""


# fastmath: every value here is finite (forbidden = BIG, inputs sanitised by
# trws), and the minimum along a row vectorises only without strict IEEE order.
@numba.njit(cache=True, fastmath=True)
def _pass(dom, unary, unary_off, adj_off, adj_other, seq, pos, gamma, in_off, out_off,
          send_off, send_cost, msg, pending, labels, forward):  # pragma: no cover - compiled
    """One pass (A)-(C) over ``seq`` (reversed when not ``forward``); fills ``labels``.

    Returns (bound (B), energy of the labels). ``pos`` is the position of each
    variable in ``seq``: a neighbour is visited later when its position is
    larger (forward) or smaller (backward). ``send_off``/``send_cost`` are the
    sender-oriented matrices of :class:`~solver.trws_plan.TrwsPlan`. ``pending`` (unary
    layout, zero on entry and on exit) collects sum_{j labelled} theta_ij(x_j, .)
    for the variables not visited yet; the sender adds its row while the
    matrix is in cache for its message.
    """
    n = seq.shape[0]
    dmax = 1
    for i in range(n):
        dmax = max(dmax, dom[i])
    acc = np.empty(dmax)  # A_i, then Ahat_i
    score = np.empty(dmax)  # labelling score
    h = np.empty(dmax)  # gamma_i Ahat_i - m_{j->i}
    bound = 0.0
    energy = 0.0
    for t in range(n):
        i = seq[t] if forward else seq[n - 1 - t]
        d = dom[i]
        ub = unary_off[i]
        for a in range(d):
            acc[a] = unary[ub + a]
            score[a] = unary[ub + a] + pending[ub + a]
        for k in range(adj_off[i], adj_off[i + 1]):
            mo = in_off[k]
            for a in range(d):
                acc[a] += msg[mo + a]  # (A)
            if (pos[adj_other[k]] > pos[i]) == forward:
                # not labelled yet: its message stands in for the edge cost
                for a in range(d):
                    score[a] += msg[mo + a]
        # primal: x_i, and its true cost given the labelled neighbours
        best = 0
        for a in range(1, d):
            if score[a] < score[best]:
                best = a
        labels[i] = best
        energy += unary[ub + best] + pending[ub + best]
        for a in range(d):
            pending[ub + a] = 0.0
        # (N): forbidden entries saturate at BIG and take no part in the minimum
        low = BIG
        for a in range(d):
            if acc[a] >= FORBIDDEN:
                acc[a] = BIG
            elif acc[a] < low:
                low = acc[a]
        if low < FORBIDDEN:
            bound += low
            for a in range(d):
                if acc[a] < BIG:
                    acc[a] -= low
        else:
            # no finite value, so no finite labelling: every message below
            # comes out all BIG and says so to the neighbours
            bound += BIG
        g = gamma[i]
        # (M)-(C) to every later neighbour
        for k in range(adj_off[i], adj_off[i + 1]):
            j = adj_other[k]
            if (pos[j] > pos[i]) != forward:
                continue
            mo = in_off[k]
            for a in range(d):
                # an infinite A is never reduced by a (then also infinite) message
                h[a] = BIG if acc[a] >= BIG else g * acc[a] - msg[mo + a]
            dj = dom[j]
            out = out_off[k]
            pj = unary_off[j]
            mat = send_off[k]
            low = BIG
            for b in range(dj):
                row = mat + b * d
                m = 4.0 * BIG
                for a in range(d):
                    m = min(m, h[a] + send_cost[row + a])
                pending[pj + b] += send_cost[row + best]
                if m >= FORBIDDEN:
                    m = BIG
                elif m < low:
                    low = m
                msg[out + b] = m
            # (C)
            if low >= FORBIDDEN:
                bound += BIG
                continue
            bound += low
            for b in range(dj):
                if msg[out + b] < BIG:
                    msg[out + b] -= low
    return bound, energy


def trws(
    arr: KernelArrays,
    *,
    unary: np.ndarray | None = None,
    iterations: int = 100,
    deadline: float | None = None,
    messages: np.ndarray | None = None,
    order: np.ndarray | None = None,
    tol: float = REL_TOL,
    plan: TrwsPlan | None = None,
) -> TrwsResult:
    """Run TRW-S on ``arr`` (see the module docstring) and return the bound and best labels.

    ``unary`` replaces ``arr.unary`` (same layout, e.g. Lagrange-penalised
    costs; inf or >= FORBIDDEN is forbidden). ``messages`` warm-starts from
    ``TrwsResult.messages`` of an earlier call on the same graph: messages
    keep the bound valid whatever the unaries were, except their entries
    marking a forbidden value, which are reset (the new unaries may allow the
    value) and recomputed by the first iteration. ``deadline`` is a
    ``time.perf_counter()`` value checked between iterations (one iteration
    always runs). ``order`` is a permutation of the variables (default
    :func:`~solver.trws_plan.default_order`), or ``plan`` what :func:`~solver.trws_plan.plan_trws` built from this
    same ``arr`` (it holds copies of the edge costs; then ``order`` must be
    None). ``tol`` stops early (module docstring): with
    ``tol = 0`` only a closed gap stops before ``iterations``, with ``tol < 0``
    nothing does.

    >>> # see the module docstring for a worked two-variable example
    """
    start = time.perf_counter()
    if iterations < 1:
        raise ValueError(f"iterations: expected at least 1, got {iterations}")
    if plan is None:
        plan = plan_trws(arr, order=order)
    elif order is not None:
        raise ValueError("order: give either order or plan, not both")
    elif plan.send_off.shape != arr.adj_edge.shape or plan.order.shape != arr.dom.shape:
        raise ValueError("plan: built for another graph")
    n = arr.dom.shape[0]
    costs = arr.unary if unary is None else np.asarray(unary, dtype=np.float64)
    if costs.shape != arr.unary.shape:
        raise ValueError(f"unary: expected shape {arr.unary.shape}, got {costs.shape}")
    if np.isnan(costs).any() or np.isneginf(costs).any():
        raise ValueError("unary: NaN or -inf cost")
    # inf (or any forbidden cost) becomes BIG, the kernels' saturated +inf
    costs = np.ascontiguousarray(np.minimum(costs, BIG), dtype=np.float64)
    if messages is None:
        msg = np.zeros(plan.num_messages)
    else:
        msg = np.array(messages, dtype=np.float64)  # a copy: the caller's stays as it was
        if msg.shape != (plan.num_messages,):
            raise ValueError(f"messages: expected shape ({plan.num_messages},), got {msg.shape}")
        if np.isnan(msg).any() or np.isneginf(msg).any():
            raise ValueError("messages: NaN or -inf entry")
        msg[msg >= FORBIDDEN] = 0.0  # any finite message keeps (B) valid
    args = (arr.dom, costs, arr.unary_off, arr.adj_off, arr.adj_other, plan.order, plan.position,
            plan.gamma, plan.in_off, plan.out_off, plan.send_off, plan.send_cost, msg)

    labels = np.zeros(n, dtype=np.int64)
    pending = np.zeros(costs.shape[0])
    best_labels = labels.copy()
    best_energy = np.inf
    best_bound = -np.inf
    history: list[float] = []
    done = 0
    while done < iterations:
        bound = -np.inf
        for forward in (True, False):
            pass_bound, energy = _pass(*args, pending, labels, forward)
            bound = max(bound, pass_bound)
            if energy < best_energy:
                best_energy = energy
                best_labels = labels.copy()
        done += 1
        bound = min(bound, BIG)  # several forbidden minima: still just "no finite labelling"
        previous = best_bound
        best_bound = max(best_bound, bound)
        history.append(bound)
        scale = max(1.0, abs(best_bound))
        if best_energy - best_bound <= tol * scale or best_bound >= FORBIDDEN:
            break  # optimal within tol, or no finite labelling exists
        if done >= 2 and best_bound - previous < tol * scale:
            break  # the bound has stalled
        if deadline is not None and time.perf_counter() >= deadline:
            break
    return TrwsResult(
        lower_bound=float(best_bound),
        labels=best_labels,
        labels_energy=float(best_energy),
        messages=msg,
        iterations=done,
        seconds=time.perf_counter() - start,
        bound_history=np.array(history),
    )
