"""``autoshard(model, mesh, example_inputs)``: solve once, run everywhere (docs/api.md).

Called on every rank of an initialized process group (``torchrun``), with the
same model, mesh and example inputs (the whole batch) on every rank:

1. every rank checks that the mesh covers the job (``mesh.size()`` equals the
   world size) and traces the model (fake tensors: no memory, no
   communication) to get the plan fingerprint of *its own* graph;
2. rank 0 gets the plan: ``plan=`` (a :class:`Plan` or a path, read on rank 0
   only), else the plan cached on disk under the key of the fingerprint and
   solve options (``<cache_dir>/<sha256>.json``), else a solve, which it then
   writes to the cache atomically;
3. rank 0 broadcasts the plan as UTF-8 JSON bytes (a ``uint8`` tensor, its
   length first; never pickled) over the default process group;
4. every rank checks the plan's fingerprint against its own trace, and all
   ranks agree (one ``all_reduce``) before anything else is collective: if any
   rank fails (a plan for another model or mesh, a trace error, a solve that
   finds nothing), **every** rank raises, the failing rank its own error and
   the others :class:`RankSetupError` naming that rank and its message;
5. :class:`~autoshard.runtime.module.ShardedModule` shards the parameters
   (``sharded.plan`` holds the plan; ``sharded.plan_source`` says where it
   came from: ``"given"``, ``"cache"`` or ``"solved"``).

Ranks other than 0 wait in the broadcast while rank 0 solves, so the solve
(``time_limit``, 60 s by default) must end within the process group's
timeout (30 min by default).

>>> # torchrun --standalone --nproc-per-node 4 train.py, in train.py:
>>> # dist.init_process_group("gloo")
>>> # mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
>>> # sharded = autoshard(model, mesh, example_inputs, memory_limit=2**20)
>>> # loss = sharded(*batch); loss.backward(); optimizer.step()
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn

from costmodel.mesh import MeshSpec
from hw_profiles import HardwareProfile
from hw_profiles import load as load_profile

from autoshard.plan.fingerprint import make_fingerprint
from autoshard.plan.format import Fingerprint, Plan, PlanError
from autoshard.plan.cache_folder import cache_folder, default_cache_dir
from autoshard.plan.options import SolveOptions, profile_for_device, solve_options
from autoshard.search.solve import prepare, solve_prepared
from autoshard.runtime.devices import mesh_device
from autoshard.runtime.module import ShardedModule
from autoshard.runtime.pipeline_stages import PipelineRun
from autoshard.runtime.rank_agreement import MeshSizeError, RankSetupError, agree, broadcast_plan, comm_device
from autoshard.trace import TracedGraph, trace_joint

__all__ = ["autoshard", "MeshSizeError", "RankSetupError", "default_profile", "default_cache_dir", "cache_key"]

log = logging.getLogger(__name__)

def default_profile(mesh: Any) -> str:
    """The hardware profile priced when none is given: ``cpu-gloo`` on a CPU mesh,
    ``h100-sxm-80gb`` otherwise (:func:`autoshard.plan.options.profile_for_device`).

    >>> class M: device_type = "cpu"
    >>> default_profile(M())
    'cpu-gloo'
    """
    return profile_for_device(getattr(mesh, "device_type", "cpu"))




_NOT_IN_CACHE_KEY = ("profile", "time_limit", "server", "memory_limit", "pins")
"""Options outside the key's extra fields: the profile is in the fingerprint, the time
limit and server do not change what is asked, the memory limit and pins are always in it."""


def cache_key(fingerprint: Fingerprint, options: SolveOptions) -> str:
    """Hex sha256 of what decides the plan: the fingerprint (graph, mesh, profile,
    versions) and the solve options that change the answer (not ``time_limit``).
    Options at their default are left out, so keys of plans cached before an
    option existed stay valid.

    >>> fp = Fingerprint("sha256:ab", (2, 2), ("dp", "tp"), "cpu-gloo@sha256:cd", "2.13.0", "0.1.0")
    >>> cache_key(fp, SolveOptions()) == cache_key(fp, SolveOptions(pins={}))
    True
    >>> cache_key(fp, SolveOptions(memory_limit=1e9)) == cache_key(fp, SolveOptions())
    False
    """
    what: dict[str, Any] = {"fingerprint": fingerprint.to_dict(), "memory_limit": options.memory_limit,
                            "pins": dict(sorted(options.pins.items()))}
    defaults = SolveOptions().fields()
    for name, value in options.fields().items():
        if name not in _NOT_IN_CACHE_KEY and value != defaults[name]:
            what[name] = value
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def _rank0_plan(traced: TracedGraph, mesh_spec: MeshSpec, options: SolveOptions, here: Fingerprint,
                plan: Plan | str | os.PathLike[str] | None, cache: Path | None) -> tuple[str, Plan]:
    """Rank 0's plan and where it came from: given, cached, or solved (then cached) on
    ``traced``, the trace this rank made for its fingerprint (the model is traced once)."""
    if plan is not None:
        return "given", plan if isinstance(plan, Plan) else Plan.load(plan)
    path = None if cache is None else cache / f"{cache_key(here, options)}.json"
    if path is not None and path.exists():
        try:
            cached = Plan.load(path, expect=here)
            log.info("autoshard: plan from cache %s", path)
            return "cache", cached
        except PlanError as exc:  # a damaged or stale file: solve again and overwrite it
            log.warning("autoshard: ignoring cached plan %s (%s)", path, exc)
    t0 = time.perf_counter()
    prep = prepare(None, None, mesh_spec.shape, mesh_spec.dim_names, options, traced=traced)
    solved = solve_prepared(prep, options)
    log.info("autoshard: solved in %.1f s (%s)", time.perf_counter() - t0, solved.solver.status)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)  # the cache folder is ours to make
            solved.save(path)  # atomic: a concurrent reader never sees half a plan
        except OSError as exc:  # a read-only cache must not stop training
            log.warning("autoshard: cannot write plan cache %s (%s)", path, exc)
    return "solved", solved


def autoshard(
    model: nn.Module,
    mesh: Any = None,
    example_inputs: Sequence[torch.Tensor] | Mapping[str, torch.Tensor] | None = None,
    options: SolveOptions | None = None,
    *,
    devices: int | None = None,
    devices_per_node: int | None = None,
    plan: Plan | str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | bool | None = None,
    local_inputs: bool = False,
    trace_collectives: bool | None = None,
    allow_profile_change: bool = False,
    compile: bool = False,
    plain_replicated: bool = True,
    **changes: Any,
) -> ShardedModule | PipelineRun:
    """``model`` sharded on ``mesh`` by a plan solved on rank 0 (module docstring).

    ``example_inputs``: the whole batch (shapes and dtypes of every step).
    ``options``: the :class:`~autoshard.plan.options.SolveOptions` of rank 0's
    solve, or its fields as keywords (``profile``, ``memory_limit`` in bytes
    per device, ``pins``, ``time_limit``, ``recompute``, ...), which change
    ``options`` when both are given. Without ``options`` and ``profile`` (or
    with ``profile=None``), the profile is :func:`default_profile` of the mesh.
    ``plan``: a :class:`Plan` or plan file to use instead of solving
    (its fingerprint is checked on every rank). ``cache_dir``: folder of
    cached plans (default :func:`default_cache_dir`; ``False`` disables the
    cache). ``local_inputs`` and ``trace_collectives``: as
    :class:`ShardedModule` (None: ``AUTOSHARD_TRACE_COLLECTIVES``).
    ``allow_profile_change``: run a ``plan=`` solved for another hardware
    profile (its layout is valid; only its estimate is for other hardware).
    ``mesh=None``: the mesh is chosen for the job's ``devices`` (default: the
    world size) in nodes of ``devices_per_node`` (default: torchrun's
    ``LOCAL_WORLD_SIZE``) by a mesh search on rank 0, then built on every rank
    with the plan's shape and dim names (:mod:`autoshard.runtime.mesh_choice`;
    ``time_limit`` is the whole search's). ``recompute``: the recomputation
    policy (``auto``, ``none``, ``full``, ``selective``, ``every:K``).
    ``compile``: compile the per-rank step with inductor (``ShardedModule``).
    ``plain_replicated``: parameters stay plain tensors when the plan replicates
    every one (data parallel, a mesh of one), as DDP keeps them (``ShardedModule``).

    A mesh with a dim named ``pp`` returns a
    :class:`~autoshard.runtime.pipeline_stages.PipelineRun` instead
    (:mod:`autoshard.runtime.pipeline_api`): ``run.step(**batch)`` returns the
    loss on the last stage's ranks, None elsewhere; the optimizer steps
    ``run.parameters()``.

    Raises :class:`MeshSizeError` when the mesh is not the whole job,
    :class:`~autoshard.plan.format.PlanError` for a plan of another model,
    mesh or profile, :class:`RankSetupError` on the ranks where another rank
    failed.

    >>> # sharded = autoshard(model, init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp")), (x, y))
    >>> # sharded.plan.fingerprint.mesh_shape
    >>> # (2, 2)
    """
    opts, device_default = _call_options(example_inputs, options, changes)
    if mesh is None:  # the plan chooses the mesh
        from autoshard.runtime.mesh_choice import autoshard_on_chosen_mesh

        return autoshard_on_chosen_mesh(
            model, example_inputs, opts, device_default=device_default, devices=devices,
            devices_per_node=devices_per_node, plan=plan, cache_dir=cache_dir, local_inputs=local_inputs,
            trace_collectives=trace_collectives, allow_profile_change=allow_profile_change, compile=compile,
            plain_replicated=plain_replicated)
    if devices is not None or devices_per_node is not None:
        raise TypeError("autoshard: devices / devices_per_node choose a mesh: pass them with mesh=None, not with a mesh")
    mesh_spec, opts = _whole_job_mesh(mesh, opts, device_default)
    if "pp" in mesh_spec.dim_names:  # pipeline stages: a PipelineRun to step (autoshard.runtime.pipeline_api)
        from autoshard.runtime.pipeline_api import autoshard_pipeline

        return autoshard_pipeline(model, mesh, example_inputs, opts, plan=plan)
    cache = cache_folder(cache_dir)
    device = comm_device()
    if plan is None:
        opts = _correct_here(opts)

    # 1. every rank: its own graph and fingerprint (fake tensors, no communication)
    traced, here, error = _trace_here(model, example_inputs, mesh_spec, opts.profile, mesh_device(mesh).type)

    # 2-3. rank 0: the plan, broadcast as JSON (or its error)
    source, payload = broadcast_plan(error, lambda: _rank0_plan(traced, mesh_spec, opts, here, plan, cache), device)

    # 4. every rank: the plan must be for its own graph, mesh and profile; all agree
    received, error = _checked_plan(payload, here, error,
                                    allow_profile_change=allow_profile_change and plan is not None)
    agree(error, device)

    # 5. shard (load-time checks are deterministic: every rank passes or fails alike)
    sharded = ShardedModule(model, mesh, received, example_inputs, local_inputs=local_inputs,
                            trace_collectives=trace_collectives, traced=traced, compile=compile,
                            plain_replicated=plain_replicated)
    sharded.plan_source = source
    return sharded


def _call_options(example_inputs: Any, options: SolveOptions | None, changes: dict[str, Any]
                  ) -> tuple[SolveOptions, bool]:
    """The call's solve options, and whether the profile is the mesh device's default (none asked);
    the errors of a call that cannot run (no process group, no inputs, a reduce dtype)."""
    if not dist.is_initialized():
        raise RuntimeError("autoshard: no process group: call torch.distributed.init_process_group on every rank "
                           "first (or use autoshard.solve offline)")
    if example_inputs is None:
        raise TypeError("autoshard: example_inputs is required (the whole batch of one step)")
    if "profile" in changes and changes["profile"] is None:  # the keyword form's "no profile given"
        del changes["profile"]
    device_default = options is None and "profile" not in changes
    opts = solve_options(options, changes)
    if opts.reduce_dtype is not None:
        raise ValueError(f"reduce_dtype={opts.reduce_dtype!r}: a plan priced as FSDP2 reduces; autoshard's runtime "
                         "reduces gradients in their own dtype (use autoshard.solve to compare)")
    return opts, device_default


def _correct_here(opts: SolveOptions) -> SolveOptions:
    """The profile corrected for this machine, where ``profile_correction`` asks for it (``auto``:
    a CPU profile, since this job runs where it solves): every rank times the reference ops
    together (or reads rank 0's cached correction), so that rank 0's solve finds it cached."""
    from autoshard.calibrate.first_use import corrected_profile, resolve_mode

    mode = resolve_mode(opts.profile_correction, opts.profile, runs_here=True)
    if mode == "off":
        return opts.with_changes(profile_correction="off")
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE") or dist.get_world_size())
    corrected_profile(opts.profile, ranks=ranks, mode=mode, collective=True)
    # rank 0's solve: the cache holds it now (a calibration and its correction, or the correction)
    return opts.with_changes(profile_correction="calibrate" if mode == "calibrate" else "here")


def _whole_job_mesh(mesh: Any, opts: SolveOptions, device_default: bool) -> tuple[MeshSpec, SolveOptions]:
    """The mesh as a :class:`MeshSpec` (it must cover every rank of the job), and the
    options with their profile loaded (the mesh's device's default when none was asked)."""
    world = dist.get_world_size()
    if mesh.size() != world:
        raise MeshSizeError(f"mesh {'x'.join(map(str, mesh.shape))} has {mesh.size()} ranks, the job {world}: "
                            "the mesh must cover every rank")
    mesh_spec = MeshSpec(tuple(int(m) for m in mesh.shape), tuple(mesh.mesh_dim_names or ()))
    profile = default_profile(mesh) if device_default else opts.profile
    prof = profile if isinstance(profile, HardwareProfile) else load_profile(profile)
    return mesh_spec, opts.with_changes(profile=prof)


def _trace_here(model: nn.Module, example_inputs: Any, mesh_spec: MeshSpec, prof: HardwareProfile, device_type: str
                ) -> tuple[TracedGraph | None, Fingerprint | None, BaseException | None]:
    """This rank's traced graph (for the mesh's device type: its kernels are the ones
    this rank runs) and fingerprint, or the error that stopped them (for ``agree``)."""
    try:
        traced = trace_joint(model, example_inputs, target_device=device_type)
        return traced, make_fingerprint(traced, mesh_spec.shape, mesh_spec.dim_names, prof), None
    except Exception as exc:  # noqa: BLE001 - reported to every rank by agree
        return None, None, exc


def _checked_plan(payload: bytes, here: Fingerprint | None, error: BaseException | None, *,
                  allow_profile_change: bool) -> tuple[Plan | None, BaseException | None]:
    """The broadcast plan, checked against this rank's fingerprint, or the error (this rank's
    earlier one, else why the plan does not fit)."""
    if error is not None:
        return None, error
    try:
        received = Plan.from_dict(json.loads(payload.decode("utf-8")))
        received.check(here, allow_profile_change=allow_profile_change)
        return received, None
    except Exception as exc:  # noqa: BLE001 - reported to every rank by agree
        return None, exc
