"""The distinct calls of a traced model, and real tensors for each: captured or synthesized.

Steps 1 and 2 of :mod:`autoshard.validation.real_calls` (its docstring says why): every
DISTINCT call of a traced joint graph (op, args and kwargs with
:class:`~autoshard.rules.core.TensorMeta` in place of tensors, output metadata) is
taken once, however many nodes make it (:func:`distinct_calls`), and gets real
tensors of exactly its shapes and dtypes, never shrunk: the values it receives when
the joint graph runs on the model's parameters and inputs (:func:`capture_samples`),
or random ones made from the metadata alone within the valid range of what integer
inputs index (:func:`synthesize`; :class:`CannotSample` when no range is known).

>>> from examples.models import mlp
>>> from autoshard.trace import trace_joint
>>> calls, nodes = distinct_calls(trace_joint(*mlp.tiny()))
>>> 0 < len(calls) <= nodes
True
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch._ops import OpOverload

from autoshard.rules.calls import bind_args, ordered_tensor_args, replace_tensors
from autoshard.rules.core import TensorMeta
from autoshard.rules.registry import SampleInput, _freeze, describe_call, op_name
from autoshard.rules.samples import Sampler
from autoshard.trace import placeholder_values

__all__ = ["RealCall", "CannotSample", "distinct_calls", "capture_samples", "synthesize"]

aten = torch.ops.aten


@dataclass(slots=True)
class RealCall:
    """One distinct call of a traced graph."""

    op: OpOverload
    args: tuple
    kwargs: dict
    outputs: tuple[TensorMeta | None, ...]
    nodes: list[str] = field(default_factory=list)
    """The graph nodes that make this exact call (the first one is captured)."""

    @property
    def key(self) -> tuple:
        return _call_key(self.op, self.args, self.kwargs, self.outputs)

    def __str__(self) -> str:
        return describe_call(self)  # the rules' own wording of a call, as in their error messages


# --------------------------------------------------------------------------- calls


def _call_key(op: Any, args: Any, kwargs: Mapping[str, Any], outputs: Any) -> tuple:
    return (op, _freeze(tuple(args)), _freeze(dict(kwargs)), _freeze(tuple(outputs)))


def distinct_calls(traced: Any) -> tuple[list[RealCall], int]:
    """The distinct ATen calls of a :class:`~autoshard.trace.TracedGraph`, in
    graph order, and the number of op nodes (``operator.getitem`` excluded)."""
    calls: dict[tuple, RealCall] = {}
    nodes = 0
    for name, info in traced.nodes.items():
        if info.op is operator.getitem or not isinstance(info.op, OpOverload):
            continue
        nodes += 1
        key = _call_key(info.op, info.args, info.kwargs, info.outputs)
        call = calls.get(key)
        if call is None:
            call = calls[key] = RealCall(info.op, tuple(info.args), dict(info.kwargs), tuple(info.outputs))
        call.nodes.append(name)
    return list(calls.values()), nodes


# --------------------------------------------------------------------------- captured samples


def _snapshot(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone().contiguous()
    if isinstance(obj, tuple):
        return tuple(_snapshot(o) for o in obj)
    if isinstance(obj, list):
        return [_snapshot(o) for o in obj]
    if isinstance(obj, dict):
        return {k: _snapshot(v) for k, v in obj.items()}
    return obj


class _Recorder(fx.Interpreter):
    """Runs the joint graph and keeps the real args of the wanted nodes."""

    def __init__(self, module: fx.GraphModule, wanted: set[str]) -> None:
        super().__init__(module)
        self.wanted = wanted
        self.recorded: dict[str, tuple[tuple, dict]] = {}

    def run_node(self, n: fx.Node) -> Any:
        if n.name in self.wanted:
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            self.recorded[n.name] = (_snapshot(tuple(args)), _snapshot(dict(kwargs)))
        return super().run_node(n)


def capture_samples(
    traced: Any,
    values: Mapping[str, torch.Tensor],
    inputs: Sequence[torch.Tensor] | Mapping[str, torch.Tensor],
    calls: Sequence[RealCall],
) -> dict[tuple, SampleInput]:
    """Run the joint graph on real ``values`` (parameter and buffer FQNs ->
    tensors, as :func:`autoshard.trace.run_joint` takes them) and ``inputs``;
    the real args of the first node of each call, keyed by :attr:`RealCall.key`."""
    first = {call.nodes[0]: call.key for call in calls}
    recorder = _Recorder(traced.graph_module, set(first))
    with torch.no_grad():
        recorder.run(*placeholder_values(traced, values, inputs), enable_io_processing=False)
    return {first[name]: SampleInput(args, kwargs) for name, (args, kwargs) in recorder.recorded.items()}


# --------------------------------------------------------------------------- synthesized samples


class CannotSample(ValueError):
    """No valid random inputs are known for this call."""


_POSITIVE_FIRST = {aten.rsqrt.default, aten.sqrt.default, aten.log.default, aten.reciprocal.default}
_NONZERO_SECOND = {aten.floor_divide.default, aten.remainder.Tensor, aten.fmod.Tensor, aten.div.Tensor, aten.div.Tensor_mode}


def _unique_along(shape: tuple[int, ...], dim: int, high: int, gen: torch.Generator) -> torch.Tensor:
    """int64 indices of ``shape`` in ``[0, high)``, distinct along ``dim`` (scatter without collisions)."""
    if shape[dim] > high:
        raise CannotSample(f"{shape[dim]} distinct indices below {high}")
    full = list(shape)
    full[dim] = high
    order = torch.rand(tuple(full), generator=gen).argsort(dim=dim)
    return order.narrow(dim, 0, shape[dim]).contiguous()


def _index_bounds(self_shape: Sequence[int], indices: Sequence[Any]) -> dict[int, int]:
    """Tensor input position -> exclusive bound of its values, for the index tensors
    of ``index`` / ``index_put`` (they follow ``self`` as inputs 1, 2, ...)."""
    bounds, pos = {}, 1
    for k, idx in enumerate(indices):
        if idx is None:
            continue
        if idx.dtype == torch.bool:
            raise CannotSample("boolean index: the output shape depends on how many are true")
        bounds[pos] = self_shape[k]
        pos += 1
    return bounds


def _int_bounds(call: RealCall) -> dict[int, Any]:
    """Tensor input position -> how to draw it: an int bound (values in
    ``[0, bound)``), ``"offsets:N"``, ``"unique:dim:N"``, ``"target:C:ignore"``
    or ``"nonzero"``. Integer inputs not listed are drawn in ``[0, 10)`` where
    the op only computes with them (:data:`_VALUE_INT_OPS`)."""
    op, a = call.op, bind_args(call.op, call.args, call.kwargs)
    if op is aten.embedding.default:
        return {1: a["weight"].shape[0]}
    if op is aten.embedding_dense_backward.default:
        return {1: a["num_weights"]}
    if op is aten.gather.default:
        return {1: a["self"].shape[a["dim"]]}
    if op in (aten.scatter.src, aten.scatter.value):
        return {1: f"unique:{a['dim']}:{a['self'].shape[a['dim']]}"}
    if op in (aten.scatter_add.default, aten.index_add.default):
        dim = a["dim"]
        return {1: a["self"].shape[dim]}
    if op is aten.index_select.default:
        return {1: a["self"].shape[a["dim"]]}
    if op in (aten.nll_loss_forward.default, aten.nll_loss_backward.default):
        x = a["self"]
        classes = x.shape[-1] if x.ndim == 1 else x.shape[1]
        pos = 1 if op is aten.nll_loss_forward.default else 2
        return {pos: f"target:{classes}:{a['ignore_index']}"}
    if op is aten.index.Tensor:
        return _index_bounds(a["self"].shape, a["indices"])
    if op in (aten.index_put.default, aten.index_put_.default):
        if not a.get("accumulate", False):
            raise CannotSample("index_put without accumulate: repeated indices make the result order-dependent")
        return _index_bounds(a["self"].shape, a["indices"])
    if op is aten._grouped_mm.default:
        a_, b_ = a["self"], a["mat2"]
        # the ragged dim: rows of a 2-D mat_a with a 3-D mat_b, else the shared K of two 2-D mats
        total = a_.shape[0] if b_.ndim == 3 else (a_.shape[1] if a_.ndim == 2 and b_.ndim == 2 else a_.shape[-1])
        if a_.ndim == 3 and b_.ndim == 2:
            total = b_.shape[-1]
        return {2: f"offsets:{total}"}
    if op in _NONZERO_SECOND:
        return {1: "nonzero"}
    return {}


def synthesize(call: RealCall, seed: int = 0) -> SampleInput:
    """Random tensors of exactly the call's shapes and dtypes (module
    docstring); raises :class:`CannotSample` when no valid ones are known."""
    sampler = Sampler(seed)
    gen = sampler.gen
    metas = ordered_tensor_args(call.op, call.args, call.kwargs)
    bounds = _int_bounds(call)
    tensors: list[torch.Tensor] = []
    for j, m in enumerate(metas):
        shape, dtype = tuple(m.shape), m.dtype
        how = bounds.get(j)
        if dtype.is_floating_point:
            if j == 0 and call.op in _POSITIVE_FIRST:
                t = sampler.positive(shape, dtype)
            elif how == "nonzero":
                t = sampler.positive(shape, dtype)
            else:
                t = sampler.randn(shape, dtype)
        elif dtype.is_complex:
            t = torch.complex(sampler.randn(shape, torch.float64), sampler.randn(shape, torch.float64)).to(dtype)
        elif dtype == torch.bool:
            t = sampler.bool(shape)
        elif how is None:
            if call.op in _INDEXING_OPS:
                raise CannotSample(f"integer input {j} of {op_name(call.op)}: no known valid range")
            t = sampler.index(shape, 10).to(dtype)
        elif isinstance(how, int):
            if how < 1 and m.numel:
                raise CannotSample(f"integer input {j}: nothing to index")
            t = sampler.index(shape, max(how, 1)).to(dtype)
        elif how == "nonzero":
            t = (sampler.index(shape, 9) + 1).to(dtype)
        elif how.startswith("offsets:"):
            total, groups = int(how.split(":")[1]), m.numel
            cuts = torch.sort(torch.randint(0, total + 1, (max(groups - 1, 0),), generator=gen)).values
            t = torch.cat([cuts, torch.tensor([total])]).to(dtype).reshape(shape)
        elif how.startswith("unique:"):
            _, dim, high = how.split(":")
            t = _unique_along(shape, int(dim) % max(len(shape), 1), int(high), gen).to(dtype)
        else:  # target:C:ignore
            _, classes, ignore = how.split(":")
            t = sampler.index(shape, int(classes))
            if t.numel() > 1:
                t[sampler.bool(shape, 0.2)] = int(ignore)
            t = t.to(dtype)
        tensors.append(t)
    args, kwargs = replace_tensors(call.op, call.args, call.kwargs, tensors)
    return SampleInput(tuple(args), dict(kwargs))


_INDEXING_OPS = {
    aten.embedding.default, aten.embedding_dense_backward.default, aten.gather.default, aten.scatter.src,
    aten.scatter.value, aten.scatter_add.default, aten.scatter_reduce.two, aten.index_select.default,
    aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten.index_add.default,
    aten.nll_loss_forward.default, aten.nll_loss_backward.default, aten._grouped_mm.default,
    aten.bincount.default, aten.histc.default, aten._unsafe_index.Tensor, aten.take_along_dim.default,
    aten.index_copy.default, aten.index_fill.int_Scalar, aten.masked_scatter.default,
}
"""Ops whose integer inputs index something: drawn only within a known range."""
