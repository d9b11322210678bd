"""The step program of a solved plan, built by the planner from the assembled graph (torch-free).

The planner prices the step the runtime runs by pricing the same object: the
:class:`~autoshard.program.actions.StepProgram` (``autoshard.program.actions``).
The runtime builds it from its fx graph (``autoshard.runtime.binding.PlanBinding.program_nodes``);
the planner builds it here from what it holds, the :class:`~autoshard.assembly.request.AssemblyGraph`
and the solver's choice, so that both give the same program for the same plan
(a test compares them action for action).

**Values by plan name.** Both sides name a value as the plan does: an op by its node
name, a leaf by its plan node (``param:<fqn>``, ``input:<name>``, ``buffer:<fqn>``,
``constant:<name>``, ``tangent``), and output ``k`` of a multi-output op (one whose
strategies have several outputs) by :func:`tuple_value` (``op[k]``): the tuple access
the runtime runs, placed just after its op (a tuple access only aliases an output
that exists from its op on), one per output some node reads.

**What the program reads from the graph** (:class:`StepDataflow`): the op nodes and
their tuple accesses in graph order, each op's reads (its input edges in input
order, each value once), the values kept to the end (``keep``: what the loss, the
gradients and the buffer updates read), the recomputed ops with their regions, and
the backward: every op at or after the first op that reads a value the tangent
reaches (the joint graph runs its forward, then its backward; the runtime's
``autoshard.graph.regions.backward_nodes`` also counts there the backward formula's
ops that read only forward values).

>>> from hw_profiles import load
>>> from costmodel.mesh import MeshSpec
>>> from autoshard.assembly.request import AssemblyEdge, AssemblyGraph, AssemblyNode, StrategyPlacements
>>> one = (StrategyPlacements(((),), ((),)),)
>>> nodes = (AssemblyNode("input:x", "input", "x", one), AssemblyNode("relu", "op", "aten.relu.default", one))
>>> g = AssemblyGraph(MeshSpec((1,)), load("cpu-gloo"), nodes, (AssemblyEdge(0, 1, 0, 0, (4,), 4),), {}, {}, {}, {})
>>> [str(a) for a in step_dataflow(g, (0, 0)).program(Schedule(1, 0, ()), ()).actions]
['compute relu', 'free input:x']
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from autoshard.assembly.request import AssemblyGraph
from autoshard.graph.states import RECOMPUTE, state_of
from autoshard.program.actions import ProgramFrame, ProgramNode, StepProgram, program_frame, program_of, tuple_value
from autoshard.program.schedule import Schedule

__all__ = ["SINK_KINDS", "StepDataflow", "step_dataflow", "names_dataflow", "memory_program"]

SINK_KINDS = ("loss", "grad", "buffer_update")
"""Node kinds whose inputs are the step's results (kept to the end)."""


@dataclass(frozen=True, slots=True)
class StepDataflow:
    """What the step program reads from the graph and the solver's choice (module docstring)."""

    nodes: tuple[ProgramNode, ...]
    keep: frozenset[str] = frozenset()
    recompute: tuple[str, ...] = ()
    """The recomputed ops, in graph order."""
    regions: Mapping[str, str] = field(default_factory=dict)
    """Op name -> its checkpoint region (ops that have one)."""
    backward: frozenset[str] = frozenset()
    values: Mapping[tuple[str, int], str] = field(default_factory=dict)
    """(producer, output) -> the value's name, for every output that is read."""
    frame: ProgramFrame | None = None
    """What the programs of every schedule share (``autoshard.program.actions.program_frame``;
    None: made at each :meth:`program`)."""
    _memory: list = field(default_factory=list, compare=False, repr=False)
    """:meth:`memory_program`, once made (the timeline and the allocator replay read its lives)."""

    def program(self, schedule: Schedule, redistributions: Sequence[Any], gathers: Sequence[Any] = ()) -> StepProgram:
        """The step program under ``schedule``; ``redistributions`` and ``gathers``: the plan's
        (what each scheduled collective reads)."""
        output = {(r.tensor, r.to, r.input_index): r.output_index for r in redistributions}

        def value(edge: Sequence[Any]) -> str:
            tensor = edge[0]
            return self.values.get((tensor, output.get(tuple(edge), 0)), tensor)

        reads: dict[tuple, tuple[str, ...]] = {}
        for item in schedule.items:
            if item.edge is not None:
                reads[item.key] = (value(item.edge),)
            elif item.gather is not None:
                reads[item.key] = tuple(value(m) for m in gathers[item.gather].members)
            else:
                reads[item.key] = ()
        return program_of(self.frame or self.make_frame(), schedule, reads)

    def memory_program(self) -> StepProgram:
        """The program whose lifetimes the plan's memory timeline counts (``autoshard.program.memory``):
        the step under no collective. Lives do not depend on the schedule: a collective reads a value
        no later than the op reading its result (a bucket reads results kept anyway), and a value
        is freed after its last read."""
        if not self._memory:
            positions = sum(n.of_tuple is None for n in self.nodes)
            self._memory.append(program_of(self.frame or self.make_frame(), Schedule(positions, 0, ())))
        return self._memory[0]

    def make_frame(self) -> ProgramFrame:
        """The program frame of this dataflow."""
        recompute = {"recompute": self.recompute, "regions": self.regions, "backward": self.backward} \
            if self.recompute else {}
        return program_frame(self.nodes, keep=self.keep, **recompute)


