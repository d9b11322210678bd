"""A traced joint graph for the device type its plan runs on (docs/design.md, "Devices").

autoshard traces on fake CPU tensors, whatever the hardware: a CPU-only torch
cannot run autograd on CUDA fake tensors (its autograd engine asks the CUDA
device guard, which a CPU build lacks, and aborts the process), and a plan is
usually solved on a machine without a GPU. The graph then holds what ATen runs
on a CPU, which differs from what it runs on a GPU in two ways, both mapped
here by :func:`for_device`:

* **device arguments**: factory ops (``full``, ``arange``, ``zeros``, ...)
  carry ``device=cpu``; for a CUDA plan they say ``cuda`` (the runtime puts
  them on the rank's own GPU, ``autoshard.runtime.execute``);
* **fused kernels**: ``F.rms_norm`` (``nn.RMSNorm``) is one kernel on a GPU
  and a handful of ops on a CPU; a trace for CUDA keeps one stand-in node
  (``autoshard.trace.stand_ins``), mapped here to ``aten._fused_rms_norm``
  and its backward;
* **per-device kernels**: scaled dot-product attention is
  ``_scaled_dot_product_flash_attention_for_cpu`` (and its backward) on a CPU.
  On CUDA, ``scaled_dot_product_attention`` picks (``sdp_utils``'s order for
  training on sm80+): the flash kernel for fp16/bf16 inputs without a mask and
  with a head dim that is a multiple of 8 and at most 256, else the
  memory-efficient kernel (fp32, or a mask: its ``attn_bias``). The mapped
  node reads the same inputs and gives the same first two outputs (output,
  logsumexp), so every reader stays as it was; the backward gets the random
  state outputs it reads (seed, offset) and the sequence lengths as numbers,
  as autograd would have traced them on a GPU; the mapped nodes are named after
  their ops, as a trace on a GPU names them. A plan solved for H100s thus
  holds no ``_for_cpu`` op, and its pricing names the kernel that will run.
  A mask computed from no input whose value is the causal mask (what Hugging
  Face's ``create_causal_mask`` materialises while tracing, where eager passes
  ``is_causal=True``: ``autoshard.trace.causal_masks``) is dropped for
  ``is_causal``, so such a call takes the flash kernel, as in eager, and the
  mask's ops leave the graph.

Any other op that has a kernel for one device type only is refused with one
line (:func:`device_kernel_problems` lists them), rather than planned for a
device it cannot run on.

:func:`autoshard.trace.trace_joint` calls :func:`for_device` (its ``target_device``).

>>> from autoshard.trace import trace_joint
>>> from examples.models import llama3
>>> traced = trace_joint(*llama3.tiny(device="meta"), target_device="cuda")  # fp32: the efficient kernel
>>> sorted({str(i.op) for i in traced.nodes.values() if "attention" in str(i.op)})
['aten._scaled_dot_product_efficient_attention.default', 'aten._scaled_dot_product_efficient_attention_backward.default']
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx
from torch._ops import OpOverload

from autoshard.trace.causal_masks import CausalMasks
from autoshard.trace.compat import TraceError
from autoshard.trace.stand_ins import STAND_INS

__all__ = ["DEVICE_TYPES", "CPU_ONLY_OPS", "CUDA_ONLY_OPS", "for_device", "device_kernel_problems", "replace_devices"]

aten = torch.ops.aten

DEVICE_TYPES = ("cpu", "cuda")
"""The device types a plan can target."""

_CPU_FLASH = aten._scaled_dot_product_flash_attention_for_cpu.default
_CPU_FLASH_BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
_FLASH = aten._scaled_dot_product_flash_attention.default
_FLASH_BACKWARD = aten._scaled_dot_product_flash_attention_backward.default
_EFFICIENT = aten._scaled_dot_product_efficient_attention.default
_EFFICIENT_BACKWARD = aten._scaled_dot_product_efficient_attention_backward.default

CPU_ONLY_OPS = frozenset({_CPU_FLASH, _CPU_FLASH_BACKWARD})
"""Ops with a CPU kernel only (what a CPU trace holds and :func:`for_device` maps)."""

CUDA_ONLY_OPS = frozenset({
    _FLASH, _FLASH_BACKWARD, _EFFICIENT, _EFFICIENT_BACKWARD,
    aten._scaled_dot_product_cudnn_attention.default, aten._scaled_dot_product_cudnn_attention_backward.default,
    aten._flash_attention_forward.default, aten._flash_attention_backward.default,
    aten._efficient_attention_forward.default, aten._efficient_attention_backward.default,
})
"""Ops with CUDA kernels only (attention kernels)."""

_ONLY_ON = {**{op: "cpu" for op in CPU_ONLY_OPS}, **{op: "cuda" for op in CUDA_ONLY_OPS}}


def device_kernel_problems(graph: fx.Graph, device_type: str) -> list[str]:
    """``node (op): runs on <type> only`` for each op of ``graph`` that has no kernel
    for ``device_type``; empty when every op can run there.

    >>> g = fx.Graph(); x = g.placeholder("x")
    >>> _ = g.call_function(_CPU_FLASH, (x, x, x)); device_kernel_problems(g, "cuda")
    ['_scaled_dot_product_flash_attention_for_cpu_default (aten._scaled_dot_product_flash_attention_for_cpu.default): runs on cpu only']
    """
    out = []
    for node in graph.nodes:
        only = _ONLY_ON.get(node.target) if node.op == "call_function" else None
        if only is not None and only != device_type:
            out.append(f"{node.name} ({node.target}): runs on {only} only")
    return out


def for_device(graph: fx.Graph, fake_mode: Any, device_type: str) -> None:
    """Change the joint graph ``graph`` (traced on CPU fake tensors owned by
    ``fake_mode``) in place into what runs on ``device_type`` (``cpu``: nothing
    changes; ``cuda``: module docstring); its graph module is recompiled by the caller
    (once, after its own changes). Raises :class:`TraceError` for an
    unknown device type or an op that cannot run there.
    """
    if device_type not in DEVICE_TYPES:
        raise TraceError(f"device type {device_type!r}: autoshard plans for {', '.join(DEVICE_TYPES)}")
    if device_type != "cpu":
        _retarget_devices(graph, torch.device(device_type))
        _cuda_attention(graph, fake_mode)
        _stand_ins(graph, fake_mode)
    problems = device_kernel_problems(graph, device_type)
    if problems:
        raise TraceError(f"{problems[0]}: autoshard has no {device_type} counterpart for it"
                         + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))


def replace_devices(obj: Any, device: torch.device, *, other_types_only: bool = False) -> Any:
    """``obj`` (nested tuples, lists and dicts of arguments) with every ``torch.device``
    replaced by ``device`` (``other_types_only``: only those of another device type, so a
    graph's ``cuda:1`` stays); everything else as it is.

    >>> replace_devices((torch.device("cpu"), [1, {"device": torch.device("cpu")}]), torch.device("cuda:0"))
    (device(type='cuda', index=0), [1, {'device': device(type='cuda', index=0)}])
    """
    if isinstance(obj, torch.device):
        return device if not other_types_only or obj.type != device.type else obj
    if isinstance(obj, (tuple, list)):
        return type(obj)(replace_devices(v, device, other_types_only=other_types_only) for v in obj)
    if isinstance(obj, dict):
        return {k: replace_devices(v, device, other_types_only=other_types_only) for k, v in obj.items()}
    return obj


def _retarget_devices(graph: fx.Graph, device: torch.device) -> None:
    """Every ``torch.device`` argument of a call points at ``device``'s type."""
    for node in graph.nodes:
        if node.op == "call_function":
            node.args = replace_devices(tuple(node.args), device, other_types_only=True)
            node.kwargs = replace_devices(dict(node.kwargs), device, other_types_only=True)


def _stand_ins(graph: fx.Graph, fake_mode: Any) -> None:
    """The stand-ins of ``autoshard.trace.stand_ins`` -> the ATen kernels a GPU runs."""
    for node in list(graph.nodes):
        aten_op = STAND_INS.get(node.target) if node.op == "call_function" else None
        if aten_op is aten._fused_rms_norm_backward.default:
            _replace(graph, node, aten_op, (*node.args, [True, True]), dict(node.kwargs), fake_mode)
        elif aten_op is not None:
            _replace(graph, node, aten_op, tuple(node.args), dict(node.kwargs), fake_mode)


def _uses_flash(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any) -> bool:
    """Whether CUDA's SDPA takes the flash kernel for these inputs (module docstring)."""
    head_dims = {query.shape[-1], key.shape[-1], value.shape[-1]}
    return (mask is None and query.dtype in (torch.float16, torch.bfloat16) and len(head_dims) == 1
            and query.shape[-1] % 8 == 0 and query.shape[-1] <= 256)


def _cuda_attention(graph: fx.Graph, fake_mode: Any) -> None:
    """CPU flash attention (forward and backward) -> the CUDA kernel SDPA picks."""
    random_state: dict[fx.Node, tuple[fx.Node, fx.Node, bool]] = {}  # forward -> (seed, offset, flash)
    causal = CausalMasks()  # one per graph: every layer's attention reads the model's one mask
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is _CPU_FLASH:
            new, *state = _map_forward(graph, node, fake_mode, causal)
            random_state[new] = tuple(state)
        elif node.target is _CPU_FLASH_BACKWARD:
            _map_backward(graph, node, random_state, fake_mode)


def _val(arg: Any) -> Any:
    return arg.meta.get("val") if isinstance(arg, fx.Node) else arg


def _fake_cuda(fake_mode: Any, arg: Any) -> Any:
    """A CUDA fake tensor like ``arg``'s value (None stays None)."""
    value = _val(arg)
    if not isinstance(value, torch.Tensor):
        return value
    with fake_mode:
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="cuda")


