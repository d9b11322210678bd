"""Attention masks that are the causal mask, recognised by value: the kernel eager CUDA runs.

A model that builds its causal mask itself and hands it to
``scaled_dot_product_attention`` (Hugging Face's ``create_causal_mask``)
decides *in eager* that the mask is plain causal and passes ``is_causal=True``
instead, which runs the flash kernel. It decides by reading values (are the
position ids contiguous?), which a trace on fake tensors cannot do, so the
library takes its tracing path: it materialises a ``(batch, 1, seq, seq)``
mask and SDPA gets it, which on CUDA is the memory-efficient kernel with an
``attn_bias`` (twice the flash kernel's time at LLaMA-3-8B shapes on the H100
profile, a mask of 2 bytes a score kept for the backward, and a dozen mask ops
per step). The trace thus priced and ran a step slower than the user's eager
one.

:meth:`CausalMasks.is_causal` decides it as eager does, by value: a mask computed
from no graph input (factory ops and deterministic ops on them: its value is
fixed by the graph) is evaluated on the CPU and compared with the causal mask
``k <= q`` of SDPA's ``is_causal`` (upper-left aligned, which needs as many
queries as keys). A boolean mask must be exactly that; an additive float mask
0 where allowed and ``-inf`` (or its dtype's lowest finite value, whose
``exp`` underflows to 0 just the same) elsewhere. Only then may
:mod:`autoshard.trace.device` map the call to the causal flash kernel: the same
function, computed without the mask.

The evaluation stays cheap by keeping every value in its smallest broadcast
form: after a small op, a tensor dim whose slices are all equal is kept with
size 1 (the batch dim of a mask made from expanded position ids), and
pointwise ops and ``expand`` work on those forms under broadcasting, so the
``(16, 1, 8192, 8192)`` mask of the 8B run is computed as one ``(1, 1, 8192,
8192)`` plane (2-3 s on a loaded 2-core machine, once per graph: the per-layer copies of
the mask share it by value numbering). Any other op gets its inputs at their true shapes; a
mask whose evaluation would hold more than :data:`MAX_ELEMENTS` elements, or
that reads an input, a constant attribute or a random op, is not recognised
(the call keeps its mask, which is always correct).

>>> CausalMasks().is_causal(None)
False
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx as fx
from torch._ops import OpOverload

__all__ = ["MAX_ELEMENTS", "CausalMasks"]

MAX_ELEMENTS = 1 << 27
"""The most elements one value of a mask's evaluation may hold (0.25 GiB of bf16): a mask
that needs more is left as it is rather than slow the trace."""

_SMALL = 1 << 20
"""Values up to this many elements are searched for dims of equal slices (each check reads the value once)."""

_CPU = torch.device("cpu")


class CausalMasks:
    """:meth:`is_causal` of the masks of one graph, sharing their evaluation: every layer's
    attention reads the model's one mask, often through a view of its own.

    >>> import torch.fx as fx
    >>> g = fx.Graph(); i = g.call_function(torch.ops.aten.arange.default, (4,))
    >>> m = g.call_function(torch.ops.aten.le.Tensor, (g.call_function(torch.ops.aten.unsqueeze.default, (i, 0)),
    ...                                                g.call_function(torch.ops.aten.unsqueeze.default, (i, 1))))
    >>> _ = _set_vals(g); CausalMasks().is_causal(m)
    True
    """

    __slots__ = ("_values", "_numbers", "_checked")

    def __init__(self) -> None:
        self._values: dict[fx.Node, torch.Tensor | None] = {}
        self._numbers: dict[Any, Any] = {}
        self._checked: dict[int, bool] = {}

    def is_causal(self, mask: Any) -> bool:
        """Whether fx node ``mask`` (an SDPA ``attn_mask``) reads no graph input and its value
        is SDPA's causal mask (module docstring)."""
        if not isinstance(mask, fx.Node):
            return False
        shape = tuple(getattr(mask.meta.get("val"), "shape", ()))
        if len(shape) < 2 or shape[-1] != shape[-2]:
            return False
        nodes = _constant_ancestors(mask)
        if nodes is None or not _evaluate(nodes, self._values, self._numbers):
            return False
        value = self._values[mask]
        if id(value) not in self._checked:  # one value object per number (and expand keeps its input's)
            self._checked[id(value)] = _is_causal(value, shape[-1])
        return self._checked[id(value)]


def _constant_ancestors(node: fx.Node) -> list[fx.Node] | None:
    """``node`` and every node it reads, in graph order; None when one is not a deterministic ATen call."""
    seen: dict[fx.Node, None] = {}
    stack = [node]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        if n.op != "call_function" or not isinstance(n.target, OpOverload):
            return None
        if torch.Tag.nondeterministic_seeded in n.target.tags or n.target._schema.is_mutable:
            return None
        seen[n] = None
        stack.extend(n.all_input_nodes)
    return sorted(seen, key=_position(node.graph))


