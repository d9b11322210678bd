"""Hand-made block pricings of the pipeline recomputation tests (``test_pipeline_partial``,
``test_pipeline_selective``): a block kept whole (``NONE``) against one fully checkpointed (``FULL``),
with an embedding and a head as the first and last stages' extras, and the balanced cut of them; and
the tiny LLaMA's stage priced under each recomputation policy (:func:`tiny_stage_pricing`), solved once
per policy for every test module that asks."""

from __future__ import annotations

import functools
from dataclasses import replace

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


def balanced_cut(n_blocks: int, schedule) -> object:
    return cut_stages([NONE.block] * n_blocks, schedule.n_stages, first_extra=NONE.first_extra,
                      last_extra=replace(NONE.last_extra, state_bytes=NONE.last_extra.state_bytes
                                         + int(NONE.head_transient_bytes)))


_TINY_TRACES: dict = {}


@functools.cache
def tiny_stage_pricing(policy: str) -> BlockPricing:
    """The tiny LLaMA's stage on 2 dp ranks (microbatches of 4, depths 2 and 3) under ``policy``: the same
    pricing for every test module, so each policy's stage solves run once per test session."""
    from examples.models import llama3

    from autoshard.search.pipeline_blocks import price_blocks

    return price_blocks(llama3.tiny, {"device": "meta"}, (2,), ("dp",), micro_batch=4, depths=(2, 3),
                        recompute=policy, profile="cpu-gloo", time_limit=20, traces=_TINY_TRACES)
