r"""Pipeline search: the ``pp`` mesh dim, stage cuts, microbatches and schedule, priced.

A mesh ``(pp, dp, tp)`` with ``pp`` outermost (across nodes) runs a model of ``N``
repeated blocks as ``K = p v`` stages, ``v`` per rank of the ``pp`` dim, over ``m``
microbatches of ``B / m`` sequences (``B`` the global batch). Inside a stage the
placements and recomputation are those of the stage sub-mesh ``(dp, tp)``'s
solve at the microbatch's batch (:mod:`autoshard.search.pipeline_blocks`: per-block
forward ``f``, backward ``b``, state ``s``, saved activations ``a``, gradient
reduction ``g`` and optimizer ``o``, and the embedding / head extras).

**One candidate** ``(schedule, m, v)`` (:func:`price_pipeline`):

    (a) cuts    = cut_stages(blocks, K, extras, h = stage_in_flight(schedule), M - T)
                  (the head's state with ``T_head``, the head's transient above ``T``: counted once,
                  on the last stage: ``pipeline_blocks``, Transients)
                  (``costmodel.stage_cuts``: DP over block boundaries, least slowest stage)
    (b) stage k = StageCost(F_k = sum f + [k = K-1] f^last + a2a_k, B_k = sum b + ...,
                            I_k = W_k = (B_k - R_k) / 2 + R_k,    (the split backward: ASSUMPTION;
                                                                    W keeps all of a_k: an upper bound;
                                                                    R_k the stage's recomputation and its
                                                                    re-gathers (h'''), run in both halves:
                                                                    _stage_costs)
                            send_k = t_permute(bytes_mb, pp dim),   bytes_mb = B/m * seq * d * itemsize / (dp tp)
                            G_k = sum g (+ extras), O_k = sum o (+ extras),
                            weight gathers A_k = sum w (+ extras), once a step)
    (c) sim     = simulate_pipeline(schedule(p, m, v), [stage k])   (``costmodel.pipeline_simulate``)
    (d) memory_r = sum_{k on r} (sum s) + [r holds stage K-1] T_head + peak activation bytes of r (sim) + T  <= M
    (e) step    = sim.step_s

The send is one point-to-point permute of the boundary activation (and of its
gradient, the same bytes) on the tier the ``pp`` dim crosses
(``costmodel.collectives.collective_time_s("permute", ...)``), sequence-sharded over
``tp`` and batch-sharded over ``dp`` at the boundary, as torchtitan's sequence
parallelism leaves it.

**Search** (:func:`search_pipeline`): every schedule of the list, ``m`` in a small
set (multiples of ``p`` dividing ``B`` with ``dp | B / m``), ``v`` in ``{1, 2, 4}``
where the schedule allows (``ZBVZeroBubble``, ``DualPipeV``: 2; ``GPipe``,
``1F1B``: 1); the candidate with the least (e) among those whose (d) holds.
Ties: the first in schedule-list, then ``m``, then ``v`` order.

**Recomputation** (what the pipeline runtime runs inside a stage: FSDP2 / torch TP, each block
either keeping what its backward reads, ``none``, or checkpointed, ``full``: it keeps its input
and runs its forward again before its backward; ``pipeline_blocks``, Full recomputation). Each
policy ``r`` has its own pricing at each ``m`` (two solves each), its own saved activations
``a_r`` in (d), and ``b_full = b_none + the recomputation``. Both policies searched:

    (R1) price ``none`` at every ``m`` and every ``(schedule, v)``;
    (R2) price ``full`` at ``m`` only where some ``none`` candidate at ``m`` is memory-bound (refused
         by the limit, or its cut's bottleneck above the cut without a limit) and its bound
             LB_full(m) = m W_none(m) / p  <  the best fitting step so far
         (``W`` one microbatch's forward and backward over all blocks and extras: (f)), the
         ``m`` of the smallest bound first;
    (R3) the fastest fitting candidate of either policy; a ``full`` one replaces the incumbent
         only when strictly faster, so a tie keeps ``none``;
    (R4) at each ``m`` where (R2) priced ``full``, also ``partial`` for every ``(schedule, v)``: each
         stage checkpoints only its first ``c_k`` blocks, the fewest that fit the limit on the cut
         without one (``autoshard.search.pipeline_partial``: both pricings mixed block by block);
         it too replaces the incumbent only when strictly faster. Its work lies between the two
         policies' (``W_none <= W_partial``), so (R2)'s bound holds for it as well. Given the
         op-level (``selective``) policy's pricing too, the next ``s_k`` blocks of a stage may run
         it (``autoshard.search.pipeline_selective``): its recomputation only adds as well, so
         the bound stands.

Why (R2) loses nothing the price would pick, under two ASSUMPTIONS. Per block, ``full`` does
the forward of ``none`` and a backward no shorter (the recomputation only adds: ``f_full >=
f_none``, ``b_full >= b_none``, the two solves' placements alike; (A1) of
``autoshard.search.recompute_search``), so ``W_full(m) >= W_none(m)`` and (f) for ``full``
is at least ``LB_full(m)``: a full candidate at an ``m`` whose bound reaches the incumbent
cannot beat it. Where no none candidate at ``m`` is memory-bound, each none candidate runs
the cut without a limit, and full, with the same cut order (alike blocks), larger stage times
and the same sends, simulates no faster (each action of the simulation starts at the latest end
of what it waits for: the step grows with every stage time). Cost: two solves per ``m``
for ``none``, two more per ``m`` that (R2) lets through; pinning one policy prices it alone.

**Bound.** For one candidate, every rank's busy time is a lower bound on its step,
and the busiest rank's is at least the average:

    (f) LB = m * (sum_n (f_n + b_n) + extras) / p  <=  step

the plan states ``gap = 1 - LB / step``: how much the schedule's bubble, the sends and
the tail (reduction, optimizer) cost above perfect balance. For the mesh search,
:func:`layout_lower_bound_s` bounds any layout before it is solved:

    (g) LB_layout = FLOPs per step / (devices * peak FLOP/s of the dtype)

a layout whose (g) exceeds the best step found is cut (every step does at least
its FLOPs at no more than the peak).

>>> layouts = pipeline_layouts(512, 8)
>>> (8, 8, 8) in [l.mesh_shape for l in layouts]
True
>>> layout_lower_bound_s(1e18, 512, 1e15) > 1.9
True
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

from costmodel.collectives import collective_time_s
from costmodel.mesh import MeshSpec
from costmodel.pipeline_schedules import SCHEDULE_NAMES, build_schedule
from costmodel.pipeline_simulate import PipelineSimulation, StageCost, simulate_pipeline
from costmodel.stage_cuts import StageCuts, cut_stages, stage_in_flight

from autoshard.plan.pipeline_section import (RECOMPUTE_POLICIES, PipelineSection, build_pipeline_section,
                                             priced_sequence_parallel)
from autoshard.search.pipeline_blocks import BlockPricing

__all__ = [
    "PipelineLayout", "PipelineCandidate", "PipelinePlan", "pipeline_layouts", "layout_lower_bound_s",
    "price_pipeline", "search_pipeline", "microbatch_counts", "model_flops_per_token", "best_plan",
    "DEFAULT_SCHEDULES", "V_OF", "pipeline_section", "RECOMPUTE_POLICIES", "price_partial_candidate",
]

DEFAULT_SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
V_OF: Mapping[str, tuple[int, ...]] = {"GPipe": (1,), "1F1B": (1,), "Interleaved1F1B": (2, 4),
                                       "InterleavedZeroBubble": (1, 2, 4), "ZBVZeroBubble": (2,), "DualPipeV": (2,),
                                       "LoopedBFS": (2, 4)}
"""Stages per rank ``v`` each schedule is priced with."""


@dataclass(frozen=True, slots=True)
class PipelineLayout:
    """One mesh layout with a ``pp`` dim outermost."""

    pp: int
    dp: int
    tp: int

    @property
    def mesh_shape(self) -> tuple[int, int, int]:
        return (self.pp, self.dp, self.tp)

    @property
    def dim_names(self) -> tuple[str, str, str]:
        return ("pp", "dp", "tp")


def pipeline_layouts(devices: int, per_node: int, *, min_pp: int = 2) -> tuple[PipelineLayout, ...]:
    """Every ``(pp, dp, tp)`` of ``devices`` with ``pp >= min_pp`` outermost across nodes
    (``pp`` divides the node count), ``tp`` within a node (divides ``per_node``).

    >>> [l.mesh_shape for l in pipeline_layouts(16, 8)]
    [(2, 8, 1), (2, 4, 2), (2, 2, 4), (2, 1, 8)]
    """
    if devices < 1 or per_node < 1 or devices % per_node and devices > per_node:
        raise ValueError(f"devices={devices}, per_node={per_node}: devices must be a multiple of per_node")
    nodes = max(1, devices // per_node)
    out = []
    for pp in range(max(1, min_pp), nodes + 1):
        if nodes % pp:
            continue
        for tp in range(1, per_node + 1):
            if per_node % tp == 0 and (devices // pp) % tp == 0:
                out.append(PipelineLayout(pp, devices // pp // tp, tp))
    return tuple(out)


def layout_lower_bound_s(flops_per_step: float, devices: int, peak_flops: float) -> float:
    """(g): no layout of ``devices`` runs a step of ``flops_per_step`` in less."""
    if devices < 1 or peak_flops <= 0:
        raise ValueError(f"devices ({devices}) and peak_flops ({peak_flops}) must be positive")
    return flops_per_step / (devices * peak_flops)


@dataclass(frozen=True, slots=True)
class PipelineCandidate:
    """One priced ``(schedule, m, v)``."""

    schedule: str
    n_microbatches: int
    stages_per_rank: int
    step_s: float
    """``inf`` when it does not fit (``why``)."""
    bubble_fraction: float
    peak_bytes: float
    """Busiest rank's memory (d)."""
    why: str = ""
    """Why it was refused (memory, schedule rule); empty when it fits."""
    rank_memory_bytes: tuple[float, ...] = ()
    """Per rank of the ``pp`` dim: (d)."""
    send_s: float = 0.0
    """One boundary send (activation or gradient) of one microbatch."""
    recompute: str = "none"
    """The stages' recomputation policy it was priced with (:data:`RECOMPUTE_POLICIES`)."""
    memory_bound: bool = False
    """The memory limit refused it or slowed its cut (its bottleneck above the cut without a limit): (R2)."""
    recompute_blocks: tuple[int, ...] = ()
    """With ``recompute="partial"``: the checkpointed blocks of each stage (R4)."""
    selective_blocks: tuple[int, ...] = ()
    """With ``recompute="partial"``: each stage's blocks under the op-level policy, after its
    checkpointed ones (R4; ``pipeline_selective``); empty: none."""
    all_mm_blocks: tuple[int, ...] = ()
    """With ``recompute="partial"``: each stage's blocks under the op-level policy saving every matmul
    (``selective_all_mm``), after its selective ones; empty: none."""


