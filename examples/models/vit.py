"""A small Vision Transformer: patch embedding, class token, pre-norm blocks.

Images are cut into ``patch_size`` squares by a strided convolution, a
learned class token and learned positions are added, and the transformer
blocks of :mod:`examples.models.gpt2` run without a causal mask.
``forward(images, labels)`` returns the cross-entropy of the class token's
prediction.

Factories: ``tiny`` (tests), ``vit_base`` (ViT-B/16 shapes).

>>> model, (images, labels) = tiny(device="meta")
>>> model(images, labels).shape
torch.Size([])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from examples.models.factory import Example, build_example, random_floats, random_tokens, split_overrides
from examples.models.gpt2 import TransformerBlock

__all__ = ["ViTConfig", "ViT", "tiny", "vit_base"]


@dataclass(kw_only=True, slots=True)
class ViTConfig:
    """Architecture of :class:`ViT`."""

    image_size: int
    """Height and width of the (square) input images."""

    patch_size: int
    """Side of the square patches; must divide ``image_size``."""

    in_channels: int = 3
    """Channels of the input images."""

    dim: int
    """Width of the residual stream."""

    n_layers: int
    """Number of transformer blocks."""

    n_heads: int
    """Attention heads per block; must divide ``dim``."""

    mlp_ratio: int = 4
    """MLP hidden width as a multiple of ``dim``."""

    num_classes: int
    """Number of labels."""

    norm_eps: float = 1e-6
    """LayerNorm epsilon."""

    def __post_init__(self) -> None:
        for name in ("image_size", "patch_size", "in_channels", "dim", "n_layers", "n_heads", "mlp_ratio", "num_classes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.image_size % self.patch_size:
            raise ValueError(f"patch_size ({self.patch_size}) must divide image_size ({self.image_size})")
        if self.dim % self.n_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must divide dim ({self.dim})")

    @property
    def n_patches(self) -> int:
        """Patches per image."""
        return (self.image_size // self.patch_size) ** 2


class ViT(nn.Module):
    """Patch embedding + class token + positions, blocks, LayerNorm, linear head."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(config.in_channels, config.dim, config.patch_size, stride=config.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.dim))
        self.pos_embed = nn.Parameter(torch.randn(1, config.n_patches + 1, config.dim) * 0.02)
        self.layers = nn.ModuleList(
            TransformerBlock(config.dim, config.n_heads, config.mlp_ratio, config.norm_eps, causal=False)
            for _ in range(config.n_layers)
        )
        self.norm = nn.LayerNorm(config.dim, eps=config.norm_eps)
        self.head = nn.Linear(config.dim, config.num_classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        patches = self.patch_embed(images).flatten(2).transpose(1, 2)  # (batch, patches, dim)
        cls = self.cls_token.expand(patches.shape[0], -1, -1)
        x = torch.cat([cls, patches], dim=1) + self.pos_embed
        for layer in self.layers:
            x = layer(x)
        return F.cross_entropy(self.head(self.norm(x)[:, 0]), labels)


def _make(preset: dict, defaults: dict, overrides: dict) -> Example:
    """Build a :class:`ViT`, images ``(batch, C, H, W)`` and labels ``(batch,)``."""
    config, opts = split_overrides(ViTConfig, preset, defaults, overrides)
    shape = (opts.batch_size, config.in_channels, config.image_size, config.image_size)
    return build_example(
        opts,
        lambda: ViT(config),
        lambda gen: (random_floats(shape, opts.torch_dtype, gen),
                     random_tokens((opts.batch_size,), config.num_classes, gen)),
    )


def tiny(**overrides: object) -> Example:
    """2 layers, dim 32, 4 heads, 3x16x16 images in 4x4 patches, 10 classes, batch 4: for tests.

    >>> model, _ = tiny(device="meta")
    >>> tuple(model.pos_embed.shape)
    (1, 17, 32)
    """
    preset = {"image_size": 16, "patch_size": 4, "dim": 32, "n_layers": 2, "n_heads": 4, "num_classes": 10}
    return _make(preset, {"batch_size": 4}, overrides)


def vit_base(**overrides: object) -> Example:
    """ViT-B/16 shapes (12 layers, dim 768, 12 heads) on 224x224 images, batch 64, on meta.

    >>> model, _ = vit_base()
    >>> sum(p.numel() for p in model.parameters()) // 10**6
    86
    """
    preset = {"image_size": 224, "patch_size": 16, "dim": 768, "n_layers": 12, "n_heads": 12, "num_classes": 1000}
    return _make(preset, {"batch_size": 64, "device": "meta"}, overrides)
