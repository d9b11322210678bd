r"""The plan file's ``program`` section: one rank's step program, action by action (torch-free).

The planner prices a :class:`~autoshard.program.actions.StepProgram` and the
runtime runs one (``autoshard.runtime.execute``); this section writes the
program down in the plan, so that what was priced is on record in the file a
person reads, and the runtime can check that the program it derives from the
plan and its own graph is that one before running it (a plan edited by hand, or
written by another autoshard, is refused in one line instead of running a
different step). docs/formats.md "Program" gives the format.

**Entries**, in run order, each one string of words separated by single spaces,
the first naming the kind (the names it carries hold no spaces: fx node names,
``param:<fqn>``-style leaves, ``op[k]`` tuple accesses, regions joined by commas):

* ``compute v``: run op node or tuple access ``v`` (first pass);
* ``recompute v region position``: run ``v`` again in ``region``'s phase, its
  input redistributions again at schedule ``position``;
* ``issue i``, ``wait i``: start / join ``schedule.collectives[i]``;
* ``pack i``, ``unpack i``: a bucket item's flat buffer made before its issue /
  split after its wait;
* ``free v w ...``: drop the values (their last read was the entry before).

A collective is named by its index in the plan's schedule (its item there says
what it moves), and an entry is one line of the plan file: the section stays
small (about two entries an op node; LLaMA-3 8B on 8 GPUs: 13,163 entries, 0.34 MB).

**Checks on load** (:func:`check_program_section`, beside the schema's): every
plan node computed exactly once, a tuple access only of a plan node, a
recomputed node only one the plan's ``recompute`` lists (or its tuple access);
every collective of the schedule issued once and waited once after its issue, a
bucket's ``pack`` right before its ``issue`` and its ``unpack`` right after its
``wait``, an edge's neither; no value freed twice in one life. What they cannot
see (which values an op reads, hence where each dies) the runtime checks by
comparing the whole list with the program it derives.

>>> from autoshard.program.actions import ProgramNode, build_step_program
>>> from autoshard.program.schedule import Schedule, ScheduleItem
>>> x = ScheduleItem(1, 2, edge=("a", "c", 0))
>>> nodes = [ProgramNode("a", ("in",)), ProgramNode("b", ("a",)), ProgramNode("c", ("a", "b"))]
>>> program = build_step_program(nodes, Schedule(3, 0, (x,)), keep={"c"}, item_reads={x.key: ("a",)})
>>> program_section(program).to_dict()["actions"]
['compute a', 'free in', 'issue 0', 'compute b', 'wait 0', 'compute c', 'free a b']
>>> recorded_actions(program_section(program), program.schedule) == program.actions
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from autoshard.program.actions import Action, Compute, Free, Issue, Pack, Recompute, StepProgram, Unpack, Wait
from autoshard.program.schedule import Schedule

__all__ = ["PROGRAM_VERSION", "ProgramSection", "ProgramSectionError", "program_section", "recorded_actions",
           "check_program_section", "first_difference"]

PROGRAM_VERSION = 1
"""The section's own version: readers refuse another (one line)."""

_ITEM_KINDS = {"issue": Issue, "wait": Wait, "pack": Pack, "unpack": Unpack}


class ProgramSectionError(ValueError):
    """The ``program`` section is malformed or not a program of its plan (one line naming the entry)."""


@dataclass(frozen=True, slots=True)
class ProgramSection:
    """The recorded program: one tuple an action (module docstring, Entries)."""

    actions: tuple[tuple[Any, ...], ...]

    def to_dict(self) -> dict[str, Any]:
        return {"version": PROGRAM_VERSION,
                "actions": [" ".join((a[0], *a[1])) if a[0] == "free" else " ".join(str(x) for x in a)
                            for a in self.actions]}

    @classmethod
    def from_dict(cls, data: Any) -> "ProgramSection":
        """Parse and check the entries' shapes (``ProgramSectionError`` naming the first bad one)."""
        if not isinstance(data, Mapping):
            raise ProgramSectionError(f"program: expected an object, got {type(data).__name__}")
        if data.get("version") != PROGRAM_VERSION:
            raise ProgramSectionError(f"program.version: expected {PROGRAM_VERSION}, got {data.get('version')!r}")
        entries = data.get("actions")
        if not isinstance(entries, list):
            raise ProgramSectionError("program.actions: expected a list of actions")
        return cls(tuple(_entry(e, f"program.actions[{t}]") for t, e in enumerate(entries)))


def _entry(entry: Any, where: str) -> tuple[Any, ...]:
    words = entry.split(" ") if isinstance(entry, str) else []
    if not words or not all(words):
        raise ProgramSectionError(f"{where}: expected 'kind arg ...' (one space between words), got {entry!r}")
    kind, args = words[0], words[1:]
    if kind == "compute" and len(args) == 1:
        return (kind, args[0])
    if kind == "recompute" and len(args) == 3 and _is_index(args[2]):
        return (kind, args[0], args[1], int(args[2]))
    if kind in _ITEM_KINDS and len(args) == 1 and _is_index(args[0]):
        return (kind, int(args[0]))
    if kind == "free" and args:
        return (kind, tuple(args))
    raise ProgramSectionError(f"{where}: not an action: {entry!r} (kinds: compute, recompute, issue, wait, pack, "
                              "unpack, free)")


def _is_index(word: str) -> bool:
    return word.isascii() and word.isdigit()


