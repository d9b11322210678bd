r"""Pipeline stages that checkpoint some of their blocks: their price, and how many each checkpoints.

A plan's ``pipeline.recompute`` may be ``"partial"``: stage ``k`` of ``n_k`` blocks runs its first
``c_k`` under activation checkpointing and keeps the rest whole (``autoshard.plan.pipeline_section``;
the runtime: ``autoshard.runtime.pipeline_stages``, Recomputation). Its price mixes the block
pricings of the two policies at the same microbatch (``autoshard.search.pipeline_blocks``: ``N``
without recomputation, its residual stream and gathered inputs sequence-split (h''), (h'''); ``C``
with full recomputation, its kept input sequence-split (h')), block by block:

    (p1) F_k = (n_k - c_k) f^N + c_k f^C (+ extras),   B_k = (n_k - c_k) b^N + c_k b^C (+ extras)
    (p2) R_k = (n_k - c_k)(R^N + E^N) + c_k (R^C + E^C)   (what a split backward runs in both halves:
         ``autoshard.search.pipeline._stage_costs``)
    (p3) a_k = (n_k - c_k) a^N + c_k a^C (+ extras)   saved per microbatch in flight
    (p4) s, g, o, w per block mixed the same way; a stage's extras (embedding, head) and their
         reduction, optimizer and gathers from ``C`` where every block of the stage is checkpointed,
         else from ``N``
    (p5) rank r's memory = sum_{k on r} (n_k s + extras' state) + peak activations of r (the schedule
         simulated with (p3)) + max(T_r, H_r), with T_r the block transient of the rank's policy
         (``T^N`` where none of its blocks is checkpointed, ``T^C`` where all are, the larger of the two
         otherwise: a rank with both kinds of blocks runs both kinds of transient) and H_r the head's
         transient, ``T + head``, of the last stage's policy, on the rank that holds it

so ``c_k = 0`` everywhere prices exactly as ``N`` and ``c_k = n_k`` as ``C`` (same cut). A third kind,
``S`` (op-level checkpointing, ``s_k`` blocks after the ``c_k``), adds its own term to each of
(p1)-(p5) where given (``autoshard.search.pipeline_selective``); with every ``s_k = 0`` the price
is this one, bit for bit. So does a fourth, ``M`` (the op-level policy saving every matmul's output,
``selective_all_mm``: ``m_k`` blocks after the ``S`` ones): the terms of a stage are summed in the
order ``N``, ``C``, ``S``, ``M``, each of ``S`` and ``M`` only where its count is not 0, so the
price with every ``m_k = 0`` is the three-kind one, bit for bit.

**Choosing the counts** (:func:`best_counts`, one candidate ``(schedule, m, v)``): the faster
fitting of two, (c0) and (c1)-(c4).

(c0) (:func:`choose_counts`) the cut without a memory limit (the blocks are alike: balanced stage
times), every ``c_k = 0``; while a rank is over the limit by ``X_r``: on its stage with the most microbatches in flight
``h_k`` (``costmodel.stage_cuts.stage_in_flight``; ties the lowest index) that still has a kept
block, ``c_k += ceil(X_r / (h_k (a^N - a^C)))`` (at most its blocks); simulate again. A
checkpointed block of stage ``k`` lowers its rank's peak by at most ``h_k (a^N - a^C)`` (the peak
holds at most ``h_k`` of the stage's microbatches) and costs every stage the same time
``(b^C - b^N)``, so the stage with the most in flight frees the most per block recomputed, and the
step never checkpoints more blocks than that bound asks for. The first stages of a rank-ordered
schedule hold the most in flight (1F1B: ``p - r`` on rank ``r``), so the counts differ per stage:
the runtime applies each stage's own count at no cost.

**The cut with the counts** (:func:`cut_with_counts`): (c0) leaves the stages that recompute the
most, which pace the schedule, as long as the others; moving blocks off them pays. As
``costmodel.stage_cuts`` cuts (its (c) shares: ``M_k = (M - max(T^N, T^C)) w_k / sum_{k' on
rank(k)} w_{k'}``, ``w_k = s + h_k a^N``), with each stage's time the one of the fewest counts that fit
its share:

    (c1) c_k(i, j) = max(0, ceil((mem^N_k(i, j) - M_k) / (h_k (a^N - a^C)))),  mem^N_k the stage's
         memory without recomputation, ``h_k`` microbatches in flight (its extras and, on the last
         stage, the head's transient included); the stage does not fit where c_k > j - i;
         time_k(i, j) = (j - i) t^N + c_k (t^C - t^N) (+ extras' time)
    (c2) D(k, i) = min_j max(time_k(i, j), D(k + 1, j)) over the j that fit (``O(K N^2)``)
    (c3) the lexicographically smallest optimal cut, with its counts
    (c4) (:func:`trim_counts`) the counts checked with the schedule simulated ((c0)'s loop adds
         where a rank is still over); then one fewer, stage by stage from the fewest in flight, while
         every rank still fits: ``h_k`` microbatches per stage and the shares bound a rank's peak
         from above, so (c1) may ask for more than the simulated peak needs.

Partial: the counts and the cut are chosen against the shares' bound and the simulated peak after,
not searched jointly with the simulation. Refused (``None`` and why) where a rank is over the
limit with every block of its stages checkpointed on both cuts, or where checkpointing saves
nothing (``a^C >= a^N``) and the cut without a limit does not fit.

>>> from autoshard.search.pipeline_blocks import BlockPricing
>>> from costmodel.stage_cuts import BlockCost, cut_stages
>>> none = BlockPricing(1, BlockCost(1.0, 2.0, 0, 10), 0, 0, BlockCost(0, 0, 0, 0), BlockCost(0, 0, 0, 0), 0, 0, 0,
...                     (), 0.0)
>>> full = BlockPricing(1, BlockCost(1.0, 3.0, 0, 2), 0, 0, BlockCost(0, 0, 0, 0), BlockCost(0, 0, 0, 0), 0, 0, 0,
...                     (), 0.0, block_recompute_s=1.0)
>>> [c.activation_bytes for c in mixed_stage_costs(none, full, cut_stages([none.block] * 4, 2), (1, 0), 0.0)]
[12, 20]
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Sequence

from costmodel.pipeline_schedules import PipelineSchedule
from costmodel.pipeline_simulate import PipelineSimulation, StageCost, simulate_pipeline
from costmodel.stage_cuts import Stage, StageCuts, stage_in_flight, suffix_min_max

from autoshard.search.pipeline_blocks import BlockPricing

__all__ = ["PartialPricing", "mixed_stage_costs", "price_counts", "choose_counts", "cut_with_counts", "trim_counts",
           "best_counts", "stage_shares", "stage_need", "cut_by_stage_price"]


@dataclass(frozen=True, slots=True)
class PartialPricing:
    """One candidate's stages with ``counts`` checkpointed blocks each, priced (module docstring)."""

    counts: tuple[int, ...]
    """``c_k`` per stage."""
    cut: StageCuts
    """The cut, each stage's time and memory as (p1), (p3) price them."""
    costs: tuple[StageCost, ...]
    simulation: PipelineSimulation
    rank_memory_bytes: tuple[float, ...]
    """(p5) per rank of the ``pp`` dim."""
    selective: tuple[int, ...] = ()
    """``s_k`` per stage: blocks under the op-level policy (``autoshard.search.pipeline_selective``);
    empty: none."""
    all_mm: tuple[int, ...] = ()
    """``m_k`` per stage: blocks under the op-level policy saving every matmul (``selective_all_mm``),
    after the selective ones; empty: none."""


