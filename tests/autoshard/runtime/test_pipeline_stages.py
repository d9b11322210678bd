"""Stage modules cut from the model by a plan's ``pipeline`` section, in one process (no ranks)."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
from torch import nn

from autoshard.plan.pipeline_section import PipelineError, build_pipeline_section
from autoshard.runtime.pipeline_stages import PipelineRun, build_stage_module, check_model, model_parts
from examples.models import llama3


def _section(model: nn.Module, cuts: tuple[int, ...], n_ranks: int = 2, **over):
    parts = model_parts(model)
    return build_pipeline_section(**{"schedule": "GPipe", "n_ranks": n_ranks, "n_microbatches": 2, "batch_size": 4,
                                     "block_paths": parts.blocks, "cuts": cuts, "leading": parts.leading,
                                     "trailing": parts.trailing, **over})


def test_the_parts_of_the_example_llama_are_embedding_blocks_and_head() -> None:
    parts = model_parts(llama3.tiny(device="meta", n_layers=3)[0])
    assert parts.leading == ("tok_embeddings",)
    assert parts.blocks == ("layers.0", "layers.1", "layers.2")
    assert parts.trailing == ("norm", "output")


def test_stages_chained_compute_the_models_loss_and_gradients_under_its_names() -> None:
    model, (tokens, labels) = llama3.tiny(n_layers=3, batch_size=4)
    loss = model(tokens, labels)
    loss.backward()
    want = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    section = _section(model, (1, 2), n_ranks=3)
    stages = [build_stage_module(model, section, k) for k in range(3)]
    x = stages[0](tokens=tokens, labels=labels)
    assert x.shape == (4, 16, 64)  # the residual stream, not the loss: the forward stopped at layers.0
    for stage in stages[1:]:
        x = stage(x, tokens=tokens, labels=labels)
    torch.testing.assert_close(x, loss)
    x.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[name], msg=name)
    names = [[n.split(".")[0] + ("." + n.split(".")[1] if n.startswith("layers") else "")
              for n, _ in s.named_parameters()] for s in stages]
    assert [sorted(set(n)) for n in names] == [["layers.0", "tok_embeddings"], ["layers.1"],
                                               ["layers.2", "norm", "output"]]
    assert type(model) is llama3.Llama and len(list(model.parameters())) == len(want)  # the model is untouched


def test_weights_tied_across_stages_are_refused_in_one_line() -> None:
    model, _ = llama3.tiny(device="meta")
    model.output.weight = model.tok_embeddings.weight
    with pytest.raises(PipelineError, match=r"shared by stages \[0, 1\] \(tok_embeddings.weight, output.weight\)"):
        check_model(model, _section(model, (1,)))


def test_a_head_reading_the_first_stages_embedding_fails_naming_it() -> None:
    model, (tokens, labels) = llama3.tiny(tie_embeddings=True, batch_size=4)
    section = _section(model, (1,))
    x = build_stage_module(model, section, 0)(tokens=tokens, labels=labels)
    with pytest.raises(PipelineError, match="reads a module of another stage"):
        build_stage_module(model, section, 1)(x, tokens=tokens, labels=labels)


def test_a_model_without_blocks_or_with_other_blocks_is_refused() -> None:
    with pytest.raises(PipelineError, match="no repeated blocks"):
        model_parts(nn.Sequential(nn.Linear(2, 2)))
    model, _ = llama3.tiny(device="meta")
    other = build_pipeline_section(schedule="GPipe", n_ranks=2, n_microbatches=2, batch_size=4,
                                   block_paths=("layers.0", "layers.1", "layers.2"), cuts=(2,))
    with pytest.raises(PipelineError, match="they run 3 blocks, the model has 2"):
        check_model(model, other)


def test_step_refuses_a_batch_the_microbatches_do_not_divide() -> None:
    model, _ = llama3.tiny(device="meta")
    run = PipelineRun(_section(model, (1,), n_microbatches=4, batch_size=8), [], [], None, [])
    with pytest.raises(ValueError, match="4 microbatches do not divide this rank's batch of 6 sequences"):
        run.step(tokens=torch.zeros(6, 16, dtype=torch.long))


def _chained_step(model: nn.Module, section, tokens, labels) -> tuple[torch.Tensor, Counter, Counter]:
    """Loss of the section's stages chained in one process, backwarded; each block's forwards (its first
    child's calls, recomputations included) after the forward and after the backward."""
    parts = model_parts(model)
    calls: Counter = Counter()
    for path in parts.blocks:
        next(iter(model.get_submodule(path).children())).register_forward_pre_hook(
            lambda *_, p=path: calls.update([p]))
    stages = [build_stage_module(model, section, k) for k in range(section.n_stages)]
    x = stages[0](tokens=tokens, labels=labels)
    for stage in stages[1:]:
        x = stage(x, tokens=tokens, labels=labels)
    after_forward = Counter(calls)
    x.backward()
    return x.detach(), after_forward, calls


def test_full_recompute_runs_each_blocks_forward_again_in_the_backward_with_the_same_gradients() -> None:
    plain, (tokens, labels) = llama3.tiny(n_layers=3, batch_size=4)
    loss, forward_calls, calls = _chained_step(plain, _section(plain, (1, 2), n_ranks=3), tokens, labels)
    assert forward_calls == calls == {"layers.0": 1, "layers.1": 1, "layers.2": 1}
    model, _ = llama3.tiny(n_layers=3, batch_size=4)
    section = _section(model, (1, 2), n_ranks=3, recompute="full")
    recomputed, forward_calls, calls = _chained_step(model, section, tokens, labels)
    assert forward_calls == {"layers.0": 1, "layers.1": 1, "layers.2": 1}
    assert calls == {"layers.0": 2, "layers.1": 2, "layers.2": 2}  # each forward again, in the backward
    torch.testing.assert_close(recomputed, loss)
    grads = dict(plain.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[name].grad, msg=name)


def test_full_recompute_keeps_every_parameter_name_and_state_dict_key() -> None:
    # a checkpoint saved by a plan without recomputation loads in one with it, and back: same keys
    plain, _ = llama3.tiny(device="meta", n_layers=3)
    model, _ = llama3.tiny(device="meta", n_layers=3)
    for k in range(3):
        without = build_stage_module(plain, _section(plain, (1, 2), n_ranks=3), k)
        with_ = build_stage_module(model, _section(model, (1, 2), n_ranks=3, recompute="full"), k)
        assert [n for n, _ in with_.named_parameters()] == [n for n, _ in without.named_parameters()]
        assert list(with_.state_dict()) == list(without.state_dict())
    assert type(model.layers[0]).__name__ == "CheckpointedTransformerBlock"
    assert list(model.state_dict()) == list(plain.state_dict())


class _DropoutBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.dropout(torch.tanh(self.linear(x)))


class _DropoutNet(nn.Module):
    """Embedding, two blocks with dropout, head and loss: the stream between blocks is one tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.layers = nn.ModuleList(_DropoutBlock(8) for _ in range(2))
        self.head = nn.Linear(8, 16)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return nn.functional.cross_entropy(self.head(x).flatten(0, 1), labels.flatten())


def test_full_recompute_draws_the_same_dropout_masks_as_the_forward() -> None:
    torch.manual_seed(0)
    reference = _DropoutNet()
    model = copy.deepcopy(reference)
    tokens, labels = torch.randint(0, 16, (4, 6)), torch.randint(0, 16, (4, 6))
    torch.manual_seed(1)
    reference(tokens, labels).backward()
    torch.manual_seed(1)
    _, _, calls = _chained_step(model, _section(model, (1,), recompute="full"), tokens, labels)
    assert calls == {"layers.0": 2, "layers.1": 2}
    grads = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[name].grad, msg=name)