@dataclass(frozen=True, slots=True)
class PipelinePlan:
    """The chosen pipeline of one layout (module docstring)."""

    pp: int
    mesh_shape: tuple[int, ...]
    dim_names: tuple[str, ...]
    schedule: str
    n_microbatches: int
    stages_per_rank: int
    cuts: tuple[int, ...]
    """First block of every stage but the first (``K - 1`` entries)."""
    stage_step_s: tuple[float, ...]
    """Per stage: forward + backward of one microbatch."""
    rank_memory_bytes: tuple[float, ...]
    """Per rank of the ``pp`` dim: (d)."""
    step_s: float
    bubble_fraction: float
    lower_bound_s: float
    """(f) of the chosen candidate."""
    tokens_per_gpu_s: float
    """Global tokens / (step x GPUs): torchtitan's ``tps``."""
    tflops_per_gpu: float
    """Model FLOPs per token x tokens / (step x GPUs) / 1e12, as torchtitan's MFU and the Llama 3 paper count."""
    candidates: tuple[PipelineCandidate, ...]
    search_s: float
    """Wall seconds of the search, block pricing included."""
    stage_seconds: tuple[tuple[float, float], ...] = ()
    """Per stage: (forward, backward) of one microbatch, as priced."""
    recompute: str = "none"
    """The stages' recomputation policy: ``none``, ``full`` or ``partial`` (R4)."""
    recompute_blocks: tuple[int, ...] = ()
    """With ``partial``: per stage, how many of its blocks (its first) are checkpointed."""
    selective_blocks: tuple[int, ...] = ()
    """With ``partial``: per stage, how many of its blocks after those run the op-level policy (empty: none)."""
    all_mm_blocks: tuple[int, ...] = ()
    """With ``partial``: per stage, how many after those save every matmul (``selective_all_mm``; empty: none)."""

    @property
    def gap(self) -> float:
        """``1 - LB / step``: the most the step can exceed the chosen candidate's best balance."""
        return 1.0 - self.lower_bound_s / self.step_s if self.step_s > 0 else 0.0


