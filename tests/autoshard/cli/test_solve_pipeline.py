"""``autoshard solve`` on a mesh with a ``pp`` dim writes the searched pipeline section; bad input is one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autoshard.cli import main
from autoshard.plan.format import Plan
from autoshard.search.pipeline_model import RUNTIME_SCHEDULES

pytestmark = pytest.mark.slow


def _args(kwargs: dict, mesh: str, dims: str, out) -> list[str]:
    # 4 s: the stage and plan solves end optimal in under a second; a larger limit only lengthens
    # the expert layouts' share (measured: 15.5 s at 10 s, 10.1 s at 4 s, the same pipeline section)
    return ["solve", "examples.models.llama3:tiny", "--kwargs", json.dumps(kwargs), "--mesh", mesh, "--dims", dims,
            "--profile", "cpu-gloo", "--time-limit", "4", "-o", str(out)]


def _solve(tmp_path, kwargs: dict, mesh: str, dims: str):
    out = tmp_path / "plan.json"
    done = subprocess.run([sys.executable, "-m", "autoshard.cli", *_args(kwargs, mesh, dims, out)],
                          capture_output=True, text=True, timeout=300)
    return done, out


def test_a_pp_mesh_writes_the_searched_section_and_explain_shows_it(tmp_path, capsys):
    # in this process (``main``), sparing a second interpreter's torch import (~4 s); the bad input
    # below runs as its own process (its stderr is the point), and so does test_solve.py's solve
    out = tmp_path / "plan.json"
    code = main(_args({"batch_size": 8}, "2x2", "pp,dp", out))
    done = capsys.readouterr()
    assert code == 0, done.err
    plan = Plan.load(out)
    section = plan.pipeline
    assert section is not None and section.n_ranks == 2 and section.mesh_dim == "pp"
    assert section.schedule in RUNTIME_SCHEDULES and 8 % section.n_microbatches == 0
    assert [s.modules[0] for s in section.stages] == ["tok_embeddings", "layers.1"]
    assert all(s.forward_s and s.backward_s and s.peak_bytes for s in section.stages)
    assert f"schedule {section.schedule}, {section.n_microbatches} microbatches" in done.out


@pytest.mark.parametrize("kwargs, mesh, message", [
    ({"batch_size": 2}, "2x2", "no microbatch count: batch 2"),
    ({"batch_size": 8}, "4x1", "pp=4 stages exceed the model's 2 blocks"),
])
def test_bad_pipeline_input_is_one_line_nonzero_and_nothing_written(tmp_path, kwargs, mesh, message):
    done, out = _solve(tmp_path, kwargs, mesh, "pp,dp")
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode != 0 and len(lines) == 1 and message in lines[0], done.stderr
    assert not out.exists()


FLAT = """
import torch
from torch import nn


class Flat(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        return self.proj(x).pow(2).mean()


def tiny():
    return Flat(), (torch.randn(8, 8),)
"""


def test_a_model_without_repeated_blocks_is_one_line(tmp_path):
    (tmp_path / "flat_model.py").write_text(FLAT)
    out = tmp_path / "plan.json"
    done = subprocess.run([sys.executable, "-m", "autoshard.cli", "solve", "flat_model:tiny", "--path", str(tmp_path),
                           "--mesh", "2x1", "--dims", "pp,dp", "--profile", "cpu-gloo", "-o", str(out)],
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode != 0 and len(lines) == 1 and "no repeated blocks" in lines[0], done.stderr
    assert not out.exists()