def program_section(program: StepProgram) -> ProgramSection:
    """The section recording ``program`` (its schedule's items by index)."""
    index = {item.key: i for i, item in enumerate(program.schedule.items)}
    out: list[tuple[Any, ...]] = []
    for action in program.actions:
        words = (action.values if isinstance(action, Free) else
                 (action.node, action.region) if isinstance(action, Recompute) else
                 (action.node,) if isinstance(action, Compute) else ())
        if any(" " in w or not w for w in words):  # fx names never hold one; a region list is comma-joined
            raise ValueError(f"program: {str(action)!r}: a name with a space cannot be recorded")
        if isinstance(action, Compute):
            out.append(("compute", action.node))
        elif isinstance(action, Recompute):
            out.append(("recompute", action.node, action.region, action.position))
        elif isinstance(action, Free):
            out.append(("free", tuple(action.values)))
        else:
            kind = next(k for k, cls in _ITEM_KINDS.items() if isinstance(action, cls))
            out.append((kind, index[action.item.key]))
    return ProgramSection(tuple(out))


def recorded_actions(section: ProgramSection, schedule: Schedule) -> tuple[Action, ...]:
    """The section's typed actions (``autoshard.program.actions``) under the plan's ``schedule``."""
    items = schedule.items
    out: list[Action] = []
    for t, entry in enumerate(section.actions):
        kind = entry[0]
        if kind == "compute":
            out.append(Compute(entry[1]))
        elif kind == "recompute":
            out.append(Recompute(entry[1], entry[2], entry[3]))
        elif kind == "free":
            out.append(Free(tuple(entry[1])))
        else:
            if entry[1] >= len(items):
                raise ProgramSectionError(f"program.actions[{t}]: collective {entry[1]} is not in the schedule "
                                          f"({len(items)} collectives)")
            out.append(_ITEM_KINDS[kind](items[entry[1]]))
    return tuple(out)


def check_program_section(section: ProgramSection, node_names: Sequence[str], recompute: Sequence[str],
                          schedule: Schedule) -> None:
    """The load-time checks of the module docstring; ``ProgramSectionError`` naming the first entry
    that breaks one.

    >>> from autoshard.program.schedule import Schedule
    >>> check_program_section(ProgramSection((("compute", "a"),)), ["a", "b"], (), Schedule(2, 0, ()))
    Traceback (most recent call last):
    ...
    autoshard.plan.program_section.ProgramSectionError: program: plan node 'b' is never computed
    """
    nodes, again = set(node_names), set(recompute)
    computed: set[str] = set()
    state = [""] * len(schedule.items)  # "", "issued", "waited"
    live: set[str] = set()
    entries = section.actions
    for t, entry in enumerate(entries):
        where, kind = f"program.actions[{t}]", entry[0]
        if kind in ("compute", "recompute"):
            name = entry[1]
            owner = name.rsplit("[", 1)[0] if name.endswith("]") else name
            if owner not in nodes:
                raise ProgramSectionError(f"{where}: {kind} {name!r}: not a node of the plan")
            if kind == "compute":
                if name in computed:
                    raise ProgramSectionError(f"{where}: {name!r} computed twice")
                computed.add(name)
            elif owner not in again:
                raise ProgramSectionError(f"{where}: recompute {name!r}: the plan's recompute does not list it")
            live.add(name)
        elif kind == "free":
            for value in entry[1]:
                if value in computed and value not in live:
                    raise ProgramSectionError(f"{where}: {value!r} freed twice")
                live.discard(value)
        else:
            _check_item(entries, t, kind, entry[1], schedule, state)
    missing = [n for n in node_names if n not in computed]
    if missing:
        raise ProgramSectionError(f"program: plan node {missing[0]!r} is never computed")
    for i, s in enumerate(state):
        if s != "waited":
            raise ProgramSectionError(f"program: schedule collective {i} is never {'waited' if s else 'issued'}")


def _check_item(entries: Sequence[tuple[Any, ...]], t: int, kind: str, i: int, schedule: Schedule,
                state: list[str]) -> None:
    where = f"program.actions[{t}]"
    if i >= len(state):
        raise ProgramSectionError(f"{where}: collective {i} is not in the schedule ({len(state)} collectives)")
    bucket = schedule.items[i].edge is None
    if kind in ("pack", "unpack") and not bucket:
        raise ProgramSectionError(f"{where}: {kind} {i}: collective {i} is an edge's, not a bucket's")
    if kind == "issue":
        if state[i]:
            raise ProgramSectionError(f"{where}: collective {i} issued twice")
        if bucket and (t == 0 or entries[t - 1] != ("pack", i)):
            raise ProgramSectionError(f"{where}: bucket collective {i} issued without its pack right before")
        state[i] = "issued"
    elif kind == "wait":
        if state[i] != "issued":
            raise ProgramSectionError(f"{where}: collective {i} waited {'twice' if state[i] else 'before its issue'}")
        if bucket and (t + 1 >= len(entries) or entries[t + 1] != ("unpack", i)):
            raise ProgramSectionError(f"{where}: bucket collective {i} waited without its unpack right after")
        state[i] = "waited"


def first_difference(recorded: Sequence[Action], derived: Sequence[Action]) -> str | None:
    """Where two programs first differ, in words; None when equal.

    >>> first_difference([Compute("a"), Compute("b")], [Compute("a"), Compute("c")])
    "action 1: recorded 'compute b', here 'compute c'"
    """
    for t, (a, b) in enumerate(zip(recorded, derived)):
        if a != b:
            return f"action {t}: recorded {str(a)!r}, here {str(b)!r}"
    if len(recorded) != len(derived):
        return f"{len(recorded)} actions recorded, {len(derived)} here"
    return None
