r"""The gradient bucket cap, chosen by the simulated step.

DDP fills gradient buckets in the order the backward makes the gradients and
launches each as soon as its last gradient is made, so that the reductions run
under the rest of the backward; its cap (25 MiB) trades the call latency a
bucket pays (fewer, larger buckets pay it less often) against the overlap
(smaller buckets start earlier, and only the last one waits after the
backward). That trade-off depends on the interconnect and on the compute left
after each gradient, which the plan's schedule simulation
(``autoshard.plan.schedule.simulate_schedule``, ``costmodel.overlap``) prices. So
instead of a fixed cap the assembler groups the gradients with every cap of

    caps = GRADIENT_CAPS U {B}     (B: the graph's bucket_bytes, what the solver priced)

(``costmodel.bucketing.group_buckets``: reverse-use order, a new bucket when
the cap would be passed), schedules each grouping as the runtime runs it (a
bucket issued right after its last member gradient, waited before the
optimizer step), and keeps the one with the shortest simulated step (ties: the
larger cap, fewer calls). ``B = 0`` turns buckets off, as before. The solver's
edge prices amortise latency over ``B``-sized buckets (``costmodel.bucketing``):
an approximation the plan's estimate corrects, since it simulates the buckets
chosen here.

>>> GRADIENT_CAPS[0], GRADIENT_CAPS[-1]
(1048576, 67108864)
"""

from __future__ import annotations

from typing import Any, Sequence

from costmodel.bucketing import Bucket, group_buckets
from costmodel.mesh import MeshSpec
from hw_profiles import HardwareProfile

from autoshard.plan.schedule import build_schedule, leaf_views, simulate_schedule

__all__ = ["GRADIENT_CAPS", "choose_gradient_buckets"]

GRADIENT_CAPS = (2**20, 4 * 2**20, 16 * 2**20, 25 * 2**20, 64 * 2**20)
"""Gradient bucket caps (bytes) the assembler tries beside the graph's own."""


def choose_gradient_buckets(
    grads: Sequence[tuple[str, str, Sequence[Any]]],
    pricing: Any,
    redistributions: Sequence[Any],
    *,
    mesh: MeshSpec,
    profile: HardwareProfile,
    cap: int,
) -> tuple[tuple[Bucket, ...], int]:
    """(buckets, cap) with the shortest simulated step (module docstring).

    ``grads``: ``(sink, dtype, steps)`` of the gradient redistributions in the
    order the backward makes them; ``pricing``: the plan's
    ``autoshard.plan.assemble.StepPricing``; ``redistributions``: the plan's."""
    if cap <= 0:
        return (), 0
    best: tuple[float, int, tuple[Bucket, ...]] | None = None
    seen: set[tuple] = set()
    views = leaf_views(pricing.view_candidates, redistributions)
    for candidate in sorted(set(GRADIENT_CAPS) | {int(cap)}, reverse=True):  # larger first: ties keep it
        buckets = group_buckets(grads, mesh, profile, candidate)
        key = tuple(b.members for b in buckets)
        if key in seen:  # the same grouping as a larger cap: same step
            continue
        seen.add(key)
        schedule = build_schedule(pricing.node_names, redistributions, buckets, leaf_views=views)
        sim = simulate_schedule(schedule, pricing.op_compute_s, redistributions, buckets, tail_s=pricing.tail_s,
                                contention=pricing.contention, skew_s=pricing.skew_s)
        if best is None or sim.step_s < best[0] * (1 - 1e-9):
            best = (sim.step_s, candidate, buckets)
    assert best is not None  # at least one candidate was tried
    return best[2], best[1]
