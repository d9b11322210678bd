"""The op list of each tiny example's joint graph is stable (golden file).

The rule engine must cover these ops; a change in a model or in torch shows up
here first. After an intended change, regenerate the golden file with
``AUTOSHARD_UPDATE_GOLDEN=1 python -m pytest tests/examples/test_traced_ops.py``
and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from autoshard.trace import trace_joint, traced_ops
EXAMPLE_MODELS = ("mlp", "gpt2", "llama3", "moe", "convnet", "vit")

GOLDEN = Path(__file__).with_name("golden_ops.json")


def _op_counts(traced) -> dict[str, int]:
    return {str(op): count for op, count in sorted(traced_ops(traced).items(), key=lambda kv: str(kv[0]))}


def test_golden_file_lists_every_example_model():
    if os.environ.get("AUTOSHARD_UPDATE_GOLDEN"):
        pytest.skip("regenerating")
    assert sorted(json.loads(GOLDEN.read_text())) == sorted(EXAMPLE_MODELS)


@pytest.mark.parametrize("name", EXAMPLE_MODELS)
def test_traced_op_counts_match_the_golden_file(name, traced_tiny):
    counts = _op_counts(traced_tiny(name))
    if os.environ.get("AUTOSHARD_UPDATE_GOLDEN"):
        golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        golden[name] = counts
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
        return
    assert counts == json.loads(GOLDEN.read_text())[name]


def test_tracing_twice_gives_the_same_graph():
    from examples.models import llama3

    first = trace_joint(*llama3.tiny(device="meta"))
    second = trace_joint(*llama3.tiny(device="meta"))
    assert [(i.name, i.op, i.args) for i in first.nodes.values()] == [(i.name, i.op, i.args) for i in second.nodes.values()]
