"""The pipeline search's stage recomputation: ``none`` or ``full`` per stage, priced and chosen.

The stage runtime checkpoints whole blocks or none (``autoshard.search.pipeline``,
Recomputation): the search prices both and keeps the fastest that fits, ``full`` only where
``none`` is memory-bound (R2), ties to ``none`` (R3). Under full recomputation a block keeps
its input, sequence-split over ``tp`` as the stages run it (``pipeline_blocks`` (h')).
"""

from __future__ import annotations

import math

import pytest

from costmodel.stage_cuts import BlockCost
from hw_profiles import load as load_profile

from autoshard.plan.pipeline_section import PipelineError
from autoshard.search.pipeline_model import stage_recompute
from autoshard.search.pipeline import PipelineLayout, pipeline_section, search_pipeline
from autoshard.search.pipeline_blocks import BlockPricing

NOTHING = BlockCost(0.0, 0.0, 0, 0)
PROFILE = load_profile("cpu-gloo")


def _pricing(micro_batch: int, forward_s: float, backward_s: float, activation_bytes: int) -> BlockPricing:
    return BlockPricing(micro_batch=micro_batch, block=BlockCost(forward_s, backward_s, 1000, activation_bytes),
                        block_reduction_s=0.0, block_optimizer_s=0.0, first_extra=NOTHING, last_extra=NOTHING,
                        extra_reduction_s=0.0, extra_optimizer_s=0.0, transient_bytes=0.0, figures=(), solve_s=0.0)


# a checkpointed block keeps a tenth of what a plain one keeps and recomputes its forward
NONE = lambda mb: _pricing(mb, 1.0, 2.0, 1000 * mb)  # noqa: E731
FULL = lambda mb: _pricing(mb, 1.0, 3.0, 100 * mb)  # noqa: E731


def _search(limit: float, **kw):
    args = dict(n_blocks=4, batch=8, seq_len=8, dim=8, layout=PipelineLayout(2, 1, 1), profile=PROFILE,
                flops_per_token=0.0, schedules=("1F1B",), microbatches=(4,), memory_limit_bytes=limit)
    return search_pipeline(**{"price_at": NONE, **args, **kw})


def _peak(plan) -> float:
    return max(plan.rank_memory_bytes)


def test_full_is_chosen_exactly_when_none_does_not_fit_a_limit_full_fits() -> None:
    none, full = _search(math.inf), _search(math.inf, price_at=FULL, recompute="full")
    assert none.recompute == "none" and full.recompute == "full" and _peak(full) < _peak(none)
    assert none.step_s < full.step_s  # recomputing costs time
    between = (_peak(full) + _peak(none)) / 2
    assert _search(_peak(none), price_full=FULL).recompute == "none"  # both fit: none is faster
    chosen = _search(between, price_full=FULL, partial=False)  # (R4) off: the two policies alone
    assert chosen.recompute == "full" and chosen.step_s == full.step_s
    assert {c.recompute for c in chosen.candidates} == {"none", "full"}
    with pytest.raises(ValueError, match=r"no pipeline candidate fits .* with recompute full, none \("):
        _search(_peak(full) - 1, price_full=FULL, partial=False)
    # with (R4), some blocks checkpointed fit between the two, faster than full
    partial = _search(between, price_full=FULL)
    assert partial.recompute == "partial" and none.step_s < partial.step_s < full.step_s
    with pytest.raises(ValueError, match=r"no pipeline candidate fits .* with recompute full, none, partial \("):
        _search(_peak(full) - 1, price_full=FULL)
    # a limit no cut of the blocks fits leaves no rank memory to show: the message says so, not "inf"
    with pytest.raises(ValueError, match=r"\(no cut fits; first refusal: ") as refused:
        _search(1.0, price_full=FULL)
    assert "inf" not in str(refused.value)


def test_a_tie_keeps_none() -> None:
    """4 blocks on 2 ranks of 1F1B, 2000 bytes a block a microbatch, the first stage holding two:
    (2, 2) needs 10000 bytes on rank 0, (1, 3) 9000 on rank 1; at 9500 the limit slows the cut,
    full is priced and, costing the same, loses the tie."""
    calls = []
    plan = _search(9500, price_full=lambda mb: calls.append(mb) or NONE(mb))
    assert plan.cuts == (1,) and calls == [2] and plan.recompute == "none"
    assert all(c.memory_bound for c in plan.candidates if c.recompute != "partial")
    # (R4) with nothing to save by checkpointing: the cut chosen with the counts is none's own, counts 0
    assert [c.recompute_blocks for c in plan.candidates if c.recompute == "partial"] == [(0, 0)]


