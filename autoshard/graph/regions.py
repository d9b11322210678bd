r"""Checkpoint regions of a joint graph, and which forward values may be recomputed.

A *region* is the forward of one repeated block (a transformer layer): the
forward ops whose module path (``TracedGraph.module_paths``, recorded while
tracing) lies in one of ``TracedGraph.blocks``. ``torch.utils.checkpoint``
wraps the same unit. A model without repeated blocks has no region, and no
recomputation is offered for it.

Time is the joint graph's order (``autoshard.graph.liveness``). The backward
is every node that depends on the loss tangent or that the export tagged as
backward; the forward is the rest.
For a region R:

- ``t_rc(R)``: the time of the first backward op that reads a value made by
  R's forward. R's recomputation runs just before it (as a non-reentrant
  checkpoint's does, when the first saved tensor is unpacked).
- A storage (an op's output with its views, ``liveness.owner``) is *saved*
  when a backward op reads it; ``F`` is the time of its last forward reader
  (its own time when none), ``B`` that of its last backward reader.
- A *region output* is a storage of R read by a forward op outside R, or
  returned by the step: it is always kept, as a checkpoint keeps its inputs.
- *Candidates*: saved storages of R made by a replayable op (deterministic,
  or dropout, replayed from the same random state) without side effects, that
  are not region outputs.
- The *closure* of R: candidates, every op of R a candidate depends on
  through R's forward, and the views of closure members. Only closure members
  get recomputation states.

States of a closure member (``KEEP``, ``HOLD``, ``RECOMPUTE``):

    saved, replayable                         {KEEP, RECOMPUTE}
    forward-only, replayable                  {KEEP, HOLD, RECOMPUTE}
    not replayable or a region output         {KEEP} if saved, {KEEP, HOLD} if not
    view of a closure member                  its base's set (and the same state)
    view of a value outside R                 {KEEP, RECOMPUTE} if that value exists at t_rc(R), else {KEEP}

**The recomputation phase.** The time axis gets, just before ``t_rc(R)``,
one slot per forward op of R, in forward order (every later time moves by
the number of slots inserted before it; :attr:`RegionAnalysis.liveness` is
the joint graph's liveness on that axis). A recomputed op v runs at its slot
``s_v``; a recomputed forward-only value lives until the slot of its last
reader in R's closure ``L_v`` (a reader that may be recomputed: exact when
it is, an over-estimate within the phase when it is kept). This is how the
recomputation frees its temporaries as it goes.

``HOLD`` keeps a forward-only storage until the recomputation has read it
(``L_v``) so that a recomputed reader finds it; a saved storage kept as ``KEEP`` exists then anyway.
``HOLD`` is dropped from members that no recomputable member of R reads, and
a member left with ``{KEEP}`` is not doubled. Availability at ``t_rc(R)`` of
an input x of a recomputed op (:meth:`RegionAnalysis.available`): a leaf
always; a closure member of R when RECOMPUTE or HOLD, or KEEP and saved; any
other value when its storage's live interval covers ``t_rc(R)``.

>>> from examples.models import llama3
>>> from autoshard.trace import trace_joint
>>> from autoshard.graph.liveness import compute_liveness
>>> traced = trace_joint(*llama3.tiny(device="meta"))
>>> rs = analyse_regions(traced, compute_liveness(traced.graph_module))
>>> [r.name for r in rs.regions], rs.regions[0].recompute_time > rs.regions[1].recompute_time
(['layers.0', 'layers.1'], True)
"""

from __future__ import annotations

import bisect
import operator
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import torch
import torch.fx as fx
from torch._ops import OpOverload

from autoshard.graph.liveness import Liveness, is_view_op
from autoshard.graph.states import HOLD, KEEP, RECOMPUTE, STATE_NAMES

__all__ = ["KEEP", "HOLD", "RECOMPUTE", "STATE_NAMES", "Region", "Member", "RegionAnalysis", "analyse_regions",
           "replay_problem", "backward_nodes", "check_recompute"]


