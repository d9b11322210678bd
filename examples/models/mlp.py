"""A stack of two-layer MLP blocks with a regression loss.

The smallest model with the shape of a transformer's feed-forward block
(``dim -> hidden_dim -> dim``): the textbook case where the expert layout is
column-split then row-split (Megatron), which the solver should rediscover.

Factories: ``tiny`` (tests), ``small``.

>>> model, (x, y) = tiny(device="meta")
>>> model(x, y).shape
torch.Size([])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from examples.models.factory import Example, build_example, random_floats, split_overrides

__all__ = ["MLPConfig", "MLP", "tiny", "small"]


@dataclass(kw_only=True, slots=True)
class MLPConfig:
    """Architecture of :class:`MLP`."""

    dim: int
    """Width of the input, output and residual stream."""

    hidden_dim: int
    """Width of the inner layer of each block."""

    n_layers: int = 2
    """Number of blocks."""

    bias: bool = True
    """Whether the linear layers have a bias."""

    dropout: float = 0.0
    """Dropout probability after each block's activation (training mode only)."""

    def __post_init__(self) -> None:
        if self.dim < 1 or self.hidden_dim < 1:
            raise ValueError(f"dim and hidden_dim must be >= 1, got {self.dim}, {self.hidden_dim}")
        if self.n_layers < 1:
            raise ValueError(f"n_layers must be >= 1, got {self.n_layers}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


class FeedForward(nn.Module):
    """``x + w2(relu(w1(x)))``: one residual MLP block."""

    def __init__(self, config: MLPConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.hidden_dim, bias=config.bias)
        self.w2 = nn.Linear(config.hidden_dim, config.dim, bias=config.bias)
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.w1(x))
        if self.dropout:
            h = F.dropout(h, self.dropout, training=self.training)
        return x + self.w2(h)


class MLP(nn.Module):
    """Residual MLP blocks; ``forward(x, target)`` returns the mean-squared error."""

    def __init__(self, config: MLPConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(FeedForward(config) for _ in range(config.n_layers))

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return F.mse_loss(x, target)


def _make(preset: dict, defaults: dict, overrides: dict) -> Example:
    """Build an :class:`MLP` and an ``(x, target)`` batch of shape ``(batch_size, dim)``."""
    config, opts = split_overrides(MLPConfig, preset, defaults, overrides)
    shape = (opts.batch_size, config.dim)
    return build_example(
        opts,
        lambda: MLP(config),
        lambda gen: (random_floats(shape, opts.torch_dtype, gen), random_floats(shape, opts.torch_dtype, gen)),
    )


def tiny(**overrides: object) -> Example:
    """2 blocks of 16 -> 32 -> 16, batch 8: for tests.

    >>> model, _ = tiny(device="meta", n_layers=3)
    >>> len(model.layers)
    3
    """
    return _make({"dim": 16, "hidden_dim": 32, "n_layers": 2}, {"batch_size": 8}, overrides)


def small(**overrides: object) -> Example:
    """4 blocks of 1024 -> 4096 -> 1024, batch 64 (17M parameters).

    >>> model, (x, _) = small(device="meta")
    >>> tuple(x.shape)
    (64, 1024)
    """
    return _make({"dim": 1024, "hidden_dim": 4096, "n_layers": 4}, {"batch_size": 64}, overrides)
