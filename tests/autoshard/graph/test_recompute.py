"""Recomputation in the strategy graph: regions, prices worked out by hand on a
chain and a residual block, and the solver's choice against brute force, with
an evaluator written from the semantics of a checkpoint (not from the
problem's encoding)."""

from __future__ import annotations

import itertools
import math
import operator

import numpy as np
import pytest

from costmodel.mesh import MeshSpec
from hw_profiles import load
from solver import evaluate
from solver import solve as solve_problem

from autoshard.graph.builder import build_graph
from autoshard.graph.liveness import compute_liveness, is_view_op
from autoshard.graph.problem import to_problem
from autoshard.graph.states import HOLD, KEEP, RECOMPUTE, strategy_states
from autoshard.trace import trace_joint

from recompute_models import stack

PROFILE = load("h100-sxm-80gb")
BATCH = 32
ACT = BATCH * 8 * 4  # one [32, 8] fp32 activation: activations outweigh the 8x8 weights


@pytest.fixture(scope="module", params=["chain", "residual", "scaled"])
def case(request):
    traced = trace_joint(*stack(request.param, 2, batch=BATCH, device="meta"))
    graph = build_graph(traced, MeshSpec((1,)), PROFILE, ties=False)
    plain = build_graph(traced, MeshSpec((1,)), PROFILE, ties=False, recompute=False)
    return request.param, traced, graph, plain


def _node(graph, name):
    return graph.nodes[graph.index[name]]


def _state_index(node, state, base=0):
    n = len(node.strategies) // len(node.states)
    return node.states.index(state) * n + base


# -- regions -----------------------------------------------------------------

def test_regions_are_the_blocks_and_recompute_before_their_first_backward_reader(case) -> None:
    kind, traced, graph, _ = case
    assert [r.name for r in graph.regions] == ["layers.0", "layers.1"]
    gm_nodes = {n.name: n for n in traced.graph_module.graph.nodes}
    time = graph.times
    order = compute_liveness(traced.graph_module).time
    for region in graph.regions:
        readers = [n.name for n in traced.graph_module.graph.nodes
                   if n.meta.get("partitioner_tag") == "is_backward"
                   and any(u.name in region.members for u in n.all_input_nodes)]
        first = min(readers, key=lambda n: order[n])
        assert region.recompute_time == time[first]
        assert all(gm_nodes[m].meta.get("partitioner_tag") == "is_forward" for m in region.members)
        # the recomputation phase: one free slot per member just before t_rc
        assert region.phase_start == region.recompute_time - len(region.members)
        assert not any(region.phase_start <= t < region.recompute_time for t in time.values())
    # the backward of the later block comes first
    assert graph.regions[1].recompute_time < graph.regions[0].recompute_time


def test_region_outputs_and_unreplayable_ops_get_no_recompute_state(case) -> None:
    kind, traced, graph, _ = case
    out = "add_1" if kind == "residual" else "mm_3"  # the last block's output, read by the loss
    assert not _node(graph, out).states
    # tanh is saved (tanh_backward reads it): keep or recompute; its input mm is forward-only: also hold
    assert _node(graph, "tanh_1").states == (KEEP, RECOMPUTE)
    assert _node(graph, "mm_2").states == (KEEP, HOLD, RECOMPUTE)


def test_a_model_without_repeated_blocks_has_no_region() -> None:
    import torch
    from torch import nn

    class Flat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return self.b(torch.tanh(self.a(x))).sum()

    traced = trace_joint(Flat(), (torch.randn(2, 4),))
    assert traced.blocks == ()
    graph = build_graph(traced, MeshSpec((1,)), PROFILE)
    assert graph.regions == () and not any(n.states for n in graph.nodes)


# -- prices by hand ------------------------------------------------------------

