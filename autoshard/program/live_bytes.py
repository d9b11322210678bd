"""What a rank holds during its step program, replayed from the program alone (torch-free).

:func:`live_bytes_timeline` replays a :class:`~autoshard.program.actions.StepProgram`'s
actions with a byte size per storage (module docstring of ``autoshard.program.actions``,
Memory) and gives the bytes held after each action and the peak, counting what
``autoshard.runtime.live_bytes`` counts while the runtime interprets the same program:
the leaves all step, every value from its making to its free (a view holds its base's
storage), at each compute its inputs and outputs together, and each redistributed copy
(:class:`HeldCopy`) from the ``Wait`` that makes it (a bucket's member: from the bucket's
``Unpack``; or from its first reader) to its last reader. A test checks the runtime's measured peak against this replay, to the byte, on
one rank and on two.

>>> from autoshard.program.actions import ProgramNode, build_step_program
>>> from autoshard.program.schedule import Schedule
>>> p = build_step_program([ProgramNode("a", ("x",))], Schedule(1, 0, ()), keep={"a"})
>>> live_bytes_timeline(p, {"x": [("x", 8)], "a": [("a", 4)]}, ["x"])  # compute a, free x (a leaf: held)
([12, 12], 12)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from autoshard.program.actions import Compute, Free, Recompute, StepProgram, Unpack, Wait

__all__ = ["Storages", "HeldCopy", "live_bytes_timeline"]

Storages = Mapping[str, Sequence[tuple[str, int]]]
"""Value -> (storage key, bytes) of each storage it holds: a view shares its base's key, a
multi-output node holds one per output, a tuple access its element's."""


@dataclass(frozen=True, slots=True)
class HeldCopy:
    """A redistributed copy the step holds (module docstring): made by the ``Wait`` of
    ``made_by`` (a ``ScheduleItem.key``; a bucket's ``Unpack``, which splits the waited buffer into
    its members), or at the ``Compute`` of its first reader (None), and
    freed after the ``Compute`` of its last reader (held to the end if none of ``readers`` is
    computed: a gradient bucket's, a sink's)."""

    storage: str
    nbytes: int
    readers: tuple[str, ...] = ()
    made_by: tuple | None = None


def live_bytes_timeline(program: StepProgram, storages: Storages, leaves: Sequence[str], *,
                        copies: Sequence[HeldCopy] = (),
                        remade: Mapping[str, Sequence[tuple[str, int]]] | None = None) -> tuple[list[int], int]:
    """Bytes held after each action, and the step's peak (module docstring).

    ``leaves``: the values held all step (parameters, buffers, the batch, constants, the
    tangent); ``copies``: the redistributed copies; ``remade``: node -> the copies its
    ``Recompute`` makes again (its redistributed inputs, counted with that op alone). Without
    copies this is what ``autoshard.runtime.live_bytes`` measures for a plan without redistributions.

    >>> from autoshard.program.actions import ProgramNode, build_step_program
    >>> from autoshard.program.schedule import Schedule
    >>> p = build_step_program([ProgramNode("a", ("x",)), ProgramNode("b", ("a",))], Schedule(2, 0, ()), keep={"b"})
    >>> live_bytes_timeline(p, {"x": [("x", 8)], "a": [("a", 8)], "b": [("b", 4)]}, ["x"])
    ([16, 16, 20, 12], 20)
    >>> live_bytes_timeline(p, {"x": [("x", 8)], "a": [("a", 8)], "b": [("b", 4)]}, ["x"],
    ...                     copies=[HeldCopy("a>b", 8, ("b",))])
    ([16, 16, 20, 12], 28)
    """
    refs: dict[str, list[int]] = {}
    now = peak = 0

    def hold_key(key: str, nbytes: int) -> None:
        nonlocal now
        if nbytes:
            ref = refs.setdefault(key, [0, nbytes])
            now += nbytes if not ref[0] else 0
            ref[0] += 1

    def release_key(key: str) -> None:
        nonlocal now
        ref = refs.get(key)
        if ref is not None:
            ref[0] -= 1
            if not ref[0]:
                del refs[key]
                now -= ref[1]

    def hold(value: str) -> None:
        for key, nbytes in storages.get(value, ()):
            hold_key(key, nbytes)

    def release(value: str) -> None:
        for key, _ in storages.get(value, ()):
            release_key(key)

    for value in leaves:  # the caller's and the environment's: counted once, never released
        hold(value)
        hold(value)
    peak = now
    computed = {a.node for a in program.actions if isinstance(a, Compute)}
    waited: dict[tuple, list[HeldCopy]] = {}
    first: dict[str, list[HeldCopy]] = {}
    last: dict[str, list[HeldCopy]] = {}
    order = {a.node: t for t, a in enumerate(program.actions) if isinstance(a, Compute)}
    for c in copies:
        readers = [r for r in c.readers if r in computed]
        if c.made_by is not None:
            waited.setdefault(c.made_by, []).append(c)
        elif readers:
            first.setdefault(min(readers, key=order.__getitem__), []).append(c)
        else:
            continue  # made at no reader of the program: not in the step
        if readers:
            last.setdefault(max(readers, key=order.__getitem__), []).append(c)
    env = set(leaves)  # the values the program holds by name
    reads = {n.name: n.reads for n in program.nodes}
    tuple_of = {n.name for n in program.nodes if n.of_tuple is not None}
    levels = []
    for action in program.actions:
        if isinstance(action, (Compute, Recompute)):
            again = isinstance(action, Recompute)
            for c in () if again else first.get(action.node, ()):
                hold_key(c.storage, c.nbytes)
            if action.node not in tuple_of:  # an op: its inputs and outputs exist together
                extra = {key: b for v in (*reads[action.node], action.node) for key, b in storages.get(v, ())
                         if key not in refs}
                if again:
                    extra.update((key, b) for key, b in (remade or {}).get(action.node, ()) if key not in refs)
                peak = max(peak, now + sum(extra.values()))
            for c in () if again else last.get(action.node, ()):
                release_key(c.storage)
            if action.node in env:  # made again: the new value replaces the old
                release(action.node)
            hold(action.node)
            env.add(action.node)
        elif isinstance(action, Unpack) or (isinstance(action, Wait) and action.item.edge is not None):
            for c in waited.get(action.item.key, ()):
                hold_key(c.storage, c.nbytes)
        elif isinstance(action, Free):
            for value in action.values:
                if value in env:
                    env.discard(value)
                    release(value)
        peak = max(peak, now)
        levels.append(now)
    return levels, peak
