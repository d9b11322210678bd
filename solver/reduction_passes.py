"""The passes of ``solver.reductions``: one function per reduction (R2, R3, R5-R8).

Each pass function visits the candidates of a pass (a Python set, in its
iteration order), edits the working graph and adds what it changed, with the
neighbours, to :class:`Touched`: the next pass visits those. R2, R6 and R7
take their decisions in one kernel call on a flat view
(``solver.reduction_kernels``); the statement of every reduction and why it
keeps the optimum is in ``solver.reductions``.
"""

from __future__ import annotations

import itertools

import numpy as np

from solver.graph import MemoryTerm, WorkingGraph
from solver.reduction_kernels import (
    EMPTY,
    NEEDS_ADJACENCY,
    compact,
    dominated_values,
    follower_flags,
    follower_links,
    follower_mapping,
    forbidden_closure,
)
from solver.reduction_report import ReductionReport
from solver.reduction_views import GraphView, gather_terms, gather_view

__all__ = [
    "InfeasibleError",
    "Touched",
    "SharedView",
    "normalise_memory",
    "remove_forbidden",
    "fold_single_values",
    "merge_followers",
    "remove_dominated",
    "eliminate_memory_free",
]

# Degree-2 elimination builds a |D_u| x |D_w| table at |D_u||D_v||D_w| work.
MAX_ELIMINATION_WORK = 4_000_000
MAX_ELIMINATION_TABLE = 250_000


class InfeasibleError(ValueError):
    """Every choice uses a forbidden cost (found by reduction R2)."""


class Touched:
    """The variables a pass changed, with their neighbours: the next pass visits them.

    ``vars`` is filled in the order a per-variable loop fills it (the order
    in which the next pass visits a Python set depends on it). ``covered``
    holds variables whose neighbours are all in ``vars`` already, so touching
    a hub again (every follower merged into it) costs nothing; a variable
    leaves it when it gains a neighbour that may not be in ``vars``.
    """

    __slots__ = ("vars", "covered")

    def __init__(self) -> None:
        self.vars: set[int] = set()
        self.covered: set[int] = set()

    def around(self, graph: WorkingGraph, var: int) -> None:
        """Add ``var`` and its neighbours."""
        if var not in self.covered:
            self.vars.add(var)
            self.vars.update(graph.neighbours.get(var, ()))
            self.covered.add(var)


def normalise_memory(graph: WorkingGraph, order: list[int], report: ReductionReport) -> None:
    """(R5): move the minimum of each term to fixed memory, drop zero residuals.

    Minimum, maximum and residual of every term at once; only the variables
    with a term that changes (a positive minimum, or no residual) get a new
    list, built in visiting order so that ``fixed_memory`` fills in the same
    order as term by term.
    """
    lists = [graph.memory[v] for v in order]
    terms = list(itertools.chain.from_iterable(lists))
    if not terms:
        return
    usages = [t.usage for t in terms]
    sizes = np.fromiter(map(len, usages), dtype=np.int64, count=len(usages))
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    flat = np.concatenate(usages)
    low = np.minimum.reduceat(flat, bounds[:-1])
    has_residual = np.maximum.reduceat(flat, bounds[:-1]) > low  # (usage - min).any()
    changed = (low > 0) | ~has_residual
    if not changed.any():
        return
    if not has_residual.all():
        report.count("R5_memory_terms_fixed", int((~has_residual).sum()))
    residual = flat - np.repeat(low, sizes)
    counts = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
    first = np.concatenate([[0], np.cumsum(counts)])
    owner = np.repeat(np.arange(len(order)), counts)
    low_list, keep_list, bound_list = low.tolist(), has_residual.tolist(), bounds.tolist()
    fixed = graph.fixed_memory
    for pos in np.unique(owner[changed]).tolist():
        kept = []
        for t in range(first[pos], first[pos + 1]):
            term = terms[t]
            if low_list[t] > 0:
                fixed.append(MemoryTerm(term.start, term.end, low[t : t + 1]))
                if keep_list[t]:
                    kept.append(MemoryTerm(term.start, term.end, residual[bound_list[t] : bound_list[t + 1]]))
            elif keep_list[t]:
                kept.append(term)  # usage - 0 is usage
        graph.memory[order[pos]] = kept


