"""Random, valid inputs for the validator.

Every rule carries a ``samples(sampler)`` function that yields
:class:`~autoshard.rules.registry.SampleInput` objects built with the
:class:`Sampler` below. The validator picks the sizes so that they split on
the meshes it tests (``sizes``); rules draw every tensor dim they want split
from ``sampler.size()``.

Pointwise-like ops describe their arguments with a short spec instead of a
function (:func:`from_spec`):

====  ==========================================================
spec  argument
====  ==========================================================
x     float tensor of the base shape (the sample's float dtype)
y     float tensor broadcastable to the base shape
p     positive float tensor of the base shape (log, sqrt, ...)
q     positive float tensor broadcastable to the base shape
b     bool tensor of the base shape
c     bool tensor broadcastable to the base shape
i     int64 tensor of the base shape, values in [0, 10)
z     0-d float tensor
s     a random Python float
====  ==========================================================

Anything else in a spec is passed as it is (numbers, strings, None).

Beyond a rule's own samples, the validator checks *variants* of each
(:func:`variant`): the float tensors (and float ``dtype`` arguments) turned
into float16, int64, complex64 or bool, and float tensors with extreme
values (``-inf``, ``torch.finfo(dtype).min``), because models feed rules
masks, token counts and rotary embeddings, not only float32 activations. A
variant the op rejects is skipped: the op does not take that dtype.

>>> sampler = Sampler(0)
>>> args = from_spec(sampler, ("x", "y", 2.0), shape=(4, 6), dtype=torch.float32)
>>> args[0].shape, args[2]
(torch.Size([4, 6]), 2.0)
"""

from __future__ import annotations

import random
from typing import Any, Sequence

import torch

__all__ = ["Sampler", "from_spec", "FLOAT_DTYPES", "VARIANTS", "variant"]

FLOAT_DTYPES = (torch.float64, torch.float32, torch.bfloat16)
_DTYPE_WEIGHTS = {torch.float64: 0.5, torch.float32: 0.35, torch.bfloat16: 0.15}


