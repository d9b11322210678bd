r"""One rank's training step as one program of typed actions, built once and read by all (torch-free).

The planner prices a step and the runtime runs one; this module is where
that step is written down, so that both read the same object instead of two
derivations of it. A :class:`StepProgram` is a pure function of what the plan
file records (the op order, the schedule, the recomputation and its regions)
and of the graph's dataflow (which values each node reads), built by
:func:`build_step_program`, from the same inputs on both sides: the planner
passes its assembled graph and the solver's choice
(``autoshard.assembly.step_program``) and prices the result, the runtime its fx
graph (``autoshard.runtime.binding``; ``autoshard.runtime.execute`` interprets
the result), each value named as the plan names it (an op by its node, a leaf by
its plan node, output ``k`` of a multi-output op :func:`tuple_value`, its tuple
access placed just after it); nothing here knows torch.

**Nodes.** ``v_0 .. v_{M-1}``: the joint graph's op nodes and tuple accesses
(``getitem`` of a multi-output op) in graph order; the op nodes alone, in
that order, are the plan's nodes, so op node ``v_i`` sits at schedule
position ``pos(i)`` = the number of op nodes before it
(``autoshard.program.schedule``: position ``p`` is just before op ``p``, ``N``
after the last). ``reads(v)``: the values ``v`` reads (leaves included).

**Actions**, in run order (the SPMD order every rank keeps):

* ``Compute(v)``: run ``v`` (first pass). Stream: compute.
* ``Issue(x)`` / ``Wait(x)``: a schedule item's collectives start on the
  communication stream / join the compute stream.
* ``Pack(x)`` / ``Unpack(x)``: a gradient or gather bucket's flat buffer is
  made from its members just before ``Issue(x)`` / split back into the
  members' values just after ``Wait(x)``, on the compute stream (the copies
  ``costmodel.buckets.grouping`` prices as the bucket's ``pack_s`` and
  ``unpack_s``; ``schedule_transfers`` adds them to the op before the issue
  and to the op after the wait). An edge's item has neither.
* ``Recompute(v, region, position)``: run ``v`` again in its region's
  recomputation phase; its redistributed inputs are redistributed again and
  waited at once, recorded at schedule ``position``.
* ``Free(values)``: drop the values after the action before it.

With ``H`` the schedule's leaf views (views of a leaf, made before position
0 so that their gathers can be prefetched) and ``Phase(i)`` the recomputation
phase whose ``t_rc`` is ``v_i`` (if any), the order is

.. math::

   [\,Compute(h) : h \in H\,] \; \Vert \; \mathop{\Vert}_{i=0}^{M-1} \Big(
   Phase(i) \;\Vert\; [Pack(x)?\, Issue(x) : x.issue = pos(i)] \;\Vert\; [Wait(x)\, Unpack(x)? : x.wait = pos(i)]
   \;\Vert\; Compute(v_i) \;\Vert\; Free(D_i) \Big) \;\Vert\; Issue/Wait\ \text{at}\ N

(issues and waits only before op nodes, ``Compute(v_i)`` omitted for
``v_i \in H``; ``Pack``/``Unpack`` only for a bucket's item). ``Phase(i)`` is
``Recompute(u_j) \Vert Free(D_{i,j})`` over the phase's ops ``u_j`` in forward order.

**Recomputation** (the plan's ``recompute``; pricing in
``autoshard.graph.regions``): region R's phase runs once, just before
``t_rc(R)``, the first backward node (program order) that reads a value made
by R's forward; it re-runs R's recomputed ops and their tuple accesses in
forward order. Regions whose backward starts at the same node share a phase.
Checked: every recomputed op is a forward op with a region, its region's
backward reads it, it runs before ``t_rc``, and it reads nothing recomputed
in another region (that value would not exist yet).

**Lifetimes.** Every read is a point ``(i, 0, j)`` (step j of the phase
before ``v_i``), ``(i, 1)`` (a collective issued at ``v_i``'s position reads
it) or ``(i, 2)`` (``v_i`` itself), ordered lexicographically. A value is
freed after its last read (a read at ``(i, 1)`` frees after ``v_i``); the
``keep`` values (the step's results: loss, gradients, buffer updates) never.
A recomputed value has two lives: the first pass, ended by its last read
before its phase, and the recomputed one, from the phase on; a life without
reads ends where it starts. Values an ``H`` view reads are never freed (leaves,
and views that hold no memory). :attr:`StepProgram.lifetimes` lists every life as
``[made, freed]`` action indices.

**Time.** :func:`simulate_program` prices the program: the overlap simulation
(``autoshard.program.schedule.simulate_schedule``) of its ``Issue`` actions in
program order at their positions, each op's compute at its ``Compute``'s, a
``Pack``'s and an ``Unpack``'s copies on the compute stream beside the ops
around them (the bucket's ``pack_s``, ``unpack_s``).

**Memory.** ``autoshard.program.live_bytes.live_bytes_timeline`` replays the actions with a byte size per
storage and gives the bytes held after each action and the peak, counting what
``autoshard.runtime.live_bytes`` counts: the leaves all step, every value from
its making to its free (a view holds its base's storage), at each compute
its inputs and outputs together, and each redistributed copy (``HeldCopy``)
from its ``Wait`` (or its first reader) to its last reader.

>>> from autoshard.program.schedule import Schedule
>>> nodes = [ProgramNode("mm", ("x", "w")), ProgramNode("relu", ("mm",)), ProgramNode("sum", ("relu",))]
>>> p = build_step_program(nodes, Schedule(3, 0, ()), keep={"sum"})
>>> [str(a) for a in p.actions]
['compute mm', 'free x, w', 'compute relu', 'free mm', 'compute sum', 'free relu']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Collection, Mapping, Sequence, Union

from costmodel.overlap import StepSimulation

from autoshard.program.schedule import Schedule, ScheduleItem, simulate_schedule

__all__ = ["ProgramNode", "Compute", "Issue", "Wait", "Pack", "Unpack", "Recompute", "Free", "Action", "RecomputePhase",
           "RecomputeError", "Lifetime", "StepProgram", "ProgramFrame", "program_frame", "build_step_program",
           "program_of", "recompute_phases", "free_points",
           "simulate_program", "tuple_value"]

COMPUTE_STREAM = "compute"
COMM_STREAM = "comm"


def tuple_value(op: str, output: int) -> str:
    """The name of output ``output`` of a multi-output op ``op``: its tuple access, as both the planner
    (``autoshard.assembly.step_program``) and the runtime (``autoshard.runtime.binding``) name it.

    >>> tuple_value("native_layer_norm", 2)
    'native_layer_norm[2]'
    """
    return f"{op}[{output}]"


class RecomputeError(ValueError):
    """The plan's recomputation cannot run on this graph (names the op and why)."""