def test_full_is_not_priced_where_none_is_not_memory_bound() -> None:
    calls = []
    plan = _search(math.inf, price_full=lambda mb: calls.append(mb) or FULL(mb))
    assert plan.recompute == "none" and calls == []


def test_full_is_not_priced_where_its_bound_cannot_beat_the_incumbent() -> None:
    """m = 2: four slow sequences a microbatch that do not fit without recomputation; m = 4 fits and
    runs in 30 s, below full's bound at m = 2 (2 x 4 blocks x 30 s / 2 = 120 s): (R2) skips it."""
    calls = []
    slow_big = lambda mb: _pricing(mb, 10.0, 20.0, 10**6) if mb == 4 else NONE(mb)  # noqa: E731
    plan = _search(1e5, price_at=slow_big, microbatches=(2, 4),
                   price_full=lambda mb: calls.append(mb) or FULL(mb))
    assert plan.recompute == "none" and plan.n_microbatches == 4 and plan.step_s == pytest.approx(30.0, rel=1e-3)
    assert calls == []


def test_the_section_records_the_chosen_policy() -> None:
    chosen = _search((_peak(_search(math.inf, price_at=FULL, recompute="full")) + _peak(_search(math.inf))) / 2,
                     price_full=FULL, partial=False)
    section = pipeline_section(chosen, batch=8, seq_len=8, dim=8, block_paths=[f"layers.{i}" for i in range(4)])
    assert section.recompute == "full" and section.to_dict()["recompute"] == "full"
    plain = pipeline_section(_search(math.inf), batch=8, seq_len=8, dim=8,
                             block_paths=[f"layers.{i}" for i in range(4)])
    assert plain.recompute == "none"


def test_bad_policies_are_one_line() -> None:
    with pytest.raises(ValueError, match="recompute: 'selective' is not a stage policy; valid: none, full"):
        _search(math.inf, recompute="selective")
    with pytest.raises(ValueError, match="price_full: .* must then be 'none'"):
        _search(math.inf, recompute="full", price_full=FULL)


def test_the_mesh_search_maps_per_op_policies_to_searching_both() -> None:
    assert [stage_recompute(p) for p in ("auto", "none", "full", "selective", "every:3")] == [
        "auto", "none", "full", "auto", "auto"]


def test_choose_pipeline_refuses_an_unknown_policy_in_one_line() -> None:
    from examples.models import llama3

    from autoshard.runtime.pipeline_stages import model_parts
    from autoshard.search.pipeline_model import choose_pipeline

    model, inputs = llama3.tiny(device="meta", batch_size=8)
    with pytest.raises(PipelineError, match="^pipeline: recompute 'selective' is not a stage policy; valid: auto, "
                                            "none, full$"):
        choose_pipeline(model, inputs, (2, 2), ("pp", "dp"), block_paths=model_parts(model).blocks,
                        recompute="selective")


def test_choose_pipeline_recomputes_a_small_model_only_where_none_does_not_fit(monkeypatch) -> None:
    """The tiny MLP stack on 2 pp ranks x 2 tp (cpu-gloo, Megatron stages: activations replicated
    over tp): each policy pinned; searched under a limit that full fits and no cut of none does,
    full; under the profile's memory, none. A checkpointed block keeps its input split over tp
    (h'). Each policy's pricing (selective's too, where full is priced) is solved once for the five
    searches, each depth traced once."""
    from examples.models import mlp

    from autoshard.runtime.pipeline_stages import model_parts
    from autoshard.search import pipeline_model

    model, inputs = mlp.tiny(device="meta", batch_size=8, n_layers=4)
    parts = model_parts(model)
    solved: dict = {}
    traces: dict = {}
    price_blocks = pipeline_model.price_blocks

    def once(*args, **kw):
        key = (kw["micro_batch"], kw["recompute"])
        if key not in solved:  # tp pinned: blocks laid out alike at both depths, no expert portfolio to solve
            solved[key] = price_blocks(*args, **{**kw, "baseline": "tp", "traces": traces})
        return solved[key]

    monkeypatch.setattr(pipeline_model, "price_blocks", once)
    common = dict(block_paths=parts.blocks, leading=parts.leading, trailing=parts.trailing, schedules=("1F1B",),
                  microbatches=(2,), time_limit=10)

    def search(**kw):
        return pipeline_model.choose_pipeline(model, inputs, (2, 1, 2), ("pp", "dp", "tp"), **common, **kw)

    (_, none), (_, full) = search(recompute="none"), search(recompute="full")
    assert (none.recompute, full.recompute) == ("none", "full")
    assert _peak(full) < _peak(none) and full.step_s > none.step_s
    with pytest.raises(PipelineError, match="no pipeline candidate fits"):
        search(recompute="none", memory_limit=_peak(full))
    section, chosen = search(memory_limit=_peak(full))
    assert chosen.recompute == section.recompute == "full" and chosen.step_s == pytest.approx(full.step_s)
    assert search()[1].recompute == "none"
    # selective (op-level) blocks are priced where full is, the third kind of a partial section
    assert sorted(solved) == [(4, "full"), (4, "none"), (4, "selective")] and sorted(traces) == [(2, 4), (3, 4)]
    block_input = 4 * 16 * 4  # 4 rows of 16 fp32, replicated over tp as solved
    assert solved[4, "full"].block.activation_bytes == block_input // 2


