"""A plan whose caching-allocator reservation exceeds the device is solved again under a lower limit.

The solver bounds the live peak (``torch.cuda.max_memory_allocated``); on a CUDA device the job
also needs what PyTorch's caching allocator keeps beside the live tensors
(``max_memory_reserved``), which ``autoshard.program.reservation`` replays for every plan on a GPU
profile (``estimate.reserved_bytes``). A plan whose live peak fits but whose reservation does not
would run out of memory on the GPU (LLaMA-3.1 405B on 64x8: live 78.7 GiB, reserved 80.07 GiB, on
a 79.18 GiB device), so ``autoshard.search.solve.solve_prepared`` hands it here:

    P_{k+1} limit = P_k - (R_k - D) - m D      (k = 0, 1, ..., K - 1)

with ``P_k`` and ``R_k`` the live peak and the reservation of round ``k``'s plan, ``D`` the device's
memory, ``m`` :data:`RESERVATION_MARGIN` and ``K`` :data:`RESERVATION_ROUNDS`. What the allocator
keeps beyond the live tensors (freed blocks it holds, rounding to blocks and segments) depends
on the plan but changes little between close plans, so a plan whose live peak is lower by the
overshoot should reserve about that much less. The overshoot is taken off the peak, not off the
limit: a plan well under its limit would otherwise be solved again unchanged. The first plan
whose reservation fits is returned; none within ``K`` rounds (or the time left): the caller
raises the error of an infeasible memory limit.

>>> class Estimate:
...     def __init__(self, peak, reserved): self.peak_memory_bytes, self.reserved_bytes = peak, reserved
>>> class FakePlan:
...     def __init__(self, peak, reserved): self.estimate = Estimate(peak, reserved)
>>> limits = []
>>> def solve_under(limit, seconds):  # the allocator keeps 4 bytes beyond any live peak
...     limits.append(limit)
...     return FakePlan(limit, limit + 4)
>>> fit = fit_reservation(FakePlan(90, 104), 100, solve_under, deadline=float("inf"), margin=0.01)
>>> limits, fit.plan.estimate.reserved_bytes, fit.rounds
([85.0], 89.0, 1)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["RESERVATION_ROUNDS", "RESERVATION_MARGIN", "ReservationFit", "fit_reservation", "reserved_over"]

RESERVATION_ROUNDS = 3
"""Re-solves under a lower memory limit a plan gets to fit the caching allocator's reservation."""

RESERVATION_MARGIN = 0.01
"""Share of the device's memory a re-solve's limit goes below the overshoot: the reservation
grows in whole blocks and segments (2 MiB, 20 MiB), so lowering the live peak by exactly the
overshoot can leave it a block over."""


@dataclass(frozen=True, slots=True)
class ReservationFit:
    """The outcome of :func:`fit_reservation`."""

    plan: Any
    """The first plan whose reservation fits; None when no round found one."""
    rounds: int
    """Re-solves run (0: the plan given fitted)."""


def reserved_over(plan: Any, device_bytes: float) -> bool:
    """Whether ``plan``'s replayed reservation (None on a CPU profile) exceeds ``device_bytes``."""
    reserved = plan.estimate.reserved_bytes
    return reserved is not None and reserved > device_bytes


def fit_reservation(plan: Any, device_bytes: float, solve_under: Callable[[float, float], Any], *,
                    deadline: float, rounds: int = RESERVATION_ROUNDS,
                    margin: float = RESERVATION_MARGIN) -> ReservationFit:
    """``plan`` or a re-solve of it whose reservation fits ``device_bytes`` (module docstring).
    ``solve_under(memory_limit, seconds)``: the plan solved again under ``memory_limit`` in
    ``seconds``, or None when no plan fits that limit; ``deadline``: ``time.perf_counter()``
    past which no re-solve starts."""
    ran = 0
    while reserved_over(plan, device_bytes):
        estimate = plan.estimate
        lower = estimate.peak_memory_bytes - (estimate.reserved_bytes - device_bytes) - margin * device_bytes
        left = deadline - time.perf_counter()
        if ran == rounds or lower <= 0 or left <= 0:
            return ReservationFit(None, ran)
        ran += 1
        plan = solve_under(lower, left)
        if plan is None:
            return ReservationFit(None, ran)
    return ReservationFit(plan, ran)
