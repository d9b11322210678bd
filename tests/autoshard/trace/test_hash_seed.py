"""A trace does not depend on the process's hash seed (issue 54, item 1).

Under ``torchrun`` every rank has its own ``PYTHONHASHSEED``; Gemma 3 iterates a
``set`` of attention types, so its rotary tables were traced in either order and
one rank in two refused the plan ("plan does not match: graph"). Each seed runs
in its own interpreter (the seed is fixed at start-up), traces every model once
and prints the graph hashes and node names as JSON.
"""

from __future__ import annotations

import doctest
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.fx as fx

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[3]
SEEDS = ("0", "1", "2", "3")
MODELS = (
    "examples.models.hf:hf_gemma3",  # sliding + full attention: `set(config.layer_types)` in its forward
    "set_loop",  # a user's forward over a set of branch names, with gradients (_CHILD)
    "examples.models.llama3:tiny",
    "examples.models.hf:hf_llama",
    "examples.models.moe:tiny",
)

_CHILD = textwrap.dedent("""
    import hashlib, importlib, json, sys
    import torch
    from torch import nn
    try:
        from autoshard.plan.fingerprint import graph_hash
    except ImportError:  # where it lived before
        from autoshard.plan.build import graph_hash
    from autoshard.trace import trace_joint

    class SetLoop(nn.Module):
        def __init__(self):
            super().__init__()
            self.branches = nn.ModuleDict({k: nn.Linear(8, 8) for k in ("alpha", "beta", "gamma", "delta")})
            self.head = nn.Linear(8, 1)

        def forward(self, x):
            outs = {key: torch.tanh(self.branches[key](x)) for key in set(self.branches)}
            return self.head(sum(outs[key] for key in sorted(outs))).pow(2).mean()

    out = {}
    for spec in sys.argv[1:]:
        if spec == "set_loop":
            traced = trace_joint(SetLoop(), (torch.ones(4, 8),))
        else:
            module, _, factory = spec.partition(":")
            traced = trace_joint(*getattr(importlib.import_module(module), factory)(device="meta"))
        names = hashlib.sha256(" ".join(traced.nodes).encode()).hexdigest()
        out[spec] = [graph_hash(traced), names]
    print(json.dumps(out))
""")


def _trace_under_seeds() -> dict[str, dict[str, list[str]]]:
    """Seed -> model spec -> [graph hash, hash of the node names in graph order]; one process per seed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    children = {seed: subprocess.Popen([sys.executable, "-c", _CHILD, *MODELS], cwd=ROOT,
                                       env={**env, "PYTHONHASHSEED": seed}, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
                for seed in SEEDS}
    results = {}
    try:
        for seed, child in children.items():
            stdout, stderr = child.communicate(timeout=300)
            assert child.returncode == 0, f"PYTHONHASHSEED={seed}: {stderr[-2000:]}"
            results[seed] = json.loads(stdout.strip().splitlines()[-1])
    finally:  # a failed seed leaves no process behind
        for child in children.values():
            if child.poll() is None:
                child.kill()
                child.wait()
    return results


def test_graph_hashes_and_node_names_do_not_depend_on_the_hash_seed() -> None:
    results = _trace_under_seeds()
    for spec in MODELS:
        by_seed = {seed: tuple(results[seed][spec]) for seed in SEEDS}
        assert len(set(by_seed.values())) == 1, f"{spec}: {by_seed}"


def _branches(order: tuple[int, ...]) -> fx.Graph:
    """x -> relu(x @ w_i) for each i in ``order`` (traced in that order), summed in index order."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    weights = [graph.placeholder(f"w{i}") for i in range(len(order))]
    outs = {}
    for i in order:
        outs[i] = graph.call_function(torch.relu, (graph.call_function(torch.matmul, (x, weights[i])),))
    total = outs[0]
    for i in range(1, len(order)):
        total = graph.call_function(torch.add, (total, outs[i]))
    graph.output(total)
    return graph


def test_twin_runs_take_the_order_of_the_parameters_they_read_and_names_by_position() -> None:
    from autoshard.trace.canonical import canonical_order

    traced_in_order, shuffled = _branches((0, 1, 2)), _branches((2, 0, 1))
    assert canonical_order(traced_in_order) == 0  # a trace already in order keeps its graph
    assert canonical_order(shuffled) == 1
    assert str(shuffled) == str(traced_in_order)
    shuffled.lint()


def test_runs_that_read_one_another_or_differ_in_an_op_keep_their_order() -> None:
    from autoshard.trace.canonical import canonical_order

    graph = fx.Graph()
    x, w1, w0 = graph.placeholder("x"), graph.placeholder("w1"), graph.placeholder("w0")
    first = graph.call_function(torch.matmul, (x, w0))
    second = graph.call_function(torch.matmul, (first, w1))  # reads the first run: a chain, not twins
    third = graph.call_function(torch.sub, (x, w1))
    fourth = graph.call_function(torch.add, (x, w0))  # another op than its neighbour
    graph.output((second, third, fourth))
    before = str(graph)
    assert canonical_order(graph) == 0
    assert str(graph) == before


def test_the_examples_in_the_docstring_hold() -> None:
    from autoshard.trace import canonical

    result = doctest.testmod(canonical)
    assert result.attempted > 0 and result.failed == 0