_DROPOUT = frozenset({torch.ops.aten.native_dropout.default})


@dataclass(frozen=True, slots=True)
class Region:
    """The forward of one repeated block."""

    name: str
    """The block's module path (``layers.3``)."""
    index: int
    """Position among the regions (model order)."""
    members: tuple[str, ...]
    """fx names of its forward ops (tuple access excluded), in graph order."""
    recompute_time: int
    """``t_rc``: the time of the first backward op reading one of its values."""
    phase_start: int = 0
    """The first slot of its recomputation phase (``t_rc`` minus one slot per member)."""


@dataclass(frozen=True, slots=True)
class Member:
    """One closure member: what the graph builder needs to give it states."""

    region: int
    states: tuple[int, ...]
    """Allowed states, ascending (``KEEP`` first)."""
    follows: str | None
    """The closure member this view takes its state from (None: its own)."""
    saved: bool
    """Its storage is read by the backward."""
    forward_end: int
    """``F``: last forward reader of its storage (its own time when none)."""
    backward_end: int | None
    """``B``: last backward reader of its storage (None: forward-only)."""
    slot: int = 0
    """``s_v``: when it runs again in its region's recomputation phase."""
    last_slot: int = 0
    """``L_v``: the slot of the last closure member of its region reading its storage (``s_v`` when none)."""


@dataclass(frozen=True, slots=True)
class RegionAnalysis:
    """Regions, closure members and availability (module docstring)."""

    regions: tuple[Region, ...]
    members: Mapping[str, Member]
    """fx name -> closure member with at least two states."""
    region_of: Mapping[str, int]
    """fx name -> region, for every forward op of a region."""
    not_replayable: Mapping[str, str] = field(default_factory=dict)
    """fx name -> why a region op cannot be recomputed (random, side effects, region output)."""
    liveness: Liveness | None = None
    """The joint graph's liveness on the time axis with the recomputation phases."""
    _is_leaf: frozenset[str] = frozenset()
    _saved: frozenset[str] = frozenset()

    def available(self, name: str, state: int, region: int) -> bool:
        """Whether the value of fx node ``name`` in ``state`` exists during the
        recomputation phase of ``region`` (a recomputed value made earlier in it counts)."""
        live = self.liveness
        owner = live.owner[name]
        if owner in self._is_leaf:
            return True
        r = self.regions[region]
        member = self.members.get(name)
        if member is not None:
            if state == RECOMPUTE:
                return member.region == region
            if state == HOLD:
                return member.region == region or live.time[owner] <= r.phase_start <= member.last_slot
        start, end = live.intervals[owner]
        return start <= r.phase_start and r.recompute_time <= end


def replay_problem(node: fx.Node) -> str | None:
    """Why the op at ``node`` cannot be replayed (None: it can): a random op
    other than dropout, an op that mutates an argument, or no ATen op."""
    target = node.target
    if target is operator.getitem:
        return None
    if not isinstance(target, OpOverload):
        return f"{target} is not an ATen op"
    if target in _DROPOUT or any(a.name == "dropout_p" for a in target._schema.arguments):
        return None  # dropout-like: replayed from the same random state
    if torch.Tag.nondeterministic_seeded in target.tags:
        return f"{target} draws random numbers (only dropout is replayed)"
    if any(a.alias_info is not None and a.alias_info.is_write for a in target._schema.arguments):
        return f"{target} writes one of its arguments"
    return None


def backward_nodes(graph: fx.Graph, tangent: fx.Node) -> set[fx.Node]:
    """The backward: every node that depends on the loss tangent, or that the
    joint export tagged as backward (ops of a backward formula that read only
    forward values, such as a weight's transpose for the input gradient)."""
    out = {tangent}
    for node in graph.nodes:
        if node.op == "call_function" and (node.meta.get("partitioner_tag") == "is_backward"
                                           or any(u in out for u in node.all_input_nodes)):
            out.add(node)
    return out


