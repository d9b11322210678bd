"""Names of the strategy graph's nodes, as typed values with one spelling.

A node's name is its identity everywhere downstream: the graph's ``index``,
the dumped problem's ``nodes[i].name`` and ``assembly.nodes[i].name``, the
plan's ``redistributions[].tensor`` / ``.to``, bucket members and schedule
items, and the runtime's lookups of a parameter's placement. Those files are
read by outside tools, so the spelling is fixed (``docs/formats.md``):

- an op: its fx name (``mm_1``), :class:`OpId`;
- a parameter, buffer, input, tensor constant, gradient sink, optimizer
  temporary, buffer update: ``param:<fqn>``, ``buffer:<fqn>``,
  ``input:<name>``, ``constant:<name>``, ``grad:<fqn>``, ``opt_temp:<fqn>``,
  ``buffer_update:<fqn>``, :class:`TensorId`;
- the loss tangent and the loss sink: ``tangent``, ``loss``, :class:`StepId`;
- a tied memory piece: ``memory:<role>:<owner>[:<part>]``, :class:`MemoryPieceId`;
- an exact input copy: ``memory:copy:<reader>:<position>``, :class:`MemoryCopyId`.

Each type builds its name in one place (``str(node_id)``, also ``.name``), and
:func:`parse` reads a name back, so no module rebuilds or slices the text.
The owner of a memory piece and the reader of a copy are op nodes
(``autoshard.graph.tied_memory``), whose fx names hold no ``:``; that keeps
the trailing ``:<part>`` and ``:<position>`` unambiguous.

>>> str(TensorId("param", "layers.0.wq.weight"))
'param:layers.0.wq.weight'
>>> parse("memory:in:mm_1:2")
MemoryPieceId(role='in', owner='mm_1', part=2)
>>> parse("memory:copy:cross_entropy:0").name
'memory:copy:cross_entropy:0'
>>> parse("addmm").kind, parse("grad:w").kind, parse("loss").kind
('op', 'grad', 'loss')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

__all__ = ["TENSOR_KINDS", "STEP_KINDS", "MEMORY_ROLES", "LEAF_TENSOR_KINDS", "OpId", "TensorId", "StepId",
           "MemoryPieceId", "MemoryCopyId", "NodeId", "parse", "tensor_node", "is_leaf_tensor", "TANGENT", "LOSS"]

TENSOR_KINDS = ("param", "buffer", "input", "constant", "grad", "opt_temp", "buffer_update")
"""Node kinds named ``<kind>:<tensor name>``."""
LEAF_TENSOR_KINDS = ("param", "input", "buffer")
"""The kinds whose node holds a tensor the step is handed (what a prefetch gathers ahead)."""
STEP_KINDS = ("tangent", "loss")
"""Node kinds of which a step has one, named by the kind alone."""
MEMORY_ROLES = ("gap", "tail", "in", "payload", "waiting")
"""Roles of tied memory pieces (``autoshard.graph.tied_memory``); ``copy`` is :class:`MemoryCopyId`."""

_MEMORY = "memory"
_COPY = "copy"


@dataclass(frozen=True, slots=True)
class OpId:
    """An op node: named by its fx node's name."""

    fx_name: str

    @property
    def kind(self) -> str:
        return "op"

    @property
    def name(self) -> str:
        return str(self)

    def __str__(self) -> str:
        return self.fx_name


@dataclass(frozen=True, slots=True)
class TensorId:
    """A node standing for one named tensor: ``kind`` is one of :data:`TENSOR_KINDS`,
    ``tensor`` the parameter's or buffer's FQN, the input's or constant's name."""

    kind: str
    tensor: str

    def __post_init__(self) -> None:
        if self.kind not in TENSOR_KINDS:
            raise ValueError(f"node id: unknown tensor node kind {self.kind!r} (expected one of "
                             f"{', '.join(TENSOR_KINDS)})")

    @property
    def name(self) -> str:
        return str(self)

    def __str__(self) -> str:
        return f"{self.kind}:{self.tensor}"


