"""Trace a model into one joint forward+backward ATen graph, on fake tensors
(``autoshard.trace`` exports its public names).

This is the first stage of the pipeline (docs/architecture.md): everything later (op
rules, the strategy graph, the runtime) reads the :class:`TracedGraph` built
here. The model is called as ``model(*example_inputs)`` (a tuple of
tensors) or ``model(**example_inputs)`` (a dict of keyword tensors) and must
return the scalar loss, or an object or dict whose ``loss`` is that scalar
(Hugging Face ``model(input_ids=..., labels=...)``); the joint graph then holds
the forward, the loss and every gradient.

How: parameters, buffers and inputs are copied as FakeTensors (shapes,
dtypes and strides without storage; ``meta`` tensors become fake tensors on
``device``), and ``aot_export_joint_with_descriptors`` traces the functional
joint graph of a small wrapper module that owns one fake tensor per distinct
parameter or buffer and calls the model with ``torch.func.functional_call``.
Placeholders and outputs carry descriptors, from which the parameter, buffer
and input nodes, the gradient of each parameter, buffer mutations (BatchNorm
statistics) and the loss are read, all by name. The model is left untouched.

Tensor constants: a tensor the forward makes from Python data
(``x[..., [-2], :]`` indexes with a list, ``torch.tensor(start_token)``), or
a real tensor it reads that is neither a parameter, a buffer nor an input (a
plain attribute), is no input of the graph; the trace stores its value on the graph module as an
attribute (``_tensor_constant0``) read by a ``get_attr`` node.
:attr:`TracedGraph.constants` lists them by that name; they are leaves of the
graph like buffers (never a gradient), and
:func:`autoshard.trace.run.constant_value` gives the stored tensor.

Parameters are identified by object, not by module path: a parameter that
two modules share (tied embeddings, ``lm_head.weight = wte.weight``) is one
graph input with one gradient (the sum over its uses), named by its first
``named_parameters()`` name; its other paths are in
:attr:`TracedGraph.param_aliases`. (``aot_export`` alone would collect
``named_parameters(remove_duplicate=False)`` and give each path its own input
and a partial gradient.)

While tracing, ``torch.compiler.is_compiling()`` is true (as in
``torch.export``), so that libraries skip their value-dependent fast paths
(:mod:`autoshard.trace.compat`); a model that still reads tensor values gets
one :class:`DataDependentError` line naming the op and the model's line.

The trace's op order does not depend on the process's hash seed: where the
model's code iterates a set (Gemma 3's ``set(config.layer_types)``), the runs
it traced are put in a canonical order (:mod:`autoshard.trace.canonical`), so
every rank of a job computes the same graph hash and node names.

Every private torch API that autoshard uses for tracing is called from this
module, :mod:`autoshard.trace.compat`, :mod:`autoshard.trace.canonical` or :mod:`autoshard.trace.stamp` only (``torch._functorch``,
``torch._subclasses``), so that a change between torch releases is fixed in
one place.

>>> from examples.models import mlp
>>> traced = trace_joint(*mlp.tiny(device="meta"))
>>> sorted(traced.params)[:2], traced.loss_meta.shape
(['layers.0.w1.bias', 'layers.0.w1.weight'], ())
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch._functorch._aot_autograd import descriptors as aot_desc
from torch._functorch.aot_autograd import aot_export_joint_with_descriptors
from torch._ops import OpOverload
from torch._subclasses.fake_tensor import FakeTensorMode

from autoshard.rules.core import TensorMeta, to_meta
from autoshard.trace.blocks import repeated_blocks
from autoshard.trace.canonical import canonical_order
from autoshard.trace.compat import (
    DataDependentError,
    TraceError,
    data_dependent_error,
    library_tracing,
    meta_attribute_error,
    module_annotations,
    node_module,
)
from autoshard.trace.device import for_device
from autoshard.trace.stamp import stamped_joint
from autoshard.trace.stand_ins import cuda_stand_ins
from autoshard.trace.experts import expert_stand_ins

__all__ = [
    "TensorMeta", "NodeInfo", "TracedGraph", "TraceError", "DataDependentError", "trace_joint", "traced_ops",
    "DEFAULT_DECOMPOSITIONS",
]

aten = torch.ops.aten


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One ``call_function`` node of the joint graph, with its tensor metadata."""

    name: str
    """The fx node's name (unique in the graph; plan files use it)."""

    op: OpOverload | Callable[..., Any]
    """The ATen op (``torch.ops.aten.mm.default``) or, for tuple access, ``operator.getitem``."""

    args: tuple[Any, ...]
    """Positional args with a :class:`TensorMeta` in place of every tensor (``args_meta`` of the rules)."""

    kwargs: Mapping[str, Any]
    """Keyword args, tensors replaced the same way."""

    inputs: tuple[TensorMeta, ...]
    """One entry per tensor argument, args then kwargs, lists flattened."""

    outputs: tuple[TensorMeta | None, ...]
    """One entry per output (``None`` where an output is not a tensor)."""


