"""The plan's memory over the step, counted exactly for the chosen placements (torch-free).

**One timeline.** Every tensor an op makes is counted over the lives the step program gives it
(:attr:`autoshard.program.actions.StepProgram.lifetimes`), the program the runtime interprets and
whose replay (``autoshard.program.live_bytes``) the runtime's measured live bytes are checked
against; nothing here re-derives a life from graph positions. A life ``[made, freed]`` (action
indices) is put on the problem's time axis, which the plan's ``memory_timeline`` and the
prefetch intervals use, as ``[tau(made), tau(freed) + 1)``, with ``tau`` the time of the last
``Compute`` or ``Recompute`` at or before the action (:func:`_action_times`). Let ``S`` be an op's
storage (the op's output with its views and tuple accesses, which own no memory) and ``m_S`` its
bytes at the chosen strategy; ``S`` holds ``m_S`` over the union of its aliases' lives. Two
choices make this count agree with the solver's intervals (``autoshard.graph.tied_memory``, C5 of
``autoshard.graph.recompute``), and both follow the runtime:

(a) *A result read by a gradient sink* ends at its last reader ``r`` (``tau(r) + 1``; a life
    without readers where it starts), and the sink node, in the parameter's placement, holds it
    from there to the step's end. The program keeps it to the end; where the sink's bytes
    equal ``m_S`` the two counts are one function of time,
    ``m_S 1[made, r] + m_S 1(r, end] = m_S 1[made, end]`` (the allocator replay makes them one
    tensor: ``autoshard.program.reservation``), and where they differ the tensor the optimizer
    reads to the end is the reduced one, the sink's; the unreduced one is the bucket's
    ``partial`` term until its issue. The loss and buffer updates are held to the end.
(b) *A recomputation phase* is one schedule position in the program but a sequence of
    actions, and the runtime frees a phase's temporaries between them, so each ``Recompute`` of
    op ``v`` of region ``R`` gets its own time, the slot
    ``s_v = t_rc(R) - |R| + j_v`` (``j_v``: ``v``'s index among ``R``'s forward ops, ``|R|``
    their number, ``t_rc(R)`` the time of the phase's position: the slots
    ``autoshard.graph.regions`` inserts); a ``Free`` in the phase ends a life at the slot of
    the ``Recompute`` before it. One time for the whole phase would hold every temporary of
    the phase at once, more than the runtime ever holds.

With (a) and (b) every op storage lives, on the time axis, exactly where the solver's pieces
put it, except where the solver over-estimates (a ``HOLD`` value kept to ``L_v``, the last slot of
a reader that may be recomputed): at every time ``m_plan(S, t) <= m_solver(S, t)``, and the
plan's level without the gradient buckets' terms is at most the solver's, whose interval bound
is thus an upper bound of the program's timeline (checked on the zoo:
``tests/autoshard/assembly/test_program_lifetimes.py``). The buckets' partial and payload terms
below are counted past the solver's bound nodes (ViT tiny on 2x2: 673,532 B against 672,124 B).

Beside the op storages the timeline counts:

- every other problem node (leaves all step, sinks) at its chosen strategy over its
  interval, except the ``memory`` nodes (the solver's ``bound`` copies and the ``piece`` nodes
  the lives above replace);
- a copy at the reader's placement for every edge whose chosen placements
  really differ, over the intervals the builder computed with
  ``autoshard.graph.copies.copy_intervals`` (those of a recomputed reader
  when the reader is recomputed);
- per gradient bucket, each member's partial gradient from its making until
  the bucket's last member is made (the bucket issues then), and the
  concatenated payload at that time.

The same function with every state set to keep, and the program of that choice, gives the peak
without recomputation (what the plan's recomputation saves).

>>> timeline_peak(((0, 5.0), (3, 9.0), (4, 2.0)))
9.0
"""

from __future__ import annotations

import bisect

from typing import Any, Container, Mapping, Sequence

from costmodel.buckets.grouping import Bucket
from costmodel.shard_shapes import max_local_numel

