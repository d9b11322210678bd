"""A LLaMA-3-style decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU.

Follows the shapes of Meta's LLaMA 3 (as in torchtitan's ``llama3`` model):
``n_kv_heads`` key/value heads shared by groups of query heads, a SwiGLU
feed-forward whose width comes from ``ffn_dim_multiplier`` and
``multiple_of``, RoPE with ``rope_theta``, and an output head tied to the
token embedding or not (``tie_embeddings``). ``forward(tokens, labels)``
returns the next-token cross-entropy loss.

RoPE is written with real ``cos``/``sin`` tables (rotate-half form) instead of
complex numbers, so the traced graph has only real-valued ops; the tables are
non-persistent buffers.

Factories: ``tiny`` (tests), ``llama3_1b``, ``llama3_8b``, ``llama3_70b`` (the
last three default to ``device="meta"``: they build in milliseconds and
allocate nothing).

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

__all__ = ["LlamaConfig", "Llama", "tiny", "llama3_1b", "llama3_8b", "llama3_70b", "llama3_405b"]


@dataclass(kw_only=True, slots=True)
class LlamaConfig:
    """Architecture of :class:`Llama`."""

    vocab_size: int
    """Number of token ids."""

    dim: int
    """Width of the residual stream."""

    n_layers: int
    """Number of transformer blocks."""

    n_heads: int
    """Query heads per block; must divide ``dim``."""

    n_kv_heads: int | None = None
    """Key/value heads (grouped-query attention); ``None`` means ``n_heads``."""

    multiple_of: int = 256
    """The SwiGLU hidden width is rounded up to a multiple of this."""

    ffn_dim_multiplier: float | None = None
    """Scales the SwiGLU hidden width (``2/3 * 4 * dim``) before rounding."""

    norm_eps: float = 1e-5
    """RMSNorm epsilon."""

    rope_theta: float = 500000.0
    """RoPE base frequency."""

    max_seq_len: int = 2048
    """Length of the RoPE tables (longest sequence)."""

    tie_embeddings: bool = False
    """Whether the output head reuses the token embedding matrix."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "multiple_of", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.dim % self.n_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must divide dim ({self.dim})")
        if (self.dim // self.n_heads) % 2:
            raise ValueError(f"head dim dim/n_heads ({self.dim // self.n_heads}) must be even for RoPE")
        if self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads})")

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.dim // self.n_heads

    @property
    def ffn_hidden_dim(self) -> int:
        """SwiGLU hidden width: ``2/3 * 4 * dim``, scaled, rounded up to ``multiple_of``."""
        hidden = int(2 * 4 * self.dim / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * -(-hidden // self.multiple_of)


def build_rope_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` of shape ``(max_seq_len, head_dim)`` for rotate-half RoPE.

    >>> cos, sin = build_rope_tables(4, 3, 10000.0)
    >>> tuple(cos.shape), float(cos[0, 0])
    ((3, 4), 1.0)
    """
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` of shape ``(batch, seq, heads, head_dim)`` by position.

    >>> x = torch.ones(1, 2, 1, 4); cos, sin = build_rope_tables(4, 2, 10000.0)
    >>> torch.allclose(apply_rope(x, cos, sin)[0, 0], x[0, 0])  # position 0: identity
    True
    """
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    # broadcast the (seq, head_dim) tables over batch and heads
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return x * cos + rotated * sin


class Attention(nn.Module):
    """Grouped-query attention: ``n_kv_heads`` K/V heads, each shared by a group of Q heads."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, config.head_dim
        self.wq = nn.Linear(config.dim, config.n_heads * config.head_dim, bias=False)
        self.wk = nn.Linear(config.dim, config.n_kv_heads * config.head_dim, bias=False)
        self.wv = nn.Linear(config.dim, config.n_kv_heads * config.head_dim, bias=False)
        self.wo = nn.Linear(config.n_heads * config.head_dim, config.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.wq(x).view(batch, seq, self.n_heads, self.head_dim)
        k = self.wk(x).view(batch, seq, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(batch, seq, self.n_kv_heads, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # repeat each K/V head for its group of query heads (expand is a view)
        groups = self.n_heads // self.n_kv_heads
        k, v = (
            t.unsqueeze(3).expand(batch, seq, self.n_kv_heads, groups, self.head_dim).reshape(batch, seq, self.n_heads, self.head_dim)
            for t in (k, v)
        )
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1(x)) * w3(x))``."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """Pre-norm block: ``x + attention(norm(x))``, then ``x + feed_forward(norm(x))``."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.feed_forward = FeedForward(config.dim, config.ffn_hidden_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """Token embedding, blocks, final RMSNorm, output head; returns the loss."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layers))
        self.norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.output = None if config.tie_embeddings else nn.Linear(config.dim, config.vocab_size, bias=False)
        cos, sin = build_rope_tables(config.head_dim, config.max_seq_len, config.rope_theta)
        # derived from the config, so not saved in checkpoints
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        cos, sin = self.rope_cos[:seq], self.rope_sin[:seq]
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        x = self.norm(x)
        weight = self.tok_embeddings.weight if self.output is None else self.output.weight
        logits = F.linear(x, weight)
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def _make(preset: dict, defaults: dict, overrides: dict) -> Example:
    """Build a :class:`Llama` and ``(tokens, labels)`` of shape ``(batch_size, seq_len)``."""
    config, opts = split_overrides(LlamaConfig, preset, defaults, overrides)
    if opts.seq_len is None or opts.seq_len > config.max_seq_len:
        raise ValueError(f"seq_len must be between 1 and max_seq_len={config.max_seq_len}, got {opts.seq_len}")
    shape = (opts.batch_size, opts.seq_len)
    return build_example(
        opts,
        lambda: Llama(config),
        lambda gen: (random_tokens(shape, config.vocab_size, gen), random_tokens(shape, config.vocab_size, gen)),
    )


def tiny(**overrides: object) -> Example:
    """2 layers, dim 64, 4 query / 2 K/V heads, vocab 256, batch 2 x 16: for tests.

    >>> model, _ = tiny(device="meta", tie_embeddings=True)
    >>> model.output is None
    True
    """
    preset = {"vocab_size": 256, "dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
              "multiple_of": 32, "max_seq_len": 64}
    return _make(preset, {"batch_size": 2, "seq_len": 16}, overrides)


def llama3_1b(**overrides: object) -> Example:
    """LLaMA 3.2 1B shapes (16 layers, dim 2048, 32/8 heads, tied), batch 8 x 2048, on meta.

    >>> model, _ = llama3_1b()
    >>> round(sum(p.numel() for p in model.parameters()) / 1e9, 2)
    1.24
    """
    preset = {"vocab_size": 128256, "dim": 2048, "n_layers": 16, "n_heads": 32, "n_kv_heads": 8,
              "ffn_dim_multiplier": 1.5, "multiple_of": 256, "max_seq_len": 8192, "tie_embeddings": True}
    return _make(preset, {"batch_size": 8, "seq_len": 2048, "device": "meta"}, overrides)


def llama3_8b(**overrides: object) -> Example:
    """LLaMA 3 8B shapes (32 layers, dim 4096, 32/8 heads, FFN 14336), batch 64 x 2048, on meta.

    >>> model, _ = llama3_8b()
    >>> round(sum(p.numel() for p in model.parameters()) / 1e9, 2)
    8.03
    """
    preset = {"vocab_size": 128256, "dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8,
              "ffn_dim_multiplier": 1.3, "multiple_of": 1024, "max_seq_len": 8192}
    return _make(preset, {"batch_size": 64, "seq_len": 2048, "device": "meta"}, overrides)


def llama3_70b(**overrides: object) -> Example:
    """LLaMA 3 70B shapes (80 layers, dim 8192, 64/8 heads, FFN 28672), batch 64 x 2048, on meta.

    >>> model, _ = llama3_70b()
    >>> round(sum(p.numel() for p in model.parameters()) / 1e9, 1)
    70.6
    """
    preset = {"vocab_size": 128256, "dim": 8192, "n_layers": 80, "n_heads": 64, "n_kv_heads": 8,
              "ffn_dim_multiplier": 1.3, "multiple_of": 4096, "max_seq_len": 8192}
    return _make(preset, {"batch_size": 64, "seq_len": 2048, "device": "meta"}, overrides)


def llama3_405b(**overrides: object) -> Example:
    """LLaMA 3.1 405B shapes (126 layers, dim 16384, 128/8 heads, FFN 53248), batch 16 x 8192, on meta.

    >>> model, _ = llama3_405b(n_layers=1)
    >>> model.layers[0].feed_forward.w1.weight.shape
    torch.Size([53248, 16384])
    """
    preset = {"vocab_size": 128256, "dim": 16384, "n_layers": 126, "n_heads": 128, "n_kv_heads": 8,
              "ffn_dim_multiplier": 1.2, "multiple_of": 4096, "max_seq_len": 8192}
    return _make(preset, {"batch_size": 16, "seq_len": 8192, "device": "meta"}, overrides)