@dataclass(frozen=True, slots=True)
class TracedGraph:
    """A joint forward+backward graph and what each of its inputs and outputs means.

    All mappings are keyed by name: parameter and buffer fully qualified names
    (``layers.0.attention.wq.weight``; a shared tensor under its first
    ``named_parameters()`` name), the forward's argument names or the keyword
    names for user inputs (``tokens``), fx node names for :attr:`nodes`.
    """

    graph_module: fx.GraphModule
    """The joint graph, called as ``graph_module(primals, [tangent])``
    (see :func:`autoshard.trace.run.run_joint`)."""

    nodes: Mapping[str, NodeInfo]
    """Every ``call_function`` node, in graph order."""

    params: Mapping[str, fx.Node]
    """Parameter FQN -> its placeholder."""

    grads: Mapping[str, fx.Node | None]
    """Parameter FQN -> the node computing its gradient (``None``: no gradient flows)."""

    buffers: Mapping[str, fx.Node]
    """Buffer FQN -> its placeholder."""

    buffer_updates: Mapping[str, fx.Node]
    """Buffer FQN -> the node with its new value, for buffers the step mutates."""

    inputs: Mapping[str, fx.Node]
    """Forward argument name (or keyword of a dict of example inputs) -> its placeholder, in order."""

    tangent: fx.Node
    """Placeholder for d(loss)/d(loss), fed 1.0 in training."""

    loss: fx.Node
    """The node computing the scalar loss."""

    fake_mode: Any
    """The FakeTensorMode that owns every ``node.meta["val"]`` (for re-tracing later stages)."""

    param_aliases: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    """Parameter FQN -> the other module paths of the same tensor (tied weights); only shared ones."""

    buffer_aliases: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    """Buffer FQN -> the other module paths of the same tensor; only shared ones."""

    constants: Mapping[str, fx.Node] = dataclasses.field(default_factory=dict)
    """Tensor constant (the graph module's attribute, ``_tensor_constant0``) -> its ``get_attr`` node, in graph order."""
    module_paths: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """fx node name -> path of the innermost module whose ``forward`` made it
    (``layers.3.attention.wq``); backward ops carry their forward op's module.
    Nodes made outside every submodule (the loss in the root) are absent."""

    blocks: tuple[str, ...] = ()
    """Module paths of the model's repeated blocks, in model order
    (:func:`autoshard.trace.blocks.repeated_blocks`): the recomputation regions."""

    @property
    def loss_meta(self) -> TensorMeta:
        """Metadata of the loss (a scalar)."""
        return TensorMeta.of(self.loss.meta["val"])


def traced_ops(traced: TracedGraph) -> Counter[OpOverload]:
    """How many nodes of each ATen op the joint graph has (tuple access excluded).

    >>> from examples.models import mlp
    >>> traced_ops(trace_joint(*mlp.tiny(device="meta")))[torch.ops.aten.addmm.default]
    4
    """
    return Counter(info.op for info in traced.nodes.values() if isinstance(info.op, OpOverload))


def _nll_mean_as_sums(self: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, reduction: int,
                      ignore_index: int) -> Any:
    """``nll_loss_forward`` with ``mean`` as its two sums: the summed loss over the
    summed weight of the non-ignored targets (exactly what the mean is). A
    batch split of the sums is exact (each rank's sums add up), where the mean
    of each rank's mean is not (ranks hold different numbers of ignored
    targets): plans may then split a cross-entropy over the batch instead of
    gathering the whole log-probabilities on every rank. The backward keeps
    ``nll_loss_backward`` with the global total weight, which splits exactly."""
    if reduction != 1:
        return NotImplemented
    total, count = aten.nll_loss_forward.default(self, target, weight, 2, ignore_index)
    return total / count, count


