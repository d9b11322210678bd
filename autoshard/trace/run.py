"""The joint graph run on real tensors, and its call nodes' tensor arguments
(``autoshard.trace`` exports the public names).

Apart from :mod:`autoshard.trace.joint` because it is the other half of the
contract: ``joint`` turns a model into a :class:`~autoshard.trace.joint.TracedGraph`
on fake tensors; this module binds that graph's placeholders to real tensors
(parameters and buffers by name or alias, the forward's inputs, the loss
tangent) and reads its stored constants and call arguments, as the runtime
and the equivalence tests do. It calls no private tracing API.

>>> from examples.models import mlp
>>> from autoshard.trace import trace_joint
>>> model, inputs = mlp.tiny()
>>> result = run_joint(trace_joint(model, inputs), dict(model.named_parameters()), inputs)
>>> sorted(result.grads)[:2], result.loss.shape
(['layers.0.w1.bias', 'layers.0.w1.weight'], torch.Size([]))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch._ops import OpOverload

from autoshard.trace.compat import TraceError, has_no_values
from autoshard.trace.joint import TracedGraph

__all__ = ["JointResult", "run_joint", "placeholder_values", "tensor_arg_nodes", "constant_value"]

aten = torch.ops.aten


@dataclass(frozen=True, slots=True)
class JointResult:
    """What one run of the joint graph computes."""

    loss: torch.Tensor
    """The scalar loss."""

    grads: Mapping[str, torch.Tensor | None]
    """Parameter FQN -> gradient."""

    buffer_updates: Mapping[str, torch.Tensor]
    """Buffer FQN -> new value (copy it into the buffer to finish the step)."""


def run_joint(
    traced: TracedGraph,
    values: Mapping[str, torch.Tensor],
    inputs: Sequence[torch.Tensor] | Mapping[str, torch.Tensor],
) -> JointResult:
    """Run the joint graph on real tensors: ``values`` maps parameter and buffer FQNs
    to tensors (``dict(model.named_parameters())`` and buffers, with or without
    ``remove_duplicate=False``: a shared tensor may come under any of its
    paths), ``inputs`` are the forward's arguments, in order or by name. The
    loss tangent is 1.

    >>> from examples.models import mlp
    >>> from autoshard.trace import trace_joint
    >>> model, inputs = mlp.tiny()
    >>> result = run_joint(trace_joint(model, inputs), dict(model.named_parameters()), inputs)
    >>> torch.allclose(result.loss, model(*inputs))
    True
    """
    # flat in, flat out: the module's own calling convention nests them in pytrees
    with torch.no_grad():
        outputs = fx.Interpreter(traced.graph_module).run(
            *placeholder_values(traced, values, inputs), enable_io_processing=False
        )
    output_node = next(n for n in traced.graph_module.graph.nodes if n.op == "output")
    result = {node: value for node, value in zip(output_node.args[0], outputs) if isinstance(node, fx.Node)}
    return JointResult(
        loss=result[traced.loss],
        grads={fqn: None if node is None else result[node] for fqn, node in traced.grads.items()},
        buffer_updates={fqn: result[node] for fqn, node in traced.buffer_updates.items()},
    )


def placeholder_values(
    traced: TracedGraph,
    values: Mapping[str, torch.Tensor],
    inputs: Sequence[torch.Tensor] | Mapping[str, torch.Tensor],
) -> list[torch.Tensor]:
    """The joint graph's placeholders bound to real tensors, in graph order:
    parameters and buffers from ``values`` (by FQN or any alias), the forward's
    ``inputs`` (in order or by name), and 1 for the loss tangent.

    >>> from examples.models import mlp
    >>> from autoshard.trace import trace_joint
    >>> model, inputs = mlp.tiny()
    >>> len(placeholder_values(trace_joint(model, inputs), dict(model.named_parameters()), inputs))
    11
    """
    aliases = {**traced.param_aliases, **traced.buffer_aliases}
    by_node: dict[fx.Node, torch.Tensor] = {}
    for fqn, node in {**traced.params, **traced.buffers}.items():
        name = next((n for n in (fqn, *aliases.get(fqn, ())) if n in values), None)
        if name is None:
            raise ValueError(f"values: missing tensor for {fqn!r}")
        by_node[node] = values[name].detach()
    if isinstance(inputs, Mapping):
        if sorted(inputs) != sorted(traced.inputs):
            raise ValueError(f"inputs: expected tensors named {', '.join(traced.inputs)}, got {', '.join(inputs)}")
        inputs = [inputs[name] for name in traced.inputs]
    if len(inputs) != len(traced.inputs):
        raise ValueError(f"inputs: expected {len(traced.inputs)} tensors ({', '.join(traced.inputs)}), got {len(inputs)}")
    by_node.update(zip(traced.inputs.values(), inputs))
    by_node[traced.tangent] = torch.ones((), dtype=traced.loss.meta["val"].dtype)
    return [by_node[node] for node in traced.graph_module.graph.nodes if node.op == "placeholder"]


def constant_value(traced: TracedGraph, name: str) -> torch.Tensor:
    """The tensor stored for constant ``name`` of :attr:`TracedGraph.constants`
    (the value the forward made from Python data, on the device it was made on).
    Raises :class:`TraceError` when the constant has no values (made from a
    meta tensor: shapes are known, values are not).

    >>> import torch
    >>> from autoshard.trace import trace_joint
    >>> class Pick(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.w = torch.nn.Parameter(torch.ones(4, 3))
    ...     def forward(self, x):
    ...         return (x @ self.w)[:, [0, 2]].sum()
    >>> traced = trace_joint(Pick(), (torch.ones(2, 4),))
    >>> [(name, constant_value(traced, name).tolist()) for name in traced.constants]
    [('_tensor_constant0', [0, 2])]
    """
    if name not in traced.constants:
        raise KeyError(f"no tensor constant {name!r} in the graph (constants: {', '.join(traced.constants) or 'none'})")
    value = getattr(traced.graph_module, traced.constants[name].target)
    if has_no_values(value):
        raise TraceError(f"tensor constant {name} has no values (it was made from a meta or fake tensor): "
                         "trace the model with real tensors to run it")
    return value


def tensor_arg_nodes(node: fx.Node) -> list[fx.Node]:
    """The fx nodes of a call's tensor arguments, in the rules' input order
    (positional args, then kwargs in schema order; ``autoshard.rules.calls``),
    so that position i is the rules' input i.

    >>> from examples.models import mlp
    >>> from autoshard.trace import trace_joint
    >>> traced = trace_joint(*mlp.tiny(device="meta"))
    >>> addmm = next(n for n in traced.graph_module.graph.nodes if n.target is aten.addmm.default)
    >>> len(tensor_arg_nodes(addmm))
    3
    """

    def walk(obj: Any, out: list[fx.Node]) -> None:
        if isinstance(obj, fx.Node) and isinstance(obj.meta.get("val"), torch.Tensor):
            out.append(obj)
        elif isinstance(obj, (list, tuple)):
            for item in obj:
                walk(item, out)

    found: list[fx.Node] = []
    walk(node.args, found)
    names = [a.name for a in node.target._schema.arguments] if isinstance(node.target, OpOverload) else []
    for name in sorted(node.kwargs, key=lambda n: names.index(n) if n in names else len(names)):
        walk(node.kwargs[name], found)
    return found
