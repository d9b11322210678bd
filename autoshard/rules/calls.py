"""Build an :class:`~autoshard.rules.core.OpCall` from an op and its args:
bind the args to the op's schema, flatten the tensor inputs, and find the
outputs' shapes by running the op on meta tensors.

>>> import torch
>>> from autoshard.rules.core import TensorMeta
>>> call = make_call(torch.ops.aten._softmax.default, (TensorMeta((4, 8), torch.float32), -1, False), {}, None)
>>> call.arg("dim"), call.outputs[0].shape
(-1, (4, 8))
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch._ops import OpOverload

from autoshard.rules.core import OpCall, TensorMeta

__all__ = ["make_call", "flatten_tensors", "bind_args", "run_on_meta", "infer_outputs", "OutputsUnknown", "replace_tensors", "flatten_outputs", "flatten_results", "ordered_tensor_args"]


def flatten_tensors(obj: Any) -> list[Any]:
    """Every TensorMeta (or tensor) in ``obj``, depth first, Nones skipped."""
    out: list[Any] = []

    def walk(o: Any) -> None:
        if isinstance(o, (TensorMeta, torch.Tensor)):
            out.append(o)
        elif isinstance(o, (list, tuple)):
            for x in o:
                walk(x)

    walk(obj)
    return out


def bind_args(op: OpOverload, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Schema argument name -> value, defaults filled in."""
    bound: dict[str, Any] = {}
    for i, arg in enumerate(op._schema.arguments):
        if i < len(args) and not arg.kwarg_only:
            bound[arg.name] = args[i]
        elif arg.name in kwargs:
            bound[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
    return bound


def ordered_tensor_args(op: OpOverload, args: tuple, kwargs: Mapping[str, Any]) -> list[Any]:
    """Tensors of the positional args, then of the kwargs in schema order."""
    found = flatten_tensors(args)
    names = [a.name for a in op._schema.arguments]
    for name in sorted(kwargs, key=lambda n: names.index(n) if n in names else len(names)):
        found.extend(flatten_tensors(kwargs[name]))
    return found


def _to_device_tensor(obj: Any, device: str) -> Any:
    if isinstance(obj, TensorMeta):
        return torch.empty(obj.shape, dtype=obj.dtype, device=device)
    if isinstance(obj, tuple):
        return tuple(_to_device_tensor(o, device) for o in obj)
    if isinstance(obj, list):
        return [_to_device_tensor(o, device) for o in obj]
    return obj


def run_on_meta(op: OpOverload, args: tuple, kwargs: Mapping[str, Any]) -> Any:
    """Run ``op`` on meta tensors made from the TensorMetas in the args."""
    meta_args = _to_device_tensor(args, "meta")
    meta_kwargs = {k: _to_device_tensor(v, "meta") for k, v in kwargs.items()}
    if "device" in meta_kwargs or any(a.name == "device" for a in op._schema.arguments if a.kwarg_only):
        meta_kwargs["device"] = torch.device("meta")
    with torch.no_grad():
        return op(*meta_args, **meta_kwargs)


def flatten_results(result: Any) -> list[Any]:
    """The tensors an op returned, flattened (None kept for absent outputs;
    non-tensor values such as ints are not outputs)."""
    if isinstance(result, torch.Tensor):
        return [result]
    out: list[Any] = []
    if isinstance(result, (list, tuple)):
        for r in result:
            if isinstance(r, (list, tuple)):
                out.extend(flatten_results(r))
            elif isinstance(r, torch.Tensor) or r is None:
                out.append(r)
    return out


def flatten_outputs(result: Any) -> tuple[TensorMeta | None, ...]:
    """:func:`flatten_results` as TensorMeta."""
    return tuple(None if r is None else TensorMeta.of(r) for r in flatten_results(result))


def infer_outputs(op: OpOverload, args: tuple, kwargs: Mapping[str, Any], out_meta: Any = None) -> tuple[TensorMeta | None, ...]:
    """Flattened output metadata: from ``out_meta`` (TensorMeta, tensors or a
    nested list of them) or by running the op on meta tensors."""
    if out_meta is not None:
        return flatten_outputs(_to_device_tensor(out_meta, "meta"))
    try:
        return flatten_outputs(run_on_meta(op, args, kwargs))
    except Exception as exc:  # data-dependent shapes, ops without a meta kernel
        raise OutputsUnknown(op, exc) from exc


class OutputsUnknown(ValueError):
    """The outputs of a call cannot be inferred on meta tensors."""

    def __init__(self, op: OpOverload, cause: Exception) -> None:
        super().__init__(
            f"{op}: cannot infer output shapes on meta tensors ({type(cause).__name__}: "
            f"{str(cause).splitlines()[0] if str(cause) else ''}); pass out_meta"
        )


def make_call(op: OpOverload, args: tuple, kwargs: Mapping[str, Any], out_meta: Any) -> OpCall:
    """The :class:`OpCall` of one call (see the module docstring)."""
    inputs = tuple(ordered_tensor_args(op, args, kwargs))
    for t in inputs:
        if isinstance(t, torch.Tensor):
            raise ValueError(f"{op}: args_meta must hold TensorMeta, not tensors (use autoshard.rules.to_meta)")
    outputs = infer_outputs(op, args, kwargs, out_meta)
    return OpCall(op, args, dict(kwargs), inputs, outputs, bind_args(op, args, kwargs))


def replace_tensors(op: OpOverload, args: tuple, kwargs: Mapping[str, Any], new: list[Any]) -> tuple[tuple, dict]:
    """``args``/``kwargs`` with their tensors replaced, in the order of
    :func:`make_call`'s inputs, by the items of ``new``."""
    it = iter(new)

    def sub(o: Any) -> Any:
        if isinstance(o, (TensorMeta, torch.Tensor)):
            return next(it)
        if isinstance(o, tuple):
            return tuple(sub(x) for x in o)
        if isinstance(o, list):
            return [sub(x) for x in o]
        return o

    new_args = sub(args)
    names = [a.name for a in op._schema.arguments]
    new_kwargs = {}
    for name in sorted(kwargs, key=lambda n: names.index(n) if n in names else len(names)):
        new_kwargs[name] = sub(kwargs[name])
    return new_args, new_kwargs
