"""The transformer written outside the examples (benchmarks.common.unseen_model) and its runtime_step case."""

from __future__ import annotations

import fnmatch

import torch

from benchmarks import runtime_step as rs
from benchmarks.common.models import load
from benchmarks.common.unseen_model import TinyGPT, transformer


def test_the_unseen_case_is_issue_54s_shapes_and_loads_through_the_spec_loader():
    model, (tokens, labels) = rs._example("unseen")
    assert isinstance(model, TinyGPT)
    assert (len(model.layers), model.tok.weight.shape, tuple(tokens.shape)) == (2, (2048, 256), (16, 64))
    assert labels.shape == tokens.shape and int(labels.max()) < 2048


def test_the_same_seed_gives_the_same_weights_and_batch_on_every_rank():
    (a, ia), (b, ib) = transformer(n_layers=1, seed=3), transformer(n_layers=1, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert all(torch.equal(x, y) for x, y in zip(ia, ib))
    _, other = transformer(n_layers=1, seed=4)
    assert not torch.equal(ia[0], other[0])


def test_a_few_adamw_steps_lower_the_loss():
    model, batch = load("benchmarks.common.unseen_model:transformer", {"dim": 32, "n_heads": 4, "vocab_size": 64,
                                                                      "batch_size": 4, "seq_len": 8})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(5):
        loss = model(*batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_the_torch_tp_plan_names_modules_of_the_unseen_model():
    model, _ = transformer(device="meta")
    names = [n for n, _ in model.named_modules()]
    for pattern in rs.TP_PLANS["unseen"]:
        assert len(fnmatch.filter(names, pattern)) == len(model.layers), pattern