def _terms(n: int, c: int, s: int, m: int, none: BlockPricing, full: BlockPricing, sel: BlockPricing | None,
           mm: BlockPricing | None) -> list[tuple[int, BlockPricing]]:
    """A stage's ``(count, pricing)`` per kind, in summing order: ``N`` and ``C`` always, ``S`` and ``M``
    only where their count is not 0 (so a stage without them sums as before they were added)."""
    terms = [(n - c - s - m, none), (c, full)]
    if s:
        terms.append((s, sel))  # type: ignore[arg-type]
    if m:
        terms.append((m, mm))  # type: ignore[arg-type]
    return terms


def _mix(terms: Sequence[tuple[int, BlockPricing]], get: Callable[[BlockPricing], float]) -> float:
    """``sum count * get(pricing)`` over ``terms``, left to right."""
    total = terms[0][0] * get(terms[0][1])
    for count, q in terms[1:]:
        total += count * get(q)
    return total


def _policy(terms: Sequence[tuple[int, BlockPricing]], n: int) -> BlockPricing:
    """The pricing a stage's extras follow (p4): ``C``, ``S`` or ``M`` where all its blocks are of that
    kind, else ``N``."""
    for count, q in reversed(terms[1:]):
        if n and count == n:
            return q
    return terms[0][1]


