"""The numba kernels of the reductions against straightforward Python on small random graphs.

Each kernel must take exactly the decisions of a loop that visits the
variables one at a time (same values removed, same events in the same order,
same follower links), since R6 and R7 depend on the visiting order; the
flat view must describe the graph it was gathered from.
"""

from __future__ import annotations

import doctest
import math

import numpy as np

import solver.reduction_kernels as kernels
import solver.reduction_views as views
from solver.graph import MemoryTerm, WorkingGraph
from solver.problem import Problem
from solver.reduction_kernels import (
    CLOSED,
    EMPTY,
    NEEDS_ADJACENCY,
    compact,
    compile_kernels,
    dominated_values,
    follower_flags,
    follower_links,
    follower_mapping,
    forbidden_closure,
)
from solver.reduction_passes import SharedView, Touched, _apply_removals, normalise_memory, remove_forbidden
from solver.reduction_views import gather_terms, gather_view
from solver.reductions import ReductionReport


def random_graph(rng: np.random.Generator, *, nodes: int = 8, strategies: int = 5, forbidden: float = 0.3,
                 one_finite: float = 0.2) -> WorkingGraph:
    """A random working graph: forbidden entries, some edges with one finite entry per row, memory terms."""
    counts = rng.integers(1, strategies + 1, size=nodes)
    data_nodes = []
    for k in counts.tolist():
        cost = [None if rng.random() < forbidden / 3 else int(rng.integers(0, 6)) for _ in range(k)]
        node = {"cost": cost, "memory": [int(v) for v in rng.integers(0, 4, size=k)]}
        if rng.random() < 0.5:
            start = int(rng.integers(0, 4))
            node["live"] = [start, start + 1 + int(rng.integers(0, 3))]
        data_nodes.append(node)
    edges = []
    for _ in range(int(rng.integers(nodes, 3 * nodes))):
        u, v = (int(x) for x in rng.choice(nodes, size=2, replace=False))
        if rng.random() < one_finite:  # a function: one finite entry per row
            mat = [[None] * int(counts[v]) for _ in range(int(counts[u]))]
            for row in mat:
                row[int(rng.integers(counts[v]))] = int(rng.integers(0, 6))
        else:
            mat = [[None if rng.random() < forbidden else int(rng.integers(0, 6)) for _ in range(int(counts[v]))]
                   for _ in range(int(counts[u]))]
        edges.append({"src": u, "dst": v, "cost": mat})
    return WorkingGraph.from_problem(Problem.from_dict({"nodes": data_nodes, "edges": edges}))


def domains(view, alive) -> dict[int, list[int]]:
    return {int(var): np.flatnonzero(alive[view.val_off[i]: view.val_off[i + 1]]).tolist()
            for i, var in enumerate(view.var_ids)}


# -- the view ---------------------------------------------------------------------------
def test_view_describes_the_graph():
    rng = np.random.default_rng(0)
    for _ in range(30):
        graph = random_graph(rng)
        cands = list(set(graph.unary))[::2]
        view = gather_view(graph, cands)
        assert view.var_ids[: len(cands)].tolist() == cands and view.num_loaded == len(cands)
        for i, var in enumerate(view.var_ids.tolist()):
            assert view.local[var] == i
            assert np.array_equal(view.unary[view.val_off[i]: view.val_off[i + 1]], graph.unary[var])
        for i, var in enumerate(cands):
            ks = range(view.adj_off[i], view.adj_off[i + 1])
            assert [int(view.var_ids[view.adj_other[k]]) for k in ks] == list(graph.neighbours[var])
            for k in ks:
                other, e = int(view.var_ids[view.adj_other[k]]), view.adj_edge[k]
                stored = view.costs[view.edge_off[e]: view.edge_off[e + 1]].reshape(
                    view.edge_rows[e], view.edge_cols[e])
                assert view.adj_row[k] == (var < other)
                assert np.array_equal(stored, graph.edges[(min(var, other), max(var, other))])


def test_doctests_of_the_view_module():
    result = doctest.testmod(views)
    assert result.attempted > 0 and result.failed == 0


