"""Hand-made block pricings of the pipeline recomputation tests (``test_pipeline_partial``,
``test_pipeline_selective``): a block kept whole (``NONE``) against one fully checkpointed (``FULL``),
with an embedding and a head as the first and last stages' extras, and the balanced cut of them; a block
under the op-level policy (``SEL``); the search of 8 such blocks on 2 ranks that the section tests run
(:func:`search_two_ranks`, under a limit set from :func:`kept_peak_two_ranks`); and the tiny LLaMA's
stage priced under each recomputation policy (:func:`tiny_stage_pricing`), solved once per policy for
every test module that asks."""

from __future__ import annotations

import functools
from dataclasses import replace

from costmodel.pipeline_schedules import build_schedule
from costmodel.stage_cuts import BlockCost, cut_stages
from hw_profiles import load as load_profile

from autoshard.search.pipeline_blocks import BlockPricing

PROFILE = load_profile("cpu-gloo")
FIRST, LAST = BlockCost(0.0, 0.0, 500, 0), BlockCost(0.5, 1.0, 700, 300)


def pricing(forward_s: float, backward_s: float, acts: int, *, recompute_s: float = 0.0, regather_s: float = 0.0,
             transient: float = 0.0, head: float = 0.0) -> BlockPricing:
    return BlockPricing(micro_batch=2, block=BlockCost(forward_s, backward_s, 1000, acts), block_reduction_s=0.01,
                        block_optimizer_s=0.02, first_extra=FIRST, last_extra=LAST, extra_reduction_s=0.03,
                        extra_optimizer_s=0.04, transient_bytes=transient, figures=(), solve_s=0.0,
                        block_gather_s=0.005, extra_gather_s=0.006, block_recompute_s=recompute_s,
                        head_transient_bytes=head, block_regather_s=regather_s)


NONE = pricing(1.0, 2.0, 2000, regather_s=0.1, transient=300.0, head=200.0)
FULL = pricing(1.0, 3.0, 200, recompute_s=1.0, transient=400.0, head=50.0)
SEL = pricing(1.0, 2.33, 800, recompute_s=0.33, transient=350.0, head=100.0)
"""A block under the op-level policy: between ``NONE`` and ``FULL`` in kept bytes and in time."""


def balanced_cut(n_blocks: int, schedule) -> object:
    return cut_stages([NONE.block] * n_blocks, schedule.n_stages, first_extra=NONE.first_extra,
                      last_extra=replace(NONE.last_extra, state_bytes=NONE.last_extra.state_bytes
                                         + int(NONE.head_transient_bytes)))


def kept_peak_two_ranks() -> float:
    """The busiest rank's bytes with every block kept, 8 blocks on 2 ranks, 1F1B, 4 microbatches, no send:
    the memory limit :func:`search_two_ranks`' tests set a block or two below."""
    from autoshard.search.pipeline_partial import price_counts

    sched = build_schedule("1F1B", n_ranks=2, n_microbatches=4)
    return max(price_counts(NONE, FULL, sched, balanced_cut(8, sched), (0, 0), 0.0).rank_memory_bytes)


def search_two_ranks(limit: float, **more):
    """``search_pipeline`` of 8 ``NONE`` blocks (``FULL`` checkpointed) on 2 ranks, 1F1B, 4 microbatches,
    under ``limit`` bytes a rank; ``more``: the other block kinds' pricings."""
    from autoshard.search.pipeline import PipelineLayout, search_pipeline

    return search_pipeline(lambda mb: NONE, n_blocks=8, batch=8, seq_len=16, dim=8, layout=PipelineLayout(2, 1, 1),
                           profile=PROFILE, flops_per_token=1.0, schedules=("1F1B",), microbatches=(4,),
                           recompute="none", price_full=lambda mb: FULL, memory_limit_bytes=limit, **more)


def two_ranks_section(plan):
    """The plan file's ``pipeline`` section of a :func:`search_two_ranks` plan (blocks ``layers.0``-``7``)."""
    from autoshard.search.pipeline import pipeline_section

    return pipeline_section(plan, batch=8, seq_len=16, dim=8, block_paths=[f"layers.{i}" for i in range(8)])


def recompute_line(section) -> str:
    """``autoshard explain``'s ``recompute: partial`` line of ``section``."""
    from types import SimpleNamespace

    from autoshard.plan.explain_pipeline import pipeline_lines

    return next(x for x in pipeline_lines(SimpleNamespace(pipeline=section)) if x.startswith("recompute: partial"))


_TINY_TRACES: dict = {}


@functools.cache
def tiny_stage_pricing(policy: str) -> BlockPricing:
    """The tiny LLaMA's stage on 2 dp ranks (microbatches of 4, depths 2 and 3) under ``policy``: the same
    pricing for every test module, so each policy's stage solves run once per test session."""
    from examples.models import llama3

    from autoshard.search.pipeline_blocks import price_blocks

    return price_blocks(llama3.tiny, {"device": "meta"}, (2,), ("dp",), micro_batch=4, depths=(2, 3),
                        recompute=policy, profile="cpu-gloo", time_limit=20, traces=_TINY_TRACES)