def _empty_domain(graph: WorkingGraph, var: int) -> InfeasibleError:
    return InfeasibleError(
        f"every strategy of node {graph.members[var][0].node if graph.members[var] else var} "
        "uses a forbidden cost (directly or with every strategy of a neighbour)"
    )


class SharedView:
    """The last view gathered in this pass, reused by later stages.

    Gathering copies every edge matrix of the visited variables. R6 only reads
    which entries are finite and the adjacency, so it takes R2's view as R2
    and R3 left it: values R2 removed are masked (``alive``), variables R3
    folded are ``gone`` (removing a neighbour leaves the order of a set's
    other elements as it was). R7 reads costs, so it takes the view only
    while the graph is unchanged since the gather (``current``); on a pass
    where R2, R3 and R6 change nothing, R2, R6 and R7 share one view.
    """

    __slots__ = ("view", "alive", "gone", "current")

    def __init__(self) -> None:
        self.view: GraphView | None = None
        self.alive: np.ndarray | None = None
        self.gone: np.ndarray | None = None
        self.current = False

    def set(self, view: GraphView) -> None:
        self.view, self.current = view, True
        self.alive = np.ones(int(view.val_off[-1]), dtype=np.bool_)
        self.gone = np.zeros(view.var_ids.shape[0], dtype=np.bool_)

    def drop(self) -> None:
        self.view = self.alive = self.gone = None
        self.current = False

    def restricted(self, alive: np.ndarray) -> None:
        """The graph kept only the ``alive`` values of the view."""
        self.alive, self.current = alive, False

    def folded(self, var: int) -> None:
        """R3 removed ``var`` (and its edges) from the graph and changed its neighbours' unary costs."""
        if self.view is not None:
            local = self.view.local[var]
            if local >= 0:
                self.gone[local] = True
            self.current = False

    def _order(self, cands: list[int]) -> np.ndarray | None:
        if self.view is None:
            return None
        order = self.view.local[np.array(cands, dtype=np.int64)]
        return order if ((order >= 0) & (order < self.view.num_loaded)).all() else None

    def get(self, graph: WorkingGraph, cands: list[int]) -> tuple[GraphView, np.ndarray]:
        """A view of the graph as it is, with ``cands`` loaded, and their local indices in order."""
        order = self._order(cands) if self.current else None
        if order is None:
            self.set(gather_view(graph, cands))
            order = np.arange(len(cands), dtype=np.int64)
        return self.view, order

    def get_structure(self, graph: WorkingGraph,
                      cands: list[int]) -> tuple[GraphView, np.ndarray, np.ndarray, np.ndarray]:
        """Like :meth:`get`, but the view may be restricted (``alive``) and folded (``gone``) since."""
        order = self._order(cands)
        if order is None:
            return (*self.get(graph, cands), self.alive, self.gone)
        return self.view, order, self.alive, self.gone


def _apply_removals(graph: WorkingGraph, view: GraphView, alive: np.ndarray, locals_: list[int],
                    touched: Touched) -> None:
    """Restrict the variables at ``locals_`` to their alive values, touching them in that order.

    Their costs and edges come restricted from one kernel pass over the view
    (the view holds every edge of a loaded variable, and only loaded ones
    shrink); restricting one variable after the other gives the same arrays.
    """
    unary_off, kept, unary, edge_changed, edge_off, edge_rows, costs = compact(view, alive)
    var_ids, bounds = view.var_ids.tolist(), unary_off.tolist()
    keeps, unary_of = {}, {}
    for local in locals_:
        var, start, end = var_ids[local], bounds[local], bounds[local + 1]
        keeps[var], unary_of[var] = kept[start:end], unary[start:end]
    changed = np.flatnonzero(edge_changed)
    shapes = zip(view.edge_lo[changed].tolist(), view.edge_hi[changed].tolist(), edge_off[changed].tolist(),
                 edge_off[changed + 1].tolist(), edge_rows[changed].tolist())
    edges = {(lo, hi): costs[start:end].reshape(rows, -1) for lo, hi, start, end, rows in shapes}
    graph.restrict_many(keeps, unary_of, edges)
    for local in locals_:
        touched.around(graph, var_ids[local])


