"""How an op's kernel walks memory, from the real strides of its tensors:
the innermost contiguous run, and whether a Python scalar rides along.

Why: the roofline prices bytes as if every kernel streamed them. Kernels
that walk short runs do not: a transposed copy reads one element per cache
line, a broadcast inside the row (``[4, 128, 4, 32] * [1, 128, 1, 32]``) or
a reduction over a middle dim restarts its vector loop every 32 elements,
and an op whose only tensor input is expanded (stride 0 in the inner loop)
falls off the vectorised path. On the calibration host those ops ran 2-6x
slower than their bytes said. The cost model prices a short run ``r`` with
the profile's ``efficiency.run`` curve (``costmodel.compute``); this module
finds ``r`` (infinity: contiguous, no penalty). It needs strides, which the
rules' ``TensorMeta`` does not carry, so the graph builder and the accuracy
check call it with the FX node's tensors (FakeTensors) or real ones.

The run, by kind:

* elementwise and copy ops whose tensors broadcast to the output's shape
  (TensorIterator's case): order the dims by the output's strides, take the
  innermost dim. If an operand walks it with a stride other than 0 or 1 the
  run is 1 (a gather); if every tensor input walks it with stride 0 (only
  expanded inputs) the run is 1 too (no vectorised loop). Else extend the
  run outward while every operand's stride keeps it contiguous (stride =
  inner stride x inner size, or 0 for a broadcast operand that is 0 there too);
* reductions: in the input's memory order, the innermost dims up to the first
  reduced one (reducing a middle dim) or, when the innermost dim is reduced,
  the contiguous reduced dims (one row per run);
* other ops (cat, slice_backward, losses...): the shortest run of any tensor
  in its own memory order.

A run that covers the whole tensor is contiguous: infinity.

>>> import torch
>>> x = torch.empty(4, 128, 4, 32)
>>> inner_run("elementwise", [x, torch.empty(1, 128, 1, 32)], [x])
32.0
>>> inner_run("copy", [torch.empty(900, 700).t()], [torch.empty(700, 900)])
1.0
>>> inner_run("elementwise", [x, x], [x])
inf
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

__all__ = ["inner_run", "reduced_dims", "has_scalar_operand"]

_NO_RUN_KINDS = ("matmul", "attention", "attention_backward", "view")


def _tensors(values: Sequence[Any]) -> list[torch.Tensor]:
    return [v for v in values if isinstance(v, torch.Tensor) and v.numel() > 1]


def _expanded_strides(t: torch.Tensor, shape: Sequence[int]) -> list[int] | None:
    """``t``'s strides broadcast to ``shape`` (0 on broadcast dims), or None
    when ``t`` does not broadcast to it."""
    if t.dim() > len(shape):
        return None
    pad = len(shape) - t.dim()
    out = [0] * pad
    for size, stride, target in zip(t.shape, t.stride(), shape[pad:]):
        if size == target:
            out.append(stride if size > 1 else 0)
        elif size == 1:
            out.append(0)
        else:
            return None
    return out


def _broadcast_run(out: torch.Tensor, inputs: Sequence[torch.Tensor]) -> float | None:
    """TensorIterator's innermost run (module docstring), or None when the
    inputs do not broadcast to the output's shape."""
    shape = list(out.shape)
    operands = [list(out.stride())]
    for t in inputs:
        strides = _expanded_strides(t, shape)
        if strides is None:
            return None
        operands.append(strides)
    dims = [d for d in range(len(shape)) if shape[d] > 1]
    if not dims:
        return math.inf
    dims.sort(key=lambda d: (abs(operands[0][d]), -d))  # innermost first, by the output's layout
    d0 = dims[0]
    if any(s[d0] not in (0, 1) for s in operands):
        return 1.0
    if inputs and all(s[d0] == 0 for s in operands[1:]):
        return 1.0
    run, prev = shape[d0], d0
    for d in dims[1:]:
        if all(s[d] == s[prev] * shape[prev] for s in operands):
            run *= shape[d]
            prev = d
        else:
            break
    return math.inf if run >= out.numel() else float(run)