def _region_index(path: str | None, blocks: tuple[str, ...]) -> int | None:
    if path is None:
        return None
    for i, block in enumerate(blocks):
        if path == block or path.startswith(block + "."):
            return i
    return None


def analyse_regions(traced: object, liveness: Liveness) -> RegionAnalysis:
    """The regions of ``traced`` (a :class:`autoshard.trace.TracedGraph`) and
    their closure members (module docstring)."""
    blocks = tuple(getattr(traced, "blocks", ()) or ())
    paths = getattr(traced, "module_paths", {}) or {}
    graph = traced.graph_module.graph  # type: ignore[attr-defined]
    if not blocks:
        return RegionAnalysis((), {}, {}, {}, liveness)
    backward = backward_nodes(graph, traced.tangent)  # type: ignore[attr-defined]
    nodes = [n for n in graph.nodes if n.op in ("placeholder", "call_function")]
    owner = liveness.owner
    leaves = frozenset(n.name for n in nodes if n.op == "placeholder")
    outputs = frozenset(owner[n.name] for n in graph.find_nodes(op="output")[0].all_input_nodes if n.name in owner)
    region_of = _forward_region_of(nodes, backward, paths, blocks)
    reads = _storage_reads(nodes, backward, liveness, region_of)
    regions, region_of = _regions_read_by_the_backward(blocks, nodes, region_of, reads.first_read)
    steps = _Steps(by_name={n.name: n for n in nodes}, liveness=liveness, leaves=leaves, outputs=outputs,
                   reads=reads, saved=frozenset(reads.backward_end))
    members: dict[str, Member] = {}
    outside: dict[str, set[int]] = {}  # value made outside a region -> regions whose recomputation reads it
    for region in regions:
        states, follows = _closure_states(steps, region)
        _drop_unneeded_holds(steps, states)
        for name, s in states.items():  # a view keeps exactly its base's set
            if follows[name] is not None:
                states[name] = states[follows[name]]
        members.update(_members_with_choices(steps, region.index, states, follows))
        _note_inputs_gone_before_recompute(steps, region, states, outside)
    _hold_outside(outside, members, region_of, steps.by_name, owner, steps.saved, reads.forward_end,
                  reads.backward_end, liveness.time)
    return _with_phases(tuple(regions), members, region_of, steps.not_replayable, liveness, leaves, steps.saved,
                        steps.by_name)


@dataclass(frozen=True, slots=True)
class _StorageReads:
    """Who reads each storage (keyed by its owner's fx name), from the joint graph's order."""

    forward_end: dict[str, int]
    """``F``: time of the last forward reader."""
    backward_end: dict[str, int]
    """``B``: time of the last backward reader (storages the backward reads only)."""
    read_outside: set[str]
    """Storages read by a forward op of another region (or of none)."""
    first_read: dict[int, int]
    """Region (block index) -> time of the first backward op reading one of its values (``t_rc``)."""


@dataclass(frozen=True, slots=True)
class _Steps:
    """What the per-region steps of :func:`analyse_regions` read; ``not_replayable`` they fill."""

    by_name: Mapping[str, fx.Node]
    liveness: Liveness
    leaves: frozenset[str]
    outputs: frozenset[str]
    """Storages the joint graph returns."""
    reads: _StorageReads
    saved: frozenset[str]
    """Storages the backward reads."""
    not_replayable: dict[str, str] = field(default_factory=dict)


def _forward_region_of(nodes: list[fx.Node], backward: set[fx.Node], paths: Mapping[str, str],
                       blocks: tuple[str, ...]) -> dict[str, int]:
    """fx name -> block index of every forward op inside a block (tuple access goes with its producer)."""
    region_of: dict[str, int] = {}
    for n in nodes:
        if n.op == "call_function" and n not in backward:
            r = _region_index(paths.get(n.name), blocks)
            if r is None and n.target is operator.getitem and n.args[0].name in region_of:
                r = region_of[n.args[0].name]
            if r is not None:
                region_of[n.name] = r
    return region_of