def _mse_mean_as_sum(self: torch.Tensor, target: torch.Tensor, reduction: int = 1) -> Any:
    """``mse_loss`` with ``mean`` as the summed loss over the global element count
    (a constant of the graph: exactly what the mean is); a batch split of the sum
    is ``P(sum)``, and the division keeps it."""
    if reduction != 1:
        return NotImplemented
    return aten.mse_loss.default(self, target, 2) / self.numel()


def _mse_backward_mean_as_sum(grad_output: torch.Tensor, self: torch.Tensor, target: torch.Tensor,
                              reduction: int) -> Any:
    """``mse_loss_backward`` with ``mean`` as the ``sum`` backward of ``grad_output``
    over the global element count. The ``mean`` kernel divides by the count of the
    slice it is given (a 1/k batch slice gets k times its gradient), so no batch
    split of it is exact and a DDP plan had to gather the output and target at
    the loss; the ``sum`` kernel splits exactly (``autoshard.rules.losses``).
    (Autograd differentiates ``mse_loss`` above the decompositions, so the
    forward's rewrite alone leaves this op ``mean``.)"""
    if reduction != 1:
        return NotImplemented
    return aten.mse_loss_backward.default(grad_output / self.numel(), self, target, 2)


DEFAULT_DECOMPOSITIONS: Mapping[OpOverload, Callable[..., Any]] = {
    aten.nll_loss_forward.default: _nll_mean_as_sums,
    aten.mse_loss.default: _mse_mean_as_sum,
    aten.mse_loss_backward.default: _mse_backward_mean_as_sum,
}
"""Decompositions every trace applies (:func:`trace_joint`): exact rewrites that let rules split more."""


def trace_joint(
    model: nn.Module,
    example_inputs: Sequence[torch.Tensor] | Mapping[str, torch.Tensor],
    *,
    device: str | torch.device = "cpu",
    decompositions: Mapping[OpOverload, Callable[..., Any]] | None = None,
    target_device: str = "cpu",
    stamp: bool = False,
) -> TracedGraph:
    """Trace ``model(*example_inputs)`` or ``model(**example_inputs)`` (the loss) and its backward into one graph.

    The model returns the scalar loss, or an object or dict with a ``loss``
    entry (Hugging Face outputs). Parameters, buffers and inputs may be real,
    ``meta`` or fake; the trace runs on fake tensors placed on ``device``
    (which picks device-specific kernels, e.g. the CPU flash-attention op), so
    it allocates no tensor memory. ``decompositions`` maps ops to Python
    functions that replace them during the trace, added to
    :data:`DEFAULT_DECOMPOSITIONS` (otherwise the graph keeps the ops autograd
    emits). ``aten.detach`` nodes are removed: in a joint graph they are
    identities.

    Raises :class:`TraceError` (a ``ValueError``) with one line when the model
    cannot be traced as given, :class:`DataDependentError` when it reads
    tensor values.

    ``target_device``: the device type the graph will run on (``cpu`` or
    ``cuda``): the trace runs on CPU fake tensors and
    :func:`autoshard.trace.device.for_device` maps what differs per device
    (device arguments, attention kernels) to that type.

    ``stamp``: a stack of at least :data:`~autoshard.trace.stamp.STAMP_MIN_BLOCKS`
    interchangeable blocks (transformer layers) is traced as three blocks and
    the rest stamped out from them (:mod:`autoshard.trace.stamp`: the same graph,
    node for node, checked on four blocks; LLaMA-3 8B 10.6 -> ~3 s); where it does
    not apply, the model is traced whole. Planning passes it; the runtime does not.

    >>> from examples.models import llama3
    >>> traced = trace_joint(*llama3.tiny(device="meta"))
    >>> list(traced.inputs), traced.grads["norm.weight"] is not None
    (['tokens', 'labels'], True)
    """
    if isinstance(example_inputs, Mapping):
        input_names, values, by_keyword = list(example_inputs), list(example_inputs.values()), True
    else:
        values, by_keyword = list(example_inputs), False
        input_names = _input_names(model, len(values))
    for name, value in zip(input_names, values):
        if not isinstance(value, torch.Tensor):
            raise TraceError(f"example input {name!r} must be a tensor, got {type(value).__name__}")

    def trace() -> _Joint:
        return _joint(model, values, input_names if by_keyword else None, torch.device(device),
                      {**DEFAULT_DECOMPOSITIONS, **(decompositions or {})}, target_device)

    stamped = stamped_joint(model, trace, lambda m: _model_slots(m)[0]) if stamp else None
    if stamped is None:
        joint = trace()
        graph_module, slot_names = joint.graph_module, joint.slot_names
        param_aliases, buffer_aliases = joint.param_aliases, joint.buffer_aliases
        for_device(graph_module.graph, joint.fake_mode, target_device)
        graph_module.recompile()
    else:  # for_device after stamping: what it adds (the device's attention kernels) is named as in a whole trace
        joint, graph = stamped
        slot_names, param_aliases, buffer_aliases = _model_slots(model)
        for_device(graph, joint.fake_mode, target_device)
        graph_module = fx.GraphModule(joint.graph_module, graph)
    traced = _describe(
        graph_module, input_names, joint.fake_mode, names=slot_names,
        param_aliases=param_aliases, buffer_aliases=buffer_aliases,
    )
    paths = {n.name: path for n in graph_module.graph.nodes if n.op == "call_function"
             and (path := node_module(n)) is not None}
    return dataclasses.replace(traced, module_paths=paths, blocks=repeated_blocks(model))


