"""``autoshard.solve``: the sharding plan of a model, on a given mesh or on the
best mesh layout of a number of devices.

The one-mesh solve is :mod:`autoshard.plan.solve` (``prepare`` traces and
builds, ``solve_prepared`` solves); the search over layouts is
:mod:`autoshard.plan.mesh_search`, which runs the one-mesh solve per layout.
This module picks between the two, so that neither imports the other's caller.

>>> from examples.models import mlp
>>> plan = solve(*mlp.tiny(), mesh_shape=(2,), dim_names=("dp",), profile="cpu-gloo", time_limit=30)
>>> plan.fingerprint.mesh_shape
(2,)
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from hw_profiles import HardwareProfile

from autoshard.plan.format import Plan
from autoshard.plan.mesh_search import search_mesh
from autoshard.plan.solve import Progress, prepare, solve_prepared

__all__ = ["solve"]


def solve(
    model: Any,
    example_inputs: Sequence[Any] | Mapping[str, Any],
    mesh_shape: Sequence[int] | None = None,
    dim_names: Sequence[str] | None = None,
    *,
    devices: int | None = None,
    devices_per_node: int | None = None,
    jobs: int | None = None,
    cache_dir: Any = None,
    profile: str | HardwareProfile = "h100-sxm-80gb",
    memory_limit: float | None = None,
    pins: Mapping[str, str] | None = None,
    time_limit: float = 60.0,
    backend: str = "cbc",
    ties: bool = True,
    optimizer: str = "adamw",
    mixed_precision: bool = False,
    baseline: str | None = None,
    search: str = "auto",
    progress: Progress | None = None,
    server: str | None = None,
    recompute: str = "auto",
) -> Plan:
    """The sharding plan of one training step of ``model`` on a mesh (DESIGN.md, Python API).

    ``model(*example_inputs)`` (or ``model(**example_inputs)``) returns the
    loss, or an object/dict with a ``loss``. ``pins`` fix placements by name
    pattern (``{"*.tok_embeddings.weight": "S(0)R"}``); ``ties=False`` lets
    every repeated layer choose its own strategies; ``optimizer`` is
    ``adamw`` (default), ``sgd``, ``sgd-momentum`` or ``none``; ``search``
    as in :func:`prepare`. ``server``: the URL of an ``autoshard serve``
    (``"http://host:8470"``) that solves instead of this process; tracing and
    building stay here, the plan is the same. ``recompute``: ``auto`` (the
    solver decides what the backward recomputes, with the placements),
    ``none``, ``full``, ``selective`` or ``every:K``
    (``autoshard.graph.recompute_policy``); the plan lists what is recomputed
    (``plan.recompute``).

    ``devices`` instead of ``mesh_shape``: search the mesh. Every layout of
    ``devices`` devices in nodes of ``devices_per_node`` is solved with these
    options (``jobs`` worker processes, layouts cached under ``cache_dir``,
    ``time_limit`` for the whole search) and the fastest plan is returned;
    its mesh is in ``plan.fingerprint``, every layout's outcome in
    ``plan.options["mesh_search"]`` (:mod:`autoshard.plan.mesh_search`).
    """
    if devices is not None or mesh_shape is None:
        if mesh_shape is not None or dim_names is not None:
            raise ValueError("mesh_shape/dim_names and devices: give one (devices searches the mesh)")
        if devices is None:
            raise TypeError("solve: give mesh_shape (a mesh) or devices (search the mesh)")
        return search_mesh(model, example_inputs, devices, devices_per_node, profile=profile, time_limit=time_limit,
                           jobs=jobs, cache_dir=cache_dir,
                           progress=(lambda st: progress(st.phase, st.done, st.total)) if progress else None,
                           memory_limit=memory_limit, pins=pins, backend=backend, ties=ties, optimizer=optimizer,
                           mixed_precision=mixed_precision, baseline=baseline, search=search, server=server,
                           recompute=recompute)
    prep = prepare(model, example_inputs, mesh_shape, dim_names, profile=profile, optimizer=optimizer,
                   mixed_precision=mixed_precision, progress=progress, search=search, recompute=recompute)
    return solve_prepared(prep, memory_limit=memory_limit, pins=pins, time_limit=time_limit, backend=backend,
                          ties=ties, baseline=baseline, progress=progress, server=server, recompute=recompute)