def _storage_reads(nodes: list[fx.Node], backward: set[fx.Node], liveness: Liveness,
                   region_of: Mapping[str, int]) -> _StorageReads:
    """The last forward and backward reader of every storage, the storages read across a
    region boundary, and each region's first backward reader."""
    time, owner = liveness.time, liveness.owner
    reads = _StorageReads({}, {}, set(), {})
    for n in nodes:
        t = time[n.name]
        for u in n.all_input_nodes:
            if u.name not in owner:
                continue
            root = owner[u.name]
            if n in backward:
                reads.backward_end[root] = max(reads.backward_end.get(root, t), t)
                r = region_of.get(u.name)
                if r is not None:
                    reads.first_read[r] = min(reads.first_read.get(r, t), t)
            else:
                reads.forward_end[root] = max(reads.forward_end.get(root, t), t)
                if region_of.get(n.name) != region_of.get(root):
                    reads.read_outside.add(root)
    return reads


def _regions_read_by_the_backward(blocks: tuple[str, ...], nodes: list[fx.Node], region_of: Mapping[str, int],
                                  first_read: Mapping[int, int]) -> tuple[list[Region], dict[str, int]]:
    """The regions, renumbered, of the blocks with forward ops that a backward op reads
    (the others are dropped), and ``region_of`` on the new numbers."""
    regions = []
    for i, block in enumerate(blocks):
        members = tuple(n.name for n in nodes if region_of.get(n.name) == i and n.target is not operator.getitem)
        if members and i in first_read:
            regions.append(Region(block, i, members, first_read[i]))
    by_block = {r.index: k for k, r in enumerate(regions)}
    regions = [Region(r.name, k, r.members, r.recompute_time) for k, r in enumerate(regions)]
    return regions, {name: by_block[r] for name, r in region_of.items() if r in by_block}


def _why_not_replayed(steps: _Steps, name: str) -> str | None:
    """Why a region op cannot be recomputed: its own op (:func:`replay_problem`), or it is a region output."""
    why = replay_problem(steps.by_name[name])
    if why is None and (name in steps.reads.read_outside or name in steps.outputs):
        why = "a region output (kept, as a checkpoint keeps its inputs)"
    return why


def _closure(steps: _Steps, region: Region) -> set[str]:
    """The region's closure: its replayable storages that the backward reads, their
    ancestors within the region's forward, and the views of those."""
    owner, inside = steps.liveness.owner, set(region.members)
    candidates = []
    for name in region.members:
        if owner[name] != name or name not in steps.saved:
            continue
        why = _why_not_replayed(steps, name)
        if why is not None:
            steps.not_replayable[name] = why
            continue
        candidates.append(name)
    closure: set[str] = set()
    stack = list(candidates)
    while stack:
        name = stack.pop()
        if name in closure:
            continue
        closure.add(name)
        for u in steps.by_name[name].all_input_nodes:
            src = u.args[0].name if u.target is operator.getitem else u.name
            if src in inside:
                stack.append(src)
    for name in region.members:  # views of closure members follow them
        node = steps.by_name[name]
        if is_view_op(node.target) and node.args and isinstance(node.args[0], fx.Node):
            if _base(node) in closure:
                closure.add(name)
    return closure


def _closure_states(steps: _Steps, region: Region) -> tuple[dict[str, tuple[int, ...]], dict[str, str | None]]:
    """Each closure member's allowed states, and the closure member a view follows (None: its own)."""
    closure = _closure(steps, region)
    states: dict[str, tuple[int, ...]] = {}
    follows: dict[str, str | None] = {}
    for name in region.members:  # graph order: a view's base comes first
        if name not in closure:
            continue
        node = steps.by_name[name]
        base = _base(node) if is_view_op(node.target) and node.args and isinstance(node.args[0], fx.Node) else None
        if base is not None and base in closure:
            states[name], follows[name] = states.get(base, (KEEP,)), base
            continue
        follows[name] = None
        if base is not None:  # a view of a leaf or of a value made outside the region
            states[name] = (KEEP, RECOMPUTE)
            continue
        why = _why_not_replayed(steps, name)
        if why is not None:
            steps.not_replayable.setdefault(name, why)
        is_saved = name in steps.saved
        if why is None:
            states[name] = (KEEP, RECOMPUTE) if is_saved else (KEEP, HOLD, RECOMPUTE)
        else:
            states[name] = (KEEP,) if is_saved else (KEEP, HOLD)
    return states, follows