def remove_forbidden(graph: WorkingGraph, candidates: set[int], touched: Touched, shared: SharedView,
                     report: ReductionReport) -> None:
    """(R2) arc consistency on infinite costs, to a fixpoint.

    Candidates are checked against their unary costs and every neighbour;
    after that, a variable whose domain shrank only re-checks its neighbours
    against itself (AC-3 on arcs), so a hub is not rescanned whenever a
    neighbour moves. The view loads the candidates' adjacency; when the
    propagation reaches a variable beyond it, the kernel stops and runs again
    on a view that loads that variable too (same answer, found later).
    """
    cands = [v for v in candidates if v in graph.unary]
    order = np.arange(len(cands), dtype=np.int64)
    extra: list[int] = []
    while True:
        view = gather_view(graph, cands + extra)
        alive = np.ones(int(view.val_off[-1]), dtype=np.bool_)
        outcome, local, event_var, event_removed = forbidden_closure(view, order, alive)
        if outcome != NEEDS_ADJACENCY:
            break
        beyond = np.unique(event_var[event_var >= view.num_loaded])
        extra += view.var_ids[beyond].tolist()
    if outcome == EMPTY:
        raise _empty_domain(graph, int(view.var_ids[local]))
    shared.set(view)
    if event_var.size:
        report.count("R2_forbidden_values", int(event_removed.sum()))
        _, first = np.unique(event_var, return_index=True)
        _apply_removals(graph, view, alive, event_var[np.sort(first)].tolist(), touched)
        shared.restricted(alive)


def fold_single_values(graph: WorkingGraph, candidates: set[int], touched: Touched, shared: SharedView,
                       report: ReductionReport) -> None:
    """(R3) fold variables with one value left."""
    unary = graph.unary
    for var in list(candidates):
        if var in unary and len(unary[var]) == 1:
            neighbours = list(graph.neighbours[var])
            graph.fix(var)
            touched.vars.update(neighbours)
            report.count("R3_single_value")
            shared.folded(var)


def merge_followers(graph: WorkingGraph, candidates: set[int], touched: Touched, shared: SharedView,
                    report: ReductionReport) -> None:
    """(R6) merge variables whose value is a function of one neighbour's.

    Follower relations form a forest (cycles of mutual followers are cut at
    one variable). Merging leaves into their leader one by one would move a
    chain's accumulated members and memory terms again at every step, so
    followers are merged root first: after a leader has merged into its root,
    its followers' edges lead to the root, and they merge there directly.
    """
    view, order, alive, gone = shared.get_structure(graph, [v for v in candidates if v in graph.unary])
    follower, lead = follower_links(view, order, *follower_flags(view, alive), gone)
    leader = dict(zip(view.var_ids[follower].tolist(), view.var_ids[lead].tolist()))
    depth: dict[int, int] = {}
    for start in list(leader):
        path, on_path, node = [], set(), start
        while node in leader and node not in depth and node not in on_path:
            path.append(node)
            on_path.add(node)
            node = leader[node]
        if node in on_path:  # a cycle of followers: its entry becomes a root
            del leader[node]
            path = path[: path.index(node)]
            depth[node] = 0
        base = depth.get(node, 0)
        for offset, member in enumerate(reversed(path), start=1):
            depth[member] = base + offset
    for var in sorted(leader, key=depth.__getitem__):
        if var not in graph.unary:
            continue
        # The leader may have merged into its root by now; the edge moved there.
        target = graph.representative(leader[var])
        if target is None or target not in graph.neighbours[var]:
            continue
        # var follows target iff every row of M(target, var) has at most one finite entry
        stored = graph.edges[(target, var) if target < var else (var, target)]
        mapping = follower_mapping(np.ascontiguousarray(stored), target > var)
        if mapping.shape[0]:
            _merge(graph, var, target, mapping, touched)
            report.count("R6_followers")
            shared.drop()
    for var in list(candidates):
        if var in graph.unary and len(graph.neighbours[var]) == 1:
            if _leaf_follower(graph, var, touched):
                report.count("R6_leaf_followers")
                shared.drop()