from autoshard.graph.copies import fsdp2_payload_ends, fsdp2_reduction
from autoshard.program.actions import Compute, Recompute, StepProgram

__all__ = ["CopyEvent", "Span", "exact_spans", "exact_timeline", "param_view_roots", "timeline_peak",
           "peak_with_extra", "storage_spans"]

CopyEvent = tuple[int, "tuple[Placement, ...]", bool]
"""(edge index, reader placement, reader recomputed) of a redistribution that happens."""


Span = tuple["int | None", "int | None", float, tuple, str]
"""(start, end, bytes, tensor key, kind) of one term of the timeline: ``start`` None: held all
step; a negative term removes bytes from the earlier term of the same key (a gradient's sink
before its FSDP2 reduction). Kinds: a graph node's kind, ``copy``, ``partial``, ``payload``."""


def exact_timeline(graph: Any, problem: Any, choice: Sequence[int], copies: Sequence[CopyEvent],
                   buckets: Sequence[Bucket], *, program: StepProgram, recomputed: bool = True,
                   param_views: Mapping[int, int] | None = None,
                   fsdp2_reductions: bool = False) -> tuple[tuple[int, float], ...]:
    """(time, bytes live) at every change (module docstring); ``graph`` is an
    ``AssemblyGraph``; ``program`` the step program of ``choice`` (its lives give every op
    storage's: ``autoshard.assembly.step_program.memory_program``); ``recomputed=False`` counts copies as if no reader were recomputed;
    ``param_views`` (node -> the parameter node its view chain starts at, :func:`param_view_roots`):
    copies of one parameter over the same interval are one copy, the largest (FSDP2 gathers a
    unit's parameter once per pass, and the views its readers read alias it); ``fsdp2_reductions``:
    buckets reduce as FSDP2 does (measured with ``FSDPMemTracker``): a unit's reduction starts a
    step after its last gradient, once the unit's gathered parameters are freed (its post-backward
    reshards, then copies the gradients into the reduce-scatter input); the payload lives until the
    next unit's reduction starts (FSDP2 keeps a unit's reduce-scatter input until then); a member's
    reduced gradient (its sink) exists from the reduction on, not while it waits. (autoshard's runtime
    makes its reduced gradients at the issue too; its count keeps the sink from the gradient's making,
    an over-count of at most a bucket's sinks.)"""
    always = 0.0
    events: dict[int, float] = {}
    for start, end, amount, _, _ in exact_spans(graph, problem, choice, copies, buckets, program=program,
                                                recomputed=recomputed,
                                                param_views=param_views, fsdp2_reductions=fsdp2_reductions):
        if start is None:
            always += amount
        elif amount and start < end:
            events[start] = events.get(start, 0.0) + amount
            events[end] = events.get(end, 0.0) - amount
    out, level = [], always
    for t in sorted(events):
        level += events[t]
        out.append((t, level))
    return tuple(out) or ((0, always),)


