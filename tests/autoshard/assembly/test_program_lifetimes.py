"""One memory timeline, checked: the graph's live intervals are the step program's lifetimes.

The planner's exact memory timeline (``autoshard.program.memory``) and the allocator
replay (``autoshard.program.reservation``) read the problem's live intervals (an op node's
own interval, then its ``memory:gap:`` and ``memory:tail:`` pieces while the backward holds
it: ``autoshard.graph.tied_memory``); the runtime's measured bytes follow the step program's
lifetimes (``autoshard.program.live_bytes``). On solved plans, every op storage that is not
recomputed (an op's output with its views and tuple accesses) lives, on the problem's time
axis, exactly where the program holds it: from its op to one past the action that frees its
last alias. Two differences. A result (the loss, a gradient) the program holds to the step's
end; the graph ends its op's storage at its last reader and counts it on as its sink node,
in the sink's placement (``autoshard.program.reservation`` joins the two as one tensor where
their bytes agree). And inside a recomputation
phase: the graph gives the phase its own time slots just before the phase's first backward
op (one per forward op of the region, ``autoshard.graph.regions``) where the program places
the whole phase at that op's position. So a storage whose last reader is a recomputed op
ends, in the graph, at that reader's slot, and a recomputed storage's second life starts at
its own slot: both inside the phase's slots, between the op before the phase and the phase's
first backward op.
"""

from __future__ import annotations

import pytest

from autoshard.assembly import assemble
from autoshard.graph.liveness import is_view_name
from autoshard.program.actions import Recompute
from autoshard.search.solve import prepare, solve_prepared
from examples.models import llama3, mlp

CASES = {
    "mlp-ddp": (lambda: mlp.tiny(n_layers=3), (2, 2), dict(baseline="ddp", recompute="none")),
    "mlp-fsdp-full": (lambda: mlp.tiny(n_layers=3), (2, 2), dict(baseline="fsdp", recompute="full")),
    "llama-ddp-selective": (lambda: llama3.tiny(batch_size=2, seq_len=16), (2,),
                            dict(baseline="ddp", recompute="selective")),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def solved(request):
    """(graph, problem, choice, the plan's step program, the time of each schedule position)."""
    make, mesh, options = CASES[request.param]
    captured = []
    real = assemble.step_pricing

    def recording(graph, problem, choice):
        pricing = real(graph, problem, choice)
        captured.append((graph, problem, tuple(choice), pricing))
        return pricing

    patch = pytest.MonkeyPatch()
    patch.setattr(assemble, "step_pricing", recording)
    try:
        model, inputs = make()
        prep = prepare(model, inputs, mesh, ("dp", "tp")[:len(mesh)], profile="cpu-gloo")
        plan = solve_prepared(prep, time_limit=10, **options)
    finally:
        patch.undo()
    graph, problem, choice, pricing = captured[-1]
    return graph, problem, choice, pricing.program(plan.schedule, plan.redistributions, plan.gather_buckets), \
        pricing.times


def _storage_of(graph, program):
    """Program value -> the op node whose storage it holds (a view's or tuple access's base)."""
    index = {n.name: i for i, n in enumerate(graph.nodes)}
    first_input = {}
    for e in graph.edges:
        if e.dst_input == 0:
            first_input[e.dst] = graph.nodes[e.src].name
    root = {}
    for n in program.nodes:
        base = n.of_tuple if n.of_tuple is not None else (
            first_input.get(index[n.name]) if is_view_name(graph.nodes[index[n.name]].target) else None)
        root[n.name] = root.get(base, base) if base is not None else n.name
    return root


def _program_lives(graph, program, times):
    """Op storage -> [(start, end)] of each life on the problem's time axis (end None: to the step's end),
    and the storages recomputed."""
    root, index = _storage_of(graph, program), {n.name: i for i, n in enumerate(graph.nodes)}
    positions, n_actions = program.positions, len(program.actions)
    lives: dict[str, list[tuple[int, int | None]]] = {}
    for life in program.lifetimes:
        storage = root.get(life.value)
        if storage is None or life.made < 0 or graph.nodes[index[storage]].kind != "op":
            continue
        end = times[positions[life.freed]] + 1 if life.freed < n_actions else None
        lives.setdefault(storage, []).append((times[positions[life.made]], end))
    again = {root[a.node] for a in program.actions if isinstance(a, Recompute)}
    return lives, again


def _phase_slots(program, times):
    """Time of each phase's first backward op -> the time of the op before it (the graph's phase
    slots lie between the two)."""
    return {times[ph.position]: times[ph.position - 1] for ph in program.phases}


def _graph_pieces(graph, problem, choice):
    """Op storage -> the intervals the problem holds it over at the chosen states (bytes > 0)."""
    out: dict[str, list[tuple[int, int]]] = {}
    for i, (node, pnode) in enumerate(zip(graph.nodes, problem.nodes)):
        if pnode.live is None or not float(pnode.memory_bytes[choice[i]]):
            continue
        if node.kind == "op":
            out.setdefault(node.name, []).append(tuple(pnode.live))
        elif node.kind == "memory" and node.target == "piece":
            out.setdefault(node.name.split(":", 2)[2], []).append(tuple(pnode.live))
    return out


def test_a_storage_kept_lives_in_the_graph_exactly_where_the_program_holds_it(solved):
    graph, problem, choice, program, times = solved
    lives, again = _program_lives(graph, program, times)
    pieces = _graph_pieces(graph, problem, choice)
    before = _phase_slots(program, times)
    root = _storage_of(graph, program)
    results = {root.get(v, v) for v in program.frame.keep}
    compared = 0
    for storage, spans in lives.items():
        if storage in again or storage not in pieces:
            continue  # recomputed (next test), or a storage of no bytes on this rank
        start, ends = min(s for s, _ in spans), [e for _, e in spans]
        end = None if None in ends else max(ends)
        held = pieces[storage]
        graph_start, graph_end = min(s for s, _ in held), max(e for _, e in held)
        assert graph_start == start, storage
        if end is not None and end - 1 in before:  # last read by the recomputation: at its reader's slot
            assert before[end - 1] + 1 < graph_end <= end, storage
        elif end is None and graph_end <= times[-1]:  # a result: from its last reader on, its sink holds it
            assert storage in results, storage
        else:
            assert (None if graph_end > times[-1] else graph_end) == end, storage
        compared += 1
    assert compared >= 20


def test_a_recomputed_storage_lives_again_from_the_phase_the_graph_inserts_to_where_the_program_frees_it(solved):
    graph, problem, choice, program, times = solved
    lives, again = _program_lives(graph, program, times)
    pieces = _graph_pieces(graph, problem, choice)
    assert bool(again) == any(isinstance(a, Recompute) for a in program.actions)
    before = _phase_slots(program, times)
    assert bool(again & set(pieces)) == bool(again), "a recomputed storage of no bytes would make this vacuous"
    for storage in again & set(pieces):
        second = [(s, e) for s, e in lives[storage] if s in before]
        t_rc = min(s for s, _ in second)
        start, end = max(pieces[storage])  # the graph's last piece: the recomputed life
        assert before[t_rc] < start < t_rc, storage  # a slot of the phase
        last = max(e for _, e in second)
        if last - 1 in before:  # freed inside the phase: at its last recomputed reader's slot
            assert start < end <= last, storage
        else:
            assert end == last, storage