def _bound(node: fx.Node) -> dict[str, Any]:
    """The node's arguments by schema name, defaults filled."""
    schema = node.target._schema
    out = {a.name: a.default_value if a.has_default_value() else None for a in schema.arguments}
    out.update(zip((a.name for a in schema.arguments), node.args))
    out.update(node.kwargs)
    return out


def _replace(graph: fx.Graph, node: fx.Node, op: OpOverload, args: tuple, kwargs: dict, fake_mode: Any) -> fx.Node:
    """Put ``op(*args, **kwargs)`` in ``node``'s place (named after its op, as a
    trace on the GPU names it), with its value computed on CUDA fake tensors."""
    with graph.inserting_before(node):
        new = graph.call_function(op, args, kwargs)
    new._rename(op.overloadpacket.__name__)
    new.meta = dict(node.meta)
    fake_args, fake_kwargs = fx.node.map_aggregate((args, kwargs), lambda a: _fake_cuda(fake_mode, a))
    with fake_mode:
        new.meta["val"] = op(*fake_args, **fake_kwargs)
    node.replace_all_uses_with(new)
    graph.erase_node(node)
    for user in new.users:  # the outputs' shapes are the new kernel's (the efficient one pads its logsumexp)
        if user.target is operator.getitem:
            user.meta["val"] = new.meta["val"][user.args[1]]
    return new