def exact_spans(graph: Any, problem: Any, choice: Sequence[int], copies: Sequence[CopyEvent],
                buckets: Sequence[Bucket], *, program: StepProgram, recomputed: bool = True,
                param_views: Mapping[int, int] | None = None, fsdp2_reductions: bool = False) -> list[Span]:
    """The terms :func:`exact_timeline` sums, one per tensor (and its adjustments), in its order."""
    out: list[Span] = []

    def add(start: int, end: int, amount: float, key: tuple, kind: str) -> None:
        if amount and start < end:
            out.append((start, end, amount, key, kind))

    lives = storage_spans(graph, problem, choice, program)
    for i, (node, pnode, k) in enumerate(zip(graph.nodes, problem.nodes, choice)):
        if node.kind == "op":  # its storage, over the program's lives of it
            out.extend(lives.get(i, ()))
            continue
        if node.kind == "memory":  # the solver's bounds and pieces: the lives above count exactly
            continue
        m = float(pnode.memory_bytes[k])
        if pnode.live is None:
            out.append((None, None, m, ("node", i), node.kind))
        else:
            add(pnode.live[0], pnode.live[1], m, ("node", i), node.kind)
    mesh = graph.mesh.shape
    shared: dict[tuple[int, int, int], float] = {}
    for j, placement, reader_recomputed in copies:
        e = graph.edges[j]
        live = e.copy_live_recomputed if (reader_recomputed and recomputed and e.copy_live_recomputed) else e.copy_live
        if not live:
            continue
        nbytes = float(max_local_numel(e.shape, placement, mesh) * e.itemsize)
        root = param_views.get(e.src) if param_views else None
        for start, end in live:
            if root is None:
                add(start, end, nbytes, ("copy", j, start), "copy")
            else:
                shared[(root, start, end)] = max(shared.get((root, start, end), 0.0), nbytes)
    for (root, start, end), nbytes in shared.items():
        add(start, end, nbytes, ("copy", -1 - root, start), "copy")
    sink_edge = {graph.nodes[e.dst].name: j for j, e in enumerate(graph.edges) if graph.nodes[e.dst].kind == "grad"}
    index = {n.name: i for i, n in enumerate(graph.nodes)}
    issued = []
    spans = _param_copy_spans(graph, param_views or {}) if fsdp2_reductions and buckets else {}
    for b, bucket in enumerate(buckets):
        made = []
        for member in bucket.members:
            j = sink_edge[member]
            e = graph.edges[j]
            src = graph.nodes[e.src].strategies[choice[e.src]].output_placements[e.src_output]
            t = problem.nodes[index[member]].live[0] - 1  # the sink holds the gradient from the next time
            made.append((t, float(max_local_numel(e.shape, src, mesh) * e.itemsize)))
        issue = max(t for t, _ in made)
        if fsdp2_reductions:  # once the unit's backward is done and its gathered parameters are freed
            issue = _unit_backward_end(spans, bucket.members, issue)
        for member, (t, nbytes) in zip(bucket.members, made):
            add(t + 1, issue + 1, nbytes, ("partial", member), "partial")  # waits, partial, until the last member
            if fsdp2_reductions:  # the reduced (sharded) gradient is made by the reduction
                i = index[member]
                add(t + 1, issue + 1, -float(problem.nodes[i].memory_bytes[choice[i]]), ("node", i), "grad")
        issued.append((issue, float(bucket.bytes), b))
    issued.sort()
    # FSDP2 frees a unit's reduce-scatter input when the next unit's reduction starts
    payload_end = fsdp2_payload_ends(t for t, _, _ in issued) if fsdp2_reductions else {}
    for issue, nbytes, b in issued:  # the concatenated payload
        add(issue, payload_end.get(issue, issue + 1), nbytes, ("payload", b), "payload")
    return out


def _op_times(graph: Any, problem: Any) -> tuple[int, ...]:
    """The time of each schedule position on the problem's time axis: the op nodes' times in graph
    order, then the step's end (the optimizer update), ``N + 1`` entries."""
    times = [problem.nodes[i].live[0] if problem.nodes[i].live is not None else 0
             for i, n in enumerate(graph.nodes) if n.kind == "op"]
    ends = [n.live[1] - 1 for n in problem.nodes if n.live is not None and n.live[1] > n.live[0]]
    return (*times, max([t + 1 for t in times] + ends, default=0))