@dataclass(frozen=True, slots=True)
class ProgramNode:
    """One op node or tuple access of the graph: ``v`` and ``reads(v)`` (module docstring)."""

    name: str
    reads: tuple[str, ...]
    """The values it reads, each once, in argument order (leaves included)."""
    of_tuple: str | None = None
    """A tuple access: the multi-output node it takes an element of (then ``reads`` is that node)."""


@dataclass(frozen=True, slots=True)
class Compute:
    """Run node ``node`` (first pass)."""

    node: str
    stream: ClassVar[str] = COMPUTE_STREAM

    def __str__(self) -> str:
        return f"compute {self.node}"


@dataclass(frozen=True, slots=True)
class Recompute:
    """Run ``node`` again in ``region``'s recomputation phase, its inputs redistributed at ``position``."""

    node: str
    region: str
    position: int
    stream: ClassVar[str] = COMPUTE_STREAM

    def __str__(self) -> str:
        return f"recompute {self.node} ({self.region})"


@dataclass(frozen=True, slots=True)
class Issue:
    """Start a schedule item's collectives (its last one left in flight on the communication stream)."""

    item: ScheduleItem
    stream: ClassVar[str] = COMM_STREAM

    def __str__(self) -> str:
        return f"issue {_item(self.item)}"


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait for a schedule item: its result joins the compute stream."""

    item: ScheduleItem
    stream: ClassVar[str] = COMM_STREAM

    def __str__(self) -> str:
        return f"wait {_item(self.item)}"


@dataclass(frozen=True, slots=True)
class Pack:
    """Copy a bucket's members into its flat buffer (just before its ``Issue``)."""

    item: ScheduleItem
    stream: ClassVar[str] = COMPUTE_STREAM

    def __str__(self) -> str:
        return f"pack {_item(self.item)}"


