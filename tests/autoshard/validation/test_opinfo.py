"""The OpInfo sweep on a bounded subset: PyTorch's own samples of a few ops
(casts, indexing with 0-D tensors, matmul near the float range, a
layer-norm backward over one element) pass every enumerated strategy; the
tracing records in-place calls as their functional form; and the command
line reports it. The whole sweep is ``benchmarks/opinfo_rules.py``."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("expecttest", reason="PyTorch's OpInfo database imports expecttest (pip install expecttest)")

from autoshard.rules import load_rules  # noqa: E402
from autoshard.validation.opinfo import load_op_db, select_infos, traced_calls  # noqa: E402
from autoshard.validation.opinfo_sweep import check_calls, sweep  # noqa: E402

aten = torch.ops.aten
SUBSET = ["to", "index_select", "scatter_add", "addmm", "nn.functional.layer_norm"]
DTYPES = (torch.float32, torch.int64, torch.uint8, torch.bool)


@pytest.fixture(scope="module")
def db():
    return load_op_db()


def test_subset_passes_every_strategy_with_no_crash() -> None:
    report = sweep(SUBSET, dtypes=DTYPES, max_samples=2)
    assert report.ruled_calls > 40 and report.strategies_checked > 2000
    assert report.ok, "\n".join(str(f) for f in report.findings[:10])
    # the findings are among the calls checked: integer casts, 0-D indexing, a layer-norm backward
    checked = set(report.per_op)
    assert {"aten._to_copy.default", "aten.index_select.default", "aten.native_layer_norm_backward.default"} <= checked


def test_the_sweep_is_deterministic(db) -> None:
    infos = select_infos(db, ["index_select"])
    first = [str(c) for c in traced_calls(infos, dtypes=[torch.float32], max_samples=2)]
    again = [str(c) for c in traced_calls(infos, dtypes=[torch.float32], max_samples=2)]
    assert first == again and first


def test_in_place_calls_are_recorded_as_their_functional_form(db) -> None:
    # cumprod's backward fills in place (masked_fill_): a functional graph holds masked_fill
    calls = traced_calls(select_infos(db, ["cumprod"]), dtypes=[torch.float32], max_samples=1)
    ops = {c.op for c in calls}
    assert aten.masked_fill.Scalar in ops and not any(op._schema.is_mutable for op in ops)


def test_sweep_reports_a_wrong_rule_and_a_crash(db) -> None:
    from autoshard.rules.core import P, SingleDimStrategy
    from autoshard.rules.registry import Rule, RuleRegistry

    real = load_rules()
    registry = RuleRegistry()
    relu = real.rule_for(aten.relu.default)
    registry.add(Rule(aten.relu.default, "bad", lambda call: [SingleDimStrategy(P, P)], relu.compute))  # relu is not linear
    registry.add(Rule(aten.index_select.default, "bad", lambda call: [call.inputs[0].shape[9]], relu.compute))
    calls = traced_calls(select_infos(db, ["nn.functional.relu", "index_select"]), dtypes=[torch.float32], max_samples=3)
    report = check_calls(calls, registry, meshes=((2,),))
    assert report.per_op["aten.relu.default"].wrong > 0 and report.per_op["aten.index_select.default"].crashes > 0
    assert any("failed on aten.index_select.default(" in f.message for f in report.findings)


def test_validate_rules_opinfo_command_line(capsys: pytest.CaptureFixture) -> None:
    from autoshard.cli import main

    assert main(["validate-rules", "--opinfo", "--opinfo-ops", "cumsum", "--max-samples", "1"]) == 0
    out = capsys.readouterr().out
    assert "wrong 0, crashes 0" in out
    assert main(["validate-rules", "--opinfo", "--opinfo-ops", "nosuchopinfo"]) == 2