@dataclass(frozen=True, slots=True)
class _Joint:
    """One trace's joint graph and how its inputs map to the model."""

    graph_module: fx.GraphModule
    fake_mode: FakeTensorMode
    slot_names: dict[str, str]
    param_aliases: dict[str, tuple[str, ...]]
    buffer_aliases: dict[str, tuple[str, ...]]


def _joint(model: nn.Module, values: list[torch.Tensor], keywords: list[str] | None, target: torch.device,
           decompositions: Mapping[OpOverload, Callable[..., Any]], target_device: str) -> _Joint:
    """The joint graph of ``model`` as it is now (:func:`trace_joint`'s trace, before
    :func:`~autoshard.trace.device.for_device`; not recompiled)."""
    # a real tensor the forward reads that is no parameter, buffer or input (a plain
    # attribute) is converted on the fly and becomes a constant of the graph
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    params, param_aliases = _unique_tensors(model.named_parameters(remove_duplicate=False))
    buffers, buffer_aliases = _unique_tensors(model.named_buffers(remove_duplicate=False))
    with fake_mode:
        fake_params = {
            name: nn.Parameter(_to_fake(fake_mode, p, target), requires_grad=p.requires_grad)
            for name, p in params.items()
        }
        fake_buffers = {name: _to_fake(fake_mode, b, target) for name, b in buffers.items()}
        fake_inputs = tuple(_to_fake(fake_mode, value, target) for value in values)
    wrapper = _LossOf(model, fake_params, fake_buffers, {**param_aliases, **buffer_aliases}, keywords)
    try:
        with contextlib.ExitStack() as stack, library_tracing(), module_annotations(model):
            stack.enter_context(expert_stand_ins())  # MoE experts as one node (autoshard.trace.experts)
            if target_device == "cuda":  # kernels only a GPU run calls (autoshard.trace.stand_ins)
                stack.enter_context(cuda_stand_ins())
            joint = aot_export_joint_with_descriptors(stack, wrapper, fake_inputs, decompositions=decompositions)
            graph_module = joint.graph_module
    except TraceError:
        raise
    except Exception as exc:  # a model reading tensor values: one line instead of a torch-internal trace
        error = data_dependent_error(exc) or meta_attribute_error(exc)
        if error is None:
            raise
        raise error from exc
    _remove_detach(graph_module)
    # the model's code may iterate a set (Gemma 3's attention types): op order and names
    # must not follow the hash seed, or ranks with different seeds refuse each other's plan
    canonical_order(graph_module.graph)
    return _Joint(graph_module, fake_mode, wrapper.slot_names, param_aliases, buffer_aliases)