@dataclass(frozen=True, slots=True)
class Unpack:
    """Split a bucket's waited flat buffer into its members' values (just after its ``Wait``)."""

    item: ScheduleItem
    stream: ClassVar[str] = COMPUTE_STREAM

    def __str__(self) -> str:
        return f"unpack {_item(self.item)}"


@dataclass(frozen=True, slots=True)
class Free:
    """Drop ``values`` (their last read was the action before)."""

    values: tuple[str, ...]
    stream: ClassVar[str] = COMPUTE_STREAM

    def __str__(self) -> str:
        return "free " + ", ".join(self.values)


Action = Union[Compute, Recompute, Issue, Wait, Pack, Unpack, Free]


def _item(item: ScheduleItem) -> str:
    return ":".join(str(k) for k in item.key)


@dataclass(frozen=True, slots=True)
class RecomputePhase:
    """One recomputation phase: the regions whose backward starts at node ``at``."""

    region: str
    """The block's module path (``layers.3``); regions sharing a phase, joined by commas."""
    at: int
    """Node index of ``t_rc``: the phase runs just before that node."""
    position: int
    """The schedule position there."""
    ops: tuple[int, ...]
    """Node indices of the recomputed ops and their tuple accesses, in forward order."""


@dataclass(frozen=True, slots=True)
class Lifetime:
    """One life of a value: made by action ``made`` (-1: before the step, a leaf), freed by ``freed``
    (``len(actions)``: held to the end)."""

    value: str
    made: int
    freed: int
    recomputed: bool


@dataclass(frozen=True, slots=True)
class StepProgram:
    """One rank's training step (module docstring): a frame (:func:`program_frame`) under a
    schedule. Its actions, their positions and the lifetimes are made from these when first read
    (pricing reads only :meth:`issued`, which needs none of them)."""

    frame: "ProgramFrame"
    schedule: Schedule
    item_reads: tuple[tuple[tuple, tuple[str, ...]], ...] = ()
    """(``ScheduleItem.key``, the values its issue reads), for the items that read any."""
    _made: list = field(default_factory=list, compare=False, repr=False)
    _memo: dict = field(default_factory=dict, compare=False, repr=False)
    """What readers derive from this program once and ask for again (``autoshard.program.memory``:
    the storage spans that the timeline and the allocator replay of one plan both count)."""

    @property
    def nodes(self) -> tuple[ProgramNode, ...]:
        return self.frame.nodes

    @property
    def phases(self) -> tuple[RecomputePhase, ...]:
        return self.frame.phases

    @property
    def leaf_views(self) -> frozenset[str]:
        """Nodes computed before position 0 (``Schedule.leaf_views``)."""
        return frozenset(self.schedule.leaf_views)

    @property
    def actions(self) -> tuple[Action, ...]:
        return self._make()[0]

    @property
    def positions(self) -> tuple[int, ...]:
        """The schedule position of each action: ``Issue(x)`` and ``Pack(x)`` at ``x.issue``, ``Wait(x)`` and
        ``Unpack(x)`` at ``x.wait``,
        ``Compute`` of op node ``p`` at ``p`` (a tuple access at the next op's, a leaf view at 0), a phase
        at its ``t_rc``'s, a ``Free`` at its action's: where the overlap simulation prices each
        (``autoshard.program.schedule.schedule_transfers``)."""
        return self._make()[1]

    @property
    def lifetimes(self) -> tuple[Lifetime, ...]:
        return self._make()[2]

    def issued(self) -> list[ScheduleItem]:
        """The schedule items in the order the program issues them (the simulation's ``timings``
        order): the ``Issue`` actions' items, found without making the actions."""
        issues, _ = _by_position(self.schedule)
        return [x for p in sorted(issues) if 0 <= p <= self.schedule.positions for x in issues[p]]

    def frees_after(self) -> dict[str, tuple[str, ...]]:
        """First-pass node -> the values freed right after it (what an evaluation pass, which
        runs the first pass alone, frees)."""
        out: dict[str, tuple[str, ...]] = {}
        for before, action in zip(self.actions, self.actions[1:]):
            if isinstance(action, Free) and isinstance(before, Compute):
                out[before.node] = action.values
        return out

    def _make(self) -> tuple[tuple[Action, ...], tuple[int, ...], tuple[Lifetime, ...]]:
        if not self._made:
            actions, positions = _actions(self.frame, self.schedule, dict(self.item_reads))
            self._made.append((tuple(actions), tuple(positions), _lifetimes(actions)))
        return self._made[0]