def test_compile_kernels_reports_its_time_once():
    compile_kernels()
    assert compile_kernels() == 0.0


# -- (R2) -------------------------------------------------------------------------------
def reference_forbidden(graph: WorkingGraph, order: list[int]):
    """The per-variable AC-3 loop: (outcome, variable, events, domains)."""
    dom = {v: list(range(graph.domain_size(v))) for v in graph.unary}
    events: list[tuple[int, int]] = []

    def supported(v: int, w: int) -> list[bool]:
        mat = graph.edge_matrix(v, w)
        return [any(math.isfinite(mat[a, b]) for b in dom[w]) for a in dom[v]]

    def shrink(v: int, ok: list[bool]) -> bool:
        if all(ok):
            return False
        events.append((v, ok.count(False)))
        dom[v] = [a for a, keep in zip(dom[v], ok) if keep]
        return True

    stack = []
    for v in order:
        ok = [math.isfinite(graph.unary[v][a]) for a in dom[v]]
        for w in graph.neighbours[v]:
            ok = [x and y for x, y in zip(ok, supported(v, w))]
        if shrink(v, ok):
            if not dom[v]:
                return EMPTY, v, events, dom
            stack.append(v)
    while stack:
        v = stack.pop()
        for w in graph.neighbours[v]:
            if shrink(w, supported(w, v)):
                if not dom[w]:
                    return EMPTY, w, events, dom
                stack.append(w)
    return CLOSED, -1, events, dom


def test_forbidden_closure_matches_the_loop():
    rng = np.random.default_rng(1)
    outcomes = set()
    for _ in range(200):
        graph = random_graph(rng, forbidden=float(rng.uniform(0.1, 0.6)))
        order_vars = list(set(graph.unary))
        rng.shuffle(order_vars)
        view = gather_view(graph, order_vars)
        alive = np.ones(int(view.val_off[-1]), dtype=np.bool_)
        outcome, local, event_var, event_removed = forbidden_closure(view, np.arange(len(order_vars)), alive)
        ref_outcome, ref_var, ref_events, ref_dom = reference_forbidden(graph, order_vars)
        outcomes.add(outcome)
        assert outcome == ref_outcome
        assert list(zip(view.var_ids[event_var].tolist(), event_removed.tolist())) == ref_events
        if outcome == CLOSED:
            assert domains(view, alive) == ref_dom
        else:
            assert int(view.var_ids[local]) == ref_var
    assert outcomes == {CLOSED, EMPTY}


def test_forbidden_pass_loads_variables_the_propagation_reaches():
    # chain 0 - 1 - 2 - 3: node 0 loses value 1, which leaves 1's value 1,
    # 2's value 1 and 3's value 1 without support, one after the other
    inf = None
    chain = [[0, inf], [inf, 0]]
    problem = Problem.from_dict({
        "nodes": [{"cost": [0, inf]}, {"cost": [0, 1]}, {"cost": [0, 1]}, {"cost": [0, 1]}],
        "edges": [{"src": 0, "dst": 1, "cost": chain}, {"src": 1, "dst": 2, "cost": chain},
                  {"src": 2, "dst": 3, "cost": chain}]})
    graph = WorkingGraph.from_problem(problem)
    view = gather_view(graph, [0])
    alive = np.ones(int(view.val_off[-1]), dtype=np.bool_)
    assert forbidden_closure(view, np.arange(1), alive)[0] == NEEDS_ADJACENCY
    report = ReductionReport(before=None)
    touched = Touched()
    remove_forbidden(graph, {0}, touched, SharedView(), report)
    assert {v: graph.domain_size(v) for v in graph.unary} == {0: 1, 1: 1, 2: 1, 3: 1}
    assert report.counts["R2_forbidden_values"] == 4
    assert touched.vars == {0, 1, 2, 3}


