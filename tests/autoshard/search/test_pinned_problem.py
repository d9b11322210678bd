"""A solve's problems built once per policy (``autoshard.search.pinned_problem``): the problem under
another memory limit is the one built, with that limit, and the solver answers it as it answers the
problem built afresh under that limit."""

from __future__ import annotations

import numpy as np
import pytest
from solver.evaluate import evaluate, peak_memory

from autoshard.plan.options import SolveOptions
from autoshard.search import pinned_problem as module
from autoshard.search.pinned_problem import PinnedProblems, pinned_problem
from autoshard.search.solve import prepare
from examples.models import llama3


@pytest.fixture(scope="module")
def prep():
    model, inputs = llama3.tiny(device="meta", n_layers=2, batch_size=8, seq_len=32)
    return prepare(model, inputs, (2,), ("dp",), profile="cpu-gloo")


def _same(a, b) -> None:
    """Every number and field the solver reads, equal (inf where inf)."""
    assert (a.memory_limit, a.ties, dict(a.pins), a.name) == (b.memory_limit, b.ties, dict(b.pins), b.name)
    assert len(a.nodes) == len(b.nodes) and len(a.edges) == len(b.edges)
    for x, y in zip(a.nodes, b.nodes):
        assert np.array_equal(x.cost, y.cost) and np.array_equal(x.memory_bytes, y.memory_bytes)
        assert (x.live, x.name, x.strategies) == (y.live, y.name, y.strategies)
    for x, y in zip(a.edges, b.edges):
        assert (x.src, x.dst) == (y.src, y.dst) and np.array_equal(x.cost, y.cost)


@pytest.mark.parametrize("baseline", [None, "fsdp"])
@pytest.mark.parametrize("policy", ["none", "auto"])
def test_the_problem_under_another_limit_equals_the_one_built_under_it(prep, policy, baseline) -> None:
    opts = SolveOptions(baseline=baseline)
    assert prep.graph.bucket_bytes > 0  # the gather edges are repriced: the part that must keep the limit
    limit = 1e9
    problems = PinnedProblems(prep.graph, opts)
    free = problems(None, policy)
    under = problems(limit, policy)
    assert free.memory_limit is None and under.memory_limit == limit
    _same(under, pinned_problem(prep.graph, opts, limit, policy))
    _same(free, pinned_problem(prep.graph, opts, None, policy))


def test_each_policy_is_built_once(prep, monkeypatch) -> None:
    built = []
    real = module.to_problem
    monkeypatch.setattr(module, "to_problem", lambda graph, **kw: built.append(kw["recompute"]) or real(graph, **kw))
    problems = PinnedProblems(prep.graph, SolveOptions())
    problems(None, "none"), problems(1e9, "none"), problems(1e9, "none"), problems(2e9, "auto")
    assert built == ["none", "auto"]


def test_the_solver_prices_the_reused_problem_as_the_fresh_one(prep) -> None:
    opts = SolveOptions()
    problems = PinnedProblems(prep.graph, opts)
    replicated = [0] * len(prep.graph.nodes)  # every node's first strategy
    last = [len(n.strategies) - 1 for n in prep.graph.nodes]
    limit = 0.99 * peak_memory(problems(None, "none"), replicated)[0]  # binds: the replicated choice no longer fits
    reused, fresh = problems(limit, "none"), pinned_problem(prep.graph, opts, limit, "none")
    for choice in (replicated, last):
        assert evaluate(reused, choice) == evaluate(fresh, choice)
    assert not evaluate(fresh, replicated).feasible