def _action_times(graph: Any, program: StepProgram, times: Sequence[int]) -> list[int]:
    """``tau``: the time of each action of ``program`` (module docstring): an op's ``Compute`` its
    position's; a tuple access's (placed at the next op's position) the time just before that
    op's, where the joint graph runs its tuple accesses, right after their op; a ``Recompute``
    its op's slot (b); any other action that of the last of these before it (0 before the first)."""
    index = {n.name: i for i, n in enumerate(graph.nodes)}
    in_region: dict[str, list[tuple[int, str]]] = {}
    for i, n in enumerate(graph.nodes if program.phases else ()):
        if n.kind == "op" and n.region is not None:
            in_region.setdefault(n.region, []).append((i, n.name))
    slot: dict[str, int] = {}
    for phase in program.phases:
        at = index[program.nodes[phase.at].name]
        for region in phase.region.split(","):
            members = [name for i, name in in_region.get(region, ()) if i < at]  # R's forward ops
            slot.update((m, times[phase.position] - len(members) + j) for j, m in enumerate(members))
    of_tuple = {n.name: n.of_tuple for n in program.nodes if n.of_tuple is not None}
    out, now = [], 0
    for action, position in zip(program.actions, program.positions):
        if isinstance(action, Compute):
            now = times[position] if action.node not in of_tuple else max(now, times[position] - 1)
        elif isinstance(action, Recompute):
            now = slot[of_tuple.get(action.node, action.node)]
        out.append(now)
    return out


def storage_spans(graph: Any, problem: Any, choice: Sequence[int], program: StepProgram) -> dict[int, list[Span]]:
    """Op node -> the spans of its storage (module docstring): one per life of its own value or
    of an alias of it, cut as (a) says, on the problem's time axis; an op the builder gives no
    bytes at any strategy owns no storage (a view: ``autoshard.graph.liveness``; a zero-size
    tensor counted with its input errs high) and its lives extend those of the storage it reads first.

    >>> # lives = storage_spans(graph, problem, choice, memory_program(graph, choice))  # assembly.step_program
    """
    cached = program._memo.get("storage_spans")
    key = (graph, problem, tuple(choice))
    if cached is not None and cached[0][0] is graph and cached[0][1] is problem and cached[0][2] == key[2]:
        return cached[1]  # the plan's timeline and its allocator replay both ask (read only)
    spans = _storage_spans(graph, problem, choice, program)
    program._memo["storage_spans"] = (key, spans)
    return spans


def _storage_spans(graph: Any, problem: Any, choice: Sequence[int], program: StepProgram) -> dict[int, list[Span]]:
    nodes = graph.nodes
    index = {n.name: i for i, n in enumerate(nodes)}
    first_input = {e.dst: e.src for e in graph.edges if e.dst_input == 0}
    root: dict[str, int] = {}
    for n in program.nodes:
        i = index.get(n.of_tuple if n.of_tuple is not None else n.name)
        if i is not None and n.of_tuple is None and i in first_input and not problem.nodes[i].memory_bytes[choice[i]] \
                and not any(problem.nodes[i].memory_bytes):
            i = root.get(nodes[first_input[i]].name, first_input[i])
        root[n.name] = i
    to_grad: set[int] = set()
    held: set[int] = set()
    for e in graph.edges:
        kind = nodes[e.dst].kind
        if kind == "grad" or kind == "loss" or kind == "buffer_update":
            (to_grad if kind == "grad" else held).add(root.get(nodes[e.src].name, e.src))
    times = _op_times(graph, problem)
    tau = _action_times(graph, program, times)
    actions = program.actions
    last_read: dict[str, int] = {}
    for t, action in enumerate(actions):
        if isinstance(action, (Compute, Recompute)):
            for value in program.nodes[program.frame.index[action.node]].reads:
                last_read[value] = t
    end = times[-1] + 1
    out: dict[int, list[Span]] = {}
    for life in program.lifetimes:
        i = root.get(life.value)
        if i is None or life.made < 0 or nodes[i].kind != "op":
            continue
        if life.freed < len(actions):
            stop = tau[life.freed] + 1
        elif i in to_grad and i not in held:  # (a): the sink holds it on
            stop = tau[max(life.made, last_read.get(life.value, life.made))] + 1
        else:
            stop = end
        out.setdefault(i, []).append((tau[life.made], stop, life.recomputed))
    return {i: _union(i, spans, float(problem.nodes[i].memory_bytes[choice[i]])) for i, spans in out.items()}


