"""Counts an expert dispatch could read on the host, for steps run on fake tensors.

Fake tensors hold no values, so ``expert_dispatch._host_counts`` (a dispatch's one host read)
cannot run on them; :func:`fake_counts` stands in for it with the counts a fake process group of
``world`` ranks could deliver when every rank routes its copies as rank 0 does.

>>> read = fake_counts(8, (2, 0, 1, 1), world=2, rank=0, reads=[])
>>> read(torch.empty(9, dtype=torch.int64))
[4, 0, 2, 2, 0, 4, 0, 4, 0]
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch


def fake_counts(copies: int, share: Sequence[int], *, world: int, rank: int,
                reads: list[tuple]) -> Callable[[torch.Tensor], list[int]]:
    """A ``_host_counts`` for rank ``rank`` whose ``copies`` routed copies go to expert ``e`` in the
    proportion ``share[e]`` (on every rank alike); each call appends its tensor's (shape, dtype,
    device) to ``reads``. What it returns is what ``expert_dispatch._layout`` reads: copies sent per
    expert, the copies out of range (none), then copies received per source rank and local expert."""
    if copies % sum(share):
        raise ValueError(f"copies: {copies} does not split in the proportions {tuple(share)}")
    per_expert = [copies * n // sum(share) for n in share]
    local = len(share) // world
    mine = per_expert[rank * local:(rank + 1) * local]

    def read(counts: torch.Tensor) -> list[int]:
        reads.append((tuple(counts.shape), counts.dtype, counts.device))
        return per_expert + [0] + mine * world

    return read