def _drop_unneeded_holds(steps: _Steps, states: dict[str, tuple[int, ...]]) -> None:
    """``HOLD`` only serves a recomputable reader inside the region: drop it elsewhere."""
    owner = steps.liveness.owner
    needed = {owner[u.name] for name, s in states.items() if RECOMPUTE in s
              for u in steps.by_name[name].all_input_nodes}
    for name, s in list(states.items()):
        if HOLD in s and owner[name] not in needed:
            states[name] = tuple(x for x in s if x != HOLD)


def _members_with_choices(steps: _Steps, region: int, states: Mapping[str, tuple[int, ...]],
                          follows: Mapping[str, str | None]) -> dict[str, Member]:
    """The closure members with at least two states."""
    owner, time, reads = steps.liveness.owner, steps.liveness.time, steps.reads
    members = {}
    for name, s in states.items():
        if len(s) < 2:
            continue
        root = owner[name]
        members[name] = Member(
            region=region, states=s, follows=follows[name], saved=root in steps.saved,
            forward_end=reads.forward_end.get(root, time[root]), backward_end=reads.backward_end.get(root),
        )
    return members


def _note_inputs_gone_before_recompute(steps: _Steps, region: Region, states: Mapping[str, tuple[int, ...]],
                                       outside: dict[str, set[int]]) -> None:
    """Record the inputs made outside the region that its recomputation reads and that are gone by then."""
    owner, inside = steps.liveness.owner, set(region.members)
    for name, s in states.items():
        if RECOMPUTE not in s:
            continue
        for u in steps.by_name[name].all_input_nodes:
            root = owner[u.name]
            if root in steps.leaves or root in inside or _covers(steps.liveness, root, region.recompute_time):
                continue
            outside.setdefault(u.name, set()).add(region.index)


def _hold_outside(outside: Mapping[str, set[int]], members: dict[str, Member], region_of: Mapping[str, int],
                  by_name: Mapping[str, fx.Node], owner: Mapping[str, str], saved: frozenset[str],
                  forward_end: Mapping[str, int], backward_end: Mapping[str, int], time: Mapping[str, int]) -> None:
    """Give ``HOLD`` to values made outside the regions that read them and gone before
    their recomputation (a block's input that the backward does not read: torch's
    checkpoint keeps its inputs), with the views between them and the reader, which
    take their base's state."""
    for name in outside:
        chain = [name]
        while chain[-1] != owner[chain[-1]]:  # a view: up to the storage it aliases
            chain.append(_base(by_name[chain[-1]]))
        for link in reversed(chain):
            old = members.get(link)
            root = owner[link]
            states = old.states if old is not None else (KEEP,)
            if HOLD not in states:
                states = tuple(sorted((*states, HOLD)))
            base = None if link == root else _base(by_name[link])
            if base is not None:
                states = members[base].states
            members[link] = Member(
                region=old.region if old is not None else region_of.get(link, -1), states=states,
                follows=base if old is None else old.follows, saved=root in saved,
                forward_end=forward_end.get(root, time[root]), backward_end=backward_end.get(root),
            )