def _union(i: int, lives: Sequence[tuple[int, int, bool]], nbytes: float) -> list[Span]:
    """A storage's first life and its recomputed one, each the union of its aliases' lives (an
    alias is made after its base and read no later than the storage lives: they overlap)."""
    out: list[Span] = []
    for again in (False, True):
        mine = [(s, e) for s, e, r in lives if r == again]
        if mine and nbytes:
            start, stop = min(s for s, _ in mine), max(e for _, e in mine)
            if start < stop:
                out.append((start, stop, nbytes, ("node", i), "op"))
    return out


def _param_copy_spans(graph: Any, roots: Mapping[int, int]) -> dict[str, list[tuple[int, int]]]:
    """``grad:<fqn>`` -> the copy intervals of its parameter (and of the parameter's views)."""
    spans: dict[int, list[tuple[int, int]]] = {}
    for e in graph.edges:
        if e.src in roots and e.copy_live:
            spans.setdefault(roots[e.src], []).extend(e.copy_live)
    return {f"grad:{graph.nodes[i].target}": v for i, v in spans.items()}


def _unit_backward_end(spans: Mapping[str, Sequence[tuple[int, int]]], members: Sequence[str], last: int) -> int:
    """When FSDP2 reduces a unit whose last gradient is made at ``last``: after the unit's
    backward, which its parameters' gathered copies span (``autoshard.graph.copies.fsdp2_interval``:
    the end of the copy interval open at ``last``), and at least a step after ``last``."""
    return fsdp2_reduction(last, max([0, *(end for m in members for start, end in spans.get(m, ()) if start <= last < end)]))


def param_view_roots(graph: Any, view_ops: Container[str]) -> dict[int, int]:
    """Node -> the parameter node it is, or whose view (a chain of ``view_ops`` of one
    input each) it is; the nodes of ``graph`` (an ``AssemblyGraph``) in graph order."""
    reads: dict[int, list[int]] = {}
    for e in graph.edges:
        reads.setdefault(e.dst, []).append(e.src)
    roots: dict[int, int] = {}
    for i, node in enumerate(graph.nodes):
        if node.kind == "param":
            roots[i] = i
        elif node.kind == "op" and node.target in view_ops and len(reads.get(i, ())) == 1 and reads[i][0] in roots:
            roots[i] = roots[reads[i][0]]
    return roots


def timeline_peak(timeline: Sequence[tuple[int, float]]) -> float:
    """The highest level of a timeline."""
    return max(level for _, level in timeline)


def peak_with_extra(timeline: Sequence[tuple[int, float]], extra: Sequence[tuple[int, int, float]]) -> float:
    """Peak of ``timeline`` (a step function: ``(t, level)`` from t on, its first level before
    its first time) plus ``extra`` bytes (>= 0) over ``[start, end)`` time intervals.

    Only the points inside some interval can top the timeline's own peak, and of those only the
    interval starts and the timeline's changes: at any other point inside, the last of these
    before it has the same level and every interval open there (floats of one sign add up
    monotonically), so the maximum is the one over all points, to the last bit. There the
    intervals open are summed in their order in ``extra`` (8B on 8x8: 110 calls of a scan of
    every interval at every timeline point took 15 s)."""
    times = [t for t, _ in timeline]
    levels = [level for _, level in timeline]
    peak = max(0.0, max(levels, default=0.0))
    live = [i for i, (s, e, _) in enumerate(extra) if s < e]
    if not live:
        return peak
    points = {extra[i][0] for i in live}
    for i in live:
        s, e, _ = extra[i]
        points.update(times[bisect.bisect_left(times, s):bisect.bisect_left(times, e)])
    by_start = sorted(live, key=lambda i: extra[i][0])
    opened, active = 0, []  # indices into extra, ascending
    for t in sorted(points):
        k = bisect.bisect_right(times, t) - 1
        level = levels[max(k, 0)] if levels else 0.0
        while opened < len(by_start) and extra[by_start[opened]][0] <= t:
            bisect.insort(active, by_start[opened])
            opened += 1
        active = [i for i in active if t < extra[i][1]]
        peak = max(peak, level + sum(extra[i][2] for i in active))
    return peak