def _memory_at(problem, choice, names, graph, t):
    """Bytes that the nodes of op ``names`` (with their tied pieces) hold at time t."""
    total = 0.0
    for i, node in enumerate(graph.nodes):
        owner = node.name.split(":")[-1] if node.kind == "memory" else node.name
        if owner in names and node.live is not None and node.live[0] <= t < node.live[1]:
            total += float(problem.nodes[i].memory_bytes[choice[i]])
    return total


def _slot(graph, name):
    """When ``name`` runs again in its region's recomputation phase."""
    region = next(r for r in graph.regions if name in r.members)
    return region.phase_start + region.members.index(name)


def test_a_recomputed_value_is_priced_twice_and_held_over_two_intervals(case) -> None:
    kind, traced, graph, plain = case
    problem = to_problem(graph, ties=False)
    time = graph.times
    tanh = _node(graph, "tanh_1")
    k_keep, k_rc = _state_index(tanh, KEEP), _state_index(tanh, RECOMPUTE)
    base = _node(plain, "tanh_1").compute_s[0]
    assert tanh.compute_s[k_keep] == base and tanh.compute_s[k_rc] == 2 * base
    # tanh_1 is made at t, read by the forward's next mm, by the backward last at B; made again at its slot
    t, t_rc = time["tanh_1"], _slot(graph, "tanh_1")
    f = max(time[n.name] for n in traced.graph_module.graph.nodes
            if n.meta.get("partitioner_tag") == "is_forward" and any(u.name == "tanh_1" for u in n.all_input_nodes))
    b = max(time[n.name] for n in traced.graph_module.graph.nodes
            if any(u.name == "tanh_1" for u in n.all_input_nodes))
    assert t < f < t_rc < graph.regions[1].recompute_time < b
    choice = [0] * problem.num_nodes
    i = graph.index["tanh_1"]
    for j, node in enumerate(graph.nodes):  # the op and its tied pieces pick the same strategy
        if node.name in ("tanh_1", "memory:gap:tanh_1", "memory:tail:tanh_1"):
            choice[j] = k_rc
    expected_rc = {s: ACT if (t <= s <= f or t_rc <= s <= b) else 0 for s in range(t - 1, b + 3)}
    assert {s: _memory_at(problem, choice, {"tanh_1"}, graph, s) for s in expected_rc} == expected_rc
    for j, node in enumerate(graph.nodes):
        if node.name in ("tanh_1", "memory:gap:tanh_1", "memory:tail:tanh_1"):
            choice[j] = k_keep
    expected_keep = {s: ACT if t <= s <= b else 0 for s in range(t - 1, b + 3)}
    assert {s: _memory_at(problem, choice, {"tanh_1"}, graph, s) for s in expected_keep} == expected_keep
    assert graph.nodes[i].live == (t, f + 1)


def test_a_forward_only_input_must_be_held_or_recomputed_for_a_recomputed_reader(case) -> None:
    kind, traced, graph, _ = case
    tanh, mm = graph.index["tanh_1"], graph.index["mm_2"]
    edge = next(e for e in graph.edges if (e.src, e.dst) == (mm, tanh))
    matrix = graph.matrices[edge.matrix]
    u, v = graph.nodes[mm], graph.nodes[tanh]
    rows = strategy_states(u.states, len(u.strategies))
    cols = strategy_states(v.states, len(v.strategies))
    for a, b in itertools.product(range(len(rows)), range(len(cols))):
        forbidden = cols[b] == RECOMPUTE and rows[a] == KEEP
        assert math.isinf(matrix[a, b]) == forbidden, (rows[a], cols[b])
    # mm_2 held until tanh_1 has read it in the recomputation; recomputed: a temporary from its slot to tanh_1's
    time = graph.times
    problem = to_problem(graph, ties=False)
    t, s_mm, s_tanh = time["mm_2"], _slot(graph, "mm_2"), _slot(graph, "tanh_1")
    assert s_mm < s_tanh < graph.regions[1].recompute_time
    for state, alive in ((HOLD, lambda s: t <= s <= s_tanh), (RECOMPUTE, lambda s: t <= s <= t + 1 or s_mm <= s <= s_tanh),
                         (KEEP, lambda s: t <= s <= t + 1)):
        choice = [0] * problem.num_nodes
        for j, node in enumerate(graph.nodes):
            if node.name in ("mm_2", "memory:gap:mm_2", "memory:tail:mm_2"):
                choice[j] = _state_index(u, state)
        got = {s: _memory_at(problem, choice, {"mm_2"}, graph, s) for s in range(t - 1, s_tanh + 3)}
        assert got == {s: ACT if alive(s) else 0 for s in got}, state