def _by_position(schedule: Schedule) -> tuple[dict[int, list[ScheduleItem]], dict[int, list[ScheduleItem]]]:
    """Position -> the items issued there, and those waited there, in schedule order."""
    issues: dict[int, list[ScheduleItem]] = {}
    waits: dict[int, list[ScheduleItem]] = {}
    for item in schedule.items:
        issues.setdefault(item.issue, []).append(item)
        waits.setdefault(item.wait, []).append(item)
    return issues, waits


def recompute_phases(nodes: Sequence[ProgramNode], recompute: Sequence[str], regions: Mapping[str, str],
                     backward: Collection[str]) -> list[RecomputePhase]:
    """The phases of a plan's ``recompute`` (module docstring, Recomputation), in program order.

    ``regions``: op name -> its checkpoint region (``PlanNode.region``); ``backward``: the
    backward's node names.
    """
    index = {n.name: i for i, n in enumerate(nodes)}
    positions, k = [], 0
    for n in nodes:
        positions.append(k)
        k += n.of_tuple is None
    accesses: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        if n.of_tuple is not None:
            accesses.setdefault(n.of_tuple, []).append(i)
    per_region: dict[str, list[int]] = {}
    for name in recompute:
        if name not in index:
            raise RecomputeError(f"recompute: {name} is not an op of the graph")
        region = regions.get(name)
        if region is None:
            raise RecomputeError(f"recompute: {name} has no checkpoint region in the plan")
        if name in backward:
            raise RecomputeError(f"recompute: {name} is a backward op")
        per_region.setdefault(region, []).append(index[name])
        per_region[region].extend(accesses.get(name, ()))  # the tuple accesses run again with it
    wanted = set(recompute)
    tuple_of = {n.name: n.of_tuple for n in nodes if n.of_tuple is not None}
    for name in recompute:  # an input recomputed elsewhere would not exist yet (autoshard.graph.recompute, C3)
        for u in nodes[index[name]].reads:
            src = tuple_of.get(u, u)
            if src in wanted and regions.get(src) != regions.get(name):
                raise RecomputeError(f"recompute: {name} ({regions.get(name)}) reads {src}, recomputed in "
                                     f"another region ({regions.get(src)})")
    first: dict[str, int] = {}
    for i, n in enumerate(nodes):
        if n.name not in backward:
            continue
        for u in n.reads:
            region = regions.get(tuple_of.get(u, u)) if u not in backward else None
            if region in per_region and region not in first:
                first[region] = i
    at_once: dict[int, tuple[list[str], set[int]]] = {}
    for region, ops in per_region.items():
        if region not in first:
            raise RecomputeError(f"recompute: no backward op reads a value of {region}, so nothing recomputes it")
        at = first[region]
        if max(ops) >= at:
            raise RecomputeError(f"recompute: {nodes[max(ops)].name} runs after the backward of {region} starts")
        names, merged = at_once.setdefault(at, ([], set()))
        names.append(region)
        merged.update(ops)
    return [RecomputePhase(",".join(names), at, positions[at], tuple(sorted(ops)))
            for at, (names, ops) in sorted(at_once.items())]


@dataclass(frozen=True, slots=True)
class ProgramFrame:
    """What a step program takes from the graph whatever the schedule: the nodes, the recomputation
    phases, the kept values, and each life's last read by a node (module docstring, Lifetimes).
    Built once by :func:`program_frame`, it gives the program of any schedule (:func:`program_of`)."""

    nodes: tuple[ProgramNode, ...]
    phases: tuple[RecomputePhase, ...]
    keep: frozenset[str]
    last_reads: Mapping[tuple[str, int], tuple[int, ...]]
    """(value, life: 0 first pass, 1 recomputed) -> its last read by a node (or where a life without reads ends)."""
    second_from: Mapping[str, int]
    """Recomputed value -> node index of its phase."""
    index: Mapping[str, int]