def _selective(counts: Sequence[int], selective: Sequence[int] | None, sel: BlockPricing | None,
               what: str = "selective") -> list[int]:
    """``s_k`` (``m_k``) per stage, zeros where none given; a count without its pricing is refused."""
    out = [0] * len(counts) if selective is None else [int(x) for x in selective]
    if len(out) != len(counts):
        raise ValueError(f"{len(out)} {what} counts for {len(counts)} stages")
    if any(out) and sel is None:
        raise ValueError(f"{what} blocks without a {what} pricing")
    return out


def mixed_stage_costs(none: BlockPricing, full: BlockPricing, cut: StageCuts, counts: Sequence[int],
                      send_s: float, sel: BlockPricing | None = None,
                      selective: Sequence[int] | None = None, mm: BlockPricing | None = None,
                      all_mm: Sequence[int] | None = None) -> list[StageCost]:
    """(p1)-(p4): one :class:`StageCost` per stage of ``cut``, stage ``k`` checkpointing ``counts[k]`` blocks
    fully, ``selective[k]`` (default none) under the op-level policy priced by ``sel`` and ``all_mm[k]``
    under the one saving every matmul priced by ``mm``; with every count 0 (every count the stage's
    blocks) it is ``pipeline._stage_costs`` of ``none`` (``full``). A stage without selective (all-mm)
    blocks adds no ``S`` (``M``) term: its price is the one without that kind, bit for bit."""
    k_last = len(cut.stages) - 1
    sels = _selective(counts, selective, sel)
    mms = _selective(counts, all_mm, mm, "all-mm")
    out = []
    for k, st in enumerate(cut.stages):
        n = st.end_block - st.first_block
        c, s, m = int(counts[k]), sels[k], mms[k]
        if not (0 <= c <= n and 0 <= s <= n - c and 0 <= m <= n - c - s):
            raise ValueError(f"stage {k}: {c} checkpointed, {s} selective and {m} all-mm blocks of its {n}"
                             if m else f"stage {k}: {c} checkpointed and {s} selective blocks of its {n}")
        terms = _terms(n, c, s, m, none, full, sel, mm)
        ep = _policy(terms, n)
        extras = [e for e, here in ((ep.first_extra, k == 0), (ep.last_extra, k == k_last)) if here]
        fwd = _mix(terms, lambda q: q.block.forward_s) + sum(e.forward_s for e in extras)
        bwd = _mix(terms, lambda q: q.block.backward_s) + sum(e.backward_s for e in extras)
        acts = _mix(terms, lambda q: q.block.activation_bytes) + sum(e.activation_bytes for e in extras)
        redo = min(bwd, _mix(terms, lambda q: q.block_recompute_s + q.block_regather_s))
        half = (bwd - redo) / 2 + redo
        out.append(StageCost(
            forward_s=fwd, backward_input_s=half, backward_weight_s=half, full_backward_s=bwd,
            send_activation_s=send_s, send_gradient_s=send_s, activation_bytes=int(acts), weight_grad_bytes=int(acts),
            gradient_reduction_s=_mix(terms, lambda q: q.block_reduction_s)
            + (ep.extra_reduction_s if extras else 0.0),
            optimizer_s=_mix(terms, lambda q: q.block_optimizer_s) + (ep.extra_optimizer_s if extras else 0.0),
            weight_gather_s=_mix(terms, lambda q: q.block_gather_s) + (ep.extra_gather_s if extras else 0.0)))
    return out