def test_edges_into_a_recomputed_reader_cost_twice() -> None:
    traced = trace_joint(*stack("chain", 2, dim=64, batch=64, device="meta"))
    graph = build_graph(traced, MeshSpec((2,)), PROFILE, ties=False)
    plain = build_graph(traced, MeshSpec((2,)), PROFILE, ties=False, recompute=False)
    i, j = graph.index["tanh_1"], plain.index["tanh_1"]
    e = next(e for e in graph.edges if e.dst == i)
    e0 = next(e for e in plain.edges if e.dst == j)
    m, m0 = graph.matrices[e.matrix], plain.matrices[e0.matrix]
    u = graph.nodes[e.src]
    n_u, n_v = len(m0), len(m0[0])
    rows = strategy_states(u.states, len(u.strategies))
    for s_u in range(len(u.states)):
        block_keep = m[s_u * n_u:(s_u + 1) * n_u, 0:n_v]
        block_rc = m[s_u * n_u:(s_u + 1) * n_u, n_v:2 * n_v]
        assert np.array_equal(block_keep, m0)
        if u.states[s_u] == KEEP:  # forward-only input not kept until t_rc
            assert np.isinf(block_rc).all()
        else:
            assert np.array_equal(block_rc, 2 * m0)
    assert rows.size == len(u.strategies)


def test_every_strategy_kept_prices_as_the_graph_without_recomputation() -> None:
    traced = trace_joint(*stack("residual", 3, dim=64, batch=64, device="meta"))
    graph = build_graph(traced, MeshSpec((2,)), PROFILE)
    plain = build_graph(traced, MeshSpec((2,)), PROFILE, recompute=False)
    p0 = to_problem(plain, memory_limit=None)
    sol = solve_problem(p0, time_limit=20)
    p1 = to_problem(graph, memory_limit=None)
    choice = [None] * p1.num_nodes
    for node0, k in zip(plain.nodes, sol.choice):
        choice[graph.index[node0.name]] = k  # state KEEP is the first block of a state-expanded list
    for i, node in enumerate(graph.nodes):
        if choice[i] is None:  # a recomputation piece: its owner's choice
            choice[i] = choice[graph.index[node.name.split(":")[2]]]
    e0, e1 = evaluate(p0, sol.choice), evaluate(p1, choice)
    assert e1.cost == pytest.approx(e0.cost, rel=1e-12)
    assert e1.peak_memory_bytes == pytest.approx(e0.peak_memory_bytes, rel=1e-12)
    assert not e1.forbidden


# -- brute force ---------------------------------------------------------------

