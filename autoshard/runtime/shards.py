"""One rank's shard of a whole tensor: the slice that rank holds under a
placement on the mesh, with ``torch.chunk`` sizes as the cost model counts
them (:func:`costmodel.shard_shapes.local_indices`).

The runtime slices parameters, inputs and buffers at load, the random ops
their globally drawn tensors, and the tests their single-device references,
all with this one function.

>>> import torch
>>> from costmodel.placements import parse_placements
>>> [local_slice(torch.arange(6), parse_placements("S(0)"), (4,), (r,)).tolist() for r in range(4)]
[[0, 1], [2, 3], [4, 5], []]
"""

from __future__ import annotations

from typing import Sequence

import torch

from costmodel.shard_shapes import local_indices
from costmodel.placements import Partial, Placement

__all__ = ["local_slice"]


def local_slice(tensor: torch.Tensor, placements: Sequence[Placement], mesh_shape: Sequence[int],
                coord: Sequence[int]) -> torch.Tensor:
    """The local shard of a whole tensor at mesh coordinate ``coord`` (``torch.chunk``
    sizes, mesh dims left to right, strided shards as ``costmodel.shard_shapes``).
    Partial placements are refused: a whole value has no partial shard."""
    if any(isinstance(p, Partial) for p in placements):
        raise ValueError(f"local_slice: a whole tensor has no partial shard ({''.join(map(str, placements))})")
    out = tensor
    for dim, idx in enumerate(local_indices(tuple(tensor.shape), tuple(placements), tuple(mesh_shape), tuple(coord))):
        if len(idx) == tensor.shape[dim]:
            continue
        if idx and list(idx) == list(range(idx[0], idx[0] + len(idx))):
            out = out.narrow(dim, idx[0], len(idx))
        else:
            out = out.index_select(dim, torch.as_tensor(idx, dtype=torch.long, device=tensor.device))
    # always a copy: a shard must not alias the caller's whole tensor
    return out.clone(memory_format=torch.contiguous_format)
