"""When each tensor of the joint graph holds memory: the time axis of the problem.

Time is the position in the joint graph's order (placeholders first, then
every op as the trace recorded it: forward, loss, backward), and one last
point ``end`` after every node: the optimizer step, when parameters, every
gradient and the optimizer state are all held at once.

A tensor owns memory from the op that makes it to its last reader:
``live = [t_made, t_last_read + 1)``, half-open as in ``autoshard.problem/1``.
Views (ops whose schema says the output aliases an input, and
``_unsafe_view``) and tuple access own nothing: they extend the life of the
storage they alias, so the storage lives until the last reader of any alias.
Forward activations read by the backward therefore live into the backward,
which is where a training step's memory peaks. A tensor the step returns
(loss, buffer update) lives until ``end``; gradients are the builder's
business (they leave the graph in the parameter's placement, see
``autoshard.graph.builder``), so graph outputs are not counted as reads here.

>>> from examples.models import mlp
>>> from autoshard.trace import trace_joint
>>> live = compute_liveness(trace_joint(*mlp.tiny(device="meta")).graph_module)
>>> live.end > max(start for start, _ in live.intervals.values())
True
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping

import torch
import torch.fx as fx
from torch._ops import OpOverload

__all__ = ["Liveness", "compute_liveness", "is_view_op", "is_view_name", "alias_ends"]

_ALWAYS_VIEWS = frozenset({torch.ops.aten._unsafe_view.default})


def is_view_op(target: object) -> bool:
    """True when the op's output aliases its first input (no new storage)."""
    if target is operator.getitem:
        return True
    if not isinstance(target, OpOverload):
        return False
    if target in _ALWAYS_VIEWS:
        return True
    returns = target._schema.returns
    return bool(returns) and returns[0].alias_info is not None and not returns[0].alias_info.is_write


@lru_cache(maxsize=4096)
def is_view_name(target: str) -> bool:
    """:func:`is_view_op` for an op written ``aten.t.default`` (a graph node's ``target``).

    >>> is_view_name("aten.t.default"), is_view_name("aten.mm.default"), is_view_name("param")
    (True, False, False)
    """
    parts = target.split(".")
    if len(parts) != 3 or parts[0] != "aten":
        return False
    op = getattr(getattr(torch.ops.aten, parts[1], None), parts[2], None)
    return op is not None and is_view_op(op)


@dataclass(frozen=True, slots=True)
class Liveness:
    """Times and live intervals of the tensors of one joint graph."""

    time: Mapping[str, int]
    """fx node name -> its position on the time axis."""
    end: int
    """The optimizer step, after every node."""
    owner: Mapping[str, str]
    """fx node name -> the node whose storage it reads (itself unless a view)."""
    intervals: Mapping[str, tuple[int, int]]
    """Storage-owning node -> ``[start, end)`` of its memory; ``end`` is at
    least ``start + 1`` (an unread tensor still exists while it is made)."""

    def owns_memory(self, name: str) -> bool:
        """Whether ``name`` allocates its own storage (not a view)."""
        return self.owner[name] == name


def compute_liveness(graph_module: fx.GraphModule, *, outputs_live_to_end: frozenset[str] = frozenset()) -> Liveness:
    """Live intervals of every storage of ``graph_module`` (module docstring).

    ``outputs_live_to_end``: names of nodes whose storage is kept until the
    optimizer step although no op reads it (buffer updates, the loss).
    """
    nodes = [n for n in graph_module.graph.nodes if n.op != "output"]
    time = {n.name: i for i, n in enumerate(nodes)}
    end = len(nodes)
    owner: dict[str, str] = {}
    for n in nodes:
        if n.op == "call_function" and is_view_op(n.target) and n.args and isinstance(n.args[0], fx.Node):
            owner[n.name] = owner[n.args[0].name]
        else:
            owner[n.name] = n.name
    last: dict[str, int] = {name: time[name] for name, own in owner.items() if own == name}
    for n in nodes:
        for used in n.all_input_nodes:
            root = owner[used.name]
            last[root] = max(last[root], time[n.name])
    for name in outputs_live_to_end:
        last[owner[name]] = end
    intervals = {root: (time[root], max(t, time[root]) + 1) for root, t in last.items()}
    return Liveness(time=time, end=end, owner=owner, intervals=intervals)


def alias_ends(graph_module: fx.GraphModule, liveness: Liveness) -> dict[str, int]:
    """fx node name -> one past the last reader of the node or of any view of it
    (at least its own time + 1): how long an alias made by a view keeps what it
    aliases alive (``autoshard.graph.copies``)."""
    nodes = [n for n in graph_module.graph.nodes if n.op != "output"]
    time = liveness.time
    end = {n.name: time[n.name] + 1 for n in nodes}
    for n in nodes:
        for used in n.all_input_nodes:
            end[used.name] = max(end[used.name], time[n.name] + 1)
    for n in reversed(nodes):  # a view's readers keep its base alive too
        if n.op == "call_function" and is_view_op(n.target) and n.args and isinstance(n.args[0], fx.Node):
            base = n.args[0].name
            end[base] = max(end[base], end[n.name])
    return end