def _semantic_evaluation(traced, plain, graph, states: dict[str, int]):
    """Cost and peak memory of running the step with ``states`` (fx name -> KEEP,
    HOLD or RECOMPUTE), from what a checkpoint does, on mesh (1,); None when a
    recomputed op would read a value that no longer exists. A region's
    recomputation runs its ops in forward order, one per slot of the phase
    before its first backward reader, and frees a temporary after its last
    reader there (any op of the region that has states may read it)."""
    gm = traced.graph_module
    nodes = [n for n in gm.graph.nodes if n.op != "output"]
    time = graph.times
    regions = graph.regions
    slot = {m: r.phase_start + j for r in regions for j, m in enumerate(r.members)}
    closure = {n.name for n in graph.nodes if n.kind == "op" and n.states}
    backward = set()
    for n in nodes:
        if n.meta.get("partitioner_tag") == "is_backward" or n is traced.tangent \
                or any(u in backward for u in n.all_input_nodes):
            backward.add(n)
    base = {}
    for n in nodes:
        base[n.name] = base[n.args[0].name] if (n.op == "call_function" and is_view_op(n.target)) else n.name
    fwd_end, bwd_end = {}, {}
    for n in nodes:
        for u in n.all_input_nodes:
            table = bwd_end if n in backward else fwd_end
            table[base[u.name]] = max(table.get(base[u.name], 0), time[n.name])
    region = {m: r.index for r in regions for m in r.members}
    recomputable = {n.name for n in graph.nodes if n.kind == "op" and RECOMPUTE in n.states}
    last_slot = {}  # a recomputed or held storage: the slot of its last reader in a recomputation
    for n in nodes:
        if n.name in recomputable and n.name in region:
            for u in n.all_input_nodes:
                root = base[u.name]
                if root in closure and (region.get(root) == region[n.name] or root not in recomputable):
                    last_slot[root] = max(last_slot.get(root, -1), slot[n.name])
    # validity: a recomputed op's inputs exist at t_rc; a value read after the forward exists
    for name, s in states.items():
        if s != RECOMPUTE:
            continue
        node = next(n for n in nodes if n.name == name)
        for u in node.all_input_nodes:
            root = base[u.name]
            if next(n for n in nodes if n.name == root).op == "placeholder":
                continue
            rs = states.get(root, KEEP)
            if rs == RECOMPUTE and region.get(root) == region[name]:
                continue
            if rs == HOLD and last_slot.get(root, -1) >= slot[name]:
                continue
            if rs == KEEP and root in bwd_end:
                continue
            return None
            # a view of a recomputed base must be made again when read later
        if is_view_op(node.target) and states.get(base[name], KEEP) != RECOMPUTE \
                and next(n for n in nodes if n.name == base[name]).op != "placeholder":
            return None
    for name, s in states.items():
        node = next(n for n in nodes if n.name == name)
        if is_view_op(node.target) and states.get(base[name], KEEP) == RECOMPUTE and s != RECOMPUTE:
            return None
    cost = 0.0
    timeline = {}
    for node in plain.nodes:
        c = float(node.compute_s[0])
        s = states.get(node.name, KEEP)
        cost += 2 * c if s == RECOMPUTE else c
        m = float(node.memory_bytes[0])
        if not m:
            continue
        if node.live is None:
            intervals = [(-1, 10**9)]
        elif node.kind == "op" and node.name in states and base[node.name] == node.name:
            t, f = time[node.name], fwd_end.get(node.name, time[node.name])
            b = bwd_end.get(node.name)
            if node.name in slot and node.name in recomputable:
                again = slot[node.name]
                used = max(last_slot.get(node.name, again), again)
            else:  # held only
                again = used = last_slot.get(node.name, f)
            if s == KEEP:
                intervals = [(t, (b if b is not None else f) + 1)]
            elif s == HOLD:
                intervals = [(t, used + 1)]
            else:
                intervals = [(t, f + 1), (again, (b if b is not None else used) + 1)]
        else:
            intervals = [_shifted(node, graph)]
        for a, z in intervals:
            timeline[a] = timeline.get(a, 0.0) + m
            timeline[z] = timeline.get(z, 0.0) - m
    level, peak = 0.0, 0.0
    for t in sorted(timeline):
        level += timeline[t]
        peak = max(peak, level)
    return cost, peak


def _shifted(node, graph):
    """The node's interval in ``graph`` (the time axis with recomputation phases)."""
    return graph.nodes[graph.index[node.name]].live if node.name in graph.index else node.live


