"""Simulated shards for the validator: partial inputs cut into random pieces,
and sharded outputs compared with the unsharded op within a per-dtype
tolerance, infinities and NaN included.

A ``P(op)`` input is cut into *random* pieces that reduce to it (``sum``:
random addends with mixed signs; ``avg``: addends of ``m*x``; ``max``/``min``:
one random owner per element holds the value, the others something
smaller/larger). Values beyond the dtype's ordinary range (``-inf``,
``finfo.min`` in masks) are held whole by one rank (sum) or by every rank
(avg). A reduced output is cast back to its dtype before the comparison, as
a real all-reduce runs in it.

>>> parts = distribute(torch.arange(4.0), (Partial("sum"),), (2,), torch.Generator().manual_seed(0))
>>> torch.allclose(parts[(0,)] + parts[(1,)], torch.arange(4.0))
True
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import torch

from costmodel import simulate
from costmodel.shard_shapes import local_shape
from costmodel.placements import Partial, Placement, Replicate

__all__ = ["TOLERANCE", "distribute", "compare_output", "compare_bounded", "close", "big_magnitude", "widen"]

TOLERANCE: dict[torch.dtype, float] = {
    torch.float64: 1e-9,
    torch.float32: 2e-4,
    torch.float16: 5e-3,
    torch.bfloat16: 5e-2,
    torch.complex32: 5e-3,
    torch.complex64: 2e-4,
    torch.complex128: 1e-9,
}
"""Allowed |sharded - reference| relative to 1 + max |reference|, per dtype."""


def _random_pieces(value: torch.Tensor, reduce_op: str, m: int, gen: torch.Generator) -> list[torch.Tensor]:
    """``m`` tensors that reduce (``reduce_op``) to ``value`` (module docstring)."""
    shape = tuple(value.shape)
    if value.dtype == torch.bool:
        if reduce_op not in ("max", "min"):
            raise ValueError(f"a bool tensor cannot be P({reduce_op})")
        owner = torch.randint(0, m, shape, generator=gen)
        filler = torch.full(shape, reduce_op == "min", dtype=torch.bool)
        return [torch.where(owner == r, value, filler) for r in range(m)]
    integral = not (value.dtype.is_floating_point or value.dtype.is_complex)
    if value.dtype.is_complex:
        if reduce_op not in ("sum", "avg"):
            raise ValueError(f"a complex tensor cannot be P({reduce_op})")
        v = value.to(torch.complex128)
    else:
        v = value.to(torch.float64) if not integral else value.to(torch.int64)
    # Values near the dtype's range (masks of -inf or finfo.min) cannot be cut
    # into random addends that fit the dtype: one rank holds them whole (sum)
    # or every rank holds them (avg), which is what a real partial of a mask is.
    # (NaN and infinities fail ``<=``: extreme too)
    extreme = None if integral else ~(v.abs() <= big_magnitude(value.dtype))
    if extreme is not None and not bool(extreme.any()):
        extreme = None
    finite_v = v if extreme is None else torch.where(extreme, 0, v)
    if reduce_op in ("sum", "avg"):
        target = finite_v * m if reduce_op == "avg" else finite_v
        if integral:
            return _integer_addends(v, value.dtype, m, gen)
        else:
            scale = target.abs() + 1
            noise = torch.complex128 if v.dtype.is_complex else torch.float64
            parts = [torch.randn(shape, generator=gen, dtype=noise) * scale for _ in range(m - 1)]
        last = target - sum(parts) if parts else target
        pieces = parts + [last]
        # The holder of the remainder changes between calls: no rank is special.
        shift = int(torch.randint(0, m, (1,), generator=gen))
        pieces = pieces[shift:] + pieces[:shift]
        if extreme is not None:
            zero = torch.zeros_like(v)
            pieces = [torch.where(extreme, v if reduce_op == "avg" or r == shift else zero, p) for r, p in enumerate(pieces)]
    else:
        owner = torch.randint(0, m, shape, generator=gen)
        sign = -1 if reduce_op == "max" else 1
        pieces = []
        for r in range(m):
            if integral:
                # below the dtype's minimum (above its maximum) nothing is smaller
                # (larger): a non-owner holds the limit itself, never a wrapped value
                delta = torch.randint(1, 4, shape, generator=gen)
                lo, hi = torch.iinfo(value.dtype).min, torch.iinfo(value.dtype).max
                if sign < 0:
                    filler = torch.where(v < lo + delta, torch.full_like(v, lo), v - delta)
                else:
                    filler = torch.where(v > hi - delta, torch.full_like(v, hi), v + delta)
            else:
                delta = (finite_v.abs() + 1) * (0.5 + torch.rand(shape, generator=gen, dtype=torch.float64))
                filler = v + sign * delta
            pieces.append(torch.where(owner == r, v, filler))
    return [p.to(value.dtype) for p in pieces]


def _integer_addends(v: torch.Tensor, dtype: torch.dtype, m: int, gen: torch.Generator) -> list[torch.Tensor]:
    """``m`` integer pieces of ``v`` (int64 holding ``dtype`` values), each
    representable in ``dtype``, whose plain sum is ``v`` without wrapping.

    A partial sum of integers that some producer hands over has pieces whose
    true sum is the value (a sum of counts, of ids times one-hot weights):
    that is the layout on which every integer rule must be exact, int ->
    float casts included (``float(a) + float(b) != float(a + b mod 2**64)``).
    Pieces of mixed signs in ``[-3, 3]`` are drawn where the value is far
    from the dtype's limits; elsewhere (and for unsigned dtypes) each piece
    takes a part of the value toward zero, so no piece nor the remainder
    leaves the range.
    """
    info = torch.iinfo(dtype)
    shape = tuple(v.shape)
    # |v| < 2**(bits-2) leaves room for m - 1 parts of magnitude 3 (m is tiny)
    room = 2 ** (info.bits - 2)
    mixed = (v > -room) & (v < room) if info.min < 0 else torch.zeros(shape, dtype=torch.bool)
    rest = v.clone()
    parts = []
    for _ in range(m - 1):
        free = torch.randint(-3, 4, shape, generator=gen)
        size = torch.randint(0, 4, shape, generator=gen)
        toward_zero = torch.where(rest >= 0, torch.minimum(size, rest), torch.maximum(-size, rest))
        part = torch.where(mixed, free, toward_zero)
        parts.append(part)
        rest = rest - part
    pieces = parts + [rest]
    shift = int(torch.randint(0, m, (1,), generator=gen))
    return [p.to(dtype) for p in pieces[shift:] + pieces[:shift]]


def big_magnitude(dtype: torch.dtype) -> float:
    """Magnitudes above which a value counts as extreme (masks, overflow)."""
    real = dtype.to_real() if dtype.is_complex else dtype
    return torch.finfo(real if real.is_floating_point else torch.float64).max / 2**8


def distribute(
    tensor: torch.Tensor, placements: Sequence[Placement], mesh_shape: Sequence[int], gen: torch.Generator
) -> dict[tuple[int, ...], torch.Tensor]:
    """Local tensor of every rank: mesh dims applied left to right, shards by
    ``costmodel.simulate.shard``, partials as random pieces.

    >>> from costmodel.placements import Shard
    >>> parts = distribute(torch.arange(4.0), (Partial("sum"),), (2,), torch.Generator().manual_seed(0))
    >>> torch.allclose(parts[(0,)] + parts[(1,)], torch.arange(4.0, dtype=torch.float64).float())
    True
    """
    # Replicated mesh dims do not branch: replicas hold identical local
    # tensors, including identical partial pieces on later mesh dims.
    split_dims = [d for d, p in enumerate(placements) if not isinstance(p, Replicate)]
    pieces: dict[tuple[int, ...], torch.Tensor] = {(): tensor}
    for mesh_dim in split_dims:
        p, m = placements[mesh_dim], mesh_shape[mesh_dim]
        nxt: dict[tuple[int, ...], torch.Tensor] = {}
        for prefix, value in pieces.items():
            if isinstance(p, Partial):
                parts = _random_pieces(value, p.reduce_op, m, gen)
            else:
                split = simulate.shard(value, (p,), (m,))
                parts = [split[(r,)] for r in range(m)]
            for r, part in enumerate(parts):
                nxt[prefix + (r,)] = part.contiguous().clone()
        pieces = nxt
    return {c: pieces[tuple(c[d] for d in split_dims)] for c in simulate.mesh_coords(mesh_shape)}


# --------------------------------------------------------------------------- comparing outputs


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``torch.equal``, False where the dtype has no kernel for it (complex32)."""
    try:
        return torch.equal(a, b)
    except (NotImplementedError, RuntimeError):
        return False