def program_frame(nodes: Sequence[ProgramNode], *, recompute: Sequence[str] = (),
                  regions: Mapping[str, str] | None = None, backward: Collection[str] = frozenset(),
                  keep: Collection[str] = frozenset()) -> ProgramFrame:
    """The :class:`ProgramFrame` of ``nodes`` (arguments as :func:`build_step_program`'s)."""
    phases = recompute_phases(nodes, recompute, regions or {}, backward) if recompute else []
    keep = frozenset(keep)
    index = {n.name: i for i, n in enumerate(nodes)}
    second_from: dict[str, int] = {}
    made_again: dict[str, tuple[int, ...]] = {}
    for phase in phases:
        for j, k in enumerate(phase.ops):
            second_from[nodes[k].name] = phase.at
            made_again[nodes[k].name] = (phase.at, 0, j)
    last: dict[tuple[str, int], tuple[int, ...]] = {}
    for i, n in enumerate(nodes):
        for u in n.reads:
            _read(last, keep, second_from, u, (i, 2))
    for phase in phases:
        for j, k in enumerate(phase.ops):
            for u in nodes[k].reads:
                _read(last, keep, second_from, u, (phase.at, 0, j))
    for value, made in made_again.items():  # a life without reads ends where it starts
        if value not in keep:
            last.setdefault((value, 0), (index[value], 2))
            last.setdefault((value, 1), made)
    return ProgramFrame(tuple(nodes), tuple(phases), keep, last, second_from, index)


def _read(last: dict[tuple[str, int], tuple[int, ...]], keep: Collection[str], second_from: Mapping[str, int],
          value: str, point: tuple[int, ...]) -> None:
    if value in keep:
        return
    key = (value, 1 if value in second_from and point[0] >= second_from[value] else 0)
    if key not in last or point > last[key]:
        last[key] = point


def free_points(frame: ProgramFrame, issues: Sequence[tuple[str, int]]) -> dict[tuple[int, ...], list[str]]:
    """Where each value dies (module docstring, Lifetimes): point ``(i, 2)`` or ``(i, 0, j)`` ->
    the values freed after it. ``issues``: (value, node index whose position issues a collective
    reading it)."""
    last = dict(frame.last_reads)
    for value, i in issues:
        _read(last, frame.keep, frame.second_from, value, (i, 1))
    index = frame.index
    out: dict[tuple[int, ...], list[str]] = {}
    for (value, _), point in sorted(last.items(), key=lambda kv: (kv[1], index.get(kv[0][0], -1))):
        out.setdefault((point[0], 2) if point[1] == 1 else point, []).append(value)
    return out


def build_step_program(nodes: Sequence[ProgramNode], schedule: Schedule, *, recompute: Sequence[str] = (),
                       regions: Mapping[str, str] | None = None, backward: Collection[str] = frozenset(),
                       keep: Collection[str] = frozenset(),
                       item_reads: Mapping[tuple, Sequence[str]] | None = None) -> StepProgram:
    """The step program of ``nodes`` under ``schedule`` (module docstring).

    ``recompute``, ``regions``: the plan's ``recompute`` and each op's region; ``backward``: the
    backward's node names (needed with ``recompute``); ``keep``: the step's results;
    ``item_reads``: ``ScheduleItem.key`` -> the values its issue reads (a redistribution's
    producer, a gather bucket's members'), which then live until that issue.

    >>> from autoshard.program.schedule import Schedule, ScheduleItem
    >>> x = ScheduleItem(1, 2, edge=("a", "c", 0))
    >>> nodes = [ProgramNode("a", ("in",)), ProgramNode("b", ("a",)), ProgramNode("c", ("a", "b"))]
    >>> p = build_step_program(nodes, Schedule(3, 0, (x,)), keep={"c"}, item_reads={x.key: ("a",)})
    >>> [str(a) for a in p.actions]
    ['compute a', 'free in', 'issue edge:a:c:0', 'compute b', 'wait edge:a:c:0', 'compute c', 'free a, b']
    """
    frame = program_frame(nodes, recompute=recompute, regions=regions, backward=backward, keep=keep)
    return program_of(frame, schedule, item_reads)


