"""Memory a training step holds per rank, by tensor and placement.

What counts (every figure is for the busiest rank, the largest local shard):

- parameters and optimizer state: held all step, sharded like the parameter;
  the multi-tensor AdamW step adds one parameter-sized temporary at the step.
  AdamW keeps two moments per element (``exp_avg``, ``exp_avg_sq``), in the
  parameter's dtype as ``torch.optim.AdamW`` allocates them; SGD with momentum
  one buffer; plain SGD none. Mixed precision (``bf16`` parameters with an
  fp32 master copy) adds 4 bytes per element for the master and keeps the
  moments in fp32.
- gradients: from the op that produces them to the optimizer step, in the
  parameter's placement (the runtime redistributes each gradient as soon as
  it is made).
- activations and temporaries: every tensor an op makes, from the op to its
  last reader (``autoshard.graph.liveness``); a ``Partial`` output is a full
  size local tensor.

>>> from autoshard.rules import TensorMeta
>>> import torch
>>> local_bytes(TensorMeta((1024, 1024), torch.float32), "S(0)R", (2, 4))
2097152
>>> OptimizerMemory("adamw").state_bytes(torch.float32)
8
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import torch

from costmodel.layout import max_local_numel
from costmodel.placements import Placement

from autoshard.rules.core import TensorMeta

__all__ = ["OPTIMIZERS", "OptimizerMemory", "local_bytes"]

OPTIMIZERS = ("adamw", "sgd", "sgd-momentum", "none")


@lru_cache(maxsize=1 << 16)
def _local_numel(shape: tuple[int, ...], placements: tuple[Placement, ...] | str, mesh_shape: tuple[int, ...]) -> int:
    return max_local_numel(shape, placements, mesh_shape)


def local_bytes(meta: TensorMeta, placements: Sequence[Placement] | str | None, mesh_shape: tuple[int, ...]) -> int:
    """Bytes of the largest local shard of ``meta`` under ``placements`` (None: nothing)."""
    if placements is None:
        return 0
    key = placements if isinstance(placements, str) else tuple(placements)
    return _local_numel(meta.shape, key, tuple(mesh_shape)) * meta.itemsize


@dataclass(frozen=True, slots=True)
class OptimizerMemory:
    """Per-element memory of the optimizer, and what one update costs.

    >>> OptimizerMemory("adamw", mixed_precision=True).state_bytes(torch.bfloat16)
    12
    """

    name: str = "adamw"
    """One of :data:`OPTIMIZERS`."""
    mixed_precision: bool = False
    """Low-precision parameters with an fp32 master copy and fp32 state."""
    foreach: bool = True
    """torch's multi-tensor step (the CUDA default): AdamW makes one full-size
    temporary per parameter element (``exp_avg_sq.sqrt()``) during the step."""

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ValueError(f"optimizer: unknown {self.name!r} (expected one of {', '.join(OPTIMIZERS)})")

    def _moments(self) -> int:
        return {"adamw": 2, "sgd-momentum": 1}.get(self.name, 0)

    def state_bytes(self, param_dtype: torch.dtype) -> int:
        """Bytes of optimizer state per parameter element (master copy included)."""
        if self.mixed_precision:
            return 4 * self._moments() + (4 if self.name != "none" else 0)
        return param_dtype.itemsize * self._moments()

    def step_temp_bytes(self, param_dtype: torch.dtype) -> int:
        """Bytes per parameter element held only during the optimizer step."""
        if self.name != "adamw" or not self.foreach:
            return 0
        return 4 if self.mixed_precision else param_dtype.itemsize

    def update_flops_bytes(self, numel: int, param_dtype: torch.dtype) -> tuple[float, float]:
        """FLOPs and bytes of one elementwise update of ``numel`` parameter
        elements: reads parameter, gradient and state, writes parameter and state."""
        if self.name == "none":
            return 0.0, 0.0
        p = param_dtype.itemsize
        state = self.state_bytes(param_dtype)
        flops_per_element = {"adamw": 12.0, "sgd-momentum": 4.0, "sgd": 2.0}[self.name]
        return flops_per_element * numel, float(numel) * (3 * p + 2 * state)