@dataclass(frozen=True, slots=True)
class StepId:
    """The one loss tangent or loss sink of a step (``kind`` in :data:`STEP_KINDS`)."""

    kind: str

    def __post_init__(self) -> None:
        if self.kind not in STEP_KINDS:
            raise ValueError(f"node id: unknown step node kind {self.kind!r} (expected one of {', '.join(STEP_KINDS)})")

    @property
    def name(self) -> str:
        return str(self)

    def __str__(self) -> str:
        return self.kind


@dataclass(frozen=True, slots=True)
class MemoryPieceId:
    """A memory-only node tied to op ``owner``: one of its :data:`MEMORY_ROLES`;
    ``part`` numbers the intervals of a role that has several (0: the first,
    spelled without a suffix)."""

    role: str
    owner: str
    part: int = 0

    def __post_init__(self) -> None:
        if self.role not in MEMORY_ROLES:
            raise ValueError(f"node id: unknown memory role {self.role!r} (expected one of {', '.join(MEMORY_ROLES)})")
        if self.part < 0:
            raise ValueError(f"node id: memory part must be >= 0, got {self.part}")

    @property
    def kind(self) -> str:
        return _MEMORY

    @property
    def name(self) -> str:
        return str(self)

    def __str__(self) -> str:
        return f"{_MEMORY}:{self.role}:{self.owner}" + (f":{self.part}" if self.part else "")


@dataclass(frozen=True, slots=True)
class MemoryCopyId:
    """The exact copy node of input ``position`` of op ``reader``."""

    reader: str
    position: int

    @property
    def kind(self) -> str:
        return _MEMORY

    @property
    def name(self) -> str:
        return str(self)

    def __str__(self) -> str:
        return f"{_MEMORY}:{_COPY}:{self.reader}:{self.position}"


NodeId = Union[OpId, TensorId, StepId, MemoryPieceId, MemoryCopyId]

TANGENT = StepId("tangent")
LOSS = StepId("loss")


def tensor_node(kind: str, tensor: str) -> str:
    """The name of tensor node ``kind`` (one of :data:`TENSOR_KINDS`) of ``tensor``.

    >>> tensor_node("grad", "fc1.weight")
    'grad:fc1.weight'
    """
    return str(TensorId(kind, tensor))


def is_leaf_tensor(name: str) -> bool:
    """Whether ``name`` names a parameter, input or buffer node (:data:`LEAF_TENSOR_KINDS`);
    never raises, so a plan file's names can be asked before they are checked.

    >>> is_leaf_tensor("param:fc1.weight"), is_leaf_tensor("grad:fc1.weight"), is_leaf_tensor("mm")
    (True, False, False)
    """
    head, sep, _ = name.partition(":")
    return bool(sep) and head in LEAF_TENSOR_KINDS


def parse(name: str) -> NodeId:
    """The node id spelled ``name`` (``str(parse(name)) == name`` for every name a graph holds).

    >>> parse("buffer_update:bn.running_mean")
    TensorId(kind='buffer_update', tensor='bn.running_mean')
    >>> parse("memory:gap:relu")
    MemoryPieceId(role='gap', owner='relu', part=0)
    """
    head, sep, rest = name.partition(":")
    if not sep and name:
        return StepId(name) if name in STEP_KINDS else OpId(name)
    if head in TENSOR_KINDS and rest:
        return TensorId(head, rest)
    if head == _MEMORY:
        role, _, tail = rest.partition(":")
        owner, colon, number = tail.rpartition(":")
        canonical = number.isdigit() and str(int(number)) == number
        if role == _COPY and colon and owner and canonical:
            return MemoryCopyId(owner, int(number))
        if role in MEMORY_ROLES and tail:
            if colon and owner and canonical and int(number) > 0:
                return MemoryPieceId(role, owner, int(number))
            if not colon:
                return MemoryPieceId(role, tail)
    raise ValueError(f"node id: {name!r} is not a node name (an fx name, <kind>:<tensor>, tangent, loss, "
                     "memory:<role>:<op>[:<part>] or memory:copy:<op>:<position>)")