def _position(graph: fx.Graph) -> Any:
    order = {n: i for i, n in enumerate(graph.nodes)}
    return order.__getitem__


def _evaluate(nodes: list[fx.Node], env: dict[fx.Node, torch.Tensor | None], numbers: dict[Any, Any]) -> bool:
    """Put each node's value in its smallest broadcast form into ``env`` (nodes already there are
    not evaluated again, nor a node that repeats another's op on the same values: ``numbers``, value
    numbering, so the per-layer copies of one mask share one value); False when one is past
    :data:`MAX_ELEMENTS`."""
    for node in nodes:
        if node in env:
            continue
        key = (str(node.target), repr(fx.node.map_arg((node.args, node.kwargs), lambda a: numbers[a])))
        if key not in numbers:
            numbers[key] = (len(numbers), _value(node, env))
        numbers[node] = numbers[key][0]
        env[node] = numbers[key][1]
        if env[node] is None:
            return False
    return True


def _value(node: fx.Node, env: dict[fx.Node, torch.Tensor | None]) -> torch.Tensor | None:
    """One node's value from its inputs' forms, on the CPU (a CUDA trace's factory ops say ``cuda``)."""
    true_shape = tuple(getattr(node.meta.get("val"), "shape", ()))
    op = node.target
    if op is torch.ops.aten.expand.default:
        return env[node.args[0]]  # broadcasting gives it the expanded shape where it is read
    if torch.Tag.pointwise in op.tags:
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda a: env[a])
        forms = [env[a].shape for a in node.all_input_nodes]
        if forms and math.prod(torch.broadcast_shapes(*forms)) > MAX_ELEMENTS:  # checked before it is allocated
            return None
    else:
        shapes = [true_shape] + [tuple(getattr(a.meta.get("val"), "shape", ())) for a in node.all_input_nodes]
        if any(math.prod(shape) > MAX_ELEMENTS for shape in shapes):
            return None
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda a: _full(env[a], a))
    value = op(*_on_cpu(args), **_on_cpu(kwargs))
    if not isinstance(value, torch.Tensor) or value.numel() > MAX_ELEMENTS:
        return None
    if value.dim() < len(true_shape):  # a pointwise op of lower-rank forms: rank as the true value
        value = value.reshape((1,) * (len(true_shape) - value.dim()) + tuple(value.shape))
    return _compress(value)


def _on_cpu(obj: Any) -> Any:
    """``obj`` (nested arguments) with every ``torch.device`` the CPU."""
    if isinstance(obj, torch.device):
        return _CPU
    if isinstance(obj, (tuple, list)):
        return type(obj)(_on_cpu(v) for v in obj)
    if isinstance(obj, dict):
        return {k: _on_cpu(v) for k, v in obj.items()}
    return obj


def _full(value: torch.Tensor, node: fx.Node) -> torch.Tensor:
    """``value`` at its node's true shape (what an op other than a pointwise one reads)."""
    shape = tuple(node.meta["val"].shape)
    return value if tuple(value.shape) == shape else value.expand(shape).contiguous()


def _compress(value: torch.Tensor) -> torch.Tensor:
    """``value`` with every dim whose slices are all equal cut to size 1 (small values only)."""
    if value.numel() > _SMALL:
        return value
    for dim in range(value.dim()):
        if value.shape[dim] > 1:
            first = value.narrow(dim, 0, 1)
            if bool(torch.equal(value, first.expand(value.shape))):
                value = first
    return value


def _is_causal(value: torch.Tensor, length: int) -> bool:
    """Whether ``value`` (broadcast to ``(..., length, length)``) is SDPA's causal mask: counted
    on its lower triangle (``tril``, the allowed scores) and the rest (``triu(1)``)."""
    if value.dim() < 2 or value.shape[-1] != length or value.shape[-2] != length:
        return False  # a dim cut to 1 (or missing) takes one value along q or k: not causal past length 1
    planes = math.prod(value.shape[:-2])
    lower, upper = planes * length * (length + 1) // 2, planes * length * (length - 1) // 2
    if value.dtype == torch.bool:
        return int(value.tril().sum()) == lower and not bool(value.triu(1).any())
    if not value.is_floating_point():
        return False
    # tril() zeroes the rest: nonzero anywhere means a nonzero allowed score; triu(1) zeroes the
    # allowed ones, so the masked ones must all be at most the dtype's lowest value (-inf counts)
    return not bool(value.tril().any()) and int((value.triu(1) <= torch.finfo(value.dtype).min).sum()) == upper


def _set_vals(graph: fx.Graph) -> fx.Graph:
    """Fill ``meta["val"]`` of a hand-built graph with its values (for the docstring's example)."""
    env: dict[fx.Node, Any] = {}
    for node in graph.nodes:
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda a: env[a])
        env[node] = node.meta["val"] = node.target(*args, **kwargs)
    return graph
