"""A pipeline stage's transient memory where the stage really holds it (``pipeline_blocks``, Transients).

The one-microbatch plan's peak above its state and saved activations (the head's logits, its
weight gradient) was once added to every stage's memory; only the stage holding the head runs the
head. ``T_blk`` (a block's forward, backward and recomputation temporaries) goes to every stage,
``T_head - T_blk`` to the head's stage alone.
"""

from __future__ import annotations

import pytest

from costmodel.stage_cuts import BlockCost
from examples.models import llama3

from autoshard.search.pipeline import price_pipeline
from autoshard.search.pipeline_blocks import BlockPricing, PlanFigures, plan_figures, pricing_from_figures
from autoshard.search.solve import prepare, solve_prepared

NOTHING = BlockCost(0.0, 0.0, 0, 0)
BATCH, SEQ, RANKS = 4, 64, 2
"""The tiny LLaMA (dim 64, vocab 256) at 4 x 64 tokens, data parallel over 2 ranks, fp32."""


@pytest.fixture(scope="module")
def solved():
    """policy -> (figures of the 2-block plan, its model's config)."""
    out = {}
    for policy in ("none", "full"):
        model, inputs = llama3.tiny(device="meta", n_layers=2, batch_size=BATCH, seq_len=SEQ)
        prep = prepare(model, inputs, (RANKS,), ("dp",), profile="h100-sxm-80gb",
                       recompute="auto" if policy == "full" else "none")
        plan = solve_prepared(prep, baseline="ddp", recompute=policy, time_limit=10)
        out[policy] = (plan_figures(prep, plan, 2), model.config)
    return out


def test_the_heads_transient_is_the_logits_three_times_beside_the_final_norms_output(solved) -> None:
    """By hand, per rank ``n = 4 x 64 / 2 = 128`` tokens, logits ``L = n x 256 x 4`` bytes: at the
    log-softmax's backward the log-softmax output (saved), the loss's gradient and the backward's
    own output (``3 L``), the final norm's output and its rstd (``n x 64 x 4 + n x 4``, read by the
    head's matmul) and the loss (4 bytes) are live; nothing of the blocks' saved activations counts.
    With full recomputation the solve replays the last block as soon as the final norm's backward
    reads its output, inside the head's times: more, never less."""
    fig, config = solved["none"]
    n = BATCH * SEQ // RANKS
    by_hand = 3 * n * config.vocab_size * 4 + n * config.dim * 4 + n * 4 + 4
    assert fig.head_transient_bytes == by_hand
    assert solved["full"][0].head_transient_bytes >= by_hand


def test_a_blocks_transient_is_below_the_heads_and_recomputation_adds_to_it(solved) -> None:
    none, _ = solved["none"]
    full, config = solved["full"]
    n = BATCH * SEQ // RANKS
    assert 0 < none.block_transient_bytes < none.head_transient_bytes
    # the recomputed forward of a block lives in its backward: at least its saved activations again
    assert full.block_transient_bytes >= none.block_transient_bytes + n * config.dim * 4


def _figures(n_blocks: int, head: float, block: float) -> PlanFigures:
    return PlanFigures(n_blocks, 1.0 * n_blocks, 2.0 * n_blocks, 0.0, 0.0, 0.0, 10.0 * n_blocks, 0.0, 0.0,
                       peak_bytes=1000.0 + 100 * n_blocks, step_s=3.0 * n_blocks, forward_end_bytes=20.0 * n_blocks,
                       head_transient_bytes=head, block_transient_bytes=block)


def test_pricing_gives_every_stage_the_blocks_transient_and_the_head_only_the_excess() -> None:
    """(t1): the larger depth's ``T_blk`` (30); (t2): ``T_head - T_blk = 500 - 30``. Figures without
    transients keep the peak's rule, ``P - S_0 - L_1 a = 1200 - 20 - 2 x 10``, for every stage."""
    pricing = pricing_from_figures(1, _figures(2, 500.0, 25.0), _figures(4, 500.0, 30.0), 0.0)
    assert (pricing.transient_bytes, pricing.head_transient_bytes) == (30.0, 470.0)
    old = pricing_from_figures(1, _figures(2, 0.0, 0.0), _figures(4, 0.0, 0.0), 0.0)
    assert (old.transient_bytes, old.head_transient_bytes) == (1200.0 - 20.0 - 2 * 10.0, 0.0)


def _pricing(transient: float, head: float) -> BlockPricing:
    return BlockPricing(1, BlockCost(1.0, 2.0, 100, 10), 0.0, 0.0, NOTHING, NOTHING, 0.0, 0.0, transient, (), 0.0,
                        head_transient_bytes=head)


def test_the_heads_transient_is_held_by_the_last_stages_rank_only() -> None:
    """1F1B, 2 ranks, 4 microbatches, 2 blocks a stage: rank 0 holds 2 x 100 of state and 2 microbatches
    in flight of 2 x 10, rank 1 the same with 1 in flight; ``T`` on both, the head's 500 on rank 1."""
    base, _, _ = price_pipeline(_pricing(7.0, 0.0), n_blocks=4, batch=4, pp=2, schedule="1F1B", n_microbatches=4)
    head, _, _ = price_pipeline(_pricing(7.0, 500.0), n_blocks=4, batch=4, pp=2, schedule="1F1B", n_microbatches=4)
    assert base.rank_memory_bytes == (200 + 2 * 20 + 7, 200 + 20 + 7)
    assert head.rank_memory_bytes == (base.rank_memory_bytes[0], base.rank_memory_bytes[1] + 500)
    assert head.step_s == base.step_s


def test_a_limit_the_heads_transient_passes_moves_blocks_off_the_last_stage() -> None:
    """With a limit of 700 the last stage cannot hold 2 blocks beside the head's 500 (720): the cut
    gives it 1 (610) and the first stage 3 (300 + 2 x 30 + 7 = 367)."""
    fits, cut, _ = price_pipeline(_pricing(7.0, 500.0), n_blocks=4, batch=4, pp=2, schedule="1F1B",
                                  n_microbatches=4, memory_limit_bytes=700)
    assert fits.why == "" and cut.cuts == (3,)
    assert fits.rank_memory_bytes == (300 + 2 * 30 + 7, 100 + 10 + 7 + 500)
