"""A ``partial`` pipeline section (``recompute: "partial"``, ``recompute_blocks`` per stage): round trip,
schema, old plans unchanged, bad counts in one line (``autoshard.plan.pipeline_section``)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import jsonschema
import pytest

from autoshard.plan.format import Plan, PlanError
from autoshard.plan.pipeline_section import PipelineError, build_pipeline_section
from autoshard.plan.schema import PLAN_SCHEMA
from autoshard.search.solve import solve_prepared

BLOCKS = tuple(f"layers.{i}" for i in range(4))


def _section(**over):
    args = {"schedule": "1F1B", "n_ranks": 2, "n_microbatches": 4, "batch_size": 8, "cuts": (3,),
            "block_paths": BLOCKS, "leading": ("tok_embeddings",), "trailing": ("norm", "output"), **over}
    return build_pipeline_section(**args)


@pytest.fixture(scope="module")
def pp_plan(dp_mlp) -> Plan:
    """A solved plan whose mesh's first dim is named ``pp``, with a partial section: stage 0 checkpoints
    two of its three blocks, stage 1 none of its one."""
    plan = solve_prepared(dp_mlp, time_limit=30)
    return replace(plan, fingerprint=replace(plan.fingerprint, dim_names=("pp", "dp")),
                   pipeline=_section(recompute="partial", recompute_blocks=(2, 0)))


def test_partial_round_trips_in_the_plan_file_and_the_schema_accepts_it(pp_plan, tmp_path) -> None:
    path = tmp_path / "plan.json"
    pp_plan.save(path)
    data = json.loads(path.read_text())
    jsonschema.Draft202012Validator(PLAN_SCHEMA).validate(data)
    assert data["pipeline"]["recompute"] == "partial"
    assert [s["recompute_blocks"] for s in data["pipeline"]["stages"]] == [2, 0]
    loaded = Plan.load(path)
    assert loaded == pp_plan and [loaded.pipeline.checkpointed_blocks(k) for k in (0, 1)] == [2, 0]


@pytest.mark.parametrize("policy, counts", [("none", [0, 0]), ("full", [3, 1])])
def test_whole_stage_policies_write_no_counts_and_read_as_before(policy, counts) -> None:
    section = _section(recompute=policy)
    data = section.to_dict()
    assert all("recompute_blocks" not in s for s in data["stages"])
    assert [section.checkpointed_blocks(k) for k in (0, 1)] == counts


def _refused(pp_plan, edit, match: str, *, schema: bool = True) -> None:
    data = json.loads(json.dumps(pp_plan.to_dict()))
    edit(data["pipeline"])
    if schema:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.Draft202012Validator(PLAN_SCHEMA).validate(data)
    with pytest.raises(PlanError, match=match) as err:
        Plan.from_dict(data)
    assert "\n" not in str(err.value)


def test_a_count_that_is_no_whole_number_is_refused_naming_the_stage(pp_plan) -> None:
    for bad in (1.5, "2", True, -1):
        _refused(pp_plan, lambda p, b=bad: p["stages"][0].__setitem__("recompute_blocks", b),
                 r"pipeline.stages\[0\].recompute_blocks: ")


def test_a_count_above_the_stages_blocks_is_refused_in_one_line(pp_plan) -> None:
    # the schema cannot compare a count with the stage's blocks: the loader does
    _refused(pp_plan, lambda p: p["stages"][1].__setitem__("recompute_blocks", 2),
             r"pipeline.stages\[1\].recompute_blocks: recompute 'partial' needs a count from 0 to the stage's 1 "
             r"blocks, got 2$", schema=False)


def test_partial_without_a_count_on_a_stage_is_refused(pp_plan) -> None:
    _refused(pp_plan, lambda p: p["stages"][0].pop("recompute_blocks"),
             r"pipeline.stages\[0\].recompute_blocks: recompute 'partial' needs a count .* got None$", schema=False)


def test_a_count_with_a_whole_stage_policy_is_refused(pp_plan) -> None:
    _refused(pp_plan, lambda p: p.__setitem__("recompute", "full"),
             r"pipeline.stages\[0\].recompute_blocks: given with recompute 'full'; a count of checkpointed blocks "
             r"goes with recompute 'partial'$", schema=False)


def test_an_unknown_policy_lists_partial_among_the_valid_ones(pp_plan) -> None:
    _refused(pp_plan, lambda p: p.__setitem__("recompute", "half"),
             r"pipeline.recompute: 'half'; valid: none, full, partial$")


def test_building_with_the_wrong_number_of_counts_is_one_line() -> None:
    with pytest.raises(PipelineError, match="1 checkpointed-block counts / 0 selective / 0 all-mm for 2 stages"):
        _section(recompute="partial", recompute_blocks=(1,))
    with pytest.raises(PipelineError, match="2 checkpointed-block counts / 0 selective / 1 all-mm for 2 stages"):
        _section(recompute="partial", recompute_blocks=(1, 1), all_mm_blocks=(1,))


def test_the_cli_prints_one_line_and_fails_on_a_bad_count(pp_plan, tmp_path) -> None:
    data = pp_plan.to_dict()
    data["pipeline"]["stages"][0]["recompute_blocks"] = 7
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    out = subprocess.run([sys.executable, "-m", "autoshard.cli", "explain", str(path)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode != 0
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "recompute_blocks" in lines[0] and "got 7" in lines[0], out.stderr


def test_explain_names_each_stages_checkpointed_blocks(pp_plan) -> None:
    from autoshard.plan.explain_pipeline import pipeline_lines

    line = next(x for x in pipeline_lines(pp_plan) if x.startswith("recompute:"))
    assert line.startswith("recompute: partial (each stage's first blocks checkpointed")
    assert line.endswith("checkpointed blocks per stage 2/3, 0/1")