def test_forbidden_pass_with_some_candidates_matches_the_loop():
    rng = np.random.default_rng(2)
    for _ in range(100):
        graph = random_graph(rng, forbidden=0.4)
        cands = {v for v in graph.unary if rng.random() < 0.4}
        reference = reference_forbidden(graph, [v for v in cands])
        if reference[0] == EMPTY:
            continue
        remove_forbidden(graph, cands, Touched(), SharedView(), ReductionReport(before=None))
        assert {v: graph.domain_size(v) for v in graph.unary} == {v: len(d) for v, d in reference[3].items()}


def test_compact_restricts_costs_and_edges_and_the_graph_takes_them():
    rng = np.random.default_rng(7)
    for _ in range(100):
        graph = random_graph(rng)
        order_vars = list(set(graph.unary))
        view = gather_view(graph, order_vars)
        alive = np.ones(int(view.val_off[-1]), dtype=np.bool_)
        shrunk = [i for i in range(len(order_vars)) if view.dom[i] > 1 and rng.random() < 0.5]
        for i in shrunk:  # drop some values, keep at least one
            drop = rng.random(int(view.dom[i])) < 0.5
            drop[int(rng.integers(view.dom[i]))] = False
            alive[view.val_off[i]: view.val_off[i + 1]] &= ~drop
        unary_off, kept, unary, edge_changed, edge_off, edge_rows, costs = compact(view, alive)
        keep = {int(v): np.flatnonzero(alive[view.val_off[i]: view.val_off[i + 1]]) for i, v in enumerate(view.var_ids)}
        for i, var in enumerate(view.var_ids.tolist()):
            assert kept[unary_off[i]: unary_off[i + 1]].tolist() == keep[var].tolist()
            assert np.array_equal(unary[unary_off[i]: unary_off[i + 1]], graph.unary[var][keep[var]])
        for e, (lo, hi) in enumerate(zip(view.edge_lo.tolist(), view.edge_hi.tolist())):
            full = len(keep[lo]) == graph.domain_size(lo) and len(keep[hi]) == graph.domain_size(hi)
            assert edge_changed[e] == (not full)
            if not full:
                got = costs[edge_off[e]: edge_off[e + 1]].reshape(edge_rows[e], -1)
                assert np.array_equal(got, graph.edges[(lo, hi)][np.ix_(keep[lo], keep[hi])])
        # restricting through the view gives the graph that restrict() one by one gives
        twin = WorkingGraph.from_problem(graph_problem(graph))
        for i in shrunk:
            var = int(view.var_ids[i])
            if len(keep[var]) < twin.domain_size(var):
                twin.restrict(var, keep[var])
        _apply_removals(graph, view, alive, shrunk, Touched())
        assert {v: u.tolist() for v, u in graph.unary.items()} == {v: u.tolist() for v, u in twin.unary.items()}
        assert {k: m.tolist() for k, m in graph.edges.items()} == {k: m.tolist() for k, m in twin.edges.items()}
        assert {v: [t.usage.tolist() for t in ts] for v, ts in graph.memory.items()} == \
            {v: [t.usage.tolist() for t in ts] for v, ts in twin.memory.items()}
        assert {v: [m.table.tolist() for m in ms] for v, ms in graph.members.items()} == \
            {v: [m.table.tolist() for m in ms] for v, ms in twin.members.items()}


def graph_problem(graph: WorkingGraph) -> Problem:
    """The problem a fresh working graph was built from (one node per variable, no ties or pins)."""
    nodes = []
    for var in range(graph.num_original_nodes):
        node = {"cost": [None if math.isinf(c) else c for c in graph.unary[var].tolist()]}
        if graph.memory[var]:
            term = graph.memory[var][0]
            node["memory"] = term.usage.tolist()
            if term.start is not None:
                node["live"] = [term.start, term.end]
        nodes.append(node)
    edges = [{"src": u, "dst": w, "cost": [[None if math.isinf(c) else c for c in row] for row in m.tolist()]}
             for (u, w), m in graph.edges.items()]
    return Problem.from_dict({"nodes": nodes, "edges": edges})


