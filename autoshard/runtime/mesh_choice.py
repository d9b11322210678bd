"""``autoshard(model, example_inputs=..., devices=N)``: no mesh given, the plan chooses it.

Under ``torchrun`` without a mesh, every rank traces the model; rank 0 runs
the mesh search (:func:`autoshard.search.mesh_search.search_mesh`, in its own
process, one layout after another: the job's other ranks wait in the plan
broadcast, and nothing forks inside a process group) or takes ``plan=``;
every rank receives the plan, checks its fingerprint against its own trace
on the plan's mesh, and builds that mesh with ``init_device_mesh`` (the
plan's shape and dim names) before sharding. Node size: ``devices_per_node``,
else torchrun's ``LOCAL_WORLD_SIZE`` on profiles with nodes (two or more
interconnect tiers). Errors reach every rank as in
:func:`autoshard.runtime.api.autoshard` (one ``all_reduce`` to agree first).

Layouts are cached as in the offline search (``cache_dir``), so a second
start of the same job does not search again.

>>> # torchrun --standalone --nproc-per-node 4 train.py, in train.py:
>>> # dist.init_process_group("gloo")
>>> # sharded = autoshard(model, example_inputs=batch, devices=4)
>>> # sharded.plan.fingerprint.mesh_shape        # the layout the search chose
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Mapping, Sequence

import torch.distributed as dist
from torch import nn

from hw_profiles import HardwareProfile
from hw_profiles import load as load_profile

from autoshard.plan.fingerprint import make_fingerprint
from autoshard.plan.format import Plan
from autoshard.plan.options import SolveOptions, profile_for_device
from autoshard.runtime.module import ShardedModule
from autoshard.runtime.rank_agreement import MeshSizeError, agree, broadcast_plan, comm_device

__all__ = ["autoshard_on_chosen_mesh", "node_size_from_env"]


def node_size_from_env(profile: HardwareProfile, devices: int) -> int | None:
    """torchrun's ranks per node (``LOCAL_WORLD_SIZE``) when the profile has
    nodes to size and it divides the device count; else None (the profile's own)."""
    text = os.environ.get("LOCAL_WORLD_SIZE")
    if len(profile.interconnect) < 2 or not text or not text.isdigit():
        return None
    k = int(text)
    return k if k >= 1 and devices % k == 0 else None


def autoshard_on_chosen_mesh(
    model: nn.Module,
    example_inputs: Sequence[Any] | Mapping[str, Any],
    options: SolveOptions,
    *,
    device_default: bool,
    devices: int | None,
    devices_per_node: int | None,
    plan: Plan | str | os.PathLike[str] | None,
    cache_dir: str | os.PathLike[str] | bool | None,
    local_inputs: bool,
    trace_collectives: bool | None,
    allow_profile_change: bool,
    compile: bool = False,
    plain_replicated: bool = True,
) -> ShardedModule:
    """:func:`autoshard.runtime.api.autoshard` with ``mesh=None`` (module docstring);
    ``device_default``: price the default profile of the job's device type instead of
    ``options.profile`` (none was given)."""
    from torch.distributed.device_mesh import init_device_mesh

    from autoshard.search.mesh_layouts import profile_for_nodes
    from autoshard.trace import trace_joint

    world = dist.get_world_size()
    devices = world if devices is None else devices
    if devices != world:
        raise MeshSizeError(f"devices={devices}, the job has {world} ranks: the mesh must cover every rank")
    device = comm_device()
    profile = profile_for_device(device.type) if device_default else options.profile
    prof = profile if isinstance(profile, HardwareProfile) else load_profile(profile)
    node = devices_per_node if devices_per_node is not None else node_size_from_env(prof, devices)

    error: BaseException | None = None
    traced = None
    try:
        prof = profile_for_nodes(prof, node)
        traced = trace_joint(model, example_inputs, target_device=device.type)  # the mesh is built on device.type
    except Exception as exc:  # noqa: BLE001 - reported to every rank by agree
        error = exc

    source, payload = broadcast_plan(
        error, lambda: _rank0_plan(traced, devices, node, options.with_changes(profile=prof), plan, cache_dir), device)

    received: Plan | None = None
    if error is None:
        try:
            received = Plan.from_dict(json.loads(payload.decode("utf-8")))
            fp = received.fingerprint
            if math.prod(fp.mesh_shape) != world:
                raise MeshSizeError(f"plan mesh {'x'.join(map(str, fp.mesh_shape))} does not cover the job's "
                                    f"{world} ranks")
            here = make_fingerprint(traced, fp.mesh_shape, fp.dim_names, prof)
            received.check(here, allow_profile_change=allow_profile_change and plan is not None)
        except Exception as exc:  # noqa: BLE001 - reported to every rank by agree
            error = exc
    agree(error, device)

    fp = received.fingerprint
    mesh = init_device_mesh(device.type, fp.mesh_shape, mesh_dim_names=fp.dim_names)
    sharded = ShardedModule(model, mesh, received, example_inputs, local_inputs=local_inputs,
                            trace_collectives=trace_collectives, traced=traced, compile=compile,
                            plain_replicated=plain_replicated)
    sharded.plan_source = source
    return sharded


def _rank0_plan(traced: Any, devices: int, node: int | None, options: SolveOptions,
                plan: Plan | str | os.PathLike[str] | None,
                cache_dir: str | os.PathLike[str] | bool | None) -> tuple[str, Plan]:
    """Rank 0's plan and where it came from: given, or searched on ``traced``, this
    rank's own trace (``cache`` when the chosen layout came from the layout cache)."""
    import logging

    from autoshard.search.mesh_search import search_mesh

    if plan is not None:
        return "given", plan if isinstance(plan, Plan) else Plan.load(plan)
    t0 = time.perf_counter()
    found = search_mesh(None, None, devices, node, options, jobs=1, cache_dir=cache_dir, traced=traced)
    rows = found.options["mesh_search"]["layouts"]
    chosen = next(r for r in rows if r["chosen"])
    logging.getLogger(__name__).info("autoshard: mesh %s chosen of %d layouts in %.1f s",
                                     "x".join(map(str, chosen["shape"])), len(rows), time.perf_counter() - t0)
    return ("cache" if chosen["cached"] else "solved"), found