def _merge(graph: WorkingGraph, var: int, into: int, mapping: np.ndarray, touched: Touched) -> None:
    neighbours = graph.neighbours[var] | {into}  # all stay in the graph
    graph.merge_into(var, into, mapping)
    # Every edge the merge made joins two of these, so `covered` stays true.
    touched.vars.update(neighbours)
    touched.around(graph, into)


def _leaf_follower(graph: WorkingGraph, var: int, touched: Touched) -> bool:
    """A leaf whose cheapest value given each neighbour value also uses the least memory.

    A row whose least-memory values all cost inf while another value is
    finite has no such value: the leaf does not follow.
    """
    (other,) = graph.neighbours[var]
    total = graph.edge_matrix(other, var) + graph.unary[var][None, :]  # [other value, var value]
    least = np.ones(total.shape[1], dtype=bool)
    for term in graph.memory[var]:
        least &= term.usage == term.usage.min()
    masked = np.where(least[None, :], total, np.inf)
    mapping = masked.argmin(axis=1)
    if not np.array_equal(masked[np.arange(total.shape[0]), mapping], total.min(axis=1)):
        return False
    _merge(graph, var, other, mapping, touched)
    return True


def remove_dominated(graph: WorkingGraph, candidates: set[int], touched: Touched, shared: SharedView,
                     report: ReductionReport) -> None:
    """(R7) remove dominated values."""
    # A variable's domain changes only at its own turn, so the filter can run first.
    cands = [v for v in candidates if v in graph.unary and graph.domain_size(v) >= 2]
    view, order = shared.get(graph, cands)
    alive = np.ones(int(view.val_off[-1]), dtype=np.bool_)
    removed = dominated_values(view, order, *gather_terms(graph, cands), alive)
    if removed.any():
        report.count("R7_dominated_values", int(removed.sum()))
        _apply_removals(graph, view, alive, order[removed > 0].tolist(), touched)
        shared.drop()


def eliminate_memory_free(graph: WorkingGraph, candidates: set[int], touched: Touched, report: ReductionReport) -> None:
    """(R8) exact elimination of memory-free variables of degree <= 2."""
    for var in list(candidates):
        if var not in graph.unary or graph.memory[var]:
            continue
        degree = len(graph.neighbours[var])
        if degree == 0:
            best = int(np.argmin(graph.unary[var]))
            graph.restrict(var, np.array([best]))
            graph.fix(var)
            report.count("R8_eliminated_isolated")
        elif degree == 1:
            (other,) = graph.neighbours[var]
            total = graph.remove_edge(other, var) + graph.unary[var][None, :]
            argmin = total.argmin(axis=1)
            graph.unary[other] = graph.unary[other] + total[np.arange(total.shape[0]), argmin]
            graph.eliminate(var, (other,), argmin)
            touched.around(graph, other)
            report.count("R8_eliminated_leaf")
        elif degree == 2:
            u, w = sorted(graph.neighbours[var])
            du, dv, dw = graph.domain_size(u), graph.domain_size(var), graph.domain_size(w)
            if du * dv * dw > MAX_ELIMINATION_WORK or du * dw > MAX_ELIMINATION_TABLE:
                continue
            left = graph.remove_edge(u, var)  # [u, v]
            right = graph.remove_edge(var, w)  # [v, w]
            total = left[:, :, None] + graph.unary[var][None, :, None] + right[None, :, :]
            argmin = total.argmin(axis=1)
            best = np.take_along_axis(total, argmin[:, None, :], axis=1)[:, 0, :]
            graph.eliminate(var, (u, w), argmin)
            graph.add_edge(u, w, best)
            touched.covered.difference_update((u, w))  # the new edge u-w
            touched.around(graph, u)
            touched.around(graph, w)
            report.count("R8_eliminated_series")
