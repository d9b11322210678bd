"""The tutorial's model: a Hugging Face ``LlamaForCausalLM`` from a small config.

Why a file of its own: ``autoshard solve MODULE:FACTORY`` and the training
script must build the very same model and batch (the plan's fingerprint
hashes the traced graph, input shapes included), so both import this one
factory. Replace the config with your own model; keep the contract:
``build(**overrides) -> (model, example_inputs)``, where
``model(**example_inputs)`` returns the loss or an output with ``.loss``.

Needs ``transformers`` (``pip install -e '.[dev]'`` in a checkout).

>>> model, batch = build(batch_size=2, seq_len=8)   # doctest: +SKIP
>>> sorted(batch), model(**batch).loss.shape        # doctest: +SKIP
(['input_ids', 'labels'], torch.Size([]))
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 256


def build(batch_size: int = 8, seq_len: int = 32, seed: int = 0, **config: object) -> tuple[LlamaForCausalLM, dict]:
    """A 2-layer LLaMA (hidden 64, 4 heads, vocab 256) and one batch of
    ``batch_size`` sequences of ``seq_len`` tokens; ``config`` overrides any
    ``LlamaConfig`` field (``num_hidden_layers=4``)."""
    settings = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 128,
                "use_cache": False, **config}
    torch.manual_seed(seed)  # the same weights on every rank
    model = LlamaForCausalLM(LlamaConfig(**settings))
    return model, batch(0, batch_size, seq_len)


def batch(step: int, batch_size: int = 8, seq_len: int = 32) -> dict[str, torch.Tensor]:
    """The global batch of one step, the same on every rank: learn ``next token = token + 1``."""
    gen = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, VOCAB, (batch_size, seq_len), generator=gen)
    # Hugging Face shifts the labels inside the model: labels[t] is the target
    # after reading tokens[:t]; -100 (the first position) is ignored
    labels = torch.full_like(tokens, -100)
    labels[:, 1:] = (tokens[:, :-1] + 1) % VOCAB
    return {"input_ids": tokens, "labels": labels}