# -- (R6) -------------------------------------------------------------------------------
def reference_links(graph: WorkingGraph, order: list[int]) -> list[tuple[int, int]]:
    leader: dict[int, int] = {}
    for var in order:
        for other in graph.neighbours[var]:
            if var in leader and other in leader:
                continue
            finite = np.isfinite(graph.edge_matrix(other, var))
            if var not in leader and (finite.sum(axis=1) <= 1).all():
                leader[var] = other
            elif other not in leader and (finite.sum(axis=0) <= 1).all():
                leader[other] = var
    return list(leader.items())


def test_follower_links_match_the_loop():
    rng = np.random.default_rng(3)
    found = 0
    for _ in range(200):
        graph = random_graph(rng, one_finite=0.5)
        order_vars = list(set(graph.unary))
        rng.shuffle(order_vars)
        view = gather_view(graph, order_vars)
        alive = np.ones(int(view.val_off[-1]), dtype=np.bool_)
        gone = np.zeros(view.var_ids.shape[0], dtype=np.bool_)
        follower, leader = follower_links(view, np.arange(len(order_vars)), *follower_flags(view, alive), gone)
        links = list(zip(view.var_ids[follower].tolist(), view.var_ids[leader].tolist()))
        assert links == reference_links(graph, order_vars)
        found += len(links)
    assert found > 50


def test_follower_links_on_a_view_restricted_and_folded_since():
    # R6 reads R2's view after R2 restricted the graph and R3 folded variables
    rng = np.random.default_rng(9)
    for _ in range(100):
        graph = random_graph(rng, one_finite=0.5)
        order_vars = list(set(graph.unary))
        view = gather_view(graph, order_vars)
        alive = np.ones(int(view.val_off[-1]), dtype=np.bool_)
        shrunk = []
        for i in range(len(order_vars)):
            if rng.random() < 0.4:
                drop = rng.random(int(view.dom[i])) < 0.5
                drop[int(rng.integers(view.dom[i]))] = False
                alive[view.val_off[i]: view.val_off[i + 1]] &= ~drop
                shrunk.append(i)
        _apply_removals(graph, view, alive, shrunk, Touched())
        gone = np.zeros(view.var_ids.shape[0], dtype=np.bool_)
        for var in [v for v in order_vars if graph.domain_size(v) == 1]:
            graph.fix(var)
            gone[view.local[var]] = True
        left = [v for v in order_vars if v in graph.unary]
        follower, leader = follower_links(view, view.local[left], *follower_flags(view, alive), gone)
        links = list(zip(view.var_ids[follower].tolist(), view.var_ids[leader].tolist()))
        assert links == reference_links(graph, left)


def test_follower_mapping_matches_numpy():
    rng = np.random.default_rng(8)
    follows = 0
    for _ in range(500):
        stored = rng.integers(0, 5, size=(int(rng.integers(1, 6)), int(rng.integers(1, 6)))).astype(np.float64)
        stored[rng.random(stored.shape) < rng.uniform(0.3, 0.9)] = np.inf
        for transposed in (False, True):
            finite = np.isfinite(stored.T if transposed else stored)  # [leader value, follower value]
            got = follower_mapping(stored, transposed)
            if (finite.sum(axis=1) <= 1).all():
                assert got.tolist() == finite.argmax(axis=1).tolist()
                follows += 1
            else:
                assert got.shape == (0,)
    assert follows > 100


# -- (R7) -------------------------------------------------------------------------------
def reference_dominated(unary, blocks, usage) -> list[bool]:
    """R7 for one variable, value by value, without the kernel's early exit inside a block."""
    d = len(unary)
    removed = [False] * d
    for a in range(d):
        if not math.isfinite(unary[a]):
            continue
        for b in range(d):
            if b == a or removed[b] or not math.isfinite(unary[b]):
                continue
            if any(usage[b][k] > usage[a][k] for k in range(len(usage[a]))):
                continue
            slack = unary[b] - unary[a]
            for block in blocks:
                diffs = [block[b][x] - block[a][x] for x in range(len(block[a])) if math.isfinite(block[a][x])]
                slack += max(diffs, default=-math.inf)
                if slack > 0:
                    break
            if slack <= 0:
                removed[a] = True
                break
    return removed