def _with_phases(regions: tuple[Region, ...], members: dict[str, Member], region_of: dict[str, int],
                 not_replayable: dict[str, str], liveness: Liveness, leaves: frozenset[str], saved: frozenset[str],
                 by_name: Mapping[str, fx.Node]) -> RegionAnalysis:
    """The analysis on the time axis with one slot per region member before each ``t_rc`` (module docstring)."""
    inserts = sorted((r.recompute_time, len(r.members)) for r in regions)
    starts = [t for t, _ in inserts]
    cumulative = [0]
    for _, n in inserts:
        cumulative.append(cumulative[-1] + n)

    def new(t: int) -> int:  # every slot inserted at or before t moves t
        return t + cumulative[bisect.bisect_right(starts, t)]

    live = Liveness(
        time={name: new(t) for name, t in liveness.time.items()}, end=new(liveness.end), owner=liveness.owner,
        intervals={name: (new(a), new(b - 1) + 1) for name, (a, b) in liveness.intervals.items()},
    )
    phased = [Region(r.name, r.index, r.members, new(r.recompute_time), new(r.recompute_time) - len(r.members))
              for r in regions]
    slot = {name: phased[region_of[name]].phase_start + j for r in phased for j, name in enumerate(r.members)}
    last_slot: dict[str, int] = {}
    owner = liveness.owner
    for name, m in members.items():  # storages read by a recomputation: the slot of its last reader there
        if RECOMPUTE not in m.states or m.region < 0:
            continue
        for u in by_name[name].all_input_nodes:
            root = owner[u.name]
            held = members.get(root)
            if held is not None and (held.region == m.region or RECOMPUTE not in held.states):
                last_slot[root] = max(last_slot.get(root, -1), slot[name])
    out = {}
    for name, m in members.items():
        root = owner[name]
        if RECOMPUTE in m.states:
            again = slot[name]
            until = max(last_slot.get(root, again), again)
        else:  # held only: until its last reader in a recomputation (no slot of its own)
            again = until = last_slot.get(root, new(m.forward_end))
        out[name] = Member(m.region, m.states, m.follows, m.saved, new(m.forward_end),
                           None if m.backward_end is None else new(m.backward_end), again, until)
    return RegionAnalysis(tuple(phased), out, region_of, not_replayable, live, leaves, saved)


def _resolve(node: fx.Node) -> str:
    return node.args[0].name if node.target is operator.getitem else node.name


def _base(node: fx.Node) -> str:
    """The op whose output a view reads (tuple access resolved to its producer)."""
    return _resolve(node.args[0])


def _covers(liveness: Liveness, owner: str, t: int) -> bool:
    start, end = liveness.intervals[owner]
    return start <= t < end


def check_recompute(traced: object, names: Iterable[str]) -> None:
    """Raise ``ValueError`` naming the first of ``names`` (a plan's ``recompute``)
    that the step cannot recompute: not an op of ``traced`` (a
    :class:`autoshard.trace.TracedGraph`), not an op of a region's forward, a
    region output, or an op that cannot be replayed (from its schema). The
    torch-free check at plan load (``autoshard.plan.format``) knows op names
    only; this one knows the graph, for the runtime to call at load.

    >>> from examples.models import llama3
    >>> from autoshard.trace import trace_joint
    >>> check_recompute(trace_joint(*llama3.tiny(device="meta")), ["rsqrt_1"])
    """
    from autoshard.graph.liveness import compute_liveness

    analysis = analyse_regions(traced, compute_liveness(traced.graph_module))  # type: ignore[attr-defined]
    nodes = {n.name: n for n in traced.graph_module.graph.nodes}  # type: ignore[attr-defined]
    for i, name in enumerate(names):
        if name not in nodes or nodes[name].op != "call_function":
            raise ValueError(f"recompute[{i}]: no op named {name!r} in the traced graph")
        if name not in analysis.region_of:
            raise ValueError(f"recompute[{i}]: {name} is not an op of a repeated block's forward")
        why = analysis.not_replayable.get(name) or replay_problem(nodes[name])
        if why is not None:
            raise ValueError(f"recompute[{i}]: {name} cannot be recomputed: {why}")
        member = analysis.members.get(name)
        if member is None or RECOMPUTE not in member.states:
            raise ValueError(f"recompute[{i}]: {name} is not needed by the backward through its region")
