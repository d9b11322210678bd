"""Helpers of the runtime's multi-process tests that only the tests use.

Starting gloo ranks (:func:`spawn`) and the one-device equivalence check
(:func:`equivalence`, :func:`assert_matches_one_device`,
:func:`planned_collectives_issued`) live in the benchmarks' library
(``benchmarks/common/gloo.py``, ``benchmarks/common/equivalence.py``), which
``benchmarks/gpu_check.py`` runs on a GPU machine too; they are imported here
so that the tests keep importing them from one place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from unittest import mock

import torch

from autoshard.runtime.process_group import destroy_process_groups
from benchmarks.common.equivalence import (  # the tests import them from here
    assert_matches_one_device, equivalence, local_of, placement_names, planned_collectives_issued,
    recompute_positions)
from benchmarks.common.gloo import spawn

__all__ = ["spawn", "restricted_plan", "equivalence", "assert_matches_one_device", "planned_collectives_issued",
           "recompute_positions", "local_of", "placement_names", "whole", "teardown", "scheduled_trace",
           "assert_trace_follows_schedule", "short_profile_correction"]


Restrict = Callable[[Any, list], list]
"""``restrict(node, strategies)`` -> the strategies ``node`` keeps (``build_graph(restrict=...)``)."""


def restricted_plan(model: Any, inputs: Any, mesh_shape: tuple[int, ...], names: tuple[str, ...],
                    restrict_of: Callable[[Restrict | None], Restrict], *, profile: str, search: str = "auto",
                    time_limit: float = 10, traced: Any = None, traces: dict[str, Any] | None = None,
                    trace_key: str | None = None) -> Any:
    """The solver's plan for ``model`` on a graph whose nodes keep what ``restrict_of(seeded)``
    allows, ``seeded`` the seeded search's restriction (None where ``search`` enumerates all).

    The graph is built once: ``prepare`` traces, seeds and builds as always, but its one build is
    the restricted one (no ties, no recomputation states: the graph these tests always solved).
    They used to call ``prepare`` and build the restricted graph after it, so every forced plan
    built its graph twice (the einsum MoE on 2x2x2 in a fresh process: 36.6 s, now 28.4 s;
    2026-12-06, load 3). ``time_limit``: 10 s, as before. The solve's share is the limit less the
    seed's solve and an assembly reserve of 0.3 s per second of build (``search/solve.py``): on a
    loaded machine a 3-D plan's solve then ends ``feasible`` (gap 0.33 seen) rather than proven.
    The tests check that whatever plan is solved runs as one device and issues its collectives,
    so an unproven plan checks the same; 30 s proves them but spends the build's saving.
    ``traced``: the model already traced, as ``prepare`` takes it. ``traces``: the traces of a
    test's plans by ``trace_key`` (the model's factory and overrides): the first plan of a model
    keeps ``prepare``'s trace there and the later ones start from it (the trace does not depend
    on the mesh or the restriction; the 4-rank context-parallel test traced its tiny LLaMA for
    each of its five plans, about 1 s each).

    >>> # restricted_plan(model, inputs, (2, 2), ("cp", "tp"), lambda seeded: only_cp, profile="a100-sxm-80gb")
    """
    from autoshard.search import solve

    if traced is None and traces is not None:
        traced = traces.get(trace_key)
    build = solve.build_graph

    def build_restricted(traced: Any, mesh: Any, prof: Any, *, optimizer: Any, restrict: Restrict | None = None,
                         **_: Any) -> Any:
        return build(traced, mesh, prof, optimizer=optimizer, recompute=False, restrict=restrict_of(restrict))

    # prepare's build is a module global of autoshard.search.solve, replaced for this one call
    with mock.patch.object(solve, "build_graph", build_restricted):
        # the seed's coarse solves get their share of this limit, not of the default's 60 s: a seed
        # not proven in time is still a seed, and the plan is checked as solved whatever it keeps
        prep = solve.prepare(model, inputs, mesh_shape, names, profile=profile, device_type="cpu",
                             recompute="none", search=search, traced=traced, time_limit=time_limit)
    if traces is not None:
        traces.setdefault(trace_key, prep.traced)
    return solve.solve_prepared(prep, time_limit=time_limit)


def short_profile_correction() -> None:
    """In a rank of a test that calls ``autoshard()`` (whose ``profile_correction="auto"`` times the
    reference ops on every rank): time them in 2 rounds, not 5, and take the foreign-load vote
    (``first_use.LOADED_ROUNDS``) after the first. These tests check the correction's plumbing on a
    real job (measured together, rank 0's decision, cached, applied, recorded), not its accuracy:
    5 rounds on 4 ranks sharing 2 cores were 30 s of ``test_api``'s 58 s (2026-12-06). Every
    rank must call this before its first ``autoshard()``: all of them time the same rounds."""
    from autoshard.calibrate import first_use

    first_use.ROUNDS, first_use.LOADED_ROUNDS = 2, 1


def whole(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value; a plain tensor (a replicated parameter or gradient) itself."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def teardown(rank: int, world: int) -> dict[str, Any]:
    """What is left of the job's process groups: gloo worker threads after
    ``dist.destroy_process_group`` alone (a flattened mesh and its comm, out of
    reach but in a reference cycle, used for one all-reduce on each group),
    then after :func:`destroy_process_groups`; and the process groups
    ``torch.distributed.nn.functional`` holds as default arguments (it is
    imported here after the group exists, as autoshard's runtime does)."""
    import torch.distributed as dist
    import torch.distributed.nn.functional as dist_nn
    from torch.distributed.device_mesh import init_device_mesh

    from autoshard.runtime.collectives import MeshComm
    from autoshard.runtime.process_group import gloo_worker_threads

    def use_groups() -> None:
        comm = MeshComm(init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("a", "b")))
        for dims in ((0,), (1,), (0, 1)):
            comm.all_reduce(torch.ones(4), "sum", dims, 16)

    use_groups()
    held = [name for name, fn in vars(dist_nn).items() if callable(fn)
            for value in (getattr(fn, "__defaults__", None) or ()) if isinstance(value, dist.ProcessGroup)]
    dist.destroy_process_group()
    after_destroy = len(gloo_worker_threads())
    destroy_process_groups()
    return {"after_destroy": after_destroy, "after_destroy_process_groups": len(gloo_worker_threads()),
            "nn_defaults_holding_a_group": held}


def scheduled_trace(plan: Any, recompute_at: list[tuple[int, list[str]]] = ()) -> list[tuple]:
    """What the collective trace of one step must be, in order, by the plan's
    schedule: per item, its collectives as (edge, kind, mesh dims, bytes, issue,
    wait); all but a redistribution's last collective are waited where issued.
    With recomputation (``recompute_at``: :func:`recompute_positions`), each
    phase's collectives come at its position before that position's items: per
    recomputed op in order, its input redistributions' collectives in input
    order, each issued and waited there."""
    from costmodel.redistribute_steps import COLLECTIVE_STEPS

    from autoshard.program.schedule import build_schedule

    schedule = plan.schedule or build_schedule([n.name for n in plan.nodes], plan.redistributions, plan.buckets,
                                               gathers=plan.gather_buckets)
    by_edge = {(r.tensor, r.to, r.input_index): r for r in plan.redistributions}
    into: dict[str, list[Any]] = {}
    for r in sorted(plan.redistributions, key=lambda r: r.input_index):
        into.setdefault(r.to, []).append(r)
    phases = []
    for at, names in recompute_at:
        phases.append((at, [((r.tensor, r.to, r.input_index), s.collective, tuple(s.mesh_dims), s.bytes, at, at)
                            for name in names for r in into.get(name, ()) for s in r.steps
                            if s.collective in COLLECTIVE_STEPS]))
    out = []
    for item in schedule.items:
        while phases and phases[0][0] <= item.issue:
            out += phases.pop(0)[1]
        if item.gather is not None:
            g = plan.gather_buckets[item.gather]
            out.append((("gather", ",".join(f"{m[0]}>{m[1]}>{m[2]}" for m in g.members), 0), "all_gather",
                        tuple(g.mesh_dims), g.bytes, item.issue, item.wait))
            continue
        if item.bucket is not None:
            b = plan.buckets[item.bucket]
            out.append((("bucket", ",".join(b.members), 0), b.collective, tuple(b.mesh_dims), b.bytes, item.issue,
                        item.wait))
            continue
        steps = [s for s in by_edge[item.edge].steps if s.collective in COLLECTIVE_STEPS]
        for k, s in enumerate(steps):
            out.append((item.edge, s.collective, tuple(s.mesh_dims), s.bytes, item.issue,
                        item.wait if k == len(steps) - 1 else item.issue))
    for _, entries in phases:
        out += entries
    return out


def assert_trace_follows_schedule(plan: Any, results: list[dict[str, Any]], label: str) -> None:
    """Every rank issued its collectives in the schedule's order, each issued and
    waited at the schedule's positions, on the first step and on the last one."""
    for rank, res in enumerate(results):
        want = scheduled_trace(plan, res[label].get("recompute_at", ()))
        for key in ("trace", "trace_last"):
            got = [(tuple(e), kind, tuple(dims), nbytes, issue, wait)
                   for kind, dims, nbytes, _, e, issue, wait in res[label][key]]
            assert got == want, f"{label} rank {rank} ({key}): the trace is not the schedule"