def _getitem(graph: fx.Graph, producer: fx.Node, index: int) -> fx.Node:
    """A tuple access of ``producer``'s output ``index`` (made after its last one)."""
    last = producer
    for user in producer.users:
        if user.target is operator.getitem and user > last:
            last = user
    with graph.inserting_after(last):
        got = graph.call_function(operator.getitem, (producer, index))
    got.meta = dict(producer.meta)
    got.meta["val"] = producer.meta["val"][index]
    return got


def _map_forward(graph: fx.Graph, node: fx.Node, fake_mode: Any,
                 causal_masks: CausalMasks) -> tuple[fx.Node, fx.Node, fx.Node, bool]:
    """(the mapped node, its seed and offset accesses, whether it is the flash kernel)."""
    b = _bound(node)
    q, k, v, mask = b["query"], b["key"], b["value"], b["attn_mask"]
    causal = b["is_causal"]
    if mask is not None and not causal and b["dropout_p"] == 0.0 and causal_masks.is_causal(mask):
        mask, causal = None, True  # the call eager makes (autoshard.trace.causal_masks)
    flash = _uses_flash(_val(q), _val(k), _val(v), _val(mask))
    if flash:
        new = _replace(graph, node, _FLASH, (q, k, v, b["dropout_p"], causal, False),
                       {"scale": b["scale"]}, fake_mode)
        return new, _getitem(graph, new, 6), _getitem(graph, new, 7), True
    new = _replace(graph, node, _EFFICIENT, (q, k, v, mask, True, b["dropout_p"], b["is_causal"]),
                   {"scale": b["scale"]}, fake_mode)
    return new, _getitem(graph, new, 2), _getitem(graph, new, 3), False


def _forward_of(arg: Any) -> fx.Node | None:
    """The attention forward whose output ``arg`` takes (``getitem(forward, 0)``)."""
    if isinstance(arg, fx.Node) and arg.target is operator.getitem:
        return arg.args[0]
    return None


def _map_backward(graph: fx.Graph, node: fx.Node, random_state: dict[fx.Node, tuple[fx.Node, fx.Node, bool]],
                  fake_mode: Any) -> None:
    b = _bound(node)
    forward = _forward_of(b["out"])
    if forward not in random_state:
        raise TraceError(f"{node.name}: an attention backward whose forward output is not a traced attention "
                         "forward; autoshard cannot map it to a CUDA kernel")
    seed, offset, flash = random_state[forward]
    q, k, v = b["query"], b["key"], b["value"]
    if flash:
        length_q, length_k = int(_val(q).shape[-2]), int(_val(k).shape[-2])
        mask = b["attn_mask"]
        args = (b["grad_out"], q, k, v, b["out"], b["logsumexp"], None, None, length_q, length_k,
                b["dropout_p"], b["is_causal"] or mask is not None, seed, offset)  # a mask here was causal
        _replace(graph, node, _FLASH_BACKWARD, args, {"scale": b["scale"]}, fake_mode)
        _erase_unused(graph, mask)
        return
    mask = b["attn_mask"]
    grad_mask = [True, True, True, False]  # the mask is no parameter: its gradient is never read
    args = (b["grad_out"], q, k, v, mask, b["out"], b["logsumexp"], seed, offset, b["dropout_p"], grad_mask,
            b["is_causal"])
    _replace(graph, node, _EFFICIENT_BACKWARD, args, {"scale": b["scale"]}, fake_mode)


def _erase_unused(graph: fx.Graph, node: Any) -> None:
    """Erase ``node`` and then each of its inputs that no other node reads (a causal mask the flash
    kernel replaced: its ops would otherwise be priced and run)."""
    stack = [node] if isinstance(node, fx.Node) else []
    while stack:
        n = stack.pop()
        if n.users or n.op != "call_function":
            continue
        inputs = n.all_input_nodes
        graph.erase_node(n)
        stack.extend(inputs)
