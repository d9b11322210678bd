"""A small decoder-only transformer written the way a user writes one, outside ``examples.models``.

The runtime benchmarks' own models were written alongside autoshard; this one
is not shaped after them: fused QKV projection, multi-head attention through
``F.scaled_dot_product_attention`` (causal), pre-LayerNorm blocks with a GELU
MLP (biases on), learned positions, an untied output head and a
cross-entropy loss over ``(batch, seq)``. ``benchmarks/runtime_step.py`` runs
it as the case ``unseen`` (issue 54 item 4).

>>> model, (tokens, labels) = transformer(device="meta")
>>> tuple(tokens.shape), model(tokens, labels).shape
((16, 64), torch.Size([]))
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Block", "TinyGPT", "transformer"]


class Block(nn.Module):
    """Pre-norm block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, dim: int, n_heads: int, mlp_ratio: int = 4) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, mlp_ratio * dim)
        self.out = nn.Linear(mlp_ratio * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # chunk and -1 widths: the same code runs on a column-split qkv (torch-tp's local heads)
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, self.n_heads, -1).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, -1))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    """Token + position embedding, ``n_layers`` :class:`Block`, final LayerNorm, untied head;
    ``forward(tokens, labels)`` returns the mean cross-entropy."""

    def __init__(self, vocab: int, dim: int, n_layers: int, n_heads: int, max_len: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.layers = nn.ModuleList(Block(dim, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok(tokens) + self.pos(positions)
        for layer in self.layers:
            x = layer(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def transformer(*, vocab_size: int = 2048, dim: int = 256, n_layers: int = 2, n_heads: int = 8,
                batch_size: int = 16, seq_len: int = 64, device: str | torch.device | None = None,
                seed: int = 0) -> tuple[TinyGPT, tuple[torch.Tensor, torch.Tensor]]:
    """(model, (tokens, labels)): defaults are issue 54's case (dim 256, 2 layers, vocab 2048,
    batch 16 x 64); the same ``seed`` gives the same weights and batch on every rank.

    >>> model, _ = transformer(device="meta", n_layers=1)
    >>> len(model.layers)
    1
    """
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    with torch.device(device or "cpu"):
        model = TinyGPT(vocab_size, dim, n_layers, n_heads, seq_len)
    tokens = torch.randint(0, vocab_size, (batch_size, seq_len), generator=gen)
    labels = torch.randint(0, vocab_size, (batch_size, seq_len), generator=gen)
    return model, (tokens.to(device or "cpu"), labels.to(device or "cpu"))