def close(
    actual: torch.Tensor, expected: torch.Tensor, where: str, tol_dtype: torch.dtype | None = None, scale: float = 0.0
) -> str | None:
    """None if equal within the dtype's tolerance times ``1 + max(|expected|, scale)``."""
    if tol_dtype is None and actual.dtype != expected.dtype:
        return f"{where}: dtype {actual.dtype}, expected {expected.dtype}"
    if tuple(actual.shape) != tuple(expected.shape):
        return f"{where}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    if actual.dtype == expected.dtype and _equal(actual, expected):
        return None  # bit-equal (the common case of exact ops): nothing to weigh
    if not (expected.dtype.is_floating_point or expected.dtype.is_complex):
        if torch.equal(actual, expected):
            return None
        return f"{where}: {(actual != expected).sum().item()} of {expected.numel()} values differ"
    a, e = actual.to(torch.complex128 if expected.dtype.is_complex else torch.float64), expected.to(
        torch.complex128 if expected.dtype.is_complex else torch.float64
    )
    nan_a, nan_e = torch.isnan(a), torch.isnan(e)
    if not torch.equal(nan_a, nan_e):
        return f"{where}: NaN at different positions"
    a, e = torch.where(nan_e, 0, a), torch.where(nan_e, 0, e)
    inf_e = torch.isinf(e)
    if not torch.equal(a[inf_e], e[inf_e]):
        return f"{where}: infinities differ"
    a, e = torch.where(inf_e, 0, a), torch.where(inf_e, 0, e)
    if e.numel() == 0:
        return None
    rtol = TOLERANCE.get(tol_dtype or expected.dtype, 1e-4)
    # A finfo.min in a mask would set the scale of every other element:
    # values that large are compared relative to themselves only.
    huge = e.abs() > big_magnitude(tol_dtype or expected.dtype)
    if huge.any():
        worst = float(((a - e).abs() - rtol * e.abs())[huge].max())
        if worst > 0:
            return f"{where}: a value near the dtype's range differs by more than {rtol:.3g} of itself"
        a, e = torch.where(huge, 0, a), torch.where(huge, 0, e)
    tol = rtol * (1 + max(float(e.abs().max()), scale))
    diff = float((a - e).abs().max())
    if diff > tol:
        return f"{where}: max |difference| {diff:.3g} > {tol:.3g}"
    return None


