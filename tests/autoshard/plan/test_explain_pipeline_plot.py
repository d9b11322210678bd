"""``autoshard explain --plot-schedule``: the pipeline's per-rank timeline, from the simulation explain reports."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from autoshard.plan.explain_pipeline import plot_schedule, section_simulation, simulated_bubble
from autoshard.plan.format import Plan
from autoshard.plan.pipeline_section import build_pipeline_section
from autoshard.search.solve import solve_prepared

pytest.importorskip("matplotlib")


def _section(schedule: str = "1F1B", seconds=((3.0, 6.0), (1.0, 8.0))):
    return build_pipeline_section(schedule=schedule, n_ranks=2, n_microbatches=4, batch_size=8,
                                  block_paths=tuple(f"layers.{i}" for i in range(4)), cuts=(3,),
                                  stage_seconds=seconds)


@pytest.fixture(scope="module")
def pp_plan(dp_mlp) -> Plan:
    plan = solve_prepared(dp_mlp, time_limit=30)
    return replace(plan, fingerprint=replace(plan.fingerprint, dim_names=("pp", "dp")), pipeline=_section())


def test_the_timeline_is_the_simulation_whose_bubble_explain_prints() -> None:
    section = _section()
    sim, priced = section_simulation(section)
    assert priced and sim.bubble_fraction == simulated_bubble(section)[0]
    # 1F1B: every stage runs a forward and a backward per microbatch, each as long as the stage's priced times
    assert len(sim.actions) == 2 * 2 * 4
    lengths = {(t.action.stage, t.action.kind.value): round(t.end_s - t.start_s, 9) for t in sim.actions}
    assert lengths == {(0, "F"): 3.0, (0, "B"): 6.0, (1, "F"): 1.0, (1, "B"): 8.0}
    # the bubble is each rank's idle share of the pipeline part: what the gaps of the drawing add up to
    idle = sum(sim.pipeline_s - sum(t.end_s - t.start_s for t in sim.actions if t.rank == r) for r in (0, 1))
    assert sim.bubble_fraction == pytest.approx(idle / (2 * sim.pipeline_s))


def test_zero_bubble_schedules_draw_their_weight_gradient_actions() -> None:
    sim, _ = section_simulation(_section("InterleavedZeroBubble"))
    assert {t.action.kind.value for t in sim.actions} == {"F", "I", "W"}


def test_plot_schedule_writes_a_png_and_refuses_a_plan_without_stages(pp_plan, dp_mlp, tmp_path) -> None:
    out = tmp_path / "schedule.png"
    plot_schedule(pp_plan, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no pipeline section"):
        plot_schedule(solve_prepared(dp_mlp, time_limit=30), str(tmp_path / "none.png"))


def test_the_cli_draws_the_schedule_and_names_a_plan_without_stages(pp_plan, dp_mlp, tmp_path) -> None:
    path, png = tmp_path / "plan.json", tmp_path / "schedule.png"
    pp_plan.save(path)
    run = [sys.executable, "-m", "autoshard.cli", "explain", str(path), "--plot-schedule", str(png)]
    out = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"schedule plot written to {png}" in out.stdout and png.stat().st_size > 0
    flat = tmp_path / "flat.json"
    solve_prepared(dp_mlp, time_limit=30).save(flat)
    run[4] = str(flat)
    out = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--plot-schedule" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
