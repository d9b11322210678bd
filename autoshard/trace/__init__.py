"""Tracing: a model -> one joint forward+backward ATen graph on fake tensors.

The first stage of the pipeline (docs/architecture.md). Its modules:

- :mod:`autoshard.trace.joint`: :func:`trace_joint` and the :class:`TracedGraph` every
  later stage reads (op rules, the strategy graph, the runtime).
- :mod:`autoshard.trace.run`: the joint graph run on real tensors (:func:`run_joint`) and
  its calls' tensor arguments.
- :mod:`autoshard.trace.blocks`: a model's repeated blocks (one rule; all of them, and
  the largest stack of interchangeable ones that stamping copies).
- :mod:`autoshard.trace.compat`: what real model libraries need from a trace (the
  "being traced" signal, module labels on nodes, one-line errors); with ``joint``, the
  only place that calls torch's private tracing APIs for the trace itself.
- :mod:`autoshard.trace.stamp`: a deep stack of identical blocks traced from three of them.
- :mod:`autoshard.trace.canonical`: an op order that does not depend on the hash seed.
- :mod:`autoshard.trace.device`: the graph mapped to the kernels of the plan's device type;
  :mod:`autoshard.trace.causal_masks` recognises a mask that is the causal one by value.
- :mod:`autoshard.trace.stand_ins`, :mod:`autoshard.trace.experts`: custom-op stand-ins
  traced in place of a fused kernel (RMSNorm) or of a mixture's routed experts.
- :mod:`autoshard.trace.model_spec`: ``MODULE:FACTORY`` model specs, looked up and
  loaded with one-line errors (torch-free).

The public names of ``joint`` and ``run``, and ``repeated_blocks``, are exported here and
imported on first use, so ``from autoshard.trace.model_spec import ...`` (every
command's flag checks) does not pay for importing torch.

>>> from autoshard.trace import trace_joint   # doctest: +SKIP
>>> traced = trace_joint(model, example_inputs)   # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "joint": ("TensorMeta", "NodeInfo", "TracedGraph", "TraceError", "DataDependentError", "trace_joint",
              "traced_ops", "DEFAULT_DECOMPOSITIONS"),
    "run": ("JointResult", "run_joint", "placeholder_values", "tensor_arg_nodes", "constant_value"),
    "blocks": ("repeated_blocks",),
}
"""Module of ``autoshard.trace`` -> the public names exported from it here."""

__all__ = [name for names in _HOMES.values() for name in names]


def __getattr__(name: str) -> Any:
    # Lazy: the torch-free model_spec is imported through this package too.
    for module, names in _HOMES.items():
        if name in names:
            return getattr(importlib.import_module(f"autoshard.trace.{module}"), name)
    raise AttributeError(f"module 'autoshard.trace' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