def _as_float64(t: torch.Tensor) -> torch.Tensor:
    if t.dtype in (torch.float16, torch.bfloat16, torch.float32):
        return t.to(torch.float64)
    return t.to(torch.complex128) if t.dtype in (torch.complex32, torch.complex64) else t


def compare_output(
    k: int,
    locals_: Mapping[tuple[int, ...], torch.Tensor],
    reference: torch.Tensor,
    placements: tuple[Placement, ...],
    mesh_shape: tuple[int, ...],
    tol_dtype: torch.dtype,
) -> str | None:
    for coord, t in locals_.items():
        if not isinstance(t, torch.Tensor):
            return f"output {k} at rank {coord}: not a tensor"
        want = local_shape(tuple(reference.shape), placements, mesh_shape, coord)
        if tuple(t.shape) != want:
            return f"output {k} at rank {coord}: local shape {tuple(t.shape)}, expected {want}"
    if not any(isinstance(p, Partial) for p in placements):
        expected = simulate.shard(reference, placements, mesh_shape)
        for coord, t in locals_.items():
            want_t = expected[coord]
            msg = close(t, want_t, f"output {k} at rank {coord}")
            if msg and t.dtype == want_t.dtype and tol_dtype != t.dtype:
                msg = close(_as_float64(t), _as_float64(want_t), f"output {k} at rank {coord}", tol_dtype)
            if msg:
                return msg
        return None
    # Replicas along R mesh dims must agree before partials are reduced.
    for coord, t in locals_.items():
        for mesh_dim, p in enumerate(placements):
            if isinstance(p, Replicate) and coord[mesh_dim]:
                base = coord[:mesh_dim] + (0,) + coord[mesh_dim + 1 :]
                msg = close(_as_float64(t), _as_float64(locals_[base]), f"output {k} replica {coord} vs {base}", tol_dtype)
                if msg:
                    return msg
    for coord, t in locals_.items():
        if t.dtype != reference.dtype:
            return f"output {k} at rank {coord}: dtype {t.dtype}, expected {reference.dtype}"
    widened = {c: _as_float64(t) for c, t in locals_.items()}
    try:
        total = simulate.unshard(widened, placements, mesh_shape, check_replicas=False)
    except simulate.SimulationError as exc:
        return f"output {k}: {exc}"
    if reference.dtype.is_floating_point or reference.dtype.is_complex:
        # A real all-reduce runs in the tensor's dtype: it overflows where the
        # unsharded op overflows (a sum of finfo.min is -inf in both).
        total = _as_float64(total.to(reference.dtype))
    # Each rank's contribution was rounded on its own magnitude, which random
    # pieces make larger than the result's: scale the tolerance by their sum.
    big = big_magnitude(reference.dtype)
    maxes = []
    for t in widened.values():
        if (t.is_floating_point() or t.is_complex()) and t.numel():
            magnitude = t.abs()  # NaN and infinities fail the comparison: not ordinary
            maxes.append(torch.where(magnitude <= big, magnitude, 0).max())
    pieces = float(torch.stack(maxes).sum()) if maxes else 0.0
    return close(total, _as_float64(reference), f"output {k} (reduced)", tol_dtype=tol_dtype, scale=pieces)