def test_dominated_kernel_matches_the_definition():
    rng = np.random.default_rng(4)
    removed_any = 0
    for _ in range(400):
        d = int(rng.integers(2, 7))
        widths = rng.integers(1, 5, size=int(rng.integers(0, 4)))
        scale = 1.0 if rng.random() < 0.5 else 0.1  # 0.1: sums that round
        def draw(shape):
            values = rng.integers(0, 4, size=shape) * scale
            return np.where(rng.random(shape) < 0.2, np.inf, values)
        unary = draw(d)
        blocks = [draw((d, int(w))) for w in widths]
        usage = rng.integers(0, 3, size=(d, int(rng.integers(0, 3)))).astype(np.float64)
        rows = np.concatenate(blocks, axis=1) if blocks else np.zeros((d, 0))
        bounds = np.concatenate([[0], np.cumsum(widths)]).astype(np.int64)
        got = kernels._dominated(unary, rows, bounds, usage).tolist()
        assert got == reference_dominated(unary.tolist(), [b.tolist() for b in blocks], usage.tolist())
        removed_any += sum(got)
    assert removed_any > 100


def test_dominated_values_sees_earlier_removals():
    # Visiting in order: each variable's check uses its neighbours' values as
    # left by the variables before it, as a loop restricting the graph would.
    rng = np.random.default_rng(5)
    for _ in range(100):
        graph = random_graph(rng, forbidden=0.1)
        order_vars = [v for v in set(graph.unary) if graph.domain_size(v) >= 2]
        rng.shuffle(order_vars)
        view = gather_view(graph, order_vars)
        alive = np.ones(int(view.val_off[-1]), dtype=np.bool_)
        removed = dominated_values(view, np.arange(len(order_vars)), *gather_terms(graph, order_vars), alive)
        for pos, var in enumerate(order_vars):
            blocks = [graph.edge_matrix(var, other).tolist() for other in graph.neighbours[var]]
            usage = np.stack([t.usage for t in graph.memory[var]], axis=1) if graph.memory[var] else \
                np.zeros((graph.domain_size(var), 0))
            expected = reference_dominated(graph.unary[var].tolist(), blocks, usage.tolist())
            assert removed[pos] == sum(expected)
            if any(expected):
                graph.restrict(var, np.flatnonzero(~np.array(expected)))
        assert {v: graph.domain_size(v) for v in view.var_ids.tolist()} == \
            {int(v): int(alive[view.val_off[i]: view.val_off[i + 1]].sum()) for i, v in enumerate(view.var_ids)}


# -- (R5) -------------------------------------------------------------------------------
def test_normalise_memory_matches_term_by_term():
    rng = np.random.default_rng(6)
    for _ in range(100):
        graph = random_graph(rng)
        for var in graph.unary:  # add a second term to some variables, and constant ones
            if rng.random() < 0.3:
                usage = np.full(graph.domain_size(var), float(rng.integers(0, 3)))
                if rng.random() < 0.5:
                    usage = usage + rng.integers(0, 2, size=usage.shape[0])
                graph.memory[var].append(MemoryTerm(None, None, usage))
        order = list(set(graph.unary))
        expected_fixed, expected_terms, expected_count = [], {}, 0
        for var in order:
            kept = []
            for term in graph.memory[var]:
                low = float(term.usage.min())
                if low > 0:
                    expected_fixed.append((term.start, term.end, low))
                if (term.usage - low).any():
                    kept.append((term.start, term.end, (term.usage - low).tolist()))
                else:
                    expected_count += 1
            expected_terms[var] = kept
        report = ReductionReport(before=None)
        normalise_memory(graph, order, report)
        assert [(t.start, t.end, float(t.usage[0])) for t in graph.fixed_memory] == expected_fixed
        assert {v: [(t.start, t.end, t.usage.tolist()) for t in graph.memory[v]] for v in order} == expected_terms
        assert report.counts.get("R5_memory_terms_fixed", 0) == expected_count
