"""``autoshard solve --devices`` chooses pipeline stages where they pay, and ``explain`` draws them.

Two H100s in nodes of one (every link the network): a LLaMA of 4 blocks of width 512 on 4
sequences of 64 tokens. Any one-stage layout replicates or shards the weights across the
network; two stages send one activation per microbatch. The CLI writes the pp plan with its
pipeline section, and ``explain --plot-schedule`` draws that section's timeline.
"""

from __future__ import annotations

import json

import pytest

from autoshard.cli import main
from autoshard.plan.format import Plan

KWARGS = {"device": "meta", "batch_size": 4, "seq_len": 64, "max_seq_len": 64, "dim": 512, "n_layers": 4,
          "n_heads": 8, "n_kv_heads": 8, "vocab_size": 256}



def test_devices_over_a_slow_link_picks_stages_and_explain_draws_their_schedule(tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    path, png = tmp_path / "plan.json", tmp_path / "schedule.png"
    # The solve runs in this process (``main``), sparing a second interpreter's torch import (~4 s);
    # ``autoshard solve`` as its own process is tests/autoshard/cli/test_solve.py's. A 10 s limit:
    # both layouts solve to optimal within it (measured on this search: dp 1.7 s and pp 4.7 s of an
    # 8 s limit, the pp step of a 20 s one); more only lengthens the dp layout's stages that run to
    # a share of the limit (4.5 s at 20 s).
    code = main(["solve", "examples.models.llama3:tiny", "--kwargs", json.dumps(KWARGS), "--devices", "2",
                 "--devices-per-node", "1", "--profile", "h100-sxm-80gb", "--time-limit", "10", "--jobs", "1",
                 "--no-cache", "-o", str(path)])
    out = capsys.readouterr()
    assert code == 0, out.err
    plan = Plan.load(path)
    assert plan.fingerprint.dim_names == ("pp",) and plan.pipeline is not None
    assert f"pipeline: {plan.pipeline.n_stages} stages on 2 ranks of pp" in out.out
    rows = {tuple(r["dim_names"]): r for r in plan.options["mesh_search"]["layouts"]}
    assert rows[("pp",)]["chosen"] and rows[("pp",)]["step_s"] < rows[("dp",)]["step_s"]
    # in this process too (``explain --plot-schedule`` as its own process is
    # tests/autoshard/plan/test_explain_pipeline_plot.py's)
    code = main(["explain", str(path), "--plot-schedule", str(png)])
    shown = capsys.readouterr()
    assert code == 0, shown.err
    assert png.read_bytes()[:4] == b"\x89PNG"
