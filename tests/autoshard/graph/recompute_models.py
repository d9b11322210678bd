"""Small models whose recomputation prices are worked out by hand in the tests.

``stack("chain", n)``: n blocks ``x -> W2 tanh(W1 x)``; ``stack("residual", n)``:
n blocks ``x -> x + W2 tanh(W1 x)``; ``stack("scaled", n)``: n blocks
``x -> W2 tanh(W1 (2 x))``, whose input the backward does not read (a
recomputation of the block needs it held); loss ``mean(y * y)``. Inputs are 2-D
(``[batch, dim]``), so every linear layer is one ``t`` and one ``mm``.
"""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int, kind: str) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, dim, bias=False)
        self.w2 = nn.Linear(dim, dim, bias=False)
        self.kind = kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.w2(torch.tanh(self.w1(2 * x if self.kind == "scaled" else x)))
        return x + y if self.kind == "residual" else y


class Stack(nn.Module):
    def __init__(self, kind: str, n_blocks: int, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(dim, kind) for _ in range(n_blocks)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return (x * x).mean()


def stack(kind: str = "chain", n_blocks: int = 2, *, dim: int = 8, batch: int = 4, device: str = "cpu"):
    """(model, (x,)) on ``device``, seeded."""
    torch.manual_seed(0)
    model = Stack(kind, n_blocks, dim).to(device)
    return model, (torch.randn(batch, dim, device=device),)
