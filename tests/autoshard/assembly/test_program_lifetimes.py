"""One memory timeline: the plan's exact timeline counts the step program's lifetimes, and the
solver's live intervals bound it from above.

The plan's timeline and the allocator replay (``autoshard.program.memory``,
``autoshard.program.reservation``) put every op storage over the lives the step program gives it
(``StepProgram.lifetimes``: what the runtime runs and its measured live bytes are checked against),
with a result read by a gradient sink ended at its last reader (the sink holds it on) and a
recomputation phase one time slot per recomputed op. The solver keeps its own intervals (an op
node and its ``memory:gap:``/``memory:tail:`` pieces, linear in the choice:
``autoshard.graph.tied_memory``); these tests check, on solved plans, that its bound is never
below the program's count (per storage, at every time) and that the plan's peak of what the
program holds is never above the solver's ``peak_memory``.
"""

from __future__ import annotations

import pytest

from solver.evaluate import peak_memory

from autoshard.assembly import assemble
from autoshard.assembly.step_program import memory_program
from autoshard.program.actions import Recompute
from autoshard.program.memory import exact_spans, exact_timeline, storage_spans, timeline_peak
from autoshard.search.solve import prepare, solve_prepared
from examples.models import llama3, mlp, vit

CASES = {
    "mlp-ddp": (lambda: mlp.tiny(n_layers=3), (2, 2), dict(baseline="ddp", recompute="none")),
    "mlp-fsdp-full": (lambda: mlp.tiny(n_layers=3), (2, 2), dict(baseline="fsdp", recompute="full")),
    "llama-ddp-selective": (lambda: llama3.tiny(batch_size=2, seq_len=16), (2,),
                            dict(baseline="ddp", recompute="selective")),
    "vit": (lambda: vit.tiny(), (2, 2), dict(baseline="ddp", recompute="none")),  # a multi-output op (convolution_backward) whose outputs are results
}


@pytest.fixture(scope="module", params=sorted(CASES))
def solved(request):
    """(graph, problem, choice, plan, the plan's step program, what the plan's timeline was made of)."""
    make, mesh, options = CASES[request.param]
    captured, made = [], []
    real, real_timelines = assemble.step_pricing, assemble._timelines

    def recording(graph, problem, choice):
        pricing = real(graph, problem, choice)
        captured.append((graph, problem, tuple(choice), pricing))
        return pricing

    def timelines(*args):
        made.append(args)
        return real_timelines(*args)

    patch = pytest.MonkeyPatch()
    patch.setattr(assemble, "step_pricing", recording)
    patch.setattr(assemble, "_timelines", timelines)
    try:
        model, inputs = make()
        prep = prepare(model, inputs, mesh, ("dp", "tp")[:len(mesh)], profile="cpu-gloo")
        plan = solve_prepared(prep, time_limit=10, **options)
    finally:
        patch.undo()
    assert len(captured) == len(made) == 1, "one plan assembled: the one returned"
    graph, problem, choice, pricing = captured[-1]
    program = pricing.program(plan.schedule, plan.redistributions, plan.gather_buckets)
    return graph, problem, choice, plan, program, made[-1]


def _profile(spans):
    """time -> bytes of ``(start, end, bytes)`` terms, at every time some term starts or ends."""
    events: dict[int, float] = {}
    for start, end, nbytes in spans:
        if nbytes and start < end:
            events[start] = events.get(start, 0.0) + nbytes
            events[end] = events.get(end, 0.0) - nbytes
    out, level = {}, 0.0
    for t in sorted(events):
        level += events[t]
        out[t] = level
    return out


def _at(profile, t):
    return max(((s, v) for s, v in profile.items() if s <= t), default=(0, 0.0))[1]


def _solver_storages(graph, problem, choice):
    """Op node -> the solver's terms of its storage: the op node and its tied pieces, at the choice."""
    index = {n.name: i for i, n in enumerate(graph.nodes)}
    out: dict[int, list[tuple[int, int, float]]] = {}
    for i, (node, pnode) in enumerate(zip(graph.nodes, problem.nodes)):
        owner = i if node.kind == "op" else (
            index[node.name.split(":", 2)[2]] if node.kind == "memory" and node.target == "piece" else None)
        if owner is not None and pnode.live is not None:
            out.setdefault(owner, []).append((*pnode.live, float(pnode.memory_bytes[choice[i]])))
    return out


def test_the_timeline_reads_the_same_lives_from_the_plans_program_as_from_its_schedule_free_one(solved):
    graph, problem, choice, plan, program, _ = solved
    assert any(a.__class__.__name__ == "Issue" for a in program.actions) == bool(plan.schedule.items)
    assert storage_spans(graph, problem, choice, program) == storage_spans(graph, problem, choice,
                                                                           memory_program(graph, choice))


def test_the_plans_timeline_is_the_one_counted_from_the_program(solved):
    graph, problem, choice, plan, program, (_, _, _, copies, buckets, _, shared, *_) = solved
    timeline = exact_timeline(graph, problem, choice, copies, buckets, program=program, param_views=shared)
    assert tuple(map(tuple, plan.memory_timeline)) == timeline
    assert timeline_peak(timeline) == plan.estimate.peak_memory_bytes


def test_the_solvers_intervals_hold_every_op_storage_at_least_as_long_as_the_program(solved):
    graph, problem, choice, _, program, _ = solved
    solver = _solver_storages(graph, problem, choice)
    ours = storage_spans(graph, problem, choice, program)
    assert len(ours) >= 20
    equal = 0
    for i, spans in ours.items():
        theirs, mine = _profile(solver.get(i, ())), _profile([(s, e, b) for s, e, b, _, _ in spans])
        times = sorted(set(theirs) | set(mine))
        assert all(_at(theirs, t) >= _at(mine, t) for t in times), graph.nodes[i].name
        equal += all(_at(theirs, t) == _at(mine, t) for t in times)
    assert equal >= 0.9 * len(ours)  # the solver's one over-estimate: a HOLD value kept to L_v


def test_the_solvers_peak_bounds_the_plans_peak_of_what_the_program_holds(solved):
    # the gradient buckets' partial and payload terms are left out: the plan counts them past the
    # solver's bound nodes (vit: 673,532 B against 672,124 B), a gap of the bucket timeline, not of the lives
    graph, problem, choice, plan, program, (_, _, _, copies, buckets, _, shared, *_) = solved
    spans = exact_spans(graph, problem, choice, copies, buckets, program=program, param_views=shared)
    held = sum(b for s, _, b, _, _ in spans if s is None)
    profile = _profile([(s, e, b) for s, e, b, _, kind in spans if s is not None and kind not in ("partial", "payload")])
    bound, _ = peak_memory(problem, choice)
    assert held + max(profile.values()) <= bound
    if not buckets:
        assert plan.estimate.peak_memory_bytes <= bound
    if any(isinstance(a, Recompute) for a in program.actions):  # recomputation saves what the program frees
        assert plan.estimate.peak_without_recompute_bytes >= plan.estimate.peak_memory_bytes
