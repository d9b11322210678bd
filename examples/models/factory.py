"""What every example-model factory shares: splitting overrides, placing tensors.

A *factory* is a function ``FACTORY(**overrides) -> (model, example_inputs)``:

- ``model`` is an ``nn.Module`` whose ``forward(*example_inputs)`` returns the
  scalar training loss, so that a joint forward+backward trace contains the
  loss and every gradient;
- ``example_inputs`` is a tuple of tensors (inputs and labels) on the same
  device as the model (library models in ``hf.py`` take a dict of keyword
  tensors instead, ``model(**example_inputs).loss``);
- ``overrides`` are keyword arguments: any field of the model's config
  dataclass (``dim=64``, ``n_layers=2``) or one of the build options below
  (``batch_size``, ``seq_len`` where the model takes sequences, ``device``,
  ``dtype``, ``seed``). An unknown name raises ``ValueError`` listing the
  valid ones, so ``autoshard coverage MODULE:FACTORY --kwargs '{...}'`` fails
  with one clear line.

Factories for large shapes (``llama3_8b``, ``llama3_70b``) default to
``device="meta"``: parameters and inputs have shapes and dtypes but no
storage, which is all that tracing needs. Small ones default to ``"cpu"`` with
a fixed seed, so tests and runtime checks get the same numbers every time.

>>> from examples.models import mlp
>>> model, (x, y) = mlp.tiny(device="meta", batch_size=4)
>>> x.shape[0], x.device.type
(4, 'meta')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn

ConfigT = TypeVar("ConfigT")
Example = tuple[nn.Module, tuple[torch.Tensor, ...]]

_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}


@dataclass(kw_only=True, slots=True)
class BuildOptions:
    """How to materialise a model and its example inputs (not the architecture)."""

    batch_size: int = 2
    """Number of samples (sequences or images) in the example batch."""

    seq_len: int | None = None
    """Tokens per sequence for sequence models; ``None`` for image models."""

    device: str = "cpu"
    """Where parameters and inputs live: ``"meta"`` allocates no memory."""

    dtype: str = "float32"
    """Parameter and floating-point input dtype, by name (JSON-friendly)."""

    seed: int = 0
    """RNG seed for weights and inputs on real devices (ignored on meta)."""

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.seq_len is not None and self.seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {self.seq_len}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        try:
            torch.device(self.device)
        except RuntimeError as exc:
            raise ValueError(f"device {self.device!r} is not a torch device: {exc}") from None

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype as a ``torch.dtype``."""
        return _DTYPES[self.dtype]


def split_overrides(
    config_type: type[ConfigT],
    preset: Mapping[str, Any],
    options: Mapping[str, Any],
    overrides: Mapping[str, Any],
) -> tuple[ConfigT, BuildOptions]:
    """Build ``(config, options)`` from a preset and user overrides.

    ``preset`` holds config fields, ``options`` the factory's default build
    options; ``overrides`` may name either kind and wins over both.

    >>> from examples.models.mlp import MLPConfig
    >>> cfg, opt = split_overrides(MLPConfig, {"dim": 8, "hidden_dim": 16}, {"batch_size": 4}, {"n_layers": 3})
    >>> cfg.dim, cfg.n_layers, opt.batch_size
    (8, 3, 4)
    """
    config_names = {f.name for f in dataclasses.fields(config_type)}
    option_names = {f.name for f in dataclasses.fields(BuildOptions)}
    unknown = sorted(set(overrides) - config_names - option_names)
    if unknown:
        valid = ", ".join(sorted(config_names | option_names))
        raise ValueError(f"unknown override(s) {', '.join(unknown)}; valid names: {valid}")
    config_kwargs = {**preset, **{k: v for k, v in overrides.items() if k in config_names}}
    option_kwargs = {**options, **{k: v for k, v in overrides.items() if k in option_names}}
    try:
        return config_type(**config_kwargs), BuildOptions(**option_kwargs)
    except TypeError as exc:  # e.g. a required config field missing from the preset
        raise ValueError(str(exc)) from None


def build_example(
    options: BuildOptions,
    make_model: Callable[[], nn.Module],
    make_inputs: Callable[[torch.Generator | None], tuple[torch.Tensor, ...]],
) -> Example:
    """Run ``make_model`` and ``make_inputs`` on ``options.device`` with a fixed seed.

    The global RNG is forked, so building an example does not change the
    caller's random state.

    >>> ex = build_example(BuildOptions(device="meta"), lambda: nn.Linear(2, 3),
    ...                    lambda gen: (torch.empty(2, 2),))
    >>> ex[0].weight.device.type, ex[1][0].device.type
    ('meta', 'meta')
    """
    device = torch.device(options.device)
    with torch.random.fork_rng(devices=[]), device:
        torch.manual_seed(options.seed)
        # floating tensors only: Module.to(dtype) would also turn complex buffers (torchtitan's
        # rotary table) into real ones, dropping their imaginary part
        dtype = options.torch_dtype
        model = make_model()._apply(lambda t: t.to(dtype) if t.is_floating_point() else t)
        generator = None
        if device.type == "cpu":
            generator = torch.Generator().manual_seed(options.seed + 1)
        inputs = make_inputs(generator)
    return model, inputs


def random_tokens(
    shape: tuple[int, ...], vocab_size: int, generator: torch.Generator | None
) -> torch.Tensor:
    """Token ids in ``[0, vocab_size)`` on the ambient device (seeded on CPU).

    >>> random_tokens((2, 3), 10, torch.Generator().manual_seed(0)).shape
    torch.Size([2, 3])
    """
    return torch.randint(0, vocab_size, shape, generator=generator, dtype=torch.long)


def random_floats(
    shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator | None
) -> torch.Tensor:
    """Standard-normal values on the ambient device (seeded on CPU).

    >>> random_floats((2, 3), torch.float32, None).dtype
    torch.float32
    """
    return torch.randn(shape, generator=generator, dtype=dtype)