def _rank_memory(none: BlockPricing, full: BlockPricing, cut: StageCuts, counts: Sequence[int],
                 schedule: PipelineSchedule, sim: PipelineSimulation, sel: BlockPricing | None = None,
                 selective: Sequence[int] | None = None, mm: BlockPricing | None = None,
                 all_mm: Sequence[int] | None = None) -> tuple[float, ...]:
    """(p5) per rank; a rank with ``S`` (``M``) blocks adds ``T^S`` (``T^M``) to the transients it takes
    the largest of."""
    p, k_last = schedule.n_ranks, len(cut.stages) - 1
    sels = _selective(counts, selective, sel)
    mms = _selective(counts, all_mm, mm, "all-mm")
    state, head = [0.0] * p, [0.0] * p
    used: list[dict[int, BlockPricing]] = [{} for _ in range(p)]  # per rank: the kinds it runs, by id
    for k, st in enumerate(cut.stages):
        n, r = st.end_block - st.first_block, schedule.stage_ranks[k]
        terms = _terms(n, int(counts[k]), sels[k], mms[k], none, full, sel, mm)
        ep = _policy(terms, n)
        # the sum stands as it was where no block is selective or all-mm (bit for bit)
        state[r] += _mix(terms, lambda q: q.block.state_bytes)
        state[r] += (ep.first_extra.state_bytes if k == 0 else 0) + (ep.last_extra.state_bytes if k == k_last else 0)
        running = [q for count, q in terms if count > 0]
        used[r].update((id(q), q) for q in running)
        if k == k_last:
            head[r] = max(q.transient_bytes + q.head_transient_bytes for q in running)
    out = []
    for r in range(p):
        blocks = max([q.transient_bytes for q in used[r].values()], default=none.transient_bytes)
        out.append(state[r] + sim.ranks[r].peak_activation_bytes + max(blocks, head[r]))
    return tuple(out)


def price_counts(none: BlockPricing, full: BlockPricing, schedule: PipelineSchedule, cut: StageCuts,
                 counts: Sequence[int], send_s: float, sel: BlockPricing | None = None,
                 selective: Sequence[int] | None = None, mm: BlockPricing | None = None,
                 all_mm: Sequence[int] | None = None) -> PartialPricing:
    """The candidate of ``schedule`` on ``cut`` with ``counts`` checkpointed blocks per stage (and
    ``selective`` blocks under ``sel``'s op-level policy, then ``all_mm`` under ``mm``'s), simulated
    (module docstring, (p1)-(p5)); every pricing at the same microbatch."""
    for q in (full, sel, mm):
        if q is not None and q.micro_batch != none.micro_batch:
            raise ValueError(f"pricings of microbatches of {none.micro_batch} and {q.micro_batch} sequences")
    if len(counts) != len(cut.stages):
        raise ValueError(f"{len(counts)} counts for {len(cut.stages)} stages")
    costs = mixed_stage_costs(none, full, cut, counts, send_s, sel, selective, mm, all_mm)
    sim = simulate_pipeline(schedule, costs)
    memory = _rank_memory(none, full, cut, counts, schedule, sim, sel, selective, mm, all_mm)
    held = stage_in_flight(schedule)
    stages = tuple(Stage(st.first_block, st.end_block, c.forward_s + c.backward_s,
                         int(memory[schedule.stage_ranks[k]] if held[k] else 0))
                   for k, (st, c) in enumerate(zip(cut.stages, costs)))
    sels = tuple(int(x) for x in selective) if selective is not None and any(selective) else ()
    mms = tuple(int(x) for x in all_mm) if all_mm is not None and any(all_mm) else ()
    return PartialPricing(tuple(int(c) for c in counts), StageCuts(stages, max(s.time_s for s in stages)),
                          tuple(costs), sim, memory, sels, mms)


