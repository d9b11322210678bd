"""Compute descriptions (:class:`~autoshard.rules.core.OpCompute`) of op
families, from the shapes in a call; pass a call with local shard shapes to
price one rank. Each factory returns a function ``OpCall -> OpCompute``.

Counting conventions: a multiply-add is 2 FLOPs; bytes are what the kernel
touches, read or written once (caches ignored: a roofline input, not a
simulation). For most ops that is every tensor operand read once plus every
output written once (:func:`io_bytes`). Ops that touch less or more than
their operands count what they touch:

* gathers (``embedding``, ``index_select``, ``gather``, ``index.Tensor``)
  read only the selected rows, not the table: ``2 * out + indices``;
* out-of-place scatters (``scatter``, ``scatter_add``, ``index_add``,
  ``index_put``) copy ``self`` and touch only the indexed elements:
  ``2 * self + indices + k * touched`` (``k`` = 2 for a write of ``src``
  values, 3 for a read-modify-write, 1 for a scalar fill);
* ``embedding_dense_backward`` zero-fills the weight gradient, then adds the
  ``N`` gradient rows into it: ``grad_weight + grad_output + 2 * N rows + indices``;
* ``nll_loss_forward`` reads one log-probability (and weight) per target,
  not the whole ``[N, C]`` input; ``nll_loss_backward`` zero-fills
  ``[N, C]`` and writes ``N`` values;
* ``slice_backward`` / ``select_backward`` / ``constant_pad_nd`` fill their
  output and copy the input in: ``out + 2 * in``; ``slice_scatter`` /
  ``select_scatter`` copy ``self`` and then the source: ``2 * self + 2 * src``;
* causal attention does the (query, key) pairs under the diagonal only
  (:func:`attention_compute`).

>>> import torch
>>> from autoshard.rules.core import OpCall, TensorMeta
>>> a, b, c = TensorMeta((8, 4), torch.float32), TensorMeta((4, 2), torch.float32), TensorMeta((8, 2), torch.float32)
>>> einsum_compute("mk,kn->mn")(OpCall(torch.ops.aten.mm.default, (a, b), {}, (a, b), (c,)))
OpCompute(kind='matmul', flops=128.0, bytes_accessed=224.0)
"""

from __future__ import annotations

import math
from typing import Callable

from autoshard.rules.core import OpCall, OpCompute, TensorMeta

