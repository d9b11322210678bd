"""A small ConvNet classifier: conv-BatchNorm-ReLU stages, pooling, linear head.

``forward(images, labels)`` returns the cross-entropy loss. BatchNorm in
training mode updates its running statistics, so the traced graph also
carries buffer mutations; convolution weights are 4-D, which sharding rules
for linear layers never see.

Factories: ``tiny`` (tests), ``small``.

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

__all__ = ["ConvNetConfig", "ConvNet", "tiny", "small"]


@dataclass(kw_only=True, slots=True)
class ConvNetConfig:
    """Architecture of :class:`ConvNet`."""

    in_channels: int = 3
    """Channels of the input images."""

    image_size: int
    """Height and width of the (square) input images."""

    channels: tuple[int, ...]
    """Output channels of each stage; each stage after the first halves the resolution."""

    num_classes: int
    """Number of labels."""

    def __post_init__(self) -> None:
        self.channels = tuple(self.channels)  # JSON overrides arrive as lists
        if not self.channels or min(self.channels) < 1:
            raise ValueError(f"channels must be a non-empty list of positive ints, got {self.channels}")
        if self.in_channels < 1 or self.num_classes < 1:
            raise ValueError(f"in_channels and num_classes must be >= 1, got {self.in_channels}, {self.num_classes}")
        if self.image_size < 2 ** (len(self.channels) - 1):
            raise ValueError(f"image_size {self.image_size} is too small for {len(self.channels)} stages")


class ConvStage(nn.Module):
    """3x3 convolution (stride 2 to downsample), BatchNorm, ReLU."""

    def __init__(self, in_channels: int, out_channels: int, *, stride: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class ConvNet(nn.Module):
    """Conv stages, global average pooling, linear classifier."""

    def __init__(self, config: ConvNetConfig) -> None:
        super().__init__()
        widths = (config.in_channels, *config.channels)
        self.stages = nn.ModuleList(
            ConvStage(widths[i], widths[i + 1], stride=1 if i == 0 else 2) for i in range(len(config.channels))
        )
        self.head = nn.Linear(config.channels[-1], config.num_classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = images
        for stage in self.stages:
            x = stage(x)
        return F.cross_entropy(self.head(x.mean(dim=(2, 3))), labels)


def _make(preset: dict, defaults: dict, overrides: dict) -> Example:
    """Build a :class:`ConvNet`, images ``(batch, C, H, W)`` and labels ``(batch,)``."""
    config, opts = split_overrides(ConvNetConfig, preset, defaults, overrides)
    shape = (opts.batch_size, config.in_channels, config.image_size, config.image_size)
    return build_example(
        opts,
        lambda: ConvNet(config),
        lambda gen: (random_floats(shape, opts.torch_dtype, gen),
                     random_tokens((opts.batch_size,), config.num_classes, gen)),
    )


def tiny(**overrides: object) -> Example:
    """Stages of 8 and 16 channels on 3x16x16 images, 10 classes, batch 4: for tests.

    >>> model, (images, _) = tiny(device="meta")
    >>> tuple(images.shape)
    (4, 3, 16, 16)
    """
    preset = {"image_size": 16, "channels": (8, 16), "num_classes": 10}
    return _make(preset, {"batch_size": 4}, overrides)


def small(**overrides: object) -> Example:
    """Stages of 64-128-256-512 channels on 3x224x224 images, 1000 classes, batch 64, on meta.

    >>> model, _ = small()
    >>> len(model.stages)
    4
    """
    preset = {"image_size": 224, "channels": (64, 128, 256, 512), "num_classes": 1000}
    return _make(preset, {"batch_size": 64, "device": "meta"}, overrides)
