"""Compute descriptions (:class:`~autoshard.rules.core.OpCompute`) of op
families, from the shapes in a call; pass a call with local shard shapes to
price one rank. Each factory returns a function ``OpCall -> OpCompute``.

Counting conventions: a multiply-add is 2 FLOPs; bytes are every tensor
operand read once plus every output written once (caches ignored: a roofline
input, not a simulation).

>>> import torch
>>> from autoshard.rules.core import OpCall, TensorMeta
>>> a, b, c = TensorMeta((8, 4), torch.float32), TensorMeta((4, 2), torch.float32), TensorMeta((8, 2), torch.float32)
>>> einsum_compute("mk,kn->mn")(OpCall(torch.ops.aten.mm.default, (a, b), {}, (a, b), (c,)))
OpCompute(kind='matmul', flops=128.0, bytes_accessed=224.0)
"""

from __future__ import annotations

import math
from typing import Callable

from autoshard.rules.core import OpCall, OpCompute

__all__ = [
    "io_bytes",
    "elementwise",
    "reduction",
    "copy",
    "view",
    "einsum_compute",
    "attention_compute",
]

ComputeFn = Callable[[OpCall], OpCompute]


def io_bytes(call: OpCall) -> float:
    """Bytes of every tensor input and output of the call."""
    total = sum(m.nbytes for m in call.inputs)
    total += sum(m.nbytes for m in call.outputs if m is not None)
    return float(total)


def _out_numel(call: OpCall) -> int:
    outs = [m.numel for m in call.outputs if m is not None]
    if outs:
        return max(outs)
    return max((m.numel for m in call.inputs), default=0)


def elementwise(flops_per_element: float = 1.0) -> ComputeFn:
    """Pointwise work: ``flops_per_element`` per output element."""

    def compute(call: OpCall) -> OpCompute:
        return OpCompute("elementwise", flops_per_element * _out_numel(call), io_bytes(call))

    return compute


def reduction(flops_per_element: float = 1.0) -> ComputeFn:
    """A reduction: ``flops_per_element`` per element of the largest input."""

    def compute(call: OpCall) -> OpCompute:
        n = max((m.numel for m in call.inputs), default=0)
        return OpCompute("reduction", flops_per_element * n, io_bytes(call))

    return compute


def copy() -> ComputeFn:
    """Data movement only (cat, gather, index, contiguous copies)."""

    def compute(call: OpCall) -> OpCompute:
        return OpCompute("copy", 0.0, io_bytes(call))

    return compute


def view() -> ComputeFn:
    """Metadata only: no FLOPs, no bytes."""

    def compute(call: OpCall) -> OpCompute:
        return OpCompute("view", 0.0, 0.0)

    return compute


def einsum_letters(equation: str) -> tuple[list[str], str]:
    """``"mk,kn->mn"`` -> (["mk", "kn"], "mn")."""
    lhs, out = equation.replace(" ", "").split("->")
    return lhs.split(","), out


def einsum_compute(equation: str, *, first_input: int = 0) -> ComputeFn:
    """Matmul-like work: 2 FLOPs per point of the iteration space of the
    einsum (every letter's size multiplied). ``first_input`` skips leading
    tensor inputs that the equation does not name (the bias of addmm)."""
    ins, _ = einsum_letters(equation)

    def compute(call: OpCall) -> OpCompute:
        sizes: dict[str, int] = {}
        for letters, meta in zip(ins, call.inputs[first_input:]):
            for letter, size in zip(letters, meta.shape):
                sizes[letter] = max(sizes.get(letter, 1), size)
        flops = 2.0 * math.prod(sizes.values())
        return OpCompute("matmul", flops, io_bytes(call))

    return compute


def attention_compute(*, backward: bool) -> ComputeFn:
    """Scaled dot-product attention on ``[B, H, S_q, D]`` queries and
    ``[B, H_kv, S_k, D(v)]`` keys/values: ``QK^T`` and ``PV`` are 2 matmuls of
    ``2*B*H*S_q*S_k*D`` FLOPs each; the backward recomputes ``QK^T`` and does
    four more (2.5x the forward)."""

    def compute(call: OpCall) -> OpCompute:
        offset = 1 if backward else 0  # backward starts with grad_out
        q, k = call.inputs[offset], call.inputs[offset + 1]
        b, h, sq, d = q.shape[0], q.shape[1], q.shape[-2], q.shape[-1]
        sk = k.shape[-2]
        flops = 4.0 * b * h * sq * sk * d
        if backward:
            flops *= 2.5
        return OpCompute("attention", flops, io_bytes(call))

    return compute
