"""autoshard: automatic sharding of PyTorch models over N-D device meshes.

The pipeline (docs/architecture.md): trace -> op rules -> strategy graph -> solve -> plan
-> runtime. This package holds the torch-facing stages; the torch-free layers
below it are ``solver``, ``costmodel`` and ``hw_profiles``.

>>> from autoshard import autoshard, solve, Plan   # doctest: +SKIP
>>> sharded = autoshard(model, mesh, example_inputs)  # under torchrun, every rank  # doctest: +SKIP
>>> plan = solve(model, example_inputs, mesh_shape=(8, 8), dim_names=("dp", "tp"))  # doctest: +SKIP
>>> plan.save("plan.json")   # doctest: +SKIP
"""

from typing import Any

from autoshard.version import __version__

__all__ = ["__version__", "autoshard", "solve", "Plan"]


def __getattr__(name: str) -> Any:
    # Lazy: ``autoshard --help`` and the torch-free layers must not pay for torch.
    if name == "autoshard":
        from autoshard.runtime.api import autoshard

        return autoshard
    if name == "solve":
        from autoshard.search.api import solve

        return solve
    if name == "Plan":
        from autoshard.plan.format import Plan

        return Plan
    raise AttributeError(f"module 'autoshard' has no attribute {name!r}")
