"""The train-step timer of the benchmarks: build a step, warm it up, time rounds, take the median.

:func:`train_step` is one training step as every benchmark times it: forward,
backward, ``optimizer.step()``, ``zero_grad(set_to_none=True)``; on a GPU the
device is synchronised after the backward and after the optimizer, so that a
time is the device's work and not the host's queueing. It reports the loss and
the forward+backward part of its own time.

:func:`time_rounds` steps several variants in turn, one step each per round,
so that they share the machine's conditions (a 2-core machine shared with
other work drifts by minutes); the first ``warmup`` rounds are not counted
(the first steps of autoshard's runtime interpret, trace and compile). Inside
a process group every step starts after a barrier and its time is the maximum
over the ranks (a step is as slow as its slowest rank); the result per variant
is the median over the rounds, robust to one round that another job slowed.

>>> import torch
>>> model = torch.nn.Linear(4, 1)
>>> step = train_step(lambda x: model(x).sum(), (torch.ones(2, 4),), torch.optim.SGD(model.parameters(), lr=0.1))
>>> times = time_rounds({"linear": step}, rounds=3, warmup=1)
>>> times["linear"].rounds, times["linear"].step_s > 0, times["linear"].part_s <= times["linear"].step_s
(3, True, True)
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.common.models import loss_of

__all__ = ["StepRun", "StepTime", "device_sync", "train_step", "time_rounds", "load_average"]


@dataclass(frozen=True, slots=True)
class StepRun:
    """What one call of a :func:`train_step` step reports."""

    loss: Any
    """The step's loss, a detached tensor: its value is read on the host by the caller, outside the
    time (on a GPU the read waits for the device; ``DeviceAudit`` counts it as a host sync)."""
    forward_backward_s: float
    """Seconds of the forward and backward (with any ``after_backward`` work), without the optimizer."""


@dataclass(frozen=True, slots=True)
class StepTime:
    """One variant's time from :func:`time_rounds`."""

    step_s: float
    """Median over the timed rounds of the whole step (max over ranks in a process group)."""
    part_s: float
    """Median of the forward+backward part a :class:`StepRun` reports (max over ranks); NaN for a
    step that reports none."""
    rounds: int
    """Timed rounds (warm-up not counted)."""


def device_sync(device: str | torch.device) -> Callable[[], None]:
    """What makes a step's time the device's: ``torch.cuda.synchronize`` on a GPU, nothing on the CPU.

    >>> device_sync("cpu")()
    """
    device = torch.device(device)
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def train_step(module: Callable[..., Any], inputs: tuple | dict, optimizer: Any, *,
               sync: Callable[[], None] = lambda: None,
               after_backward: Callable[[], None] | None = None) -> Callable[[], StepRun]:
    """One training step of ``module`` on ``inputs`` (positional or keyword tensors), as a function
    to call once per step: forward, backward, ``after_backward()`` (a hand-written data-parallel
    all-reduce), ``optimizer.step()``, ``zero_grad``.

    >>> # step = train_step(model, inputs, torch.optim.AdamW(model.parameters()), sync=device_sync("cuda"))
    """

    def step() -> StepRun:
        start = time.perf_counter()
        loss = loss_of(module, inputs)
        loss.backward()
        if after_backward is not None:
            after_backward()
        sync()
        forward_backward = time.perf_counter() - start
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        return StepRun(loss=loss.detach(), forward_backward_s=forward_backward)

    return step


def time_rounds(steps: Mapping[str, Callable[[], Any]], *, rounds: int, warmup: int,
                before_timed: Callable[[], None] | None = None) -> dict[str, StepTime]:
    """Each of ``steps`` (name -> a step; any callable, a :class:`StepRun` result gives the part)
    called ``warmup + rounds`` times, in turn; ``before_timed()`` runs once after the warm-up
    (a GPU's peak memory reset). Every rank of a process group calls it with the same ``steps``.

    >>> # times = time_rounds({"eager": eager, "autoshard": ours}, rounds=10, warmup=4)
    """
    if rounds < 1 or warmup < 0:
        raise ValueError(f"time_rounds: rounds must be at least 1 and warmup at least 0, got {rounds}, {warmup}")
    # one rank is its own max (and an NCCL group of one could not all-reduce this CPU tensor)
    grouped = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    whole: dict[str, list[float]] = {name: [] for name in steps}
    part: dict[str, list[float]] = {name: [] for name in steps}
    for i in range(warmup + rounds):
        if i == warmup and before_timed is not None:
            before_timed()
        for name, step in steps.items():
            if grouped:
                dist.barrier()
            start = time.perf_counter()
            out = step()
            elapsed = time.perf_counter() - start
            inner = out.forward_backward_s if isinstance(out, StepRun) else -1.0  # -1: none (a max stays -1)
            if grouped:  # the slowest rank's
                both = torch.tensor([elapsed, inner], dtype=torch.float64)
                dist.all_reduce(both, op=dist.ReduceOp.MAX)
                elapsed, inner = float(both[0]), float(both[1])
            if i >= warmup:
                whole[name].append(elapsed)
                part[name].append(inner if inner >= 0 else math.nan)
    return {name: StepTime(step_s=statistics.median(whole[name]), part_s=statistics.median(part[name]),
                           rounds=rounds) for name in steps}


def load_average() -> str:
    """The machine's load average over 1, 5 and 15 minutes, as the reports print it beside a time
    (``"?"`` where the system has none): a time taken under load says so.

    >>> len(load_average().split()) in (1, 3)
    True
    """
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "?"