def names_dataflow(names: Sequence[str]) -> StepDataflow:
    """The dataflow of op nodes known by name alone (no reads): enough to price a schedule, which
    reads only the program's issue order.

    >>> len(names_dataflow(["a", "b"]).nodes)
    2
    """
    flow = StepDataflow(tuple(ProgramNode(name, ()) for name in names))
    return replace(flow, frame=flow.make_frame())


def step_dataflow(graph: AssemblyGraph, choice: Sequence[int]) -> StepDataflow:
    """The :class:`StepDataflow` of ``choice`` on ``graph`` (module docstring)."""
    nodes = graph.nodes
    into: dict[int, list[Any]] = {}
    for e in graph.edges:
        into.setdefault(e.dst, []).append(e)
    multi = {i for i, n in enumerate(nodes)
             if n.kind == "op" and len(n.strategies[choice[i]].output_placements) > 1}
    values: dict[tuple[str, int], str] = {}
    accessed: dict[int, set[int]] = {}
    for e in graph.edges:
        if e.src in multi and nodes[e.dst].kind != "memory":
            accessed.setdefault(e.src, set()).add(e.src_output)
            values[(nodes[e.src].name, e.src_output)] = tuple_value(nodes[e.src].name, e.src_output)

    def value(e: Any) -> str:
        return values.get((nodes[e.src].name, e.src_output), nodes[e.src].name)

    program: list[ProgramNode] = []
    keep: set[str] = set()
    tangent_reach: set[str] = {n.name for n in nodes if n.kind == "tangent"}
    backward: set[str] = set()
    for i, n in enumerate(nodes):
        if n.kind in SINK_KINDS:
            keep.update(value(e) for e in into.get(i, ()))
        if n.kind != "op":
            continue
        reads = tuple(dict.fromkeys(value(e) for e in sorted(into.get(i, ()), key=lambda e: e.dst_input)))
        program.append(ProgramNode(n.name, reads))
        outs = [ProgramNode(tuple_value(n.name, k), (n.name,), n.name) for k in sorted(accessed.get(i, ()))]
        program += outs
        if backward or tangent_reach.intersection(reads):
            backward.add(n.name)
            backward.update(p.name for p in outs)
            tangent_reach.add(n.name)
            tangent_reach.update(p.name for p in outs)
    recompute = tuple(n.name for n, k in zip(nodes, choice) if n.kind == "op" and state_of(n, k) == RECOMPUTE)
    regions = {n.name: n.region for n in nodes if n.kind == "op" and n.region is not None}
    flow = StepDataflow(tuple(program), frozenset(keep), recompute, regions, frozenset(backward), values)
    return replace(flow, frame=flow.make_frame())


def memory_program(graph: AssemblyGraph, choice: Sequence[int]) -> StepProgram:
    """The program of ``choice`` whose lives the memory timeline counts (:meth:`StepDataflow.memory_program`).

    >>> # timeline = exact_timeline(graph, problem, choice, copies, buckets, program=memory_program(graph, choice))
    """
    return step_dataflow(graph, choice).memory_program()
