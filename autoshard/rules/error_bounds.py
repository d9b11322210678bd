"""Forward error bounds of ops whose rounding depends on the kernel, for the
validator's comparisons.

A BLAS kernel may add the products of a dot product in any order, block them,
fuse multiply-adds, and scale by ``alpha`` before or after (MKL's small-matrix
path computes ``(alpha * A) @ B`` for three rows or fewer, its blocked path
``alpha * (A @ B)``). A sharded run calls the kernel on other shapes, so it
rounds, and near the dtype's range overflows, elsewhere than the unsharded
run. A fixed relative tolerance is then either too tight (a value near
``finfo.max`` becomes ``inf`` in one run only) or too loose. The validator
instead compares each computed value with an exact reference (the op in
float64) within a bound that holds for EVERY evaluation order.

Dot product (Higham, *Accuracy and Stability of Numerical Algorithms*, 3.1):
for ``s = sum_{i<k} a_i b_i`` evaluated in any order in a floating type of
unit roundoff ``u``, without overflow,

    |fl(s) - s| <= gamma_k * sum_i |a_i| |b_i|,   gamma_n = n u / (1 - n u).

``beta * c + alpha * s`` adds three roundings (the two scalings and the final
add), so with ``M = |alpha| sum|a||b| + |beta| |c|``

    |fl(out) - out| <= gamma_{k+3} * M.

Complex products round twice per term (real and imaginary parts): ``n`` is
doubled. bfloat16 and float16 operands are accumulated in float32 by
PyTorch's CPU kernels (and by cuBLAS): a product of two half values is exact
in float32, the sum rounds with float32's ``u``; the scalings by alpha and
beta and the final add may round in the dtype itself (``addr`` is an
elementwise kernel), four roundings in all, so for them

    |fl(out) - out| <= (gamma_{k+3}(u_float32) + gamma_4(u_dtype)) * M.

(With the dtype's own ``u`` the bound would exceed ``M`` itself from
``k = 256`` on: it would check nothing.)

Underflow: products and sums below ``finfo.smallest_normal`` round to a
multiple of the smallest subnormal ``eta`` (absolute, not relative), so
``n * eta`` is added to every bound.

Overflow: the bound holds only while no intermediate exceeds ``finfo.max``.
An output element is left unconstrained (bound ``inf``) where one may:
``|alpha| * |a_i|`` or ``|alpha| * |b_i|`` (a kernel that scales an operand
first), any partial sum (at most ``sum|a||b|``, scaled or not) or ``|beta| |c|``.
Infinite inputs are not magnitudes: they are left out of ``M`` and the
validator requires the exact reference's ``inf``/``NaN`` there, which every
order gives alike (``inf + x = inf``, ``inf - inf = NaN``).

>>> import torch
>>> a, b = torch.ones(2, 4), torch.ones(4, 3)
>>> bound = einsum_error_bound("mk,kn->mn")(torch.ops.aten.mm.default, (a, b), {})[0]
>>> bool((bound > 0).all() and (bound < 1e-5).all())
True
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from autoshard.rules.calls import bind_args, ordered_tensor_args
from autoshard.rules.compute import einsum_letters

__all__ = ["ErrorBoundFn", "einsum_error_bound", "unit_roundoff"]

ErrorBoundFn = Callable[[Any, tuple, dict], "list[torch.Tensor | None] | None"]
"""(op, args, kwargs) -> per output a float64 bound on |computed - exact| for
any evaluation order (``inf`` where anything may come out), or None where the
op is exact (integers) and compared as usual."""


def unit_roundoff(dtype: torch.dtype) -> float:
    """``u = eps / 2`` of a floating or complex dtype."""
    real = dtype.to_real() if dtype.is_complex else dtype
    return torch.finfo(real).eps / 2


def _subnormal(dtype: torch.dtype) -> float:
    info = torch.finfo(dtype)
    return info.smallest_normal * info.eps


def _magnitude(t: torch.Tensor) -> torch.Tensor:
    m = t.abs().to(torch.float64)
    return torch.where(torch.isfinite(m), m, 0)


def einsum_error_bound(equation: str, *, bias: bool = False) -> ErrorBoundFn:
    """The bound (module docstring) of ``einsum(equation)`` of the last two
    tensor inputs, with ``beta * bias + alpha * ...`` when ``bias``."""
    ins, out = einsum_letters(equation)
    pair = f"{ins[0]},{ins[1]}->{out}"
    contracted = sorted(set(ins[0] + ins[1]) - set(out))

    def bound(op: Any, args: tuple, kwargs: dict) -> list[torch.Tensor | None] | None:
        tensors = ordered_tensor_args(op, args, kwargs)
        if not all(t.dtype.is_floating_point or t.dtype.is_complex for t in tensors):
            return None
        a, b = tensors[-2], tensors[-1]
        named = bind_args(op, args, kwargs)
        alpha = abs(complex(named.get("alpha", 1))) if bias else 1.0
        beta = abs(complex(named.get("beta", 1))) if bias else 0.0
        dtype = torch.result_type(a, b)
        real = dtype.to_real() if dtype.is_complex else dtype
        fmax = torch.finfo(real).max
        sizes = dict(zip(ins[0], a.shape)) | dict(zip(ins[1], b.shape))
        k = math.prod(sizes[c] for c in contracted)
        n = (k + 3) * (2 if dtype.is_complex else 1)
        half = real in (torch.float16, torch.bfloat16)
        nu = n * unit_roundoff(torch.float32 if half else dtype)
        if nu >= 1:  # no bound: anything may come out
            return [torch.full(torch.einsum(pair, torch.zeros(a.shape), torch.zeros(b.shape)).shape, math.inf,
                               dtype=torch.float64)]
        gamma = nu / (1 - nu)
        if half:
            scalar = 4 * unit_roundoff(dtype)
            gamma += scalar / (1 - scalar)
        ma, mb = _magnitude(a), _magnitude(b)
        sums = torch.einsum(pair, ma, mb)
        total = alpha * sums
        over = (sums * (1 + gamma) >= fmax) | (total * (1 + gamma) >= fmax)
        # a kernel may scale an operand by alpha first
        for scaled, other, first in ((ma, mb, True), (mb, ma, False)):
            flags = (alpha * scaled >= fmax).to(torch.float64)
            if bool(flags.any()):
                ones = torch.ones_like(other)
                hit = torch.einsum(pair, flags, ones) if first else torch.einsum(pair, ones, flags)
                over |= hit > 0
        if bias and beta != 0:
            c = tensors[0]
            scaled_c = torch.broadcast_to(beta * _magnitude(c), total.shape)
            total = total + scaled_c
            over |= torch.broadcast_to(scaled_c >= fmax, total.shape) | (total * (1 + gamma) >= fmax)
        eta = max(_subnormal(real), _subnormal(torch.float32) if half else 0.0)
        result = gamma * total + n * eta
        return [torch.where(over, math.inf, result)]

    return bound
