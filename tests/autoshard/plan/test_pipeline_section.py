"""The plan's ``pipeline`` section: round trip, schema, old plans, bad input in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import jsonschema
import pytest

from hw_profiles import load

from autoshard.plan.format import Plan, PlanError
from autoshard.plan.pipeline_section import PipelineError, build_pipeline_section
from autoshard.plan.schema import PLAN_SCHEMA
from autoshard.search.pipeline import PipelineLayout, pipeline_section, search_pipeline
from autoshard.search.pipeline_blocks import BlockCost, BlockPricing
from autoshard.search.solve import solve_prepared

BLOCKS = tuple(f"layers.{i}" for i in range(4))
PARTS = {"block_paths": BLOCKS, "leading": ("tok_embeddings",), "trailing": ("norm", "output")}


def _section(**over):
    args = {"schedule": "1F1B", "n_ranks": 2, "n_microbatches": 4, "batch_size": 8, "cuts": (2,), **PARTS, **over}
    return build_pipeline_section(**args)


@pytest.fixture(scope="module")
def pp_plan(dp_mlp) -> Plan:
    """A solved plan whose mesh's first dim is named ``pp`` (its placements are the 2x2 solve's)."""
    plan = solve_prepared(dp_mlp, time_limit=30)
    return replace(plan, fingerprint=replace(plan.fingerprint, dim_names=("pp", "dp")), pipeline=_section())


def test_the_section_round_trips_in_the_plan_file_and_the_schema_accepts_it(pp_plan, tmp_path) -> None:
    path = tmp_path / "plan.json"
    pp_plan.save(path)
    data = json.loads(path.read_text())
    jsonschema.Draft202012Validator(PLAN_SCHEMA).validate(data)
    assert data["pipeline"]["schedule"] == "1F1B" and data["pipeline"]["version"] == 1
    assert [s["modules"] for s in data["pipeline"]["stages"]] == [
        ["tok_embeddings", "layers.0", "layers.1"], ["layers.2", "layers.3", "norm", "output"]]
    assert Plan.load(path) == pp_plan


def test_a_plan_without_the_section_loads_as_one_stage(pp_plan, tmp_path) -> None:
    data = pp_plan.to_dict()
    del data["pipeline"]
    jsonschema.Draft202012Validator(PLAN_SCHEMA).validate(data)
    assert Plan.from_dict(data).pipeline is None
    assert "pipeline" not in replace(pp_plan, pipeline=None).to_dict()


def test_interleaved_and_v_shaped_stages_sit_on_the_ranks_torch_puts_them() -> None:
    looped = _section(schedule="Interleaved1F1B", stages_per_rank=2, cuts=(1, 2, 3))
    assert [s.rank for s in looped.stages] == [0, 1, 0, 1]
    v = _section(schedule="ZBVZeroBubble", stages_per_rank=2, cuts=(1, 2, 3))
    assert [s.rank for s in v.stages] == [0, 1, 1, 0]
    assert v.planned_sends(1) == (0, 4) and v.planned_sends(2) == (4, 0)  # the V's turn stays on rank 1


def test_schedule_names_are_the_ones_torch_offers() -> None:
    from torch.distributed.pipelining.schedules import get_schedule_class

    from costmodel.pipeline_schedules import SCHEDULE_NAMES

    for name in SCHEDULE_NAMES:
        get_schedule_class(name)


@pytest.mark.parametrize("over, message", [
    ({"batch_size": 6}, r"4 microbatches do not divide the batch of 6 sequences"),
    ({"n_ranks": 8, "cuts": (1, 2, 3, 4, 5, 6, 7)}, r"8 stages need at least 8 blocks; the model has 4"),
    ({"schedule": "ZeroBubbleMagic"}, r"'ZeroBubbleMagic' is not a schedule torch offers; valid names: GPipe"),
    ({"cuts": (4,)}, r"pipeline.cuts"),
    ({"data_parallel": "ddp"}, r"data_parallel"),
    ({"recompute": "selective"}, r"^pipeline.recompute: 'selective'; valid: none, full, partial$"),
])
def test_bad_input_gets_one_line_naming_it(over, message) -> None:
    with pytest.raises(PipelineError, match=message) as err:
        _section(**over)
    assert "\n" not in str(err.value)


def test_a_hand_edited_section_is_refused_at_load_naming_the_field(pp_plan) -> None:
    data = pp_plan.to_dict()
    bad = json.loads(json.dumps(data))
    bad["pipeline"]["batch_size"] = 6
    with pytest.raises(PlanError, match="do not divide the batch of 6"):
        Plan.from_dict(bad)
    bad = json.loads(json.dumps(data))
    bad["pipeline"]["stages"][1]["blocks"] = [3, 4]
    with pytest.raises(PlanError, match=r"pipeline.stages\[1\]: blocks \[3, 4\)"):
        Plan.from_dict(bad)
    bad = json.loads(json.dumps(data))
    bad["pipeline"]["n_ranks"], bad["pipeline"]["stages_per_rank"] = 1, 2
    bad["pipeline"]["schedule"] = "Interleaved1F1B"
    bad["pipeline"]["stages"][1]["rank"] = 0
    with pytest.raises(PlanError, match=r"pipeline.n_ranks: 1, but mesh dim 'pp' has 2 ranks"):
        Plan.from_dict(bad)


def test_the_cli_prints_one_line_and_fails_on_a_bad_section(pp_plan, tmp_path) -> None:
    data = pp_plan.to_dict()
    data["pipeline"]["schedule"] = "GPipeline"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    out = subprocess.run([sys.executable, "-m", "autoshard.cli", "explain", str(path)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode != 0
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "'GPipeline' is not a schedule torch offers" in lines[0], out.stderr


def test_the_search_choice_becomes_the_section() -> None:
    unit = BlockCost(1.0, 2.0, 0, 0)
    nothing = BlockCost(0.0, 0.0, 0, 0)

    def price_at(micro_batch: int) -> BlockPricing:
        return BlockPricing(micro_batch, unit, 0.0, 0.0, nothing, BlockCost(0.0, 6.0, 0, 0), 0.0, 0.0, 0.0, (), 0.0)

    chosen = search_pipeline(price_at, n_blocks=4, batch=8, seq_len=16, dim=64, layout=PipelineLayout(2, 2, 1),
                             profile=load("h100-sxm-80gb"), flops_per_token=1.0, schedules=("GPipe", "1F1B"),
                             microbatches=(2, 4))
    section = pipeline_section(chosen, batch=8, seq_len=16, dim=64, **PARTS, itemsize=4)
    assert (section.schedule, section.n_microbatches) == (chosen.schedule, chosen.n_microbatches)
    assert tuple(s.first_block for s in section.stages[1:]) == chosen.cuts
    # the head's backward on the last stage: the cut leaves it fewer blocks
    assert chosen.cuts == (3,) and section.stages[-1].modules == ("layers.3", "norm", "output")
    assert section.send_bytes == 8 // chosen.n_microbatches * 16 * 64 * 4 // 2


@pytest.mark.parametrize("over, message", [
    ({"n_ranks": 4, "cuts": (1, 2, 3), "n_microbatches": 2}, r"1F1B needs n_microbatches >= n_ranks"),
    ({"schedule": "DualPipeV", "stages_per_rank": 2, "cuts": (1, 2, 3), "n_microbatches": 2},
     r"DualPipeV needs n_microbatches >= 2 \* n_ranks"),
])
def test_microbatch_counts_torchs_schedule_class_refuses_get_one_line(over, message):
    with pytest.raises(PipelineError, match=r"^pipeline.n_microbatches: " + message) as info:
        _section(**over)
    assert "\n" not in str(info.value)


def test_recompute_full_round_trips_in_the_plan_file_and_the_schema_accepts_it(pp_plan, tmp_path) -> None:
    plan = replace(pp_plan, pipeline=_section(recompute="full"))
    path = tmp_path / "plan.json"
    plan.save(path)
    data = json.loads(path.read_text())
    jsonschema.Draft202012Validator(PLAN_SCHEMA).validate(data)
    assert data["pipeline"]["recompute"] == "full"
    assert Plan.load(path).pipeline.recompute == "full" and Plan.load(path) == plan


def test_a_section_without_recompute_is_written_without_it_and_reads_as_none(pp_plan) -> None:
    data = pp_plan.to_dict()
    assert pp_plan.pipeline.recompute == "none" and "recompute" not in data["pipeline"]
    assert Plan.from_dict(data).pipeline.recompute == "none"


def test_a_hand_edited_recompute_is_refused_by_the_schema_and_at_load_in_one_line(pp_plan) -> None:
    data = json.loads(json.dumps(pp_plan.to_dict()))
    data["pipeline"]["recompute"] = "every:2"
    _refused_by_schema_and_load(data, r"pipeline.recompute: 'every:2'; valid: none, full")


def _refused_by_schema_and_load(data: dict, match: str) -> None:
    """``data`` (a plan) fails the schema, and loading it raises one line matching ``match``."""
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(PLAN_SCHEMA).validate(data)
    with pytest.raises(PlanError, match=match) as err:
        Plan.from_dict(data)
    assert "\n" not in str(err.value)


TP = (("layers.0.wq", "colwise"), ("layers.0.wo", "rowwise"))


def test_sequence_parallel_round_trips_in_the_plan_file_and_is_written_only_when_true(pp_plan, tmp_path) -> None:
    plan = replace(pp_plan, pipeline=_section(tensor_parallel=TP, sequence_parallel=True))
    path = tmp_path / "plan.json"
    plan.save(path)
    data = json.loads(path.read_text())
    jsonschema.Draft202012Validator(PLAN_SCHEMA).validate(data)
    assert data["pipeline"]["sequence_parallel"] is True
    assert Plan.load(path).pipeline.sequence_parallel is True and Plan.load(path) == plan
    plain = replace(pp_plan, pipeline=_section(tensor_parallel=TP)).to_dict()
    assert "sequence_parallel" not in plain["pipeline"]
    assert Plan.from_dict(plain).pipeline.sequence_parallel is False


def test_sequence_parallel_without_a_tensor_parallel_layout_is_refused_in_one_line() -> None:
    with pytest.raises(PipelineError, match=r"^pipeline.sequence_parallel: true needs a tensor_parallel layout"):
        _section(sequence_parallel=True)


def test_a_hand_edited_sequence_parallel_that_is_no_boolean_is_refused_naming_it(pp_plan) -> None:
    data = json.loads(json.dumps(replace(pp_plan, pipeline=_section(tensor_parallel=TP)).to_dict()))
    data["pipeline"]["sequence_parallel"] = "yes"
    _refused_by_schema_and_load(data, r"pipeline.sequence_parallel: expected true or false, got 'yes'")
