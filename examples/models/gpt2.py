"""A GPT-2-style decoder: learned positions, pre-LayerNorm, GELU MLP, tied embeddings.

``forward(tokens, labels)`` returns the next-token cross-entropy loss. The
attention is causal ``F.scaled_dot_product_attention`` over a fused ``qkv``
projection; the output head reuses the token embedding matrix (tied), so the
embedding receives gradient from two places.

Factories: ``tiny`` (tests), ``gpt2_small`` (124M shapes).

>>> model, (tokens, labels) = tiny(device="meta")
>>> model(tokens, labels).shape
torch.Size([])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from examples.models.factory import Example, build_example, random_tokens, split_overrides

__all__ = ["GPT2Config", "GPT2", "Attention", "TransformerBlock", "tiny", "gpt2_small"]


@dataclass(kw_only=True, slots=True)
class GPT2Config:
    """Architecture of :class:`GPT2`."""

    vocab_size: int
    """Number of token ids."""

    dim: int
    """Width of the residual stream."""

    n_layers: int
    """Number of transformer blocks."""

    n_heads: int
    """Attention heads per block; must divide ``dim``."""

    max_seq_len: int
    """Number of learned position embeddings (longest sequence)."""

    mlp_ratio: int = 4
    """MLP hidden width as a multiple of ``dim``."""

    norm_eps: float = 1e-5
    """LayerNorm epsilon."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "max_seq_len", "mlp_ratio"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.dim % self.n_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must divide dim ({self.dim})")


class Attention(nn.Module):
    """Multi-head self-attention with a fused ``qkv`` projection."""

    def __init__(self, dim: int, n_heads: int, *, causal: bool) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.causal = causal
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(x).split(dim, dim=-1)
        # (batch, seq, dim) -> (batch, heads, seq, head_dim), as SDPA expects
        q, k, v = (t.view(batch, seq, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(out.transpose(1, 2).reshape(batch, seq, dim))


class TransformerBlock(nn.Module):
    """Pre-norm block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, dim: int, n_heads: int, mlp_ratio: int, norm_eps: float, *, causal: bool) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = Attention(dim, n_heads, causal=causal)
        self.ln2 = nn.LayerNorm(dim, eps=norm_eps)
        self.fc = nn.Linear(dim, mlp_ratio * dim)
        self.proj = nn.Linear(mlp_ratio * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    """Token + position embeddings, blocks, final LayerNorm, tied output head."""

    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.pos_embeddings = nn.Embedding(config.max_seq_len, config.dim)
        self.layers = nn.ModuleList(
            TransformerBlock(config.dim, config.n_heads, config.mlp_ratio, config.norm_eps, causal=True)
            for _ in range(config.n_layers)
        )
        self.norm = nn.LayerNorm(config.dim, eps=config.norm_eps)
        # GPT-2's init scale: unit-variance embeddings would make the tied head's logits huge
        nn.init.normal_(self.tok_embeddings.weight, std=0.02)
        nn.init.normal_(self.pos_embeddings.weight, std=0.02)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok_embeddings(tokens) + self.pos_embeddings(positions)
        for layer in self.layers:
            x = layer(x)
        # tied head: logits = x @ E^T with the token embedding matrix E
        logits = F.linear(self.norm(x), self.tok_embeddings.weight)
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def _make(preset: dict, defaults: dict, overrides: dict) -> Example:
    """Build a :class:`GPT2` and ``(tokens, labels)`` of shape ``(batch_size, seq_len)``."""
    config, opts = split_overrides(GPT2Config, preset, defaults, overrides)
    if opts.seq_len is None or opts.seq_len > config.max_seq_len:
        raise ValueError(f"seq_len must be between 1 and max_seq_len={config.max_seq_len}, got {opts.seq_len}")
    shape = (opts.batch_size, opts.seq_len)
    return build_example(
        opts,
        lambda: GPT2(config),
        lambda gen: (random_tokens(shape, config.vocab_size, gen), random_tokens(shape, config.vocab_size, gen)),
    )


def tiny(**overrides: object) -> Example:
    """2 layers, dim 32, 4 heads, vocab 128, batch 2 x 16 tokens: for tests.

    >>> model, (tokens, _) = tiny(device="meta", seq_len=8)
    >>> tuple(tokens.shape)
    (2, 8)
    """
    preset = {"vocab_size": 128, "dim": 32, "n_layers": 2, "n_heads": 4, "max_seq_len": 64}
    return _make(preset, {"batch_size": 2, "seq_len": 16}, overrides)


def gpt2_small(**overrides: object) -> Example:
    """GPT-2 124M shapes (12 layers, dim 768, 12 heads), batch 8 x 1024, on meta.

    >>> model, _ = gpt2_small()
    >>> sum(p.numel() for p in model.parameters()) // 10**6
    124
    """
    preset = {"vocab_size": 50257, "dim": 768, "n_layers": 12, "n_heads": 12, "max_seq_len": 1024}
    return _make(preset, {"batch_size": 8, "seq_len": 1024, "device": "meta"}, overrides)
