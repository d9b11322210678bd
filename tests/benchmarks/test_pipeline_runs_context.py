"""The Llama 3 long-context row of ``benchmarks.pipeline_runs`` (issue 56): its layout, batch and
microbatches agree with the paper's Table 4 row 3, its FLOPs count attention at 131,072 tokens, and
its "Meta's CP" what-if removes only what the priced attention costs above Meta's GQA gather."""

from __future__ import annotations

import math

from benchmarks.pipeline_runs import RUNS, _flops_per_token

ROW = next(r for r in RUNS if r.key == "meta-405b-128k")


def test_the_long_context_row_is_16384_gpus_of_tp8_cp16_pp16_with_16m_tokens_a_batch() -> None:
    pp, dp, tp = ROW.layout
    assert (tp, ROW.cp, pp) == (8, 16, 16)
    assert pp * dp * ROW.cp * tp == ROW.gpus == 16384
    assert ROW.batch * ROW.seq == 16 * 2**20  # 16M tokens, 128 sequences of 131,072
    assert ROW.batch % (ROW.n_microbatches * dp) == 0  # each microbatch: one sequence per dp rank
    assert ROW.batch // ROW.n_microbatches == dp
    assert ROW.seq % (2 * ROW.cp) == 0  # two chunks a CP rank (head and tail)


def test_attention_flops_at_131072_tokens_are_counted_at_that_length() -> None:
    short, long = _flops_per_token(8192), _flops_per_token(ROW.seq)
    # 12 L d t: only the attention term grows with the sequence
    assert long - short == math.prod((12, 126, 16384)) * (ROW.seq - 8192)


def _what_ifs(forward_s: float, backward_s: float) -> dict:
    from costmodel.stage_cuts import BlockCost
    from hw_profiles import load

    from autoshard.search.pipeline import PipelineLayout, search_pipeline
    from autoshard.search.pipeline_blocks import BlockPricing
    from benchmarks.pipeline_context import context_what_ifs

    pp, dp, tp = ROW.layout
    none = BlockCost(0.0, 0.0, 0, 0)
    pricing = BlockPricing(ROW.batch // ROW.n_microbatches, BlockCost(0.2, 0.6, 10**8, 10**7), 0.0, 0.0, none,
                           none, 0.0, 0.0, 0.0, (), 0.0, block_recompute_s=0.15)
    pinned = dict(layout=PipelineLayout(pp, dp * ROW.cp, tp), schedules=(ROW.schedule,),
                  microbatches=(ROW.n_microbatches,), stages_per_rank=(ROW.stages_per_rank,), recompute="full",
                  n_blocks=126, batch=ROW.batch, seq_len=ROW.seq, dim=16384, profile=load(ROW.profile),
                  flops_per_token=_flops_per_token(ROW.seq))
    out = context_what_ifs(ROW, pricing, {"forward_s": forward_s, "backward_s": backward_s, "exchanges": ()}, pinned)
    return {"base": search_pipeline(lambda mb: pricing, **pinned), **out}


