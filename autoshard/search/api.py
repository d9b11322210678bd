"""``autoshard.solve``: the sharding plan of a model, on a given mesh or on the
best mesh layout of a number of devices.

The one-mesh solve is :mod:`autoshard.search.solve` (``prepare`` traces and
builds, ``solve_prepared`` solves); the search over layouts is
:mod:`autoshard.search.mesh_search`, which runs the one-mesh solve per layout.
This module picks between the two, so that neither imports the other's caller.

>>> from examples.models import mlp
>>> plan = solve(*mlp.tiny(), mesh_shape=(2,), dim_names=("dp",), profile="cpu-gloo", time_limit=30)
>>> plan.fingerprint.mesh_shape
(2,)
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

from autoshard.plan.format import Plan
from autoshard.search.mesh_search import search_mesh
from autoshard.plan.options import SolveOptions, solve_options
from autoshard.search.solve import Progress, prepare, solve_prepared

__all__ = ["solve"]


def solve(
    model: Any,
    example_inputs: Sequence[Any] | Mapping[str, Any],
    mesh_shape: Sequence[int] | None = None,
    dim_names: Sequence[str] | None = None,
    options: SolveOptions | None = None,
    *,
    devices: int | None = None,
    devices_per_node: int | None = None,
    jobs: int | None = None,
    cache_dir: Any = None,
    progress: Progress | None = None,
    **changes: Any,
) -> Plan:
    """The sharding plan of one training step of ``model`` on a mesh (docs/api.md).

    ``model(*example_inputs)`` (or ``model(**example_inputs)``) returns the
    loss, or an object/dict with a ``loss``. ``options``: a
    :class:`~autoshard.plan.options.SolveOptions`, or its fields as keywords
    (``profile``, ``memory_limit``, ``pins``, ``time_limit``, ``backend``,
    ``ties``, ``optimizer``, ``mixed_precision``, ``baseline``, ``search``,
    ``server``, ``recompute``, ...; each documented there), which change
    ``options`` when both are given. ``pins`` fix placements by name pattern
    (``{"*.tok_embeddings.weight": "S(0)R"}``); ``server``: the URL of an
    ``autoshard serve`` (``"http://host:8470"``) that solves instead of this
    process; tracing and building stay here, the plan is the same.
    ``recompute``: ``auto`` (the solver decides what the backward recomputes,
    with the placements), ``none``, ``full``, ``selective`` or ``every:K``
    (``autoshard.graph.recompute_policy``); the plan lists what is recomputed
    (``plan.recompute``).

    ``devices`` instead of ``mesh_shape``: search the mesh. Every layout of
    ``devices`` devices in nodes of ``devices_per_node`` is solved with these
    options (``jobs`` worker processes, layouts cached under ``cache_dir``,
    ``time_limit`` for the whole search) and the fastest plan is returned;
    its mesh is in ``plan.fingerprint``, every layout's outcome in
    ``plan.options["mesh_search"]`` (:mod:`autoshard.search.mesh_search`).
    """
    opts = solve_options(options, changes)
    if devices is not None or mesh_shape is None:
        if mesh_shape is not None or dim_names is not None:
            raise ValueError("mesh_shape/dim_names and devices: give one (devices searches the mesh)")
        if devices is None:
            raise TypeError("solve: give mesh_shape (a mesh) or devices (search the mesh)")
        return search_mesh(model, example_inputs, devices, devices_per_node, opts, jobs=jobs, cache_dir=cache_dir,
                           progress=(lambda st: progress(st.phase, st.done, st.total)) if progress else None)
    started = time.perf_counter()  # time_limit bounds the whole call, trace and build included
    prep = prepare(model, example_inputs, mesh_shape, dim_names, opts, progress=progress)
    return solve_prepared(prep, opts, progress=progress, started=started)
