r"""Pipeline stages mixing three block kinds: kept whole, checkpointed, and op-level (selective) checkpointed.

``autoshard.search.pipeline_partial`` mixes two kinds of block per stage, ``N`` (kept whole) and
``C`` (fully checkpointed). Between them lies ``S``: a block under torchtitan's op-level policy
(``autoshard.graph.recompute_policy``, ``selective``: every other ``aten.mm`` output and the
attention's outputs saved, the rest recomputed), priced like the other two from two stage plans
solved under that policy (``autoshard.search.pipeline_blocks``; its kept input sequence-split as
``C``'s, (h')). Stage ``k`` of ``n_k`` blocks runs its first ``c_k`` as ``C``, the next ``s_k`` as
``S`` and the rest as ``N`` (``autoshard.runtime.pipeline_stages``, Recomputation: the backward
runs a stage's first blocks last, so the kinds with the largest recomputation transient go
first). The price is (p1)-(p5) of ``pipeline_partial`` with a third term, ``s_k`` times the
``S`` figures (``pipeline_partial.price_counts``):

    (p1') F_k = (n_k - c_k - s_k) f^N + c_k f^C + s_k f^S (+ extras), likewise B, R, a, s, g, o, w
    (p5') rank memory: max(T_r, H_r) over the kinds the rank runs, ``T^S`` included

so ``s_k = 0`` everywhere prices bit for bit as the two-kind mix (tested).

**Choosing the counts.** Per block of stage ``k`` (``h_k`` microbatches in flight), with
``d^X = a^N - a^X`` and ``dt^X = (f^X + b^X) - (f^N + b^N)``:

    N -> S frees h_k d^S   for dt^S,     N -> C frees h_k d^C for dt^C,
    S -> C frees h_k (d^C - d^S) for dt^C - dt^S.

(s0) (:func:`choose_counts3`, the two-kind (c0) generalised) from every count 0, while a rank is
over the limit by ``X_r``: of the moves open on its stages, the one with the most bytes freed per
second (``h_k d / dt``; ties the stage with the most in flight, then the lowest index), applied
``ceil(X_r / (h_k d))`` times (at most the blocks it may move); simulate again. Where ``d^S /
dt^S >= (d^C - d^S) / (dt^C - dt^S)`` (the 405B stage: ``S`` frees most of what ``C`` frees at a
fraction of its recomputation) this makes a stage's blocks ``S`` before any ``C``, the order of the
lower convex hull of the three points ``(dt, d)``.
(The 405B stage at ``dp`` 128, ``tp`` 8, one sequence a rank, h100-sxm-80gb: ``a^N`` 0.66 GiB,
``a^S`` 0.20, ``a^C`` 0.03; ``dt^S`` 4.2 ms, ``dt^C`` 8.3 ms: 109 GiB/s for ``N -> S``, 41 for
``S -> C``; the transients ``T^N`` 1.45 GiB, ``T^S`` 2.40, ``T^C`` 2.53.)

(s1) (:func:`cut_with_counts3`, (c1)-(c3) generalised) each stage's counts for its share ``M_k``
of the limit as ``pipeline_partial`` (c1) sets it (the transient the largest of the three kinds'):
the fastest pair that frees enough,

    (c_k, s_k) = argmin { c dt^C + s dt^S : c d^C + s d^S >= over_k / h_k, c + s <= n_k }

found exactly by trying every ``c`` (``s`` the fewest that then suffice: ``O(n_k)``); the stage's
time ``n_k t^N + c_k dt^C + s_k dt^S`` enters (c2)'s recursion, which depends on ``(k, n_k)``
only, so each pair is priced once.

(s2) (:func:`trim_counts3`, (c4) generalised) after (s0)'s loop on (s1)'s cut and counts: stage by
stage from the fewest in flight, each ``C`` made ``S`` while the simulated ranks fit, then each
``S`` made ``N``.

(s2') (:func:`rebalance_counts3`) (s0) and (s1) weigh a move by what it frees, not by the stage it
slows: the step is paced by the slowest stages, so two ``S`` blocks on one stage may cost more than
one on each of two stages of the same rank (Interleaved1F1B, ``v = 2``: the brute force below finds
it). So, after (s2), one ``C`` or ``S`` block is moved from a slower stage to a faster one of the
same rank (the pairs of the largest difference in priced time first), or a ``C`` of the one made
``S`` and an ``S`` of the other made ``C``, the first change that still fits and simulates faster
kept, until none does (at most :data:`REBALANCE_TRIALS` simulations).

(s3) (:func:`best_counts3`) the fastest fitting of (s0) on the balanced cut, (s1)-(s2'), and the
two-kind choice (``pipeline_partial.best_counts``), so adding ``S`` never prices a candidate
slower than before. Given the search's incumbent step ``t*``, (s0)-(s2') run only where the
candidate without any recomputation on the balanced cut simulates faster than ``t*``: recomputation
only adds time (``autoshard.search.pipeline``, (R2)'s ASSUMPTIONS), so no counts could beat the
incumbent there, and the search keeps strictly faster candidates only. On the 405B 512-GPU row the
three-kind choice on every candidate took the search from 293 to 727 s.

Partial: as the two-kind choice, counts chosen against linear bounds and the simulation checked
after, not searched jointly with it; a brute force over every ``(c_k, s_k)`` on small cases
(``tests/autoshard/search/test_pipeline_selective.py``) finds nothing faster that fits there.

>>> from autoshard.search.pipeline_blocks import BlockPricing
>>> from costmodel.stage_cuts import BlockCost
>>> z = BlockCost(0, 0, 0, 0)
>>> none = BlockPricing(1, BlockCost(1.0, 2.0, 0, 10), 0, 0, z, z, 0, 0, 0, (), 0.0)
>>> full = BlockPricing(1, BlockCost(1.0, 3.0, 0, 2), 0, 0, z, z, 0, 0, 0, (), 0.0)
>>> sel = BlockPricing(1, BlockCost(1.0, 2.25, 0, 5), 0, 0, z, z, 0, 0, 0, (), 0.0)
>>> fastest_pair(4, 9.0, none, full, sel)   # free 9 bytes a microbatch: two S (0.5 s), not one S + one C
(0, 2)
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

from costmodel.pipeline_schedules import PipelineSchedule
from costmodel.stage_cuts import StageCuts, stage_in_flight

from autoshard.search.pipeline_blocks import BlockPricing
from autoshard.search.pipeline_partial import (PartialPricing, best_counts, cut_by_stage_price, price_counts,
                                                 stage_need, stage_shares)

__all__ = ["fastest_pair", "choose_counts3", "cut_with_counts3", "trim_counts3", "rebalance_counts3",
           "best_counts3", "REBALANCE_TRIALS"]

REBALANCE_TRIALS = 64
"""The most simulations (s2') runs for one candidate: a 16-rank, 64-stage schedule of 16 microbatches
simulates in about 30 ms, of 128 in 300 ms."""


def _gains(none: BlockPricing, full: BlockPricing, sel: BlockPricing) -> tuple[float, float, float, float]:
    """``(d^C, d^S, dt^C, dt^S)`` per block (module docstring)."""
    t = lambda q: q.block.forward_s + q.block.backward_s  # noqa: E731
    a = none.block.activation_bytes
    return (a - full.block.activation_bytes, a - sel.block.activation_bytes, t(full) - t(none), t(sel) - t(none))


def fastest_pair(n: int, need: float, none: BlockPricing, full: BlockPricing,
                 sel: BlockPricing) -> tuple[int, int] | None:
    """(s1): the ``(c, s)`` of least extra time whose blocks free at least ``need`` bytes a microbatch,
    ``c + s <= n``; None where even ``n`` checkpointed blocks do not."""
    if need <= 0:
        return 0, 0
    d_c, d_s, dt_c, dt_s = _gains(none, full, sel)
    best: tuple[float, int, int] | None = None
    for c in range(n + 1):
        rest = need - c * d_c
        if rest <= 0:
            s = 0
        elif d_s > 0:
            s = math.ceil(rest / d_s)
        else:
            continue
        if c + s > n:
            continue
        t = c * dt_c + s * dt_s
        if best is None or t < best[0]:
            best = (t, c, s)
    return None if best is None else (best[1], best[2])


def choose_counts3(none: BlockPricing, full: BlockPricing, sel: BlockPricing, schedule: PipelineSchedule,
                   cut: StageCuts, send_s: float, memory_limit_bytes: float,
                   start: tuple[Sequence[int], Sequence[int]] | None = None) -> tuple[PartialPricing | None, str]:
    """(s0): counts ``(c, s)`` per stage of ``cut`` that fit ``memory_limit_bytes`` a rank, moved greedily
    by bytes freed per second from ``start`` (default none): ``(priced, "")``, or ``(None, why)``."""
    d_c, d_s, dt_c, dt_s = _gains(none, full, sel)
    held = stage_in_flight(schedule)
    sizes = [st.end_block - st.first_block for st in cut.stages]
    c = list(start[0]) if start is not None else [0] * len(sizes)
    s = list(start[1]) if start is not None else [0] * len(sizes)
    # (from, to, bytes freed a block and microbatch, seconds a block)
    moves = [m for m in (("N", "S", d_s, dt_s), ("N", "C", d_c, dt_c), ("S", "C", d_c - d_s, dt_c - dt_s))
             if m[2] > 0]
    while True:
        priced = price_counts(none, full, schedule, cut, c, send_s, sel, s)
        over = [(r, x - memory_limit_bytes) for r, x in enumerate(priced.rank_memory_bytes) if x > memory_limit_bytes]
        if not over:
            return priced, ""
        for r, excess in over:
            options = []
            for k, rank in enumerate(schedule.stage_ranks):
                if rank != r:
                    continue
                h = max(1, held[k])
                for src, dst, freed, dt in moves:
                    room = sizes[k] - c[k] - s[k] if src == "N" else s[k]
                    if room > 0:
                        rate = h * freed / dt if dt > 0 else math.inf
                        options.append((rate, held[k], -k, k, src, dst, h * freed, room))
            if not options:
                return None, (f"rank {r} memory {priced.rank_memory_bytes[r] / 2**30:.1f} GiB > limit "
                              f"{memory_limit_bytes / 2**30:.1f} GiB with every block checkpointed")
            _, _, _, k, src, dst, freed, room = max(options)
            times = min(room, max(1, math.ceil(excess / freed)))
            if src == "S":
                s[k] -= times
            if dst == "S":
                s[k] += times
            else:
                c[k] += times


def cut_with_counts3(none: BlockPricing, full: BlockPricing, sel: BlockPricing, schedule: PipelineSchedule,
                     n_blocks: int, memory_limit_bytes: float
                     ) -> tuple[StageCuts, tuple[int, ...], tuple[int, ...]] | None:
    """(s1): the cut whose slowest stage is least when each stage runs the fastest ``(c, s)`` its share
    of the limit allows, and those counts; None where no cut fits."""
    k_stages, held = schedule.n_stages, stage_in_flight(schedule)
    blk = none.block
    _, _, dt_c, dt_s = _gains(none, full, sel)
    t_n = blk.forward_s + blk.backward_s
    share = stage_shares(none, schedule,
                         memory_limit_bytes - max(none.transient_bytes, full.transient_bytes, sel.transient_bytes))
    head = max(none.head_transient_bytes, full.head_transient_bytes, sel.head_transient_bytes)

    @functools.lru_cache(maxsize=None)
    def stage(k: int, n: int) -> tuple[float, int, int]:  # (time, c, s); c = -1 where it cannot fit
        kept, e_t = stage_need(none, held, k, k_stages, n, head)
        over = kept - share[k]
        if over <= 0:
            return n * t_n + e_t, 0, 0
        pair = fastest_pair(n, over / held[k], none, full, sel) if held[k] else None
        if pair is None:
            return math.inf, -1, -1
        return n * t_n + pair[0] * dt_c + pair[1] * dt_s + e_t, pair[0], pair[1]

    found = cut_by_stage_price(lambda k, i, j: stage(k, j - i), n_blocks, k_stages)
    if found is None:
        return None
    cut, picks = found
    return cut, tuple(c for c, _ in picks), tuple(s for _, s in picks)


def trim_counts3(none: BlockPricing, full: BlockPricing, sel: BlockPricing, schedule: PipelineSchedule,
                 priced: PartialPricing, send_s: float, memory_limit_bytes: float) -> PartialPricing:
    """(s2): each stage's ``C`` blocks made ``S``, then its ``S`` blocks made ``N``, one at a time from the
    stages with the fewest in flight, while the simulated ranks still fit."""
    held = stage_in_flight(schedule)
    c = list(priced.counts)
    s = list(priced.selective) or [0] * len(c)
    useful = sel.block.activation_bytes < none.block.activation_bytes

    def fits(cc: list[int], ss: list[int]) -> PartialPricing | None:
        trial = price_counts(none, full, schedule, priced.cut, cc, send_s, sel, ss)
        return trial if max(trial.rank_memory_bytes) <= memory_limit_bytes else None

    for k in sorted(range(len(c)), key=lambda k: (held[k], -k)):
        while c[k]:
            c[k] -= 1
            s[k] += useful  # C -> S, or C -> N where S saves nothing
            trial = fits(c, s)
            if trial is None:
                c[k] += 1
                s[k] -= useful
                break
            priced = trial
        while s[k]:
            s[k] -= 1
            trial = fits(c, s)
            if trial is None:
                s[k] += 1
                break
            priced = trial
    return priced


def rebalance_counts3(none: BlockPricing, full: BlockPricing, sel: BlockPricing, schedule: PipelineSchedule,
                      priced: PartialPricing, send_s: float, memory_limit_bytes: float,
                      trials: int = REBALANCE_TRIALS) -> PartialPricing:
    """(s2'): one checkpointed or selective block moved between two stages of one rank while that fits
    and simulates faster; at most ``trials`` simulations."""
    c = list(priced.counts)
    s = list(priced.selective) or [0] * len(c)
    sizes = [st.end_block - st.first_block for st in priced.cut.stages]
    ranks = schedule.stage_ranks
    improved = True
    while improved and trials > 0:
        improved = False
        # from a slower stage to a faster one of its rank, the largest difference first (a move the other
        # way slows the slower one)
        t = [x.forward_s + x.full_backward_s for x in priced.costs]
        pairs = sorted(((a, b) for a in range(len(c)) for b in range(len(c))
                        if a != b and ranks[a] == ranks[b] and t[a] > t[b]), key=lambda ab: t[ab[1]] - t[ab[0]])
        for a, b in pairs:
            # (stage a's change, stage b's change) in (c, s): a block moved, or a C and an S swapped
            for da, db in (((0, -1), (0, 1)), ((-1, 0), (1, 0)), ((-1, 1), (1, -1))):
                if trials <= 0 or c[a] + da[0] < 0 or s[a] + da[1] < 0 or s[b] + db[1] < 0 \
                        or c[b] + db[0] + s[b] + db[1] > sizes[b]:
                    continue
                c[a], s[a], c[b], s[b] = c[a] + da[0], s[a] + da[1], c[b] + db[0], s[b] + db[1]
                trials -= 1
                trial = price_counts(none, full, schedule, priced.cut, c, send_s, sel, s)
                if max(trial.rank_memory_bytes) <= memory_limit_bytes \
                        and trial.simulation.step_s < priced.simulation.step_s:
                    priced, improved = trial, True
                    break
                c[a], s[a], c[b], s[b] = c[a] - da[0], s[a] - da[1], c[b] - db[0], s[b] - db[1]
            if improved:
                break
    return priced


def best_counts3(none: BlockPricing, full: BlockPricing, sel: BlockPricing, schedule: PipelineSchedule,
                 balanced: StageCuts, n_blocks: int, send_s: float,
                 memory_limit_bytes: float, incumbent_s: float = math.inf) -> tuple[PartialPricing | None, str]:
    """(s3): the fastest fitting of (s0) on ``balanced``, (s1)-(s2), and the two-kind choice:
    ``(priced, "")``, or ``(None, why)`` where none fits; only the two-kind choice where the candidate
    without recomputation is no faster than ``incumbent_s`` (module docstring)."""
    if sel.micro_batch != none.micro_batch:
        raise ValueError(f"pricings of microbatches of {none.micro_batch} and {sel.micro_batch} sequences")
    if incumbent_s < math.inf:
        bound = price_counts(none, full, schedule, balanced, [0] * len(balanced.stages), send_s)
        if bound.simulation.step_s >= incumbent_s:
            return best_counts(none, full, schedule, balanced, n_blocks, send_s, memory_limit_bytes)
    tried = []
    found, why = choose_counts3(none, full, sel, schedule, balanced, send_s, memory_limit_bytes)
    if found is not None:
        tried.append(rebalance_counts3(none, full, sel, schedule,
                                       trim_counts3(none, full, sel, schedule, found, send_s, memory_limit_bytes),
                                       send_s, memory_limit_bytes))
    joint = cut_with_counts3(none, full, sel, schedule, n_blocks, memory_limit_bytes)
    if joint is not None:
        fixed, _ = choose_counts3(none, full, sel, schedule, joint[0], send_s, memory_limit_bytes,
                                  start=(joint[1], joint[2]))
        if fixed is not None:
            tried.append(rebalance_counts3(
                none, full, sel, schedule, trim_counts3(none, full, sel, schedule, fixed, send_s, memory_limit_bytes),
                send_s, memory_limit_bytes))
    two, why2 = best_counts(none, full, schedule, balanced, n_blocks, send_s, memory_limit_bytes)
    if two is not None:
        tried.append(two)
    if not tried:
        return None, why or why2
    return min(tried, key=lambda p: p.simulation.step_s), ""