class Sampler:
    """Seeded source of sizes, dtypes and tensors for one validator case.

    >>> s = Sampler(1, sizes=(6,))
    >>> s.shape(2)
    (6, 6)
    """

    def __init__(self, seed: int, *, sizes: Sequence[int] = (4, 8, 12), max_ndim: int = 3) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.sizes = tuple(sizes)
        self.max_ndim = max_ndim

    # ------------------------------------------------------------------ sizes, dtypes

    def size(self) -> int:
        """A tensor dim size that splits on the meshes under test."""
        return self.rng.choice(self.sizes)

    def shape(self, ndim: int | None = None, *, min_ndim: int = 1) -> tuple[int, ...]:
        """A random shape (``ndim`` dims, else ``min_ndim..max_ndim``)."""
        n = ndim if ndim is not None else self.rng.randint(min_ndim, max(min_ndim, self.max_ndim))
        return tuple(self.size() for _ in range(n))

    def broadcastable(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A shape that broadcasts to ``shape``: equal, fewer leading dims, or size-1 dims."""
        kind = self.rng.randrange(4)
        if kind == 0 or not shape:
            return shape
        if kind == 1:
            return shape[self.rng.randrange(1, len(shape) + 1) :]
        if kind == 2:
            d = self.rng.randrange(len(shape))
            return shape[:d] + (1,) + shape[d + 1 :]
        return shape[-1:]

    def float_dtype(self, choices: Sequence[torch.dtype] = FLOAT_DTYPES) -> torch.dtype:
        """float64 most often (exact checks), then float32, then bfloat16."""
        weights = [_DTYPE_WEIGHTS.get(d, 0.15) for d in choices]
        return self.rng.choices(list(choices), weights=weights)[0]

    def choice(self, seq: Sequence[Any]) -> Any:
        return self.rng.choice(list(seq))

    def randint(self, low: int, high: int) -> int:
        """A Python int in ``[low, high]``."""
        return self.rng.randint(low, high)

    def uniform(self, low: float, high: float) -> float:
        return self.rng.uniform(low, high)

    # ------------------------------------------------------------------ tensors

    def randn(self, shape: Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(tuple(shape), generator=self.gen, dtype=torch.float64).to(dtype)

    def positive(self, shape: Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Values in [0.5, 2.5): away from 0 for log, rsqrt, reciprocal."""
        return (torch.rand(tuple(shape), generator=self.gen, dtype=torch.float64) * 2 + 0.5).to(dtype)

    def uniform_tensor(self, shape: Sequence[int], low: float, high: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        x = torch.rand(tuple(shape), generator=self.gen, dtype=torch.float64)
        return (x * (high - low) + low).to(dtype)

    def index(self, shape: Sequence[int], high: int) -> torch.Tensor:
        """int64 indices in ``[0, high)``."""
        return torch.randint(0, high, tuple(shape), generator=self.gen, dtype=torch.long)

    def bool(self, shape: Sequence[int], p_true: float = 0.5) -> torch.Tensor:
        return torch.rand(tuple(shape), generator=self.gen) < p_true

    def permutation(self, n: int) -> torch.Tensor:
        return torch.randperm(n, generator=self.gen)


def from_spec(sampler: Sampler, spec: Sequence[Any], *, shape: tuple[int, ...], dtype: torch.dtype) -> tuple:
    """Arguments built from a spec string per argument (module docstring)."""
    out: list[Any] = []
    for item in spec:
        if not isinstance(item, str) or len(item) != 1 or item not in "xypqbcisz":
            out.append(item)
        elif item == "x":
            out.append(sampler.randn(shape, dtype))
        elif item == "y":
            out.append(sampler.randn(sampler.broadcastable(shape), dtype))
        elif item == "p":
            out.append(sampler.positive(shape, dtype))
        elif item == "q":
            out.append(sampler.positive(sampler.broadcastable(shape), dtype))
        elif item == "b":
            out.append(sampler.bool(shape))
        elif item == "c":
            out.append(sampler.bool(sampler.broadcastable(shape)))
        elif item == "i":
            out.append(sampler.index(shape, 10))
        elif item == "z":
            out.append(sampler.randn((), dtype))
        else:  # "s"
            out.append(round(sampler.uniform(-2.0, 2.0), 3))
    return tuple(out)


VARIANTS: tuple[str, ...] = ("extreme", "float16", "int64", "complex64", "bool")
"""Variant kinds, cycled over the validator's cases (:func:`variant`)."""


def _cast(t: torch.Tensor, kind: str, gen: torch.Generator) -> torch.Tensor:
    if kind == "float16":
        return t.to(torch.float16)
    if kind == "int64":
        # small integers with repeats and zeros, as in counts and ids
        return (t.to(torch.float64) * 3).round().to(torch.int64)
    if kind == "bool":
        return t > 0
    imag = torch.randn(tuple(t.shape), generator=gen, dtype=torch.float64)
    return torch.complex(t.to(torch.float64), imag).to(torch.complex64)


def _with_extremes(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One element set to ``-inf`` or ``finfo.min``: one only, because a
    reduction that meets an infinity and an overflow (``-inf + inf``) gives
    NaN or not depending on the order it adds in, which no split keeps."""
    out = t.clone()
    pick = torch.randint(0, out.numel(), (1,), generator=gen)
    value = float("-inf") if bool(torch.randint(0, 2, (1,), generator=gen)) else torch.finfo(t.dtype).min
    out[torch.unravel_index(pick, tuple(out.shape))] = value
    return out


def variant(args: tuple, kwargs: dict, kind: str, gen: torch.Generator) -> tuple[tuple, dict] | None:
    """``args``/``kwargs`` with every float tensor cast to ``kind`` (a float
    ``dtype`` argument too), or for ``"extreme"`` one float tensor with
    extreme values; None when nothing changes.

    >>> a, k = variant((torch.ones(2, 3), 2), {}, "bool", torch.Generator().manual_seed(0))
    >>> a[0].dtype, a[1]
    (torch.bool, 2)
    >>> a, _ = variant((torch.zeros(4),), {}, "extreme", torch.Generator().manual_seed(0))
    >>> a[0].min().item() in (float("-inf"), torch.finfo(torch.float32).min)
    True
    """
    floats: list[torch.Tensor] = []

    def collect(o: Any) -> None:
        if isinstance(o, torch.Tensor) and o.dtype.is_floating_point and o.numel() >= 2:
            floats.append(o)
        elif isinstance(o, (list, tuple)):
            for x in o:
                collect(x)
        elif isinstance(o, dict):
            for x in o.values():
                collect(x)

    collect((args, kwargs))
    target = floats[int(torch.randint(0, len(floats), (1,), generator=gen))] if floats and kind == "extreme" else None
    changed = False

    def sub(o: Any) -> Any:
        nonlocal changed
        if isinstance(o, torch.Tensor) and o.dtype.is_floating_point:
            if kind == "extreme":
                if o is not target:
                    return o
                changed = True
                return _with_extremes(o, gen)
            changed = True
            return _cast(o, kind, gen)
        if isinstance(o, torch.dtype) and o.is_floating_point and kind != "extreme":
            changed = True
            return getattr(torch, kind)
        if isinstance(o, tuple):
            return tuple(sub(x) for x in o)
        if isinstance(o, list):
            return [sub(x) for x in o]
        return o

    new_args = sub(args)
    new_kwargs = {k: sub(v) for k, v in kwargs.items()}
    return (new_args, new_kwargs) if changed else None
