"""benchmarks/common: the model loader, the gloo launcher and the train-step timer."""

from __future__ import annotations

import math
import operator
import time

import pytest
import torch

from benchmarks.common.gloo import spawn
from benchmarks.common.models import example_spec, load
from benchmarks.common.timing import StepRun, time_rounds, train_step


def test_short_names_are_examples_specs_and_bad_ones_say_so():
    assert example_spec("llama3.tiny") == "examples.models.llama3:tiny"
    assert example_spec("examples.models.hf:hf_gpt2") == "examples.models.hf:hf_gpt2"
    with pytest.raises(ValueError, match="model 'tiny': expected MODULE:FACTORY"):
        example_spec("tiny")


def test_load_goes_through_the_model_spec_loader():
    model, inputs = load("mlp.tiny", {"batch_size": 4}, device="meta")
    assert isinstance(inputs, tuple) and inputs[0].shape[0] == 4 and inputs[0].device.type == "meta"
    with pytest.raises(ValueError, match="has no factory 'nope'"):  # autoshard.trace.model_spec's one line
        load("mlp.nope")


def test_train_step_steps_the_optimizer_and_reports_its_parts():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    before = model.weight.detach().clone()
    calls = []
    step = train_step(lambda x: model(x).pow(2).sum(), (torch.ones(3, 4),),
                      torch.optim.SGD(model.parameters(), lr=0.1), after_backward=lambda: calls.append(1))
    run = step()
    assert isinstance(run, StepRun) and run.forward_backward_s > 0 and calls == [1]
    assert not torch.equal(model.weight, before) and model.weight.grad is None  # stepped, then zeroed


def test_time_rounds_counts_only_the_timed_rounds_in_turn():
    order: list[str] = []
    marks: list[int] = []
    steps = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    times = time_rounds(steps, rounds=3, warmup=2, before_timed=lambda: marks.append(len(order)))
    assert order == ["a", "b"] * 5  # in turn, one step each per round
    assert marks == [4]  # once, after the two warm-up rounds
    assert times["a"].rounds == 3 and times["a"].step_s >= 0 and math.isnan(times["a"].part_s)
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        time_rounds(steps, rounds=0, warmup=0)


def test_spawn_returns_every_rank_in_order_and_raises_a_rank_error(tmp_path):
    assert spawn(2, operator.add, (), tmp_path / "ok") == [2, 3]  # rank + world
    with pytest.raises(Exception, match="math domain error"):  # rank 0's log(0, 2), with its traceback
        spawn(2, math.log, (), tmp_path / "err")
    with pytest.raises(TimeoutError, match="2 ranks did not finish within 0 s"):
        spawn(2, sleeping, (30.0,), tmp_path / "slow", timeout=0.01)


def sleeping(rank: int, world: int, seconds: float) -> None:
    """A rank that outlives the job's timeout (a rank started from the fork server is ready in well
    under the spawn's first second: a plain one would finish before the timeout is looked at)."""
    time.sleep(seconds)