__all__ = [
    "io_bytes",
    "elementwise",
    "reduction",
    "copy",
    "allocation",
    "view",
    "einsum_compute",
    "attention_compute",
    "causal_pairs",
    "pow_scalar_compute",
    "gather_compute",
    "scatter_compute",
    "index_add_compute",
    "index_put_compute",
    "embedding_backward_compute",
    "nll_loss_forward_compute",
    "nll_loss_backward_compute",
    "fill_copy_compute",
    "scatter_into_compute",
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


def allocation(*, written: bool) -> ComputeFn:
    """A tensor made from nothing but sizes (``empty``, ``zeros``, ``new_full``, ``fill``): no
    input is read, however large the tensor it takes its dtype and device from; ``written``: its
    output is filled (zeros, ones, a value), else it is only allocated (``empty``: no kernel)."""

    def compute(call: OpCall) -> OpCompute:
        if not written:
            return OpCompute("view", 0.0, 0.0)
        return OpCompute("copy", 0.0, float(sum(m.nbytes for m in call.outputs if m is not None)))

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


def causal_pairs(sq: int, sk: int) -> int:
    """(query, key) pairs a causal mask keeps: query ``i`` sees keys ``j <= i``
    (torch's ``is_causal``, aligned top-left).

    >>> causal_pairs(4, 4), causal_pairs(2, 4), causal_pairs(4, 2)
    (10, 3, 7)
    """
    if sq <= sk:
        return sq * (sq + 1) // 2
    return sk * (sk + 1) // 2 + (sq - sk) * sk


def attention_compute(*, backward: bool) -> ComputeFn:
    """Scaled dot-product attention on ``[B, H, S_q, D]`` queries and
    ``[B, H_kv, S_k, D(v)]`` keys/values: ``QK^T`` and ``PV`` are 2 matmuls of
    ``2*B*H*pairs*D`` FLOPs each, ``pairs`` = ``S_q*S_k``, or
    :func:`causal_pairs` with ``is_causal`` (flash kernels skip the blocks
    above the diagonal); the backward recomputes ``QK^T`` and does four more
    (2.5x the forward), and is its own kind (``attention_backward``: it reaches
    another fraction of peak than the forward).

    >>> import torch
    >>> from autoshard.rules.core import TensorMeta
    >>> q = TensorMeta((1, 2, 4, 8), torch.float32)
    >>> op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    >>> attention_compute(backward=False)(OpCall(op, (q, q, q), {}, (q, q, q), (q,), {"is_causal": True})).flops
    640.0
    """

    def compute(call: OpCall) -> OpCompute:
        offset = 1 if backward else 0  # backward starts with grad_out
        q, k = call.inputs[offset], call.inputs[offset + 1]
        b, h, sq, d = q.shape[0], q.shape[1], q.shape[-2], q.shape[-1]
        sk = k.shape[-2]
        pairs = causal_pairs(sq, sk) if call.arg("is_causal", False) else sq * sk
        flops = 4.0 * b * h * pairs * d
        if backward:
            flops *= 2.5
        return OpCompute("attention_backward" if backward else "attention", flops, io_bytes(call))

    return compute


def _named(call: OpCall) -> dict[str, list[TensorMeta]]:
    """Tensor inputs by schema argument name (a ``Tensor[]`` gives several)."""
    out: dict[str, list[TensorMeta]] = {}
    for name, meta in zip(call.tensor_names(), call.inputs):
        out.setdefault(name, []).append(meta)
    return out


def _first_output(call: OpCall) -> TensorMeta:
    return next(m for m in call.outputs if m is not None)


def gather_compute(*, index_names: tuple[str, ...] = ("index", "indices")) -> ComputeFn:
    """A gather (``embedding``, ``index_select``, ``gather``, ``index.Tensor``):
    reads the selected elements and writes them, plus the indices:
    ``2 * out + indices``.

    >>> import torch
    >>> from autoshard.rules.core import TensorMeta
    >>> w, i, o = TensorMeta((1000, 64), torch.float32), TensorMeta((8,), torch.int64), TensorMeta((8, 64), torch.float32)
    >>> op = torch.ops.aten.embedding.default
    >>> gather_compute()(OpCall(op, (w, i), {}, (w, i), (o,), {"weight": w, "indices": i})).bytes_accessed
    4160.0
    """

    def compute(call: OpCall) -> OpCompute:
        named = _named(call)
        index_bytes = sum(m.nbytes for n in index_names for m in named.get(n, ()))
        return OpCompute("copy", 0.0, 2.0 * _first_output(call).nbytes + index_bytes)

    return compute


def scatter_compute(*, touch: int) -> ComputeFn:
    """Out-of-place ``scatter`` (``touch`` = 2: read ``src``, write),
    ``scatter.value`` (1: write) and ``scatter_add`` (3: read ``src``, read
    and write ``self``): copy ``self``, then touch ``index.numel`` elements.

    >>> import torch
    >>> from autoshard.rules.core import TensorMeta
    >>> x, i = TensorMeta((100, 10), torch.float32), TensorMeta((5, 10), torch.int64)
    >>> op = torch.ops.aten.scatter_add.default
    >>> call = OpCall(op, (x, 0, i, i), {}, (x, i, TensorMeta((5, 10), torch.float32)), (x,), {"self": x, "index": i, "src": i})
    >>> scatter_compute(touch=3)(call).bytes_accessed  # 2*4000 + 400 + 3*50*4
    9000.0
    """

    def compute(call: OpCall) -> OpCompute:
        named = _named(call)
        this, index = named["self"][0], named["index"][0]
        touched = float(index.numel * this.itemsize)
        flops = float(index.numel) if touch == 3 else 0.0
        return OpCompute("copy", flops, 2.0 * this.nbytes + index.nbytes + touch * touched)

    return compute


def index_add_compute(call: OpCall) -> OpCompute:
    """Out-of-place ``index_add``: copy ``self``, read ``source``, read and
    write the rows it adds into: ``2 * self + index + 3 * source``."""
    named = _named(call)
    this, source = named["self"][0], named["source"][0]
    index = sum(m.nbytes for m in named.get("index", ()))
    return OpCompute("copy", float(source.numel), 2.0 * this.nbytes + index + 3.0 * source.nbytes)


def index_put_compute(call: OpCall) -> OpCompute:
    """Out-of-place ``index_put``: copy ``self``, write the indexed elements
    from ``values`` (read and write them too with ``accumulate``)."""
    named = _named(call)
    this = named["self"][0]
    values = sum(m.nbytes for m in named.get("values", ()))
    indices = sum(m.nbytes for m in named.get("indices", ()))
    touch = 3.0 if call.arg("accumulate", False) else 2.0
    return OpCompute("copy", 0.0, 2.0 * this.nbytes + indices + touch * values)


def embedding_backward_compute(call: OpCall) -> OpCompute:
    """``embedding_dense_backward``: zero-fill ``[V, D]``, then add each of
    the ``N`` gradient rows into its row (read and write):
    ``grad_weight + grad_output + 2 * grad_output + indices``.

    >>> import torch
    >>> from autoshard.rules.core import TensorMeta
    >>> g, i, o = TensorMeta((8, 64), torch.float32), TensorMeta((8,), torch.int64), TensorMeta((1000, 64), torch.float32)
    >>> op = torch.ops.aten.embedding_dense_backward.default
    >>> embedding_backward_compute(OpCall(op, (g, i, 1000, -1, False), {}, (g, i), (o,), {"grad_output": g, "indices": i})).bytes_accessed
    262208.0
    """
    named = _named(call)
    grad = named["grad_output"][0]
    indices = sum(m.nbytes for m in named.get("indices", ()))
    return OpCompute("copy", float(grad.numel), _first_output(call).nbytes + 3.0 * grad.nbytes + indices)


def nll_loss_forward_compute(call: OpCall) -> OpCompute:
    """``nll_loss_forward``: one log-probability (and one weight) per target,
    summed: ``N`` reads of the input, not ``N * C``.

    >>> import torch
    >>> from autoshard.rules.core import TensorMeta
    >>> x, t = TensorMeta((512, 2048), torch.float32), TensorMeta((512,), torch.int64)
    >>> out = (TensorMeta((), torch.float32), TensorMeta((), torch.float32))
    >>> nll_loss_forward_compute(OpCall(torch.ops.aten.nll_loss_forward.default, (x, t, None, 1, -100), {}, (x, t), out, {"self": x, "target": t}))
    OpCompute(kind='elementwise', flops=1024.0, bytes_accessed=6152.0)
    """
    named = _named(call)
    this, target = named["self"][0], named["target"][0]
    n = target.numel
    weight = this.itemsize * n if "weight" in named else 0
    outputs = sum(m.nbytes for m in call.outputs if m is not None)
    return OpCompute("elementwise", 2.0 * n, float(target.nbytes + this.itemsize * n + weight + outputs))


def nll_loss_backward_compute(call: OpCall) -> OpCompute:
    """``nll_loss_backward``: zero-fill the ``[N, C]`` gradient and write one
    value per target (``self`` is read for its shape only)."""
    named = _named(call)
    target = named["target"][0]
    out = _first_output(call)
    n = target.numel
    small = sum(m.nbytes for name in ("grad_output", "total_weight") for m in named.get(name, ()))
    weight = out.itemsize * n if "weight" in named else 0
    return OpCompute("elementwise", 2.0 * n, float(out.nbytes + target.nbytes + out.itemsize * n + weight + small))


def fill_copy_compute(*, source: str) -> ComputeFn:
    """An op that fills its output and copies input ``source`` into part of
    it (``slice_backward``, ``select_backward``, ``constant_pad_nd``):
    ``out + 2 * in``."""

    def compute(call: OpCall) -> OpCompute:
        inp = _named(call)[source][0]
        return OpCompute("copy", 0.0, float(_first_output(call).nbytes + 2 * inp.nbytes))

    return compute


def scatter_into_compute(call: OpCall) -> OpCompute:
    """``slice_scatter`` / ``select_scatter``: copy ``self``, then ``src`` into
    its slice: ``2 * self + 2 * src``."""
    named = _named(call)
    return OpCompute("copy", 0.0, float(2 * named["self"][0].nbytes + 2 * named["src"][0].nbytes))


_POW_FAST = {2.0: 1.0, 3.0: 2.0, 0.5: 2.0, -0.5: 2.0, -1.0: 1.0, -2.0: 2.0, 1.0: 0.0}
"""FLOPs per element of ``pow(x, p)`` for the exponents kernels turn into
multiplies and square roots (``x*x`` for 2, ``sqrt`` for 0.5, as ``sqrt`` /
``rsqrt`` / ``reciprocal`` count); other exponents are exp(p log x): 4."""


def pow_scalar_compute(call: OpCall) -> OpCompute:
    """``pow.Tensor_Scalar``: FLOPs by exponent (:data:`_POW_FAST`).

    >>> import torch
    >>> from autoshard.rules.core import TensorMeta
    >>> x = TensorMeta((4, 256), torch.float32)
    >>> call = OpCall(torch.ops.aten.pow.Tensor_Scalar, (x, 2), {}, (x,), (x,), {"exponent": 2})
    >>> pow_scalar_compute(call).flops
    1024.0
    """
    exponent = call.arg("exponent", 0.0)
    per = _POW_FAST.get(float(exponent), 4.0) if isinstance(exponent, (int, float)) else 4.0
    return OpCompute("elementwise", per * _out_numel(call), io_bytes(call))
