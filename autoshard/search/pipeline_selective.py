r"""Pipeline stages mixing three or four block kinds: kept, checkpointed, and op-level checkpointed (one or two).

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

(s1) (``_cut_with``, (c1)-(c3) generalised) each stage's counts for its share ``M_k``
of the limit as ``pipeline_partial`` (c1) sets it (the transient the largest of the three kinds'):
the fastest pair that frees enough,

    (c_k, s_k) = argmin { c dt^C + s dt^S : c d^C + s d^S >= over_k / h_k, c + s <= n_k }

found exactly by trying every ``c`` (``s`` the fewest that then suffice: ``O(n_k)``); the stage's
time ``n_k t^N + c_k dt^C + s_k dt^S`` enters (c2)'s recursion, which depends on ``(k, n_k)``
only, so each pair is priced once.

(s2) (``_trim``, (c4) generalised) after (s0)'s loop on (s1)'s cut and counts: stage by
stage from the fewest in flight, each ``C`` made ``S`` while the simulated ranks fit, then each
``S`` made ``N``.

(s2') (``_rebalance``) (s0) and (s1) weigh a move by what it frees, not by the stage it
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

**A fourth kind, ``M``** (``selective_all_mm``: every ``aten.mm`` output and the attention's saved,
the rest recomputed), given its pricing (``best_counts3(..., mm=)``), runs ``m_k`` blocks after the
``S`` ones (stage order ``C``, ``S``, ``M``, ``N``) and is priced the same way ((p1') with an ``m_k``
term, ``T^M`` in (p5'); every ``m_k = 0`` bit for bit the three-kind price). Why: ``S`` is a coarse
step. On the 405B stage at 16,384 GPUs every microbatch is in flight on every stage (``h_k = 16``),
so one block ``N -> S`` moves ``16 x 0.46 = 7.3`` GiB a rank, more than the ranks have left; ``M``
keeps more than ``S`` and recomputes less, a step between (that stage, as above: ``a^M`` 0.55 GiB,
``dt^M`` 0.86 ms, ``T^M`` 2.30 GiB; ``N -> M`` frees 123 GiB/s, ``M -> S`` 107, and one block
``N -> M`` moves 1.7 GiB a rank). The choice generalises each of (s0)-(s2')
over the kinds, each rule reducing to the three-kind one where ``M`` is absent (the same moves, in
the same order, with the same ties; checked against the three-kind code it replaced, the same
choice on 240 random cases, when written):

- (s0) the moves are every pair from a kind of less recomputation to one of more (``N -> M``,
  ``N -> S``, ``N -> C``, ``M -> S``, ``M -> C``, ``S -> C``) that frees bytes, each weighed by
  ``h_k (d^Y - d^X) / (dt^Y - dt^X)``;
- (s1) ``fastest_counts``: every ``(c, s)`` tried, ``m`` the fewest that then suffice (``O(n_k^2)``,
  cut short once a count's time reaches the best: each further block only adds time);
- (s2) each block made the next kind of less recomputation that saves something (``C -> S``,
  ``S -> M``, ``M -> N``) while it fits;
- (s2') one block of any recomputing kind moved between two stages of a rank (the least recomputing
  kind first), or two kinds swapped between them.

(s3) with ``M`` runs (s0)-(s2') over the three kinds and over the four, and keeps the fastest of
those and the two-kind choice: adding ``M`` never prices a candidate slower than without it.

(s3'') The four-kind pass costs about 1.5 times the three-kind one (the 405B stage at 16,384 GPUs,
64 stages: 14 s against 9 s a candidate), and run on every candidate the bound lets through it took
the 512-GPU row's search from 575 to 1,031 s (h100, quiet machine). So it runs only where the
three-kind choice of the candidate already beats the incumbent (where the search would take it):
it refines the candidates that win, and ``M`` (its pricing included: called only then) costs a
few passes a search. A heuristic, not a bound: a candidate the three kinds leave slower than the
incumbent is not tried with ``M``, which might have made it faster (the gain of ``M`` over three
kinds: 1.0 % on that 405B candidate; up to 8 % on the tiny hand-made cases of the tests).

Partial: as the two-kind choice, counts chosen against linear bounds and the simulation checked
after, not searched jointly with it; a brute force over every ``(c_k, s_k)`` (``(c_k, s_k, m_k)``)
on small cases (``tests/autoshard/search/test_pipeline_selective.py``,
``test_pipeline_all_mm.py``) finds little faster that fits there.

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
from typing import Callable, Sequence

from costmodel.pipeline_schedules import PipelineSchedule
from costmodel.stage_cuts import StageCuts, stage_in_flight

from autoshard.search.pipeline_blocks import BlockPricing
from autoshard.search.pipeline_partial import (PartialPricing, best_counts, cut_by_stage_price, price_counts,
                                                 stage_need, stage_shares)

__all__ = ["fastest_pair", "fastest_counts", "choose_counts3", "best_counts3", "REBALANCE_TRIALS"]

REBALANCE_TRIALS = 64
"""The most simulations (s2') runs for one candidate: a 16-rank, 64-stage schedule of 16 microbatches
simulates in about 30 ms, of 128 in 300 ms."""


_LETTERS = ("C", "S", "M")
"""The reducing kinds in stage order (a stage runs its ``C`` blocks first, then ``S``, then ``M``, then ``N``)."""


def _kinds(full: BlockPricing, sel: BlockPricing, mm: BlockPricing | None) -> list[BlockPricing]:
    """The reducing kinds' pricings in stage order: ``C``, ``S`` and, where given, ``M``."""
    return [full, sel] if mm is None else [full, sel, mm]


def _t(q: BlockPricing) -> float:
    return q.block.forward_s + q.block.backward_s




def _price(none: BlockPricing, kinds: Sequence[BlockPricing], schedule: PipelineSchedule, cut: StageCuts,
           x: Sequence[Sequence[int]], send_s: float) -> PartialPricing:
    """``price_counts`` of the counts ``x[j][k]`` of kind ``j`` (stage order) on stage ``k``."""
    mm, all_mm = (kinds[2], x[2]) if len(kinds) > 2 else (None, None)
    return price_counts(none, kinds[0], schedule, cut, x[0], send_s, kinds[1], x[1], mm, all_mm)


def _counts_of(priced: PartialPricing, n_kinds: int) -> list[list[int]]:
    """The counts per kind (stage order) of ``priced``, zeros where it has none of a kind."""
    zeros = [0] * len(priced.counts)
    return [list(priced.counts), list(priced.selective) or zeros[:], list(priced.all_mm) or zeros[:]][:n_kinds]


def fastest_counts(n: int, need: float, none: BlockPricing,
                   kinds: Sequence[BlockPricing]) -> tuple[int, ...] | None:
    """(s1): the counts per reducing kind (stage order) of least extra time whose blocks free at least
    ``need`` bytes a microbatch, at most ``n`` blocks in all; None where even ``n`` of the one that
    frees most do not. Exact: every count of the kinds but the last tried, the last's the fewest that
    then suffice (``O(n^(K-1))`` for ``K`` kinds)."""
    if need <= 0:
        return (0,) * len(kinds)
    a, t_n = none.block.activation_bytes, _t(none)
    d = [a - q.block.activation_bytes for q in kinds]
    dt = [_t(q) - t_n for q in kinds]
    # where every kind from j on adds time, a count of kind j whose time reaches the best cannot improve it
    prunable = [all(x >= 0 for x in dt[j:]) for j in range(len(kinds))]
    best: tuple[float, tuple[int, ...]] | None = None

    def walk(j: int, left: int, rest: float, t: float, picked: tuple[int, ...]) -> None:
        nonlocal best
        if j == len(kinds) - 1:
            if rest <= 0:
                last = 0
            elif d[j] > 0:
                last = math.ceil(rest / d[j])
            else:
                return
            if last > left:
                return
            t += last * dt[j]
            if best is None or t < best[0]:
                best = (t, (*picked, last))
            return
        for x in range(left + 1):
            if x and prunable[j] and best is not None and t + x * dt[j] >= best[0]:
                break
            walk(j + 1, left - x, rest - x * d[j], t + x * dt[j], (*picked, x))

    walk(0, n, need, 0.0, ())
    return None if best is None else best[1]


def fastest_pair(n: int, need: float, none: BlockPricing, full: BlockPricing,
                 sel: BlockPricing) -> tuple[int, int] | None:
    """(s1) of the three kinds: the ``(c, s)`` of least extra time whose blocks free at least ``need``
    bytes a microbatch, ``c + s <= n``; None where even ``n`` checkpointed blocks do not."""
    found = fastest_counts(n, need, none, [full, sel])
    return None if found is None else (found[0], found[1])


def _choose(none: BlockPricing, kinds: Sequence[BlockPricing], schedule: PipelineSchedule, cut: StageCuts,
            send_s: float, memory_limit_bytes: float,
            start: Sequence[Sequence[int]] | None = None) -> tuple[PartialPricing | None, str]:
    """(s0) over ``kinds`` (stage order): counts per kind and stage, moved greedily by bytes freed per
    second from ``start`` (default none)."""
    held = stage_in_flight(schedule)
    sizes = [st.end_block - st.first_block for st in cut.stages]
    x = [list(c) for c in start] if start is not None else [[0] * len(sizes) for _ in kinds]
    # each kind's bytes freed and seconds added against N (the differences of two kinds taken of these,
    # as the three-kind choice took them, so it chooses as it did bit for bit)
    a, t_n = none.block.activation_bytes, _t(none)
    d = {"N": 0, **{_LETTERS[j]: a - q.block.activation_bytes for j, q in enumerate(kinds)}}
    dt = {"N": 0.0, **{_LETTERS[j]: _t(q) - t_n for j, q in enumerate(kinds)}}
    order = ["N", *reversed(_LETTERS[:len(kinds)])]  # least recomputation first
    at = {letter: j for j, letter in enumerate(_LETTERS)}
    # (from, to, bytes freed a block and microbatch, seconds a block): towards more recomputation only
    moves = [(src, dst, d[dst] - d[src], dt[dst] - dt[src]) for i, src in enumerate(order)
             for dst in order[i + 1:] if d[dst] - d[src] > 0]
    while True:
        priced = _price(none, kinds, schedule, cut, x, send_s)
        over = [(r, m - memory_limit_bytes) for r, m in enumerate(priced.rank_memory_bytes) if m > memory_limit_bytes]
        if not over:
            return priced, ""
        for r, excess in over:
            options = []
            for k, rank in enumerate(schedule.stage_ranks):
                if rank != r:
                    continue
                h = max(1, held[k])
                for src, dst, freed, secs in moves:
                    room = sizes[k] - sum(c[k] for c in x) if src == "N" else x[at[src]][k]
                    if room > 0:
                        rate = h * freed / secs if secs > 0 else math.inf
                        options.append((rate, held[k], -k, k, src, dst, h * freed, room))
            if not options:
                return None, (f"rank {r} memory {priced.rank_memory_bytes[r] / 2**30:.1f} GiB > limit "
                              f"{memory_limit_bytes / 2**30:.1f} GiB with every block checkpointed")
            _, _, _, k, src, dst, freed, room = max(options)
            times = min(room, max(1, math.ceil(excess / freed)))
            if src != "N":
                x[at[src]][k] -= times
            x[at[dst]][k] += times


def choose_counts3(none: BlockPricing, full: BlockPricing, sel: BlockPricing, schedule: PipelineSchedule,
                   cut: StageCuts, send_s: float, memory_limit_bytes: float,
                   start: tuple[Sequence[int], ...] | None = None,
                   mm: BlockPricing | None = None) -> tuple[PartialPricing | None, str]:
    """(s0): counts ``(c, s)`` (and ``m`` where ``mm`` is given) per stage of ``cut`` that fit
    ``memory_limit_bytes`` a rank, moved greedily by bytes freed per second from ``start`` (default
    none): ``(priced, "")``, or ``(None, why)``."""
    return _choose(none, _kinds(full, sel, mm), schedule, cut, send_s, memory_limit_bytes, start)


def _cut_with(none: BlockPricing, kinds: Sequence[BlockPricing], schedule: PipelineSchedule, n_blocks: int,
              memory_limit_bytes: float) -> tuple[StageCuts, list[list[int]]] | None:
    """(s1) over ``kinds``: the cut and each kind's counts per stage."""
    k_stages, held = schedule.n_stages, stage_in_flight(schedule)
    t_n = _t(none)
    dt = [_t(q) - t_n for q in kinds]
    share = stage_shares(none, schedule, memory_limit_bytes - max(q.transient_bytes for q in (none, *kinds)))
    head = max(q.head_transient_bytes for q in (none, *kinds))
    zeros = (0,) * len(kinds)

    @functools.lru_cache(maxsize=None)
    def stage(k: int, n: int) -> tuple:  # (time, *counts); counts -1 where it cannot fit
        kept, e_t = stage_need(none, held, k, k_stages, n, head)
        over = kept - share[k]
        if over <= 0:
            return (n * t_n + e_t, *zeros)
        picked = fastest_counts(n, over / held[k], none, kinds) if held[k] else None
        if picked is None:
            return (math.inf, *(-1 for _ in kinds))
        total = n * t_n
        for x, step in zip(picked, dt):
            total += x * step
        return (total + e_t, *picked)

    found = cut_by_stage_price(lambda k, i, j: stage(k, j - i), n_blocks, k_stages)
    if found is None:
        return None
    cut, picks = found
    return cut, [[p[j] for p in picks] for j in range(len(kinds))]




def _trim(none: BlockPricing, kinds: Sequence[BlockPricing], schedule: PipelineSchedule,
          priced: PartialPricing, send_s: float, memory_limit_bytes: float) -> PartialPricing:
    """(s2) over ``kinds``: each block made the next useful kind of less recomputation, while it fits."""
    held = stage_in_flight(schedule)
    x = _counts_of(priced, len(kinds))
    useful = [q.block.activation_bytes < none.block.activation_bytes for q in kinds]

    def fits(xs: list[list[int]]) -> PartialPricing | None:
        trial = _price(none, kinds, schedule, priced.cut, xs, send_s)
        return trial if max(trial.rank_memory_bytes) <= memory_limit_bytes else None

    for k in sorted(range(len(x[0])), key=lambda k: (held[k], -k)):
        for j in range(len(kinds)):
            # the next kind of less recomputation that saves something, or N
            to = next((i for i in range(j + 1, len(kinds)) if useful[i]), None)
            while x[j][k]:
                x[j][k] -= 1
                if to is not None:
                    x[to][k] += 1
                trial = fits(x)
                if trial is None:
                    x[j][k] += 1
                    if to is not None:
                        x[to][k] -= 1
                    break
                priced = trial
    return priced




def _rebalance(none: BlockPricing, kinds: Sequence[BlockPricing], schedule: PipelineSchedule,
               priced: PartialPricing, send_s: float, memory_limit_bytes: float, trials: int) -> PartialPricing:
    """(s2') over ``kinds``."""
    x = _counts_of(priced, len(kinds))
    sizes = [st.end_block - st.first_block for st in priced.cut.stages]
    ranks = schedule.stage_ranks
    n_kinds = len(kinds)
    # (stage a's change, stage b's change) per kind: one block of a kind moved (the least recomputing
    # kind first), then a block of kind i of a made j and one of j of b made i (i before j)
    changes = []
    for j in reversed(range(n_kinds)):
        one = [0] * n_kinds
        one[j] = 1
        changes.append(([-v for v in one], one))
    for i in range(n_kinds):
        for j in range(i + 1, n_kinds):
            da, db = [0] * n_kinds, [0] * n_kinds
            da[i], da[j], db[i], db[j] = -1, 1, 1, -1
            changes.append((da, db))
    improved = True
    while improved and trials > 0:
        improved = False
        # from a slower stage to a faster one of its rank, the largest difference first (a move the other
        # way slows the slower one)
        t = [c.forward_s + c.full_backward_s for c in priced.costs]
        pairs = sorted(((a, b) for a in range(len(sizes)) for b in range(len(sizes))
                        if a != b and ranks[a] == ranks[b] and t[a] > t[b]), key=lambda ab: t[ab[1]] - t[ab[0]])
        for a, b in pairs:
            for da, db in changes:
                if trials <= 0 or any(x[j][a] + da[j] < 0 or x[j][b] + db[j] < 0 for j in range(n_kinds)) \
                        or sum(x[j][b] + db[j] for j in range(n_kinds)) > sizes[b]:
                    continue
                for j in range(n_kinds):
                    x[j][a] += da[j]
                    x[j][b] += db[j]
                trials -= 1
                trial = _price(none, kinds, schedule, priced.cut, x, send_s)
                if max(trial.rank_memory_bytes) <= memory_limit_bytes \
                        and trial.simulation.step_s < priced.simulation.step_s:
                    priced, improved = trial, True
                    break
                for j in range(n_kinds):
                    x[j][a] -= da[j]
                    x[j][b] -= db[j]
            if improved:
                break
    return priced




def _choices(none: BlockPricing, kinds: Sequence[BlockPricing], schedule: PipelineSchedule, balanced: StageCuts,
             n_blocks: int, send_s: float, memory_limit_bytes: float) -> tuple[list[PartialPricing], str]:
    """(s0) on ``balanced`` and (s1), each trimmed (s2) and rebalanced (s2'), over ``kinds``."""
    tried = []
    found, why = _choose(none, kinds, schedule, balanced, send_s, memory_limit_bytes)
    if found is not None:
        tried.append(_rebalance(none, kinds, schedule,
                                _trim(none, kinds, schedule, found, send_s, memory_limit_bytes),
                                send_s, memory_limit_bytes, REBALANCE_TRIALS))
    joint = _cut_with(none, kinds, schedule, n_blocks, memory_limit_bytes)
    if joint is not None:
        fixed, _ = _choose(none, kinds, schedule, joint[0], send_s, memory_limit_bytes, start=joint[1])
        if fixed is not None:
            tried.append(_rebalance(none, kinds, schedule,
                                    _trim(none, kinds, schedule, fixed, send_s, memory_limit_bytes),
                                    send_s, memory_limit_bytes, REBALANCE_TRIALS))
    return tried, why


def best_counts3(none: BlockPricing, full: BlockPricing, sel: BlockPricing, schedule: PipelineSchedule,
                 balanced: StageCuts, n_blocks: int, send_s: float,
                 memory_limit_bytes: float, incumbent_s: float = math.inf,
                 mm: BlockPricing | Callable[[], BlockPricing] | None = None) -> tuple[PartialPricing | None, str]:
    """(s3): the fastest fitting of (s0) on ``balanced``, (s1)-(s2'), and the two-kind choice:
    ``(priced, "")``, or ``(None, why)`` where none fits; only the two-kind choice where the candidate
    without recomputation is no faster than ``incumbent_s`` (module docstring). ``mm``: the all-mm
    policy's pricing (or a call that prices it, made only where it is tried), a fourth kind:
    (s0)-(s2') over the four kinds too where the three-kind choice beats ``incumbent_s`` ((s3'')),
    the fastest of all kept."""
    if sel.micro_batch != none.micro_batch:
        raise ValueError(f"pricings of microbatches of {none.micro_batch} and {sel.micro_batch} sequences")
    if incumbent_s < math.inf:
        bound = price_counts(none, full, schedule, balanced, [0] * len(balanced.stages), send_s)
        if bound.simulation.step_s >= incumbent_s:
            return best_counts(none, full, schedule, balanced, n_blocks, send_s, memory_limit_bytes)
    tried, why = _choices(none, [full, sel], schedule, balanced, n_blocks, send_s, memory_limit_bytes)
    two, why2 = best_counts(none, full, schedule, balanced, n_blocks, send_s, memory_limit_bytes)
    if two is not None:
        tried.append(two)
    if not tried:  # four kinds free no more than three: all checkpointed is the most either frees
        return None, why or why2
    three = min(tried, key=lambda p: p.simulation.step_s)
    if mm is not None and three.simulation.step_s < incumbent_s:  # (s3'')
        priced_mm = mm() if callable(mm) else mm
        if priced_mm.micro_batch != none.micro_batch:
            raise ValueError(f"pricings of microbatches of {none.micro_batch} and {priced_mm.micro_batch} sequences")
        four, _ = _choices(none, [full, sel, priced_mm], schedule, balanced, n_blocks, send_s, memory_limit_bytes)
        return min([three, *four], key=lambda p: p.simulation.step_s), ""
    return three, ""