def model_flops_per_token(n_params: int, n_layers: int, dim: int, seq_len: int) -> float:
    """Training FLOPs per token as torchtitan counts them (``get_num_flop_per_token``): ``6 N``
    for the matmuls of ``N`` non-embedding parameters (forward 2, backward 4), plus
    ``12 L d t`` for attention's scores and values over ``t`` tokens; recomputation not counted.

    >>> model_flops_per_token(405_000_000_000, 126, 16384, 8192) / 1e12
    2.63...
    """
    return 6.0 * n_params + 12.0 * n_layers * dim * seq_len


def microbatch_counts(batch: int, pp: int, dp: int, *, most: int = 3) -> tuple[int, ...]:
    """The ``m`` tried: the ``most`` largest of ``p, 2p, 4p, ...`` that divide ``batch`` with
    ``dp`` dividing ``batch / m`` (each dp rank one sequence or more); for ``p = 1``, ``m = 1``
    (one stage has no bubble to fill: more microbatches only shrink its matmuls).

    >>> microbatch_counts(256, 8, 8), microbatch_counts(256, 8, 8, most=2), microbatch_counts(64, 1, 8)
    ((8, 16, 32), (16, 32), (1,))
    """
    if pp == 1:
        return (1,)
    out, m = [], pp
    while m <= batch:
        if batch % m == 0 and (batch // m) % dp == 0:
            out.append(m)
        m *= 2
    return tuple(out[-most:])


def best_plan(plans: Sequence[PipelinePlan]) -> PipelinePlan:
    """The fastest of ``plans`` (one per layout), ties to the fewest stages: a pipeline is
    chosen only where the price says it pays, so ``pp = 1`` (no pipeline) wins a tie.

    >>> # best_plan([search_pipeline(..., layout=l) for l in pipeline_layouts(64, 8, min_pp=1)])
    """
    if not plans:
        raise ValueError("best_plan: no plans to choose from")
    return min(plans, key=lambda p: (p.step_s, p.pp))


def _stage_costs(pricing: BlockPricing, cut: StageCuts, send_s: float) -> list[StageCost]:
    """(b): one :class:`StageCost` per stage of ``cut``. A split backward (the zero-bubble
    schedules' ``I`` and ``W``) of checkpointed blocks recomputes each block in both halves, as
    the stage runtime runs them (torch's input and weight passes are separate autograd calls,
    each replaying the checkpoint: ``autoshard.runtime.pipeline_stages``, Recomputation):
    ``I = W = (B - R) / 2 + R`` with ``R`` the stage's recomputation, one more ``R`` than the
    full backward ``B``. A kept block's gathered inputs (``pipeline_blocks`` (h''')) are gathered
    again in each pass too, ``E`` in ``R``: each pass's autograd node of a linear unpacks its saved
    input, though the input pass reads only the weight (the first stage, whose input needs no
    gradient, has no input pass through its blocks: over-priced there by ``E``)."""
    k_last = len(cut.stages) - 1
    blk = pricing.block
    out = []
    for k, st in enumerate(cut.stages):
        n = st.end_block - st.first_block
        extras = [e for e, here in ((pricing.first_extra, k == 0), (pricing.last_extra, k == k_last)) if here]
        fwd = n * blk.forward_s + sum(e.forward_s for e in extras)
        bwd = n * blk.backward_s + sum(e.backward_s for e in extras)
        acts = n * blk.activation_bytes + sum(e.activation_bytes for e in extras)
        redo = min(bwd, n * (pricing.block_recompute_s + pricing.block_regather_s))
        half = (bwd - redo) / 2 + redo
        out.append(StageCost(
            forward_s=fwd, backward_input_s=half, backward_weight_s=half, full_backward_s=bwd,
            send_activation_s=send_s, send_gradient_s=send_s, activation_bytes=int(acts), weight_grad_bytes=int(acts),
            gradient_reduction_s=n * pricing.block_reduction_s + (pricing.extra_reduction_s if extras else 0.0),
            optimizer_s=n * pricing.block_optimizer_s + (pricing.extra_optimizer_s if extras else 0.0),
            weight_gather_s=n * pricing.block_gather_s + (pricing.extra_gather_s if extras else 0.0)))
    return out


def _check(n_blocks: int, batch: int, pp: int, schedule: str, m: int, v: int) -> None:
    if schedule not in SCHEDULE_NAMES:
        raise ValueError(f"unknown pipeline schedule {schedule!r}; valid names: {', '.join(SCHEDULE_NAMES)}")
    if m < 1 or batch % m:
        raise ValueError(f"n_microbatches={m} does not divide the batch of {batch} sequences")
    if pp * v > n_blocks:
        raise ValueError(f"pp={pp} x stages_per_rank={v} = {pp * v} stages exceed the model's {n_blocks} blocks")


def price_pipeline(
    pricing: BlockPricing,
    *,
    n_blocks: int,
    batch: int,
    pp: int,
    schedule: str,
    n_microbatches: int,
    stages_per_rank: int = 1,
    send_s: float = 0.0,
    memory_limit_bytes: float | None = None,
    recompute: str = "none",
    unlimited_bottleneck_s: Callable[[int], float] | None = None,
) -> tuple[PipelineCandidate, StageCuts | None, PipelineSimulation | None]:
    """(a)-(e) of one candidate; ``pricing`` at ``batch / n_microbatches`` sequences per microbatch,
    of the stages run with recomputation policy ``recompute`` (recorded on the candidate);
    ``unlimited_bottleneck_s(K)``: the bottleneck of ``K`` stages cut without a limit, when the
    caller has it (the same for every schedule of a pricing: no ``h_k`` without memory). A candidate that does not fit comes back with ``step_s = inf`` and ``why``; bad input raises
    ``ValueError`` naming it.

    >>> from autoshard.search.pipeline_blocks import BlockCost, BlockPricing
    >>> unit = BlockCost(1.0, 2.0, 0, 0)
    >>> p = BlockPricing(1, unit, 0.0, 0.0, BlockCost(0, 0, 0, 0), BlockCost(0, 0, 0, 0), 0.0, 0.0, 0.0, (), 0.0)
    >>> c, _, _ = price_pipeline(p, n_blocks=4, batch=4, pp=2, schedule="1F1B", n_microbatches=4)
    >>> c.step_s   # (m + p - 1)(f + b) with two blocks per stage
    30.0
    """
    m, v = n_microbatches, stages_per_rank
    _check(n_blocks, batch, pp, schedule, m, v)
    if pricing.micro_batch * m != batch:
        raise ValueError(f"pricing is for microbatches of {pricing.micro_batch} sequences, "
                         f"not batch {batch} / n_microbatches {m}")
    limit = math.inf if memory_limit_bytes is None else float(memory_limit_bytes)

    def refused(why: str, memory: bool) -> tuple[PipelineCandidate, None, None]:
        return PipelineCandidate(schedule, m, v, math.inf, 0.0, math.inf, why, (), send_s, recompute, memory), \
            None, None

    try:
        sched = build_schedule(schedule, n_ranks=pp, n_microbatches=m, stages_per_rank=v)
    except ValueError as exc:  # the schedule's own rule (m >= p, rounds): this (m, v) is not one of its orders
        return refused(str(exc), False)
    held = stage_in_flight(sched)
    budget = limit - pricing.transient_bytes
    # the head's transient once, with the last stage's state: cut and (d) both see it there only
    last_extra = replace(pricing.last_extra, state_bytes=pricing.last_extra.state_bytes
                         + int(pricing.head_transient_bytes))

    def cut_within(budget: float) -> StageCuts:  # (a)
        return cut_stages([pricing.block] * n_blocks, pp * v, first_extra=pricing.first_extra,
                          last_extra=last_extra, in_flight=held,
                          memory_limit_bytes=None if math.isinf(budget) else max(0, int(budget)), stages_per_rank=v,
                          stage_ranks=sched.stage_ranks)

    try:
        cut = cut_within(budget)
    except ValueError as exc:
        return refused(str(exc), True)
    # (R2): did the limit slow the cut? (the cut without a limit is cheap beside a block solve)
    free = unlimited_bottleneck_s or (lambda k: cut_within(math.inf).bottleneck_s)
    slowed = not math.isinf(budget) and cut.bottleneck_s > free(pp * v) * (1 + 1e-9)
    costs = _stage_costs(pricing, cut, send_s if pp > 1 else 0.0)
    sim = simulate_pipeline(sched, costs)  # (c)
    state = [0.0] * pp
    for k, st in enumerate(cut.stages):  # (d)
        state[sched.stage_ranks[k]] += st.memory_bytes - held[k] * costs[k].activation_bytes
    memory = [state[r] + sim.ranks[r].peak_activation_bytes + pricing.transient_bytes for r in range(pp)]
    peak = max(memory)
    if peak > limit:
        why = f"rank memory {peak / 2**30:.1f} GiB > limit {limit / 2**30:.1f} GiB"
        return PipelineCandidate(schedule, m, v, math.inf, sim.bubble_fraction, peak, why, tuple(memory), send_s,
                                 recompute, True), cut, sim
    return PipelineCandidate(schedule, m, v, sim.step_s, sim.bubble_fraction, peak, "", tuple(memory), send_s,
                             recompute, slowed), cut, sim


def price_partial_candidate(none: BlockPricing, full: BlockPricing, *, n_blocks: int, batch: int, pp: int,
                            schedule: str, n_microbatches: int, stages_per_rank: int = 1, send_s: float = 0.0,
                            memory_limit_bytes: float | None = None,
                            selective: BlockPricing | None = None,
                            incumbent_s: float = math.inf,
                            all_mm: BlockPricing | Callable[[], BlockPricing] | None = None
                            ) -> tuple[PipelineCandidate, Any]:
    """(R4) of one ``(schedule, m, v)``: each stage checkpointing the fewest of its first blocks that fit,
    on the cut without a memory limit or on the cut chosen with the counts, the faster
    (``pipeline_partial.best_counts``); ``(candidate, PartialPricing)``, or a refused candidate
    (``step_s = inf``, ``why``) and None. ``selective``: the op-level policy's pricing at the same
    microbatch, a third block kind (``pipeline_selective.best_counts3``), tried where the candidate could
    beat the search's ``incumbent_s``; ``all_mm``, with it, the all-mm policy's (or what prices it, called
    only where it is tried), a fourth."""
    from autoshard.search.pipeline_partial import best_counts
    from autoshard.search.pipeline_selective import best_counts3

    m, v = n_microbatches, stages_per_rank
    _check(n_blocks, batch, pp, schedule, m, v)
    limit = math.inf if memory_limit_bytes is None else float(memory_limit_bytes)
    try:
        sched = build_schedule(schedule, n_ranks=pp, n_microbatches=m, stages_per_rank=v)
    except ValueError as exc:
        return PipelineCandidate(schedule, m, v, math.inf, 0.0, math.inf, str(exc), (), send_s, "partial"), None
    last_extra = replace(none.last_extra, state_bytes=none.last_extra.state_bytes + int(none.head_transient_bytes))
    cut = cut_stages([none.block] * n_blocks, pp * v, first_extra=none.first_extra, last_extra=last_extra,
                     in_flight=stage_in_flight(sched), stages_per_rank=v, stage_ranks=sched.stage_ranks)
    if selective is None:
        priced, why = best_counts(none, full, sched, cut, n_blocks, send_s if pp > 1 else 0.0, limit)
    else:
        priced, why = best_counts3(none, full, selective, sched, cut, n_blocks, send_s if pp > 1 else 0.0, limit,
                                   incumbent_s, all_mm)
    if priced is None:
        return PipelineCandidate(schedule, m, v, math.inf, 0.0, math.inf, why, (), send_s, "partial", True), None
    sim = priced.simulation
    return PipelineCandidate(schedule, m, v, sim.step_s, sim.bubble_fraction, max(priced.rank_memory_bytes), "",
                             priced.rank_memory_bytes, send_s, "partial", False, priced.counts,
                             priced.selective, priced.all_mm), priced


def _search_space(batch: int, layout: PipelineLayout, n_blocks: int, schedules: Sequence[str],
                  microbatches: Sequence[int] | None, stages_per_rank: Sequence[int] | None,
                  recompute: str) -> tuple[tuple[int, ...], list[int]]:
    """The ``m`` and ``v`` :func:`search_pipeline` tries; ``ValueError`` naming a bad one."""
    for name in schedules:
        if name not in SCHEDULE_NAMES:
            raise ValueError(f"unknown pipeline schedule {name!r}; valid names: {', '.join(SCHEDULE_NAMES)}")
    if recompute not in RECOMPUTE_POLICIES:
        raise ValueError(f"recompute: {recompute!r} is not a stage policy; valid: {', '.join(RECOMPUTE_POLICIES)}")
    counts = tuple(microbatches) if microbatches is not None else microbatch_counts(batch, layout.pp, layout.dp)
    for m in counts:
        if m < 1 or batch % m:
            raise ValueError(f"n_microbatches={m} does not divide the batch of {batch} sequences")
    if not counts:
        raise ValueError(f"no microbatch count: batch {batch} has no multiple-of-pp={layout.pp} split with "
                         f"dp={layout.dp} dividing each microbatch")
    allowed_v = [v for v in (stages_per_rank or (1, 2, 4)) if layout.pp * v <= n_blocks]
    if not allowed_v:
        raise ValueError(f"pp={layout.pp} stages exceed the model's {n_blocks} blocks")
    return counts, allowed_v


def _work_s(pricing: BlockPricing, n_blocks: int) -> float:
    """One microbatch's forward and backward over every block and the extras: (f) without ``m / p``."""
    return n_blocks * (pricing.block.forward_s + pricing.block.backward_s) + sum(
        e.forward_s + e.backward_s for e in (pricing.first_extra, pricing.last_extra))


def search_pipeline(
    price_at: Callable[[int], BlockPricing],
    *,
    n_blocks: int,
    batch: int,
    seq_len: int,
    dim: int,
    layout: PipelineLayout,
    profile: object,
    flops_per_token: float,
    schedules: Sequence[str] = DEFAULT_SCHEDULES,
    microbatches: Sequence[int] | None = None,
    stages_per_rank: Sequence[int] | None = None,
    memory_limit_bytes: float | None = None,
    itemsize: int = 2,
    recompute: str = "none",
    price_full: Callable[[int], BlockPricing] | None = None,
    partial: bool = True,
    price_selective: Callable[[int], BlockPricing] | None = None,
    price_all_mm: Callable[[int], BlockPricing] | None = None,
) -> PipelinePlan:
    """The fastest fitting candidate of ``layout`` (module docstring, Search). ``price_at(micro_batch)``
    gives the block pricing of microbatches of ``micro_batch`` sequences on the stage sub-mesh
    (:func:`autoshard.search.pipeline_blocks.price_blocks`; called once per ``m``) with the stages'
    recomputation policy ``recompute``; ``price_full``, with ``recompute="none"``, the same under
    full recomputation, priced only where (R2) leaves it a chance, and with it stages checkpointing
    some of their blocks (R4) unless ``partial`` is false; ``price_selective``, with ``price_full``, the
    same under the op-level policy, priced where ``full`` is, a third block kind for (R4) (``price_all_mm``,
    with it, under the policy saving every matmul, a fourth);
    ``profile`` a ``hw_profiles.HardwareProfile`` (sends, memory); ``memory_limit_bytes``
    defaults to its usable memory. ``stages_per_rank`` narrows :data:`V_OF`.

    >>> # search_pipeline(lambda mb: price_blocks(llama3.llama3_405b, {...}, (8, 8), ("dp", "tp"), micro_batch=mb),
    >>> #                 n_blocks=126, batch=256, seq_len=8192, dim=16384, layout=PipelineLayout(8, 8, 8), ...)
    """
    started = time.perf_counter()
    counts, allowed_v = _search_space(batch, layout, n_blocks, schedules, microbatches, stages_per_rank, recompute)
    if price_full is not None and recompute != "none":
        raise ValueError(f"price_full: the second policy is full; recompute={recompute!r} must then be 'none'")
    pp, dp, tp = layout.pp, layout.dp, layout.tp
    limit = profile.device.usable_memory_bytes if memory_limit_bytes is None else memory_limit_bytes
    mesh = MeshSpec(layout.mesh_shape, layout.dim_names)
    best: list = []
    candidates: list[PipelineCandidate] = []

    def try_all(pricing: BlockPricing, m: int, policy: str) -> None:
        # sequence-parallel boundary: each rank sends its dp x tp share of the microbatch's activation
        send = collective_time_s("permute", batch // m * seq_len * dim * itemsize / (dp * tp), (0,), mesh, profile)
        free: dict[int, float] = {}

        def unlimited(k: int) -> float:
            if k not in free:
                free[k] = cut_stages([pricing.block] * n_blocks, k, first_extra=pricing.first_extra,
                                     last_extra=pricing.last_extra).bottleneck_s
            return free[k]
        for name in schedules:
            for v in V_OF.get(name, (1,)):
                if v not in allowed_v:
                    continue
                cand, cut, sim = price_pipeline(pricing, n_blocks=n_blocks, batch=batch, pp=pp, schedule=name,
                                                n_microbatches=m, stages_per_rank=v, send_s=send,
                                                memory_limit_bytes=limit, recompute=policy,
                                                unlimited_bottleneck_s=unlimited)
                candidates.append(cand)
                if cand.step_s < (best[0].step_s if best else math.inf):  # (R3): strictly faster only
                    best[:] = [cand, cut, sim, pricing, None]

    def try_partial(none: BlockPricing, full: BlockPricing, m: int, sel: BlockPricing | None = None,
                    mm: Callable[[], BlockPricing] | None = None) -> None:  # (R4)
        send = collective_time_s("permute", batch // m * seq_len * dim * itemsize / (dp * tp), (0,), mesh, profile)
        for name in schedules:
            for v in V_OF.get(name, (1,)):
                if v not in allowed_v:
                    continue
                cand, priced = price_partial_candidate(none, full, n_blocks=n_blocks, batch=batch,
                                                       pp=pp, schedule=name, n_microbatches=m, stages_per_rank=v,
                                                       send_s=send, memory_limit_bytes=limit, selective=sel,
                                                       incumbent_s=best[0].step_s if best else math.inf, all_mm=mm)
                candidates.append(cand)
                if priced is not None and cand.step_s < (best[0].step_s if best else math.inf):
                    best[:] = [cand, priced.cut, priced.simulation, none, priced.costs]

    first = {}
    for m in counts:  # (R1)
        first[m] = price_at(batch // m)
        try_all(first[m], m, recompute)
    if price_full is not None:  # (R2), the smallest bound first
        for m in sorted(counts, key=lambda m: m * _work_s(first[m], n_blocks)):
            bound = m * _work_s(first[m], n_blocks) / pp
            if bound < (best[0].step_s if best else math.inf) and any(
                    c.memory_bound for c in candidates if c.n_microbatches == m and c.recompute == "none"):
                full = price_full(batch // m)
                try_all(full, m, "full")
                if partial:
                    try_partial(first[m], full, m, price_selective(batch // m) if price_selective is not None else None,
                                (lambda mb=batch // m: price_all_mm(mb)) if price_all_mm and price_selective else None)
    if not best:
        raise _none_fits(candidates, layout, limit)
    return _chosen(best, candidates, layout, batch * seq_len, flops_per_token, n_blocks, started)


def _none_fits(candidates: Sequence[PipelineCandidate], layout: PipelineLayout, limit: float) -> ValueError:
    """The one-line error of a layout none of whose ``candidates`` fits ``limit`` bytes a rank."""
    least = min((c.peak_bytes for c in candidates), default=math.inf)
    why = next((c.why for c in candidates if c.why), "")
    tried = ", ".join(sorted({c.recompute for c in candidates}))
    # a candidate no cut fits has no rank memory to show (inf): its refusal says why
    least_text = f"least rank memory {least / 2**30:.1f} GiB; " if math.isfinite(least) else "no cut fits; "
    return ValueError(f"layout {'x'.join(map(str, layout.mesh_shape))} (pp,dp,tp): no pipeline candidate fits "
                      f"{limit / 2**30:.1f} GiB with recompute {tried} ({least_text}first refusal: {why})")


def _chosen(best: Sequence, candidates: Sequence[PipelineCandidate], layout: PipelineLayout, tokens: int,
            flops_per_token: float, n_blocks: int, started: float) -> PipelinePlan:
    """The :class:`PipelinePlan` of the best candidate ``(candidate, cut, simulation, pricing, stage costs)``
    (the stage costs: a ``partial`` candidate's, priced with both policies; else None)."""
    cand, cut, _, pricing, costs = best
    gpus = layout.pp * layout.dp * layout.tp
    work = sum(c.forward_s + c.full_backward_s for c in costs) if costs else _work_s(pricing, n_blocks)
    costs = costs or _stage_costs(pricing, cut, cand.send_s)
    return PipelinePlan(
        pp=layout.pp, mesh_shape=layout.mesh_shape, dim_names=layout.dim_names, schedule=cand.schedule,
        n_microbatches=cand.n_microbatches, stages_per_rank=cand.stages_per_rank, cuts=cut.cuts,
        stage_step_s=tuple(s.time_s for s in cut.stages), rank_memory_bytes=cand.rank_memory_bytes,
        step_s=cand.step_s, bubble_fraction=cand.bubble_fraction,
        lower_bound_s=cand.n_microbatches * work / layout.pp,  # (f)
        tokens_per_gpu_s=tokens / (cand.step_s * gpus),
        tflops_per_gpu=flops_per_token * tokens / (cand.step_s * gpus) / 1e12,
        candidates=tuple(candidates), search_s=time.perf_counter() - started,
        stage_seconds=tuple((c.forward_s, c.full_backward_s or c.backward_input_s + c.backward_weight_s)
                            for c in costs),
        recompute=cand.recompute, recompute_blocks=cand.recompute_blocks, selective_blocks=cand.selective_blocks,
        all_mm_blocks=cand.all_mm_blocks)


def pipeline_section(
    plan: PipelinePlan,
    *,
    batch: int,
    seq_len: int,
    dim: int,
    block_paths: Sequence[str],
    leading: Sequence[str] = (),
    trailing: Sequence[str] = (),
    itemsize: int = 2,
    data_parallel: str = "fsdp",
    tensor_parallel: Sequence[tuple[str, str]] = (),
) -> PipelineSection:
    """The plan file's ``pipeline`` section (``autoshard.plan.pipeline_section``) of the chosen
    candidate: its cuts over ``block_paths`` (``autoshard.trace.repeated_blocks``), ``leading``
    (embedding) on the first stage and ``trailing`` (norm, head) on the last, the send bytes as
    :func:`search_pipeline` priced them (a microbatch's boundary activation over ``dp x tp``);
    ``tensor_parallel`` the stages' column / row split of the blocks' linears on ``tp``
    (``autoshard.search.pipeline_model.stage_tensor_parallel``), run sequence parallel with a tp
    layout under either recomputation policy (a checkpointed block's kept input and a kept block's
    residual stream are priced sequence-split: ``pipeline_blocks`` (h'), (h'')).

    >>> # pipeline_section(search_pipeline(...), batch=256, seq_len=8192, dim=16384,
    >>> #                  block_paths=[f"layers.{i}" for i in range(126)], leading=("tok_embeddings",))
    """
    pp_at = plan.dim_names.index("pp") if "pp" in plan.dim_names else 0
    others = math.prod(s for i, s in enumerate(plan.mesh_shape) if i != pp_at)
    send = batch // plan.n_microbatches * seq_len * dim * itemsize // others
    return build_pipeline_section(
        schedule=plan.schedule, n_ranks=plan.pp, n_microbatches=plan.n_microbatches, batch_size=batch,
        block_paths=block_paths, cuts=plan.cuts, leading=leading, trailing=trailing,
        stages_per_rank=plan.stages_per_rank, mesh_dim=plan.dim_names[pp_at], send_bytes=send,
        data_parallel=data_parallel, stage_seconds=plan.stage_seconds, rank_peak_bytes=plan.rank_memory_bytes,
        step_s=plan.step_s, bubble_fraction=plan.bubble_fraction, recompute=plan.recompute,
        recompute_blocks=plan.recompute_blocks, selective_blocks=plan.selective_blocks,
        all_mm_blocks=plan.all_mm_blocks,
        tensor_parallel=tensor_parallel, sequence_parallel=priced_sequence_parallel(plan.recompute, tensor_parallel))