def test_meta_cp_what_if_removes_only_what_the_priced_attention_costs_above_the_gqa_gather() -> None:
    from benchmarks.pipeline_context import context_attention_costs

    gqa = context_attention_costs(ROW, ROW.batch // ROW.n_microbatches)["gqa"]
    same = _what_ifs(gqa.forward_s, gqa.backward_s)  # priced as Meta's already: nothing to remove
    assert same["d_f"] == same["d_b"] == 0.0
    assert same["what_if"]["meta_cp"].step_s == same["base"].step_s
    dearer = _what_ifs(gqa.forward_s + 0.02, gqa.backward_s + 0.05)
    assert abs(dearer["d_f"] - 0.02) < 1e-12 and abs(dearer["d_b"] - 0.05) < 1e-12
    assert dearer["what_if"]["meta_cp"].step_s < dearer["base"].step_s
    # no recomputation: the block's backward less R (0.15 s), whatever the attention
    assert dearer["what_if"]["noac"].step_s < dearer["base"].step_s


PARTIAL = next(r for r in RUNS if r.key == "meta-405b-128k-partial")


def test_the_partial_row_pins_the_long_context_rows_layout_batch_and_schedule() -> None:
    same = ("profile", "gpus", "batch", "layout", "schedule", "n_microbatches", "stages_per_rank", "cp", "seq",
            "published_tflops", "titan_loss")
    assert all(getattr(PARTIAL, k) == getattr(ROW, k) for k in same)
    assert PARTIAL.recompute == "partial"


class _TwoPolicies:
    """A pricer stub: the no-recomputation and full-recomputation block pricings of a cp stage, by policy."""

    def __init__(self, none, full) -> None:
        self.by_policy = {"none": none, "full": full}
        self.asked: list[str] = []

    def at(self, run, dp, tp, pinned, engine=None, recompute=None):
        policy = run.recompute if recompute is None else recompute
        self.asked.append(policy)
        return lambda mb: self.by_policy[policy]


def test_a_partial_cp_row_prices_both_policies_and_checkpoints_only_some_blocks_to_fit() -> None:
    from costmodel.stage_cuts import BlockCost
    from hw_profiles import load

    from autoshard.search.pipeline_blocks import BlockPricing
    from benchmarks.pipeline_runs import _flops_per_token, run_one

    zero = BlockCost(0.0, 0.0, 0, 0)
    limit = load(PARTIAL.profile).device.usable_memory_bytes
    # one block keeps 1.5 GB a microbatch in flight without recomputation, 50 MB with: none does not fit
    # 72 GiB with 8 blocks a rank and about 23 stage-microbatches in flight on rank 0, full fits easily
    none = BlockPricing(8, BlockCost(0.03, 0.09, 2 * 10**9, 15 * 10**8), 0.0, 0.0, zero, zero, 0.0, 0.0, 10**9,
                        (), 0.0)
    full = BlockPricing(8, BlockCost(0.03, 0.12, 2 * 10**9, 5 * 10**7), 0.0, 0.0, zero, zero, 0.0, 0.0, 10**9,
                        (), 0.0, block_recompute_s=0.03)
    pricer = _TwoPolicies(none, full)
    out = run_one(PARTIAL, pricer, _flops_per_token(PARTIAL.seq))
    plan = out["plan"]
    assert set(pricer.asked) == {"none", "full"}
    assert "over_memory" not in out and max(plan.rank_memory_bytes) <= limit
    assert plan.recompute == "partial"
    assert 0 < sum(plan.recompute_blocks) < 126  # some blocks checkpointed, not all
    assert (plan.n_microbatches, plan.stages_per_rank, plan.schedule) == (16, 2, "Interleaved1F1B")


def test_tensor_parallel_restriction_keeps_the_pinned_tp_reads_and_never_empties_a_node(monkeypatch) -> None:
    from types import SimpleNamespace

    import numpy as np

    import autoshard.search.baselines as baselines
    from benchmarks.pipeline_context import tensor_parallel_restriction

    strat = lambda tp: SimpleNamespace(input_placements=(("R", tp),), output_placements=(("R", tp),),  # noqa: E731
                                       exchange=None)
    shard, whole = strat("S(1)"), strat("R")
    graph = SimpleNamespace(nodes=[SimpleNamespace(name="mm", strategies=(shard, whole)),
                                   SimpleNamespace(name="view", strategies=(shard, whole))])
    monkeypatch.setattr(baselines, "tensor_parallel_reads",
                        lambda g, pins: {0: np.array([True, False]), 1: np.array([False, False])})
    restrict = tensor_parallel_restriction(graph, {}, lambda node, strategies: strategies)
    assert restrict(SimpleNamespace(name="mm"), (shard, whole)) == (shard,)  # the weight read as its tp shard
    assert restrict(SimpleNamespace(name="view"), (shard, whole)) == (shard, whole)  # no mask: left as it was
    assert restrict(SimpleNamespace(name="other"), (whole,)) == (whole,)
    # a restricted node whose inner restriction already dropped every tp read keeps what is left
    only_whole = tensor_parallel_restriction(graph, {}, lambda node, strategies: (whole,))
    assert only_whole(SimpleNamespace(name="mm"), (shard, whole)) == (whole,)