def _free_variables(problem, graph):
    groups = {}
    for g in problem.ties:
        for m in g:
            groups[m] = g
    seen, free = set(), []
    for i, node in enumerate(problem.nodes):
        if node.num_strategies > 1 and i not in seen:
            members = groups.get(i, (i,))
            seen.update(members)
            free.append(members)
    return free


def test_every_choice_evaluates_as_a_checkpoint_would_run_it(case) -> None:
    kind, traced, graph, plain = case
    problem = to_problem(graph, ties=False)
    free = _free_variables(problem, graph)
    counts = [problem.nodes[g[0]].num_strategies for g in free]
    assert 0 < math.prod(counts) < 20_000
    checked = feasible = 0
    for values in itertools.product(*[range(c) for c in counts]):
        choice = [0] * problem.num_nodes
        states = {}
        for g, k in zip(free, values):
            for m in g:
                choice[m] = k
            node = graph.nodes[g[0]]
            states[node.name] = node.states[k // (len(node.strategies) // len(node.states))]
        ev = evaluate(problem, choice)
        sem = _semantic_evaluation(traced, plain, graph, states)
        checked += 1
        if sem is None:
            assert ev.forbidden, states
            continue
        feasible += 1
        assert not ev.forbidden, states
        assert ev.cost == pytest.approx(sem[0], rel=1e-12)
        assert ev.peak_memory_bytes == pytest.approx(sem[1], rel=1e-12), states
    assert feasible > 1 and checked == math.prod(counts)


def _feasible_choices(problem, graph):
    """(choice, evaluation) of every feasible choice over the free variables (tied groups move together)."""
    free = _free_variables(problem, graph)
    for values in itertools.product(*[range(problem.nodes[g[0]].num_strategies) for g in free]):
        choice = [0] * problem.num_nodes
        for g, k in zip(free, values):
            for m in g:
                choice[m] = k
        ev = evaluate(problem, choice)
        if ev.feasible:
            yield choice, ev


def _brute_force(problem, graph):
    best = (math.inf, None)
    for choice, ev in _feasible_choices(problem, graph):
        if ev.cost < best[0]:
            best = (ev.cost, choice)
    return best


def _smallest_peak_at_cost(problem, graph, cost: float) -> float:
    return min((ev.peak_memory_bytes for _, ev in _feasible_choices(problem, graph)
                if ev.cost == pytest.approx(cost, rel=1e-9)), default=math.inf)


def test_the_solver_recomputes_exactly_as_much_as_the_limit_needs(case) -> None:
    kind, traced, graph, plain = case
    unlimited = to_problem(graph, ties=False)
    # the all-kept peak: the smallest peak of the unlimited optimum (which of its tied choices a
    # solve returns is the solver's business; a tie with a higher peak would fit "peak - 1" for free)
    best_cost, _ = _brute_force(unlimited, graph)
    peak_keep = _smallest_peak_at_cost(unlimited, graph, best_cost)
    assert solve_problem(unlimited, time_limit=10).cost == pytest.approx(best_cost, rel=1e-9)
    lows = []
    for limit in (None, peak_keep - 1, peak_keep - ACT - 1, peak_keep - 2 * ACT - 1):
        problem = to_problem(graph, ties=False, memory_limit=limit)
        best_cost, _ = _brute_force(problem, graph)
        solution = solve_problem(problem, time_limit=10)
        if math.isinf(best_cost):
            assert not solution.choice or not evaluate(problem, solution.choice).feasible
            continue
        ev = evaluate(problem, solution.choice)
        assert ev.feasible and ev.cost == pytest.approx(best_cost, rel=1e-9), limit
        lows.append(best_cost)
    assert len(lows) >= 2 and lows[1] > lows[0]  # below the all-kept peak, recomputing costs time


def test_placements_and_recomputation_are_chosen_together_optimally() -> None:
    traced = trace_joint(*stack("residual", 2, dim=64, batch=64, device="meta"))

    def restrict(node, strategies):
        """Two placements for the second block's forward ops (views excepted), one elsewhere:
        small enough to enumerate, and the placement still interacts with the states."""
        second = traced.module_paths.get(node.name, "").startswith("layers.1") and not is_view_op(node.target)
        return strategies[:2] if second and node.meta.get("partitioner_tag") == "is_forward" else strategies[:1]

    graph = build_graph(traced, MeshSpec((2,)), PROFILE, restrict=restrict)
    pins = {i: 0 for i, n in enumerate(graph.nodes) if n.kind in ("param", "input")}
    base = to_problem(graph, pins=pins)
    peak = evaluate(base, solve_problem(base, time_limit=10).choice).peak_memory_bytes
    bests = []
    for limit in (None, 0.97 * peak, 0.9 * peak, 0.8 * peak):
        problem = to_problem(graph, pins=pins, memory_limit=limit)
        free = _free_variables(problem, graph)
        free = [g for g in free if not any(m in problem.pins for m in g)]
        assert 100 < math.prod(problem.nodes[g[0]].num_strategies for g in free) < 5_000
        best = math.inf
        for values in itertools.product(*[range(problem.nodes[g[0]].num_strategies) for g in free]):
            choice = [problem.pins.get(i, 0) for i in range(problem.num_nodes)]
            for g, k in zip(free, values):
                for m in g:
                    choice[m] = k
            ev = evaluate(problem, choice)
            if ev.feasible:
                best = min(best, ev.cost)
        solution = solve_problem(problem, time_limit=10)
        if math.isinf(best):
            assert not solution.choice or not evaluate(problem, solution.choice).feasible
        else:
            assert evaluate(problem, solution.choice).cost == pytest.approx(best, rel=1e-9)
            states = {graph.nodes[i].name: graph.nodes[i].states[k // (len(graph.nodes[i].strategies)
                                                                      // len(graph.nodes[i].states))]
                      for i, k in enumerate(solution.choice) if graph.nodes[i].states and graph.nodes[i].kind == "op"}
            bests.append((best, sum(s == RECOMPUTE for s in states.values())))
    print(bests)
    # tighter limits cost more, and are met by recomputing
    assert bests[0][1] == 0 and any(n > 0 for _, n in bests[1:])
    assert all(a[0] <= b[0] for a, b in zip(bests, bests[1:])) and bests[-1][0] > bests[0][0]


def test_a_recompute_list_is_checked_against_the_traced_graph(case) -> None:
    from autoshard.graph.regions import check_recompute

    kind, traced, graph, _ = case
    check_recompute(traced, ["tanh_1", "mm_2"])
    out = "add_1" if kind == "residual" else "mm_3"
    for names, message in ((["nope"], "no op named 'nope'"), (["mean"], "not an op of a repeated block"),
                           ([out], "cannot be recomputed: a region output")):
        with pytest.raises(ValueError, match=message):
            check_recompute(traced, names)


def test_a_block_input_the_backward_does_not_read_can_be_held_for_the_recomputation() -> None:
    """``2 * x`` does not need x in the backward: the first block's output is gone
    when the second block is recomputed, unless it is held (torch's checkpoint keeps
    its inputs); without the hold, the second block could not recompute ``mul``."""
    traced = trace_joint(*stack("scaled", 2, batch=BATCH, device="meta"))
    graph = build_graph(traced, MeshSpec((1,)), PROFILE, ties=False)
    first_output = next(u.name for u in traced.graph_module.graph.nodes
                        if u.name.startswith("mul") and traced.module_paths.get(u.name, "").startswith("layers.1"))
    mul = next(n for n in traced.graph_module.graph.nodes if n.name == first_output)
    block_input = next(a.name for a in mul.args if hasattr(a, "name"))
    assert _node(graph, block_input).states == (KEEP, HOLD)
    assert RECOMPUTE in _node(graph, first_output).states
