"""torchtitan's LLaMA-3 as torchtitan trains it: its ``Transformer`` and its loss.

``titan_llama3`` builds ``torchtitan.models.llama3.Transformer`` from a
``TransformerModelArgs`` (random weights through the model's own
``init_weights``; nothing is downloaded) and wraps it with torchtitan's own
training loss, ``torchtitan.components.loss.cross_entropy_loss`` (sum over
tokens), so that ``model(tokens, labels)`` is the scalar loss. Inputs are
``(tokens, labels)`` of shape ``(batch_size, seq_len)``.

Overrides are any field of ``TransformerModelArgs`` (``dim``, ``n_layers``,
``n_heads``, ``n_kv_heads``, ``vocab_size``, ``multiple_of``,
``ffn_dim_multiplier``, ...) or a build option of
:class:`examples.models.factory.BuildOptions`.

torchtitan is an optional dependency, the ``zoo`` extra (``pip install
'.[zoo]'``): torchtitan 0.2.2, whose LLaMA-3 has SDPA attention (0.3.0 keeps
only flex and varlen attention, and FlexAttention has no backward on CPU),
and triton, which torchtitan imports unconditionally. Neither replaces the
installed torch. Importing this module does not need them; calling the
factory does.

>>> # model, (tokens, labels) = titan_llama3(device="meta")
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import torch
from torch import nn

from examples.models.factory import BuildOptions, Example, build_example, random_tokens

__all__ = ["titan_llama3", "titan_llama3_8b", "TitanWithLoss"]

_OPTIONS = tuple(f.name for f in dataclasses.fields(BuildOptions))
_TINY = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 256, "multiple_of": 32,
         "max_seq_len": 64, "rope_theta": 500000.0}
_LLAMA3_8B = {"dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8, "vocab_size": 128256,
              "ffn_dim_multiplier": 1.3, "multiple_of": 1024, "rope_theta": 500000.0, "max_seq_len": 8192}
"""torchtitan's own ``llama3_args["8B"]`` (SDPA), with ``max_seq_len`` as its trainer sets it for 8K sequences."""


class TitanWithLoss(nn.Module):
    """A torchtitan model and torchtitan's training loss: ``forward(tokens, labels)`` is the loss."""

    def __init__(self, model: nn.Module, loss_fn: Any) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(self.model(tokens), labels)


def titan_llama3(**overrides: Any) -> Example:
    """torchtitan LLaMA-3: 2 layers, dim 64, 4 query / 2 K/V heads, vocab 256, batch 2 x 16, SDPA."""
    return _make(_TINY, {"seq_len": 16}, overrides)


def titan_llama3_8b(**overrides: Any) -> Example:
    """torchtitan LLaMA-3-8B (its ``llama3_args["8B"]``), batch 8 x 1024 on meta (``n_layers=2`` for the zoo)."""
    return _make(_LLAMA3_8B, {"batch_size": 8, "seq_len": 1024, "device": "meta"}, overrides)


def _make(preset: dict[str, Any], defaults: dict[str, Any], overrides: dict[str, Any]) -> Example:
    try:
        args_module = importlib.import_module("torchtitan.models.llama3.model.args")
        model_module = importlib.import_module("torchtitan.models.llama3.model.model")
        loss_module = importlib.import_module("torchtitan.components.loss")
    except ImportError as exc:
        raise ValueError(f"the torchtitan examples need torchtitan 0.2.2 and triton (pip install '.[zoo]'): {exc}") from None
    args_type = args_module.TransformerModelArgs
    fields = {f.name for f in dataclasses.fields(args_type)}
    unknown = sorted(set(overrides) - fields - set(_OPTIONS))
    if unknown:
        raise ValueError(f"unknown override(s) {', '.join(unknown)}; valid names: {', '.join(sorted(fields | set(_OPTIONS)))}")
    options = BuildOptions(**{**defaults, **{k: v for k, v in overrides.items() if k in _OPTIONS}})
    args = args_type(**{**preset, **{k: v for k, v in overrides.items() if k in fields}})

    def make_model() -> nn.Module:
        model = model_module.Transformer(args)
        if options.device != "meta":
            with torch.no_grad():  # torchtitan initialises in place, as its trainer does after materializing
                model.init_weights()
        return TitanWithLoss(model, loss_module.cross_entropy_loss)

    def make_inputs(generator: torch.Generator | None) -> tuple[torch.Tensor, ...]:
        shape = (options.batch_size, options.seq_len or 16)
        return random_tokens(shape, args.vocab_size, generator), random_tokens(shape, args.vocab_size, generator)

    return build_example(options, make_model, make_inputs)