def _memory_order(t: torch.Tensor) -> list[int]:
    dims = [d for d in range(t.dim()) if t.shape[d] > 1]
    return sorted(dims, key=lambda d: (abs(t.stride(d)), -d))


def _own_run(t: torch.Tensor) -> float:
    """The contiguous run of one tensor in its own memory order."""
    dims = _memory_order(t)
    if not dims:
        return math.inf
    if abs(t.stride(dims[0])) != 1:
        return 1.0
    run, prev = t.shape[dims[0]], dims[0]
    for d in dims[1:]:
        if t.stride(d) != t.stride(prev) * t.shape[prev]:
            break
        run *= t.shape[d]
        prev = d
    return math.inf if run >= t.numel() else float(run)


def _reduction_run(t: torch.Tensor, reduced: Sequence[int]) -> float:
    dims = _memory_order(t)
    red = {d % t.dim() for d in reduced} if t.dim() else set()
    if not dims or not red or set(dims) <= red:
        return math.inf  # a full reduction streams the tensor
    own = _own_run(t)
    if own == 1.0:
        return 1.0
    inner_reduced = dims[0] in red
    run, prev = t.shape[dims[0]], dims[0]
    for d in dims[1:]:
        if (d in red) != inner_reduced or t.stride(d) != t.stride(prev) * t.shape[prev]:
            break
        run *= t.shape[d]
        prev = d
    return min(float(run), own)


def inner_run(kind: str, inputs: Sequence[Any], outputs: Sequence[Any], *, reduced: Sequence[int] | None = None) -> float:
    """The innermost contiguous run (elements) of an op of ``kind`` with
    these input and output tensors (module docstring); ``reduced``: the
    reduced dims of a reduction (None: all of them). ``math.inf``: contiguous.

    >>> import torch
    >>> inner_run("reduction", [torch.empty(4, 128, 4, 2, 32)], [torch.empty(4, 128, 4, 32)], reduced=[3])
    32.0
    >>> inner_run("reduction", [torch.empty(4096, 300)], [torch.empty(4096)], reduced=[1])
    300.0
    """
    if kind in _NO_RUN_KINDS:
        return math.inf
    ins, outs = _tensors(inputs), _tensors(outputs)
    if kind == "reduction":
        if not ins:
            return math.inf
        big = max(ins, key=lambda t: t.numel())
        return _reduction_run(big, range(big.dim()) if reduced is None else reduced)
    if len(outs) == 1:
        run = _broadcast_run(outs[0], ins)
        if run is not None:
            return run
    return min((_own_run(t) for t in ins + outs), default=math.inf)


def reduced_dims(call: Any) -> list[int] | None:
    """The dims a reduction call reduces (its ``dim`` argument), None = all.

    >>> import torch
    >>> from autoshard.rules.core import OpCall, TensorMeta
    >>> x = TensorMeta((4, 8), torch.float32)
    >>> reduced_dims(OpCall(torch.ops.aten.sum.dim_IntList, (x, [1]), {}, (x,), (x,), {"dim": [1]}))
    [1]
    """
    dim = call.arg("dim")
    if dim is None:
        return None
    if isinstance(dim, int):
        return [dim]
    dims = list(dim)
    return dims or None


def has_scalar_operand(op: Any, args: Sequence[Any], kwargs: dict | None = None) -> bool:
    """Whether the op gets a Python number where a binary op's operand goes,
    which the dispatcher wraps into a tensor on every call: a ``.Scalar``
    overload (``add.Scalar``, ``mul.Scalar``) or a number passed for a
    ``Tensor`` argument (``mul.Tensor(x, 0.5)``).

    >>> import torch
    >>> has_scalar_operand(torch.ops.aten.mul.Tensor, (torch.ones(2), 0.5))
    True
    >>> has_scalar_operand(torch.ops.aten.pow.Tensor_Scalar, (torch.ones(2), 2))
    False
    """
    if getattr(op, "_overloadname", "") == "Scalar":
        return True
    schema = getattr(op, "_schema", None)
    if schema is None:
        return False
    values = dict(kwargs or {})
    for arg, value in zip(schema.arguments, args):
        values[arg.name] = value
    for arg in schema.arguments:
        value = values.get(arg.name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and isinstance(arg.type, torch.TensorType):
            return True
    return False
