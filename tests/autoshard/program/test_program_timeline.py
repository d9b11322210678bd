"""autoshard.program.memory: the plan's timeline counts op storages over the step program's lives.

One hand-built step: a parameter ``w``; ``a = f(w)`` (8 bytes) at time 1; its view ``v`` at 2;
``b = g(v)`` (4 bytes) at 3; the backward ``c = h(a, b)`` (4 bytes) at 5, whose result the
gradient sink ``grad:w`` holds from 6 to the update at 7. The solver splits ``a``'s storage into
its op node and two tied pieces (``memory:gap:a``, ``memory:tail:a``); the program has one life.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from autoshard.program.actions import ProgramNode, build_step_program
from autoshard.program.memory import exact_spans, exact_timeline, storage_spans
from autoshard.program.reservation import replay_spans
from autoshard.program.schedule import Schedule


def _step(recompute=()):
    node = lambda name, kind, target="", region=None: SimpleNamespace(name=name, kind=kind, target=target,
                                                                       region=region, strategies=())
    nodes = [node("param:w", "param"), node("a", "op", "aten.relu.default", "layers.0"),
             node("v", "op", "aten.t.default", "layers.0"), node("b", "op", "aten.mm.default", "layers.0"),
             node("c", "op", "aten.mm.default"), node("grad:w", "grad"),
             node("memory:gap:a", "memory", "piece"), node("memory:tail:a", "memory", "piece")]
    edge = lambda src, dst, k=0: SimpleNamespace(src=src, dst=dst, src_output=0, dst_input=k, shape=(2,), itemsize=4,
                                                 copy_live=(), copy_live_recomputed=())
    graph = SimpleNamespace(nodes=nodes, edges=[edge(0, 1), edge(1, 2), edge(2, 3), edge(1, 4), edge(3, 4, 1),
                                                edge(4, 5)], mesh=SimpleNamespace(shape=(1,)))
    live = [None, (1, 2), (2, 3), (3, 4), (5, 6), (6, 8), (2, 3), (3, 6)]
    nbytes = [16, 8, 0, 4, 4, 4, 8, 8]
    problem = SimpleNamespace(nodes=[SimpleNamespace(memory_bytes=np.array([float(m)]), live=t)
                                     for m, t in zip(nbytes, live)])
    ops = [ProgramNode("a", ("param:w",)), ProgramNode("v", ("a",)), ProgramNode("b", ("v",)),
           ProgramNode("c", ("a", "b"))]
    program = build_step_program(ops, Schedule(4, 0, ()), keep={"c"})
    return graph, problem, program


def test_a_storage_the_solver_cuts_in_pieces_is_one_span_over_its_program_life():
    graph, problem, program = _step()
    lives = storage_spans(graph, problem, [0] * 8, program)
    # a: made at 1, read through its view until c at 5; the view owns nothing; c's result ends at
    # its last reader (itself: 5) and the sink holds it on
    assert lives == {1: [(1, 6, 8.0, ("node", 1), "op")], 3: [(3, 6, 4.0, ("node", 3), "op")],
                     4: [(5, 6, 4.0, ("node", 4), "op")]}
    spans = exact_spans(graph, problem, [0] * 8, (), (), program=program)
    assert not [s for s in spans if s[3] in (("node", 6), ("node", 7))]  # the pieces are not counted again


def test_the_timeline_equals_the_solvers_intervals_where_they_agree():
    graph, problem, program = _step()
    timeline = exact_timeline(graph, problem, [0] * 8, (), (), program=program)
    # w 16 all step; a 8 over [1, 6); b 4 over [3, 6); c 4 over [5, 6); grad:w 4 over [6, 8)
    assert timeline == ((1, 24.0), (3, 28.0), (5, 32.0), (6, 20.0), (8, 16.0))


def test_the_allocator_replays_one_tensor_per_life_not_one_per_piece():
    graph, problem, program = _step()
    spans = exact_spans(graph, problem, [0] * 8, (), (), program=program)
    assert [s[:3] for s in spans if s[3] == ("node", 1)] == [(1, 6, 8.0)]
    # held 16 B, then a, b and c at 5: four blocks of the allocator's 512 B rounding
    assert replay_spans(spans, {}, optimizer_time=7, steps=1).allocated_bytes == 4 * 512