def _model_slots(model: nn.Module) -> tuple[dict[str, str], dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
    """``(slot -> FQN, parameter aliases, buffer aliases)`` as :class:`_LossOf` names ``model``'s tensors."""
    params, param_aliases = _unique_tensors(model.named_parameters(remove_duplicate=False))
    buffers, buffer_aliases = _unique_tensors(model.named_buffers(remove_duplicate=False))
    return _slot_names(params, buffers), param_aliases, buffer_aliases


def _slot_names(params: Iterable[str], buffers: Iterable[str]) -> dict[str, str]:
    """Slot -> FQN: ``p<i>`` for the i-th distinct parameter, ``b<i>`` for the i-th buffer
    (the descriptor targets of a trace; slot names cannot contain dots)."""
    return {f"p{i}": name for i, name in enumerate(params)} | {f"b{i}": name for i, name in enumerate(buffers)}


def _input_names(model: nn.Module, count: int) -> list[str]:
    """Names of the forward's first ``count`` positional parameters (``input{i}`` past ``*args``)."""
    names: list[str] = []
    for param in inspect.signature(model.forward).parameters.values():
        if param.kind not in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            break
        names.append(param.name)
    names = names[:count]
    return names + [f"input{i}" for i in range(len(names), count)]


def _to_fake(fake_mode: FakeTensorMode, value: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A fake copy of ``value`` on ``device`` (no storage is allocated)."""
    fake = fake_mode.from_tensor(value)
    return fake if fake.device == device else fake.to(device)


def _unique_tensors(
    named: Iterable[tuple[str, torch.Tensor]],
) -> tuple[dict[str, torch.Tensor], dict[str, tuple[str, ...]]]:
    """``(first name -> tensor, first name -> its other names)`` of a ``remove_duplicate=False`` listing.

    The first name is the one ``named_parameters()`` keeps when it removes duplicates.
    """
    first: dict[int, str] = {}
    tensors: dict[str, torch.Tensor] = {}
    others: dict[str, list[str]] = {}
    for name, tensor in named:
        if id(tensor) in first:
            others.setdefault(first[id(tensor)], []).append(name)
        else:
            first[id(tensor)] = name
            tensors[name] = tensor
    return tensors, {name: tuple(paths) for name, paths in others.items()}


class _LossOf(nn.Module):
    """What ``aot_export`` traces: one slot per distinct tensor of ``model``, and the loss as output.

    ``aot_export`` lifts every ``named_parameters(remove_duplicate=False)``
    path of the module it is given into an input of its own; given this
    wrapper, it sees each shared tensor once. The model is not a submodule
    (its paths would be lifted again): ``forward`` puts the traced slot values
    at every path of the model with ``functional_call``.
    """

    def __init__(
        self,
        model: nn.Module,
        params: Mapping[str, nn.Parameter],
        buffers: Mapping[str, torch.Tensor],
        aliases: Mapping[str, tuple[str, ...]],
        keywords: list[str] | None,
    ) -> None:
        super().__init__()
        object.__setattr__(self, "model", model)
        self.keywords = keywords
        self.paths: dict[str, tuple[str, ...]] = {}
        # slot names cannot contain dots; slot_names maps them back to FQNs
        self.slot_names: dict[str, str] = _slot_names(params, buffers)
        slot_of = {name: slot for slot, name in self.slot_names.items()}
        for name, param in params.items():
            self.register_parameter(slot_of[name], param)
        for name, buffer in buffers.items():
            self.register_buffer(slot_of[name], buffer)
        self.paths = {slot: (name, *aliases.get(name, ())) for slot, name in self.slot_names.items()}

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        state = {path: getattr(self, slot) for slot, paths in self.paths.items() for path in paths}
        if self.keywords is None:
            args, kwargs = inputs, {}
        else:
            args, kwargs = (), dict(zip(self.keywords, inputs))
        return _loss_of(torch.func.functional_call(self.model, state, args, kwargs, tie_weights=False))


def _loss_of(output: Any) -> torch.Tensor:
    """The loss tensor of a model's output: the output itself, ``output["loss"]`` or ``output.loss``."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping):
        loss = output.get("loss")
    elif hasattr(output, "loss"):
        loss = output.loss
    else:
        raise TraceError(
            "forward must return the scalar loss, or an object or dict with a 'loss' entry; "
            f"got {type(output).__name__}"
        )
    if not isinstance(loss, torch.Tensor):
        raise TraceError(
            f"the model's output ({type(output).__name__}) has no loss tensor (loss is {type(loss).__name__}): "
            "pass the labels among the example inputs"
        )
    return loss


def _remove_detach(graph_module: fx.GraphModule) -> None:
    """Replace ``aten.detach`` nodes by their input: no autograd runs on the joint graph."""
    graph = graph_module.graph
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is aten.detach.default:
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)


def _describe(
    graph_module: fx.GraphModule,
    input_names: list[str],
    fake_mode: FakeTensorMode,
    *,
    names: Mapping[str, str],
    param_aliases: Mapping[str, tuple[str, ...]],
    buffer_aliases: Mapping[str, tuple[str, ...]],
) -> TracedGraph:
    """Read the descriptors on placeholders and outputs into a :class:`TracedGraph`.

    ``names`` maps the traced wrapper's slot names (descriptor targets) to FQNs of the model.
    """
    params: dict[str, fx.Node] = {}
    buffers: dict[str, fx.Node] = {}
    inputs: dict[int, fx.Node] = {}
    tangents: list[fx.Node] = []
    constants: dict[str, fx.Node] = {}
    nodes: dict[str, NodeInfo] = {}
    output_node = None
    for node in graph_module.graph.nodes:
        if node.op == "placeholder":
            desc = node.meta["desc"]
            if isinstance(desc, aot_desc.ParamAOTInput):
                params[names[desc.target]] = node
            elif isinstance(desc, aot_desc.BufferAOTInput):
                buffers[names[desc.target]] = node
            elif isinstance(desc, aot_desc.PlainAOTInput):
                inputs[desc.idx] = node
            elif isinstance(desc, aot_desc.TangentAOTInput):
                tangents.append(node)
            else:
                raise TraceError(f"unsupported graph input {node.name}: {desc} (tensor subclass or aliased input?)")
        elif node.op == "call_function":
            nodes[node.name] = _node_info(node)
        elif node.op == "get_attr":
            if not isinstance(getattr(graph_module, node.target, None), torch.Tensor):
                raise TraceError(f"unsupported graph node {node.name}: reads attribute {node.target!r}, which is "
                                 "not a tensor (a control-flow subgraph?)")
            constants[str(node.target)] = node
        elif node.op == "output":
            output_node = node
    if output_node is None:
        raise TraceError("the traced graph has no output")

    grads: dict[str, fx.Node | None] = {fqn: None for fqn in params}
    buffer_updates: dict[str, fx.Node] = {}
    losses: list[fx.Node] = []
    for value, desc in zip(output_node.args[0], output_node.meta["desc"]):
        if isinstance(desc, aot_desc.GradAOTOutput) and isinstance(desc.grad_of, aot_desc.ParamAOTInput):
            grads[names[desc.grad_of.target]] = value
        elif isinstance(desc, aot_desc.InputMutationAOTOutput) and isinstance(desc.mutated_input, aot_desc.BufferAOTInput):
            buffer_updates[names[desc.mutated_input.target]] = value
        elif isinstance(desc, aot_desc.PlainAOTOutput):
            losses.append(value)
    if len(losses) != 1 or len(tangents) != 1:
        raise TraceError(f"forward must return exactly one tensor (the loss), got {len(losses)} outputs")
    loss_meta = TensorMeta.of(losses[0].meta["val"])
    if loss_meta.shape != ():
        raise TraceError(f"forward must return a scalar loss, got shape {loss_meta.shape}")
    return TracedGraph(
        graph_module=graph_module, nodes=nodes, params=params, grads=grads, buffers=buffers,
        buffer_updates=buffer_updates,
        inputs={input_names[idx]: inputs[idx] for idx in sorted(inputs)},
        tangent=tangents[0], loss=losses[0], fake_mode=fake_mode,
        param_aliases=dict(param_aliases), buffer_aliases=dict(buffer_aliases), constants=constants,
    )


def _node_info(node: fx.Node) -> NodeInfo:
    """The op and tensor metadata of one ``call_function`` node."""
    args, kwargs = to_meta(fx.node.map_arg((tuple(node.args), dict(node.kwargs)), lambda arg: arg.meta.get("val")))
    inputs: list[TensorMeta] = []
    fx.node.map_arg((node.args, node.kwargs), lambda arg: _collect_tensor(arg, inputs))
    value = node.meta.get("val")
    values = value if isinstance(value, (tuple, list)) else (value,)
    outputs = tuple(TensorMeta.of(v) if isinstance(v, torch.Tensor) else None for v in values)
    return NodeInfo(name=node.name, op=node.target, args=args, kwargs=kwargs, inputs=tuple(inputs), outputs=outputs)


def _collect_tensor(arg: fx.Node, into: list[TensorMeta]) -> fx.Node:
    """Append the metadata of ``arg`` to ``into`` when it is a tensor."""
    value = arg.meta.get("val")
    if isinstance(value, torch.Tensor):
        into.append(TensorMeta.of(value))
    return arg