# --------------------------------------------------------------------------- comparing within an error bound


def widen(obj):
    """``obj`` with every float tensor in float64 and complex one in complex128
    (lists, tuples and dicts walked): the exact reference's arguments."""
    if isinstance(obj, torch.Tensor):
        return _as_float64(obj)
    if isinstance(obj, tuple):
        return tuple(widen(o) for o in obj)
    if isinstance(obj, list):
        return [widen(o) for o in obj]
    if isinstance(obj, dict):
        return {k: widen(v) for k, v in obj.items()}
    return obj


def _within(actual: torch.Tensor, exact: torch.Tensor, bound: torch.Tensor, where: str) -> str | None:
    """None if ``|actual - exact| <= bound`` everywhere; ``bound = inf``
    leaves an element free; a non-finite ``exact`` with a finite bound must
    come out the same (the same infinity, or NaN)."""
    a = _as_float64(actual)
    free = torch.isinf(bound)
    nonfinite = ~torch.isfinite(exact)
    same = (a == exact) | (torch.isnan(a) & torch.isnan(exact))
    bad_special = nonfinite & ~free & ~same
    if bool(bad_special.any()):
        return f"{where}: {int(bad_special.sum())} inf/NaN values differ from the exact result's"
    diff = (a - exact).abs()
    bad = ~free & ~nonfinite & ~(diff <= bound)  # NaN differences fail
    if bool(bad.any()):
        worst = float(torch.where(bad, diff - bound, 0).max()) if bool(torch.isfinite(diff[bad]).all()) else math.inf
        return (f"{where}: {int(bad.sum())} of {exact.numel()} values exceed the kernel's error bound "
                f"(worst by {worst:.3g})")
    return None


def compare_bounded(
    k: int,
    locals_: Mapping[tuple[int, ...], torch.Tensor],
    exact: torch.Tensor,
    placements: tuple[Placement, ...],
    mesh_shape: tuple[int, ...],
    bounds: Mapping[tuple[int, ...], torch.Tensor],
    exact_bound: torch.Tensor,
    dtype: torch.dtype,
) -> str | None:
    """Output ``k`` against ``exact`` (the op in float64) within the rule's
    error bounds: ``bounds[coord]`` for each rank's own computation,
    ``exact_bound`` for the float64 run. A reduced partial output adds
    the rounding of the all-reduce in ``dtype`` (``m - 1`` additions and the
    cast): ``gamma_m * sum |piece| + u * |total|``."""
    for coord, t in locals_.items():
        want = local_shape(tuple(exact.shape), placements, mesh_shape, coord)
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != want:
            return f"output {k} at rank {coord}: local shape {tuple(getattr(t, 'shape', ()))}, expected {want}"
        if t.dtype != dtype:
            return f"output {k} at rank {coord}: dtype {t.dtype}, expected {dtype}"
    if not any(isinstance(p, Partial) for p in placements):
        expected = simulate.shard(exact, placements, mesh_shape)
        slack = simulate.shard(exact_bound, placements, mesh_shape)
        for coord, t in locals_.items():
            msg = _within(t, expected[coord], bounds[coord] + slack[coord], f"output {k} at rank {coord}")
            if msg:
                return msg
        return None
    for coord, t in locals_.items():
        for mesh_dim, p in enumerate(placements):
            if isinstance(p, Replicate) and coord[mesh_dim]:
                base = coord[:mesh_dim] + (0,) + coord[mesh_dim + 1 :]
                msg = _within(t, _as_float64(locals_[base]), bounds[coord] + bounds[base],
                              f"output {k} replica {coord} vs {base}")
                if msg:
                    return msg
    as_sums = tuple(Partial("sum") if isinstance(p, Partial) else p for p in placements)
    try:
        total = simulate.unshard({c: _as_float64(t) for c, t in locals_.items()}, placements, mesh_shape, check_replicas=False)
        bound = simulate.unshard(dict(bounds), as_sums, mesh_shape, check_replicas=False)
        sizes = simulate.unshard({c: _as_float64(t).abs() for c, t in locals_.items()}, as_sums, mesh_shape, check_replicas=False)
    except simulate.SimulationError as exc:
        return f"output {k}: {exc}"
    ranks = math.prod(m for m, p in zip(mesh_shape, placements) if isinstance(p, Partial))
    u = torch.finfo(dtype.to_real() if dtype.is_complex else dtype).eps / 2
    nu = ranks * u
    reduction = (nu / (1 - nu)) * torch.where(torch.isfinite(sizes), sizes, 0) + u * torch.where(torch.isfinite(total), total.abs(), 0)
    total = _as_float64(total.to(dtype))  # a real all-reduce runs in the tensor's dtype
    return _within(total, exact, bound + reduction + exact_bound, f"output {k} (reduced)")
