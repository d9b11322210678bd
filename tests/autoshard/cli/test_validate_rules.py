"""``autoshard validate-rules`` (and ``python -m autoshard.cli.validate_rules``): the pass
table and exit code 0, exit code 1 when a rule fails, one-line errors for bad flags."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
import torch

from autoshard.cli.validate_rules import add_arguments, run
from autoshard.rules import RuleRegistry, load_rules
from autoshard.rules.compute import elementwise
from autoshard.rules.core import P, SingleDimStrategy
from autoshard.rules.registry import Rule

aten = torch.ops.aten


def _bad(op, fn) -> Rule:
    """A wrong rule for ``op`` with the registered rule's samples."""
    return Rule(op, "bad", fn, elementwise(), samples=load_rules().rule_for(op).samples)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_run_prints_a_pass_table_and_exits_zero(capsys: pytest.CaptureFixture) -> None:
    assert run(_args("--op", "aten.mm.default", "--op", "bmm", "--cases", "2")) == 0
    out = capsys.readouterr().out
    assert "aten.mm.default" in out and "aten.bmm.default" in out and "PASS" in out


def test_run_exits_non_zero_when_a_rule_fails(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    def broken() -> RuleRegistry:
        registry = RuleRegistry()
        registry.add(_bad(aten.relu.default, lambda call: [SingleDimStrategy(P, P)]))
        return registry

    monkeypatch.setattr("autoshard.rules.load_rules", broken)
    assert run(_args("--op", "relu", "--cases", "2")) == 1
    assert "FAIL aten.relu.default" in capsys.readouterr().out


def test_unknown_op_is_a_one_line_error() -> None:
    with pytest.raises(ValueError, match="--op: no registered rule matches 'nosuchop'"):
        run(_args("--op", "nosuchop"))


@pytest.mark.parametrize("spelling", [["autoshard.cli.validate_rules"], ["autoshard.cli", "validate-rules"]])
def test_python_m_validate_rules_and_autoshard_validate_rules_exit_zero(spelling: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", *spelling, "--op", "aten.mm.default", "--cases", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "1 passed, 0 failed" in done.stdout
    from autoshard.cli import main

    assert main(["validate-rules", "--op", "t", "--cases", "1"]) == 0