def choose_counts(none: BlockPricing, full: BlockPricing, schedule: PipelineSchedule, cut: StageCuts,
                  send_s: float, memory_limit_bytes: float,
                  start: Sequence[int] | None = None) -> tuple[PartialPricing | None, str]:
    """The fewest checkpointed blocks per stage of ``cut`` that fit ``memory_limit_bytes`` a rank
    (module docstring, Choosing the counts), from ``start`` (default none): ``(priced, "")``, or
    ``(None, why)``."""
    saved = none.block.activation_bytes - full.block.activation_bytes
    held = stage_in_flight(schedule)
    sizes = [st.end_block - st.first_block for st in cut.stages]
    counts = list(start) if start is not None else [0] * len(sizes)
    while True:
        priced = price_counts(none, full, schedule, cut, counts, send_s)
        over = [(r, m - memory_limit_bytes) for r, m in enumerate(priced.rank_memory_bytes) if m > memory_limit_bytes]
        if not over:
            return priced, ""
        if saved <= 0:
            return None, "checkpointing a block saves no memory here"
        for r, excess in over:
            open_ = [k for k, rank in enumerate(schedule.stage_ranks) if rank == r and counts[k] < sizes[k]]
            if not open_:
                return None, (f"rank {r} memory {priced.rank_memory_bytes[r] / 2**30:.1f} GiB > limit "
                              f"{memory_limit_bytes / 2**30:.1f} GiB with every block checkpointed")
            k = max(open_, key=lambda k: (held[k], -k))
            more = math.ceil(excess / (max(1, held[k]) * saved))
            counts[k] = min(sizes[k], counts[k] + max(1, more))


def cut_with_counts(none: BlockPricing, full: BlockPricing, schedule: PipelineSchedule, n_blocks: int,
                    memory_limit_bytes: float) -> tuple[StageCuts, tuple[int, ...]] | None:
    """(c1)-(c3) (module docstring, The cut with the counts): the cut whose slowest stage is least when
    each stage checkpoints the fewest blocks its share of the limit asks for, and those counts; None
    where no cut fits."""
    k_stages, held = schedule.n_stages, stage_in_flight(schedule)
    blk, ckp = none.block, full.block
    t_n, dt = blk.forward_s + blk.backward_s, (ckp.forward_s + ckp.backward_s) - (blk.forward_s + blk.backward_s)
    saved = blk.activation_bytes - ckp.activation_bytes
    share = stage_shares(none, schedule, memory_limit_bytes - max(none.transient_bytes, full.transient_bytes))
    head = max(none.head_transient_bytes, full.head_transient_bytes)

    def stage(k: int, i: int, j: int) -> tuple[float, int]:  # (c1): (time, count), count -1 where it cannot fit
        n = j - i
        kept, e_t = stage_need(none, held, k, k_stages, n, head)
        over = kept - share[k]
        if over <= 0:
            return n * t_n + e_t, 0
        c = math.ceil(over / (held[k] * saved)) if held[k] and saved > 0 else n + 1
        return (n * t_n + c * dt + e_t, c) if c <= n else (math.inf, -1)

    # asked for its fit and its time: priced once
    found = cut_by_stage_price(functools.lru_cache(maxsize=None)(stage), n_blocks, k_stages)
    if found is None:
        return None
    cut, picks = found
    return cut, tuple(c for c, in picks)


def stage_shares(none: BlockPricing, schedule: PipelineSchedule, budget: float) -> list[float]:
    """(c)'s shares of ``budget`` bytes a rank: ``M_k = budget w_k / sum_{k' on rank(k)} w_{k'}``,
    ``w_k = s + h_k a^N`` (module docstring, The cut with the counts)."""
    held, ranks, blk = stage_in_flight(schedule), schedule.stage_ranks, none.block
    weight = [blk.state_bytes + held[k] * blk.activation_bytes for k in range(schedule.n_stages)]
    on_rank: dict[int, float] = {}
    for k, r in enumerate(ranks):
        on_rank[r] = on_rank.get(r, 0.0) + weight[k]
    return [budget * weight[k] / on_rank[ranks[k]] if on_rank[ranks[k]] > 0 else budget
            for k in range(schedule.n_stages)]