def program_of(frame: ProgramFrame, schedule: Schedule,
               item_reads: Mapping[tuple, Sequence[str]] | None = None) -> StepProgram:
    """:func:`build_step_program` of a frame already built: the programs of several schedules of one
    graph share its work.

    >>> from autoshard.program.schedule import Schedule
    >>> frame = program_frame([ProgramNode("a", ("x",)), ProgramNode("b", ("a",))], keep={"b"})
    >>> [str(a) for a in program_of(frame, Schedule(2, 0, ())).actions]
    ['compute a', 'free x', 'compute b', 'free a']
    """
    n_ops = sum(n.of_tuple is None for n in frame.nodes)
    if schedule.positions != n_ops:
        raise ValueError(f"schedule.positions: {schedule.positions}, the program has {n_ops} op nodes")
    reads = tuple((x.key, tuple(item_reads[x.key])) for x in schedule.items if item_reads and item_reads.get(x.key))
    return StepProgram(frame, schedule, reads)


def _actions(frame: ProgramFrame, schedule: Schedule,
             item_reads: Mapping[tuple, Sequence[str]]) -> tuple[list[Action], list[int]]:
    """The program's actions and their positions (module docstring)."""
    nodes, phases = frame.nodes, frame.phases
    position_of: dict[int, int] = {}  # schedule position -> index of its op node
    for i, n in enumerate(nodes):
        if n.of_tuple is None:
            position_of[len(position_of)] = i
    issues, waits = _by_position(schedule)
    n_ops = len(position_of)
    reads = [(value, position_of[p]) for p, group in issues.items() if 0 <= p < n_ops for x in group
             for value in item_reads.get(x.key, ())]
    frees = free_points(frame, reads)
    hoisted = frozenset(schedule.leaf_views)
    actions: list[Action] = [Compute(n.name) for n in nodes if n.name in hoisted]
    positions = [0] * len(actions)

    def add(action: Action, at: int) -> None:
        actions.append(action)
        positions.append(at)

    def free(point: tuple[int, ...], at: int) -> None:
        if frees.get(point):
            add(Free(tuple(frees[point])), at)

    def collectives(at: int) -> None:
        for x in issues.get(at, ()):
            if x.edge is None:  # a bucket: its flat buffer first
                add(Pack(x), at)
            add(Issue(x), at)
        for x in waits.get(at, ()):
            add(Wait(x), at)
            if x.edge is None:
                add(Unpack(x), at)

    by_at = {ph.at: ph for ph in phases}
    ops_before = 0
    for i, n in enumerate(nodes):
        phase = by_at.get(i)
        if phase is not None:  # before the collectives of t_rc's position
            for j, k in enumerate(phase.ops):
                add(Recompute(nodes[k].name, phase.region, phase.position), phase.position)
                free((i, 0, j), phase.position)
        if n.of_tuple is None:
            collectives(ops_before)
        if n.name not in hoisted:  # a leaf view's reads are leaves or views: nothing to free
            add(Compute(n.name), ops_before)
            free((i, 2), ops_before)
        ops_before += n.of_tuple is None
    collectives(n_ops)
    return actions, positions


def simulate_program(program: StepProgram, op_compute_s: Sequence[float], redistributions: Sequence[Any],
                     buckets: Sequence[Any], *, gathers: Sequence[Any] = (), **options: Any) -> StepSimulation:
    """The program's simulated step (module docstring, Time): the collectives as the program
    issues them; ``options`` as ``simulate_schedule``'s (``tail_s``, ``contention``, ``skew_s``).

    >>> from autoshard.program.schedule import Schedule
    >>> p = build_step_program([ProgramNode("a", ("x",))], Schedule(1, 0, ()))
    >>> simulate_program(p, [2.0], (), ()).step_s
    2.0
    """
    return simulate_schedule(program.schedule, op_compute_s, redistributions, buckets, gathers=gathers,
                             issued=program.issued(), **options)


def _lifetimes(actions: Sequence[Action]) -> tuple[Lifetime, ...]:
    """Every life of every value the actions make or free, in order of making."""
    open_: dict[str, tuple[int, bool]] = {}  # value -> (made, recomputed)
    out: list[Lifetime] = []
    for t, action in enumerate(actions):
        if isinstance(action, (Compute, Recompute)):
            open_[action.node] = (t, isinstance(action, Recompute))
        elif isinstance(action, Free):
            for value in action.values:
                made, again = open_.pop(value, (-1, False))
                out.append(Lifetime(value, made, t, again))
    out += [Lifetime(v, made, len(actions), again) for v, (made, again) in open_.items()]
    return tuple(sorted(out, key=lambda life: (life.made, life.freed, life.value)))