def test_the_kept_input_is_priced_split_and_the_transient_keeps_the_solved_copies() -> None:
    """(h') on hand-made figures: 2 and 3 blocks, each keeping 800 bytes at the loss of which its
    input (400, replicated over tp = 4) is one: 500 kept a block checkpointed, 800 otherwise; the
    transient is the shallow plan's peak above its state and the 800-byte blocks."""
    from autoshard.search.pipeline_blocks import PlanFigures, pricing_from_figures

    def fig(n: int) -> PlanFigures:
        return PlanFigures(n, 1.0 * n, 2.0 * n, 0.0, 0.0, 0.0, 100.0 * n, 0.0, 0.0, 100.0 * n + 800.0 * n + 50.0,
                           0.0, forward_end_bytes=100.0 * n + 800.0 * n, block_output_bytes=400.0 * n,
                           block_output_split_bytes=100.0 * n)

    plain, kept = (pricing_from_figures(4, fig(2), fig(3), 0.0, checkpointed=c) for c in (False, True))
    assert (plain.block.activation_bytes, kept.block.activation_bytes) == (800, 500)
    assert plain.transient_bytes == kept.transient_bytes == 50.0


def test_a_split_backward_of_checkpointed_blocks_recomputes_in_both_halves() -> None:
    """The zero-bubble schedules' input and weight passes each replay a checkpointed block (the
    runtime counts 3 forwards a block): I = W = (B - R) / 2 + R a stage, one R more than the
    full backward; without recomputation the halves stay B / 2."""
    from dataclasses import replace

    from costmodel.stage_cuts import cut_stages
    from autoshard.search.pipeline import _stage_costs

    plain = _pricing(4, 1.0, 3.0, 10)
    redone = replace(plain, block_recompute_s=1.0)
    cut = cut_stages([plain.block] * 4, 2, first_extra=plain.first_extra, last_extra=plain.last_extra)
    for pricing, half in ((plain, 3.0), (redone, 4.0)):  # two blocks a stage: B = 6, R = 2
        for st in _stage_costs(pricing, cut, 0.0):
            assert st.full_backward_s == 6.0
            assert st.backward_input_s == st.backward_weight_s == half


def test_a_split_backward_of_kept_blocks_gathers_their_inputs_again_in_both_halves() -> None:
    """Without recomputation, a block's gathered inputs kept as shards are gathered again in each
    pass of a split backward (``pipeline_blocks`` (h'''); the stage runtime's count in
    ``test_pipeline_tp_sp_gloo.py``): I = W = (B - E) / 2 + E a stage, one E more than B."""
    from dataclasses import replace

    from costmodel.stage_cuts import cut_stages
    from autoshard.search.pipeline import _stage_costs

    plain = _pricing(4, 1.0, 3.0, 10)
    regathered = replace(plain, block_regather_s=0.5)  # inside the backward's 3.0, as the pricing puts it
    cut = cut_stages([plain.block] * 4, 2, first_extra=plain.first_extra, last_extra=plain.last_extra)
    for st in _stage_costs(regathered, cut, 0.0):  # two blocks a stage: B = 6, E = 1
        assert st.full_backward_s == 6.0
        assert st.backward_input_s == st.backward_weight_s == 3.5
