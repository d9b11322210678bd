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

>>> sampler = Sampler(0)
>>> args = from_spec(sampler, ("x", "y", 2.0), shape=(4, 6), dtype=torch.float32)
>>> args[0].shape, args[2]
(torch.Size([4, 6]), 2.0)
"""

from __future__ import annotations

import random
from typing import Any, Sequence

import torch

__all__ = ["Sampler", "from_spec", "FLOAT_DTYPES"]

FLOAT_DTYPES = (torch.float64, torch.float32, torch.bfloat16)
_DTYPE_WEIGHTS = (0.5, 0.35, 0.15)


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
        weights = [w for d, w in zip(FLOAT_DTYPES, _DTYPE_WEIGHTS) if d in choices] or None
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
