"""Memory a training step holds per rank, by tensor and placement.

What counts (every figure is for the busiest rank, the largest local shard):

- parameters and optimizer state: held all step, sharded like the parameter;
  the multi-tensor (foreach) AdamW step adds one parameter-sized temporary at
  the step; the fused and for-loop steps none that outlive one parameter.
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

from costmodel.compute import op_time_s
from costmodel.shard_shapes import max_local_numel
from costmodel.placements import Placement
from hw_profiles import HardwareProfile

from autoshard.rules.core import TensorMeta

__all__ = ["OPTIMIZERS", "IMPLEMENTATIONS", "OptimizerMemory", "optimizer_implementation", "local_bytes"]

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


IMPLEMENTATIONS = ("foreach", "fused", "for-loop")
"""How torch.optim runs the update: ``foreach`` (multi-tensor kernels, the
default on CUDA), ``fused`` (one kernel per update, ``fused=True``),
``for-loop`` (one kernel per op and parameter, the default on CPU)."""

_PASSES: dict[tuple[str, str], tuple[tuple[int, int, int, bool], ...]] = {
    # (optimizer, implementation) -> kernels, each (elements read, written, FLOPs, allocates its output),
    # per parameter element, as torch.optim 2.x runs them with its defaults (AdamW: weight_decay 0.01,
    # no amsgrad; SGD: no momentum unless sgd-momentum). AdamW, foreach and for-loop
    # (torch/optim/adam.py, decoupled weight decay): p *= 1 - lr*wd; m.lerp_(g); v *= b2;
    # v.addcmul_(g, g); t = sqrt(v); t /= bc2 (for-loop: a new tensor); t += eps; p.addcdiv_(m, t).
    ("adamw", "foreach"): ((1, 1, 1, False), (2, 1, 2, False), (1, 1, 1, False), (3, 1, 2, False),
                           (1, 1, 1, True), (1, 1, 1, False), (1, 1, 1, False), (3, 1, 3, False)),
    ("adamw", "for-loop"): ((1, 1, 1, False), (2, 1, 2, False), (1, 1, 1, False), (3, 1, 2, False),
                            (1, 1, 1, True), (1, 1, 1, True), (1, 1, 1, False), (3, 1, 3, False)),
    # _fused_adamw_: reads p, g, m, v once and writes p, m, v
    ("adamw", "fused"): ((4, 3, 12, False),),
    # p.add_(g, alpha=-lr)
    ("sgd", "foreach"): ((2, 1, 2, False),),
    ("sgd", "for-loop"): ((2, 1, 2, False),),
    ("sgd", "fused"): ((2, 1, 2, False),),
    # buf *= momentum; buf += g; p.add_(buf, alpha=-lr)
    ("sgd-momentum", "foreach"): ((1, 1, 1, False), (2, 1, 1, False), (2, 1, 2, False)),
    ("sgd-momentum", "for-loop"): ((1, 1, 1, False), (2, 1, 1, False), (2, 1, 2, False)),
    ("sgd-momentum", "fused"): ((3, 2, 4, False),),
}

FOREACH_TENSORS_PER_LAUNCH = 36
"""ATen's multi_tensor_apply serves at most 36 tensors of a 4-list op per launch
(``depth_to_max_tensors`` in aten/src/ATen/native/cuda/MultiTensorApply.cuh)..."""
FOREACH_ELEMENTS_PER_LAUNCH = 320 * 65536
"""... and at most 320 blocks of 65,536 elements (``depth_to_max_blocks``, ``kChunkSize``)."""


def optimizer_implementation(choice: str, profile: HardwareProfile) -> str:
    """``choice`` (``auto`` or one of :data:`IMPLEMENTATIONS`) for ``profile``'s
    device: ``auto`` is torch.optim's own default, foreach on accelerators and
    for-loop on CPU (``torch.optim.optimizer._default_to_fused_or_foreach``).

    >>> from hw_profiles import load
    >>> optimizer_implementation("auto", load("h100-sxm-80gb")), optimizer_implementation("auto", load("cpu-gloo"))
    ('foreach', 'for-loop')
    """
    if choice != "auto":
        return choice
    return "for-loop" if _is_cpu(profile) else "foreach"


def _is_cpu(profile: HardwareProfile) -> bool:
    device_type = getattr(profile, "device_type", None)
    return device_type == "cpu" if device_type else "cpu" in profile.device.name.lower()


@dataclass(frozen=True, slots=True)
class OptimizerMemory:
    """Per-element memory of the optimizer, and what one update costs.

    >>> OptimizerMemory("adamw", mixed_precision=True).state_bytes(torch.bfloat16)
    12
    >>> OptimizerMemory("adamw", implementation="fused").step_temp_bytes(torch.bfloat16)
    0
    """

    name: str = "adamw"
    """One of :data:`OPTIMIZERS`."""
    mixed_precision: bool = False
    """Low-precision parameters with an fp32 master copy and fp32 state."""
    implementation: str = "foreach"
    """One of :data:`IMPLEMENTATIONS`: which kernels run the update, and what
    they allocate. foreach AdamW makes one full-size temporary per parameter
    element (``torch._foreach_sqrt(exp_avg_sqs)``) during the step."""

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ValueError(f"optimizer: unknown {self.name!r} (expected one of {', '.join(OPTIMIZERS)})")
        if self.implementation not in IMPLEMENTATIONS:
            raise ValueError(f"optimizer_impl: unknown {self.implementation!r} "
                             f"(expected auto or one of {', '.join(IMPLEMENTATIONS)})")

    @property
    def foreach(self) -> bool:
        return self.implementation == "foreach"

    def _moments(self) -> int:
        return {"adamw": 2, "sgd-momentum": 1}.get(self.name, 0)

    def state_bytes(self, param_dtype: torch.dtype) -> int:
        """Bytes of optimizer state per parameter element (master copy included)."""
        if self.mixed_precision:
            return 4 * self._moments() + (4 if self.name != "none" else 0)
        return param_dtype.itemsize * self._moments()

    def fsdp2_shard_bytes(self) -> int:
        """Bytes per parameter element FSDP2 holds with mixed precision: the fp32 shard itself
        (its all-gather casts it to the compute dtype; no low-precision shard beside a master
        copy) and the fp32 state.

        >>> OptimizerMemory("adamw", mixed_precision=True).fsdp2_shard_bytes()
        12
        """
        return 4 + 4 * self._moments()

    def step_temp_bytes(self, param_dtype: torch.dtype) -> int:
        """Bytes per parameter element held only during the optimizer step, all
        parameters at once. Only foreach AdamW holds such a list; the for-loop's
        temporaries (``sqrt`` and ``/``: twice one parameter) live one parameter
        at a time and are not counted (on one H100 the for-loop's peak equals the
        fused one's: ``benchmarks/results/h100-2026-11-27/README.md``); fused allocates none."""
        if self.name != "adamw" or not self.foreach:
            return 0
        return 4 if self.mixed_precision else param_dtype.itemsize

    def update_time_s(self, numel: int, param_dtype: torch.dtype, profile: HardwareProfile) -> float:
        """Seconds of the update of ``numel`` parameter elements: each kernel the
        implementation runs, priced as an elementwise op on its bytes. foreach and
        fused kernels reach the profile's ``efficiency.optimizer`` fraction of
        that speed, and launch once per chunk of tensors and elements
        (:data:`FOREACH_TENSORS_PER_LAUNCH`, :data:`FOREACH_ELEMENTS_PER_LAUNCH`);
        the for-loop launches once per kernel. On a CPU the launch (dispatch)
        and the kernel run one after the other; on a GPU the host queues the
        next kernels while one runs, so a parameter's update takes the longer of
        its kernels and its launches (on one H100 the LLaMA-1B-shaped for-loop
        AdamW took 6.6 ms: its kernels are priced 6.5 ms, its launches 2.4 ms)."""
        passes = _PASSES.get((self.name, self.implementation), ())
        if not passes or numel <= 0:
            return 0.0
        item = 4 if self.mixed_precision else param_dtype.itemsize
        launch = profile.device.launch_s
        kernels = 0.0
        for reads, writes, flops, allocates in passes:
            out = (float(numel * item),) if allocates else ()
            kernels += op_time_s("elementwise", flops=float(flops * numel),
                                 bytes_accessed=float((reads + writes) * numel * item), dtype="torch.float32",
                                 profile=profile, output_bytes=out) - launch
        launches = launch * len(passes)
        if self.implementation != "for-loop":
            kernels /= profile.device.efficiency.optimizer_fraction(self.implementation)
            launches *= max(1.0 / FOREACH_TENSORS_PER_LAUNCH, numel / FOREACH_ELEMENTS_PER_LAUNCH)
        return kernels + launches if _is_cpu(profile) else max(kernels, launches)