def stage_need(none: BlockPricing, held: Sequence[int], k: int, k_stages: int, n: int,
               head: float) -> tuple[float, float]:
    """``(bytes, seconds)`` of stage ``k`` of ``n`` blocks without recomputation, ``held[k]`` microbatches
    in flight: its state, extras (embedding, head) and the head's transient ``head`` on the last stage,
    and the extras' time (``mem^N_k`` of (c1))."""
    blk = none.block
    extras = [e for e, here in ((none.first_extra, k == 0), (none.last_extra, k == k_stages - 1)) if here]
    kept = n * blk.state_bytes + sum(e.state_bytes for e in extras) + (head if k == k_stages - 1 else 0.0) \
        + held[k] * (n * blk.activation_bytes + sum(e.activation_bytes for e in extras))
    return kept, sum(e.forward_s + e.backward_s for e in extras)


def cut_by_stage_price(stage: Callable[[int, int, int], tuple], n_blocks: int,
                       k_stages: int) -> tuple[StageCuts, list[tuple]] | None:
    """(c2)-(c3) for any stage price ``stage(k, i, j) -> (seconds, count, ...)`` of blocks ``[i, j)`` as
    stage ``k`` (a negative count: does not fit): the lexicographically smallest cut whose slowest stage
    is least, and each stage's ``(count, ...)``; None where no cut fits."""
    # (c2): D[k][i], the least slowest stage of blocks [i, N) in stages k .. (stage_cuts' own recursion)
    table = suffix_min_max(n_blocks, k_stages, lambda k, i, j: stage(k, i, j)[0],
                           lambda k, i, j: stage(k, i, j)[1] >= 0)
    bottleneck = table[0][0]
    if math.isinf(bottleneck):
        return None
    stages, picks, i = [], [], 0
    for k in range(k_stages):  # (c3): the smallest next cut that keeps the optimum
        ends = [n_blocks] if k == k_stages - 1 else range(i + 1, n_blocks - (k_stages - 2 - k))
        for j in ends:
            price = stage(k, i, j)
            if price[1] >= 0 and price[0] <= bottleneck and table[k + 1][j] <= bottleneck:
                break
        stages.append(Stage(i, j, price[0], 0))
        picks.append(tuple(price[1:]))
        i = j
    return StageCuts(tuple(stages), bottleneck), picks


def trim_counts(none: BlockPricing, full: BlockPricing, schedule: PipelineSchedule, priced: PartialPricing,
                send_s: float, memory_limit_bytes: float) -> PartialPricing:
    """(c4): one checkpointed block fewer, stage by stage from the fewest microbatches in flight (the
    least memory a block frees there), while the simulated ranks still fit."""
    held = stage_in_flight(schedule)
    counts = list(priced.counts)
    for k in sorted(range(len(counts)), key=lambda k: (held[k], -k)):
        while counts[k]:
            counts[k] -= 1
            trial = price_counts(none, full, schedule, priced.cut, counts, send_s)
            if max(trial.rank_memory_bytes) > memory_limit_bytes:
                counts[k] += 1
                break
            priced = trial
    return priced


def best_counts(none: BlockPricing, full: BlockPricing, schedule: PipelineSchedule, balanced: StageCuts,
                n_blocks: int, send_s: float, memory_limit_bytes: float) -> tuple[PartialPricing | None, str]:
    """The faster fitting of (c0) the ``balanced`` cut with :func:`choose_counts` and (c1)-(c4) the cut
    with the counts (module docstring): ``(priced, "")``, or ``(None, why)`` where neither fits."""
    found, why = choose_counts(none, full, schedule, balanced, send_s, memory_limit_bytes)
    tried = [found] if found is not None else []
    joint = cut_with_counts(none, full, schedule, n_blocks, memory_limit_bytes)
    if joint is not None:
        fixed, _ = choose_counts(none, full, schedule, joint[0], send_s, memory_limit_bytes, start=joint[1])
        if fixed is not None:
            tried.append(trim_counts(none, full, schedule, fixed, send_s, memory_limit_bytes))
    if not tried:
        return None, why
    return min(tried, key=lambda p: p.simulation.step_s), ""
