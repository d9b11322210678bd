"""``autoshard explain``'s pipeline lines: stages, their priced times and memory, schedule, bubble."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest
from hw_profiles import load

from autoshard.plan.explain import explain_text
from autoshard.plan.explain_pipeline import pipeline_lines, simulated_bubble
from autoshard.plan.format import Plan
from autoshard.plan.pipeline_section import PipelineSection, build_pipeline_section
from autoshard.search.pipeline import PipelineLayout, pipeline_section, search_pipeline
from autoshard.search.pipeline_blocks import BlockCost, BlockPricing
from autoshard.search.solve import solve_prepared

PARTS = {"block_paths": tuple(f"layers.{i}" for i in range(4)), "leading": ("tok_embeddings",),
         "trailing": ("norm", "output")}


def _searched() -> PipelineSection:
    unit = BlockCost(1.0, 2.0, 0, 0)
    nothing = BlockCost(0.0, 0.0, 0, 0)

    def price_at(micro_batch: int) -> BlockPricing:
        return BlockPricing(micro_batch, unit, 0.0, 0.0, nothing, BlockCost(0.0, 6.0, 0, 0), 0.0, 0.0, 0.0, (), 0.0)

    chosen = search_pipeline(price_at, n_blocks=4, batch=8, seq_len=16, dim=64, layout=PipelineLayout(2, 2, 1),
                             profile=load("h100-sxm-80gb"), flops_per_token=1.0, schedules=("GPipe", "1F1B"),
                             microbatches=(2, 4))
    return pipeline_section(chosen, batch=8, seq_len=16, dim=64, **PARTS, itemsize=4)


@pytest.fixture(scope="module")
def pp_plan(dp_mlp) -> Plan:
    plan = solve_prepared(dp_mlp, time_limit=30)
    return replace(plan, fingerprint=replace(plan.fingerprint, dim_names=("pp", "dp")), pipeline=_searched())


def test_the_searched_section_records_each_stages_priced_times_and_round_trips(pp_plan):
    section = pp_plan.pipeline
    # stage 0: blocks 0-2 (f 1, b 2 each); stage 1: block 3 and the head's backward of 6
    assert [(s.forward_s, s.backward_s) for s in section.stages] == [(3.0, 6.0), (1.0, 8.0)]
    assert all(s.peak_bytes is not None for s in section.stages) and section.bubble_fraction is not None
    assert Plan.from_dict(pp_plan.to_dict()).pipeline == section


def test_explain_shows_stages_schedule_microbatches_and_the_simulated_bubble(pp_plan):
    text = explain_text(pp_plan)
    section = pp_plan.pipeline
    bubble, priced = simulated_bubble(section)
    assert priced and 0.0 < bubble < 1.0
    assert "| 0 | 0 | 0-2 | tok_embeddings, layers.0, layers.1, layers.2 | 3000.000 ms | 6000.000 ms |" in text
    assert "| 1 | 1 | 3-3 | layers.3, norm, output | 1000.000 ms | 8000.000 ms |" in text
    assert f"schedule {section.schedule}, {section.n_microbatches} microbatches" in text
    assert f"bubble {bubble:.1%} (simulated with the priced stage times" in text


def test_an_unpriced_section_is_simulated_from_block_counts_and_said_so():
    # balanced one-block stages, 1F1B, p = 2, m = 4: (p - 1) / (m + p - 1) of each rank's step is idle
    section = build_pipeline_section(schedule="1F1B", n_ranks=2, n_microbatches=4, batch_size=8,
                                     block_paths=("layers.0", "layers.1"), cuts=(1,))
    bubble, priced = simulated_bubble(section)
    assert not priced and bubble == pytest.approx(1 / 5)
    stub = type("P", (), {"pipeline": section})()
    assert any("not priced" in line for line in pipeline_lines(stub))


def test_a_plan_of_one_stage_has_no_pipeline_lines(dp_mlp):
    assert pipeline_lines(solve_prepared(dp_mlp, time_limit=30)) == []


def test_the_cli_explain_prints_the_pipeline(pp_plan, tmp_path):
    path = tmp_path / "plan.json"
    pp_plan.save(path)
    out = subprocess.run([sys.executable, "-m", "autoshard.cli", "explain", str(path)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pipeline: 2 stages on 2 ranks of pp" in out.stdout and "bubble" in out.stdout


def test_explain_counts_the_column_and_row_split_linears_of_a_stage_layout():
    section = build_pipeline_section(schedule="1F1B", n_ranks=2, n_microbatches=4, batch_size=8,
                                     block_paths=("layers.0", "layers.1"), cuts=(1,),
                                     tensor_parallel=(("layers.0.wq", "colwise"), ("layers.0.wk", "colwise"),
                                                      ("layers.1.wo", "rowwise")))
    lines = pipeline_lines(type("P", (), {"pipeline": section})())
    assert lines[-1].endswith("2 linears split by column, 1 by row")
    plain = build_pipeline_section(schedule="1F1B", n_ranks=2, n_microbatches=4, batch_size=8,
                                   block_paths=("layers.0", "layers.1"), cuts=(1,))
    assert not any("tensor parallel" in line for line in pipeline_lines(type("P", (), {"pipeline": plain})()))


@pytest.mark.parametrize("policy, says", [
    ("full", "recompute: full (each block's forward again before its backward, keeping only its input)"),
    ("none", "recompute: none (each block keeps what its backward reads)"),
])
def test_explain_says_what_the_stages_recompute(policy, says):
    section = build_pipeline_section(schedule="1F1B", n_ranks=2, n_microbatches=4, batch_size=8,
                                     block_paths=("layers.0", "layers.1"), cuts=(1,), recompute=policy)
    lines = pipeline_lines(type("P", (), {"pipeline": section})())
    assert [line for line in lines if line.startswith("recompute:")] == [says]


def test_every_recompute_policy_has_its_explain_line():
    from autoshard.plan.explain_pipeline import _RECOMPUTE_SAYS
    from autoshard.plan.pipeline_section import RECOMPUTE_POLICIES

    assert set(_RECOMPUTE_SAYS) == set(RECOMPUTE_POLICIES)
