"""``autoshard coverage``: op table, coverage figures, and one-line errors with exit 2."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from autoshard import cli
from autoshard.cli import coverage
from autoshard.validation.coverage import NO_RULE, compute_coverage

aten = torch.ops.aten


class MatmulOnlyRegistry:
    """A stand-in registry: rules for mm and addmm only."""

    def rule_for(self, op):
        if op in (aten.mm.default, aten.addmm.default):
            return SimpleNamespace(family="matmul")
        return None


@pytest.fixture
def fake_registry(monkeypatch):
    monkeypatch.setattr(coverage, "load_registry", lambda **_: MatmulOnlyRegistry())


def test_report_counts_ops_and_marks_those_without_rules(traced_tiny):
    report = compute_coverage(traced_tiny("mlp"), MatmulOnlyRegistry(), model="mlp")
    rows = {row.op: row for row in report.ops}
    assert rows["aten.mm.default"].count == 7 and rows["aten.mm.default"].family == "matmul"
    assert rows["aten.addmm.default"].count == 4
    assert rows["aten.relu.default"].family == NO_RULE and not rows["aten.relu.default"].covered
    # mse_loss (mean) is traced as its sum kernels and a division by the global count (the batch split)
    assert rows["aten.div.Tensor"].count == 2
    assert (report.covered_ops, report.total_ops) == (2, 11)
    assert report.covered_nodes == 11 and report.op_nodes == 49
    assert report.percent == pytest.approx(200 / 11)
    assert [row.op for row in report.ops] == sorted(rows)


def test_coverage_table_lists_each_op_and_the_percentage(fake_registry, capsys):
    assert cli.main(["coverage", "examples.models.mlp:tiny"]) == 0
    out = capsys.readouterr().out
    assert "aten.mm.default" in out and "matmul" in out and NO_RULE in out
    assert "coverage: 2/11 ops (18.2%), 11/49 op nodes" in out


def test_coverage_json_output_with_kwargs(fake_registry, capsys):
    assert cli.main(["coverage", "examples.models.mlp:tiny", "--kwargs", '{"n_layers": 1}', "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model"] == "examples.models.mlp:tiny"
    assert {row["op"]: row["count"] for row in report["ops"]}["aten.addmm.default"] == 2
    assert report["covered_ops"] == 2 and report["total_ops"] == len(report["ops"]) == 11


@pytest.mark.parametrize(
    "argv,message",
    [
        (["examples.models.llama3"], "expected MODULE:FACTORY"),
        (["no_such_module:tiny"], "cannot import module 'no_such_module'"),
        (["examples.models.llama3:no_such_factory"], "has no factory 'no_such_factory'"),
        (["examples.models.llama3:tiny", "--kwargs", '{"n_heads": 3}'], "failed: ValueError: n_heads (3) must divide dim"),
        (["examples.models.llama3:tiny", "--kwargs", "{oops"], "--kwargs is not valid JSON"),
        (["examples.models.llama3:tiny", "--kwargs", "[1]"], "--kwargs must be a JSON object"),
    ],
)
def test_bad_input_is_one_line_on_stderr_and_exit_2(fake_registry, capsys, argv, message):
    assert cli.main(["coverage", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_model_that_does_not_return_a_scalar_is_exit_2(fake_registry, capsys, tmp_path, monkeypatch):
    (tmp_path / "vector_model.py").write_text(
        "import torch\n"
        "def build():\n"
        "    return torch.nn.Linear(3, 3), (torch.randn(2, 3),)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["coverage", "vector_model:build"]) == 2
    assert "scalar loss" in capsys.readouterr().err


def test_real_registry_covers_the_matmuls_of_llama(capsys):
    coverage.load_registry()  # must load: an ImportError here is a failure, not a skip
    assert cli.main(["coverage", "examples.models.llama3:tiny", "--json"]) == 0
    rows = {row["op"]: row for row in json.loads(capsys.readouterr().out)["ops"]}
    assert rows["aten.mm.default"]["family"] != NO_RULE
