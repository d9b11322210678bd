"""Models for the benchmarks: every ``MODULE:FACTORY`` goes through
:func:`autoshard.trace.model_spec.load_model`, as the ``autoshard`` commands load them.

So a benchmark's model fails as a command's does (one ``ValueError`` line
naming the spec), and ``examples.models.*`` resolve from the repository root,
where the benchmarks run (``benchmarks/__init__.py``). The repository's own
models are named short in the tables (``llama3.tiny`` for
``examples.models.llama3:tiny``): :func:`example_spec` spells them out.

>>> example_spec("llama3.tiny")
'examples.models.llama3:tiny'
>>> example_spec("examples.models.hf:hf_gpt2")
'examples.models.hf:hf_gpt2'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autoshard.trace.model_spec import load_model

__all__ = ["example_spec", "load", "loss_of"]


def example_spec(name: str) -> str:
    """``module.factory`` of ``examples.models`` -> ``examples.models.module:factory``; a full
    ``MODULE:FACTORY`` spec is returned as it is.

    >>> example_spec("mlp.small")
    'examples.models.mlp:small'
    """
    if ":" in name:
        return name
    module, dot, factory = name.rpartition(".")
    if not dot or not module or not factory:
        raise ValueError(f"model {name!r}: expected MODULE:FACTORY or module.factory of examples.models "
                         "(e.g. llama3.tiny)")
    return f"examples.models.{module}:{factory}"


def load(spec: str, overrides: Mapping[str, Any] | None = None, **more: Any) -> tuple[Any, tuple | dict]:
    """(model, example inputs) of ``spec`` (``MODULE:FACTORY`` or ``module.factory`` of
    ``examples.models``) called with ``overrides``, then ``more`` (a device, a dtype) over them.

    >>> # model, inputs = load("mlp.small", {"n_layers": 2}, device="meta")
    """
    return load_model(example_spec(spec), {**(overrides or {}), **more})


def loss_of(module: Any, inputs: tuple | dict) -> Any:
    """The loss of ``module`` on its example inputs: positional tensors, or keywords (a Hugging Face
    model returns an output whose ``loss`` it is; a sharded module returns the loss itself).

    >>> # loss_of(model, inputs).backward()
    """
    if not isinstance(inputs, dict):
        return module(*inputs)
    import torch  # here: loading a spec does not need torch, the model's module imports it

    out = module(**inputs)
    return out if isinstance(out, torch.Tensor) else out.loss
