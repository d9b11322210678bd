r"""Mesh search: solve a model on every mesh layout of ``N`` devices and keep the fastest plan.

``search_mesh(model, inputs, devices=64, devices_per_node=8)`` traces the
model once (the trace does not depend on the mesh), then for every layout of
:mod:`autoshard.search.mesh_layouts` builds the strategy graph on that mesh, bounds
it, and solves it with the same options as ``autoshard solve --mesh`` would
(memory limit, pins, the expert-layout portfolio, and every other field of
the one :class:`~autoshard.plan.options.SolveOptions`). The
plan with the smallest estimated step wins (ties: the first layout in
enumeration order); every layout's outcome is in
``plan.options["mesh_search"]["layouts"]`` (:mod:`autoshard.plan.layout_report`).

Cutting layouts that cannot win. Let ``c_v(k)`` be the cost of strategy ``k``
of node ``v`` (the busiest rank's compute time of an op, a parameter's
optimizer update) and ``A_v`` the strategies a pin leaves it (all if
unpinned). Any plan on the layout picks ``k_v in A_v`` for every node, and its
estimate is

    step = sum_v c_v(k_v) + comm + relayout,   comm >= 0, relayout >= 0

(:mod:`autoshard.assembly.assemble`: compute is the node costs at the choice,
collectives and local re-layouts are times, never negative; gradient buckets
change only ``comm``). Dropping the edges, the memory limit and the ties
relaxes the problem, so

    bound = sum_v min_{k in A_v} c_v(k)  <=  step   of every plan on the layout,

the expert layouts of the portfolio included (they only add pins). Once a
plan with step ``s*`` is known, a layout whose ``bound >= s* (1 + 1e-9)`` cannot
beat it and is not solved (outcome ``cut``; the margin keeps a layout that can
at best tie from being cut on a rounding). The bound is taken on the graph
that ``prepare`` builds for the layout, which is the graph its own solve
uses (on 3-D meshes, after the seeded restriction: a restriction only
removes strategies, so it bounds what ``autoshard solve --mesh`` returns for
that layout, which is what the search compares). It bounds compute only:
the communication a layout forces depends on the strategies, and no
strategy-free bound on it is valid (all-replicate communicates nothing).
So it cuts layouts whose *compute* cannot be spread well (sizes the mesh
dims do not divide), not layouts that are merely slow to communicate. It
costs a build (the solve is what it saves); a cached bound cuts a layout
before it is built.

Next to the dp / tp layouts, ``pp`` layouts (stages across nodes, priced by the
pipeline search, cut by the matmul bound (p2)) and ``cp`` layouts (sequence inputs
pinned on a ``cp`` dim, cut by the bound above): :mod:`autoshard.search.mesh_stages`.
Before its build, a dp / tp / cp layout is refused (``no_fit``) when the memory every plan
holds, its parameters, gradients and optimizer state spread over all its devices (m1), exceeds the
limit, and cut when the work every plan of ``N`` devices computes, each op's FLOPs and bytes spread
over all of them at the profile's best rates (c2), is no faster than the best (it is the same for
every layout of the search: it cuts only against a pp plan, whose step the pipeline search prices;
405B on 512: 16.7 s, below the pp plans' 31-33 s, so it cuts none there; the 54.8 s that cut the 3-D
plain layouts after their builds bound their built graphs, per-strategy prices no trace-level bound
reaches); and where the model's blocks do not fit one node (``mesh_stages.pipeline_first``) the pp
layouts go first, priced in a minute each where a plain 405B layout's build takes minutes.

Parallel, resumable. Layouts are built and solved in ``jobs`` forked worker
processes that inherit the one trace (Linux; elsewhere, or with ``jobs=1``,
in this process, one after another). 3-D layouts seeded from the same
coarse 2-D mesh (``2x4x8``, ``4x2x8``, ``8x2x4``, ``8x4x2`` all from ``8x8``) go
to one worker, which builds and solves that seed once (``prepare(seed_memo=)``).
Each finished layout is written at once to :class:`~autoshard.search.layout_cache.LayoutCache`
under a key of everything that decides it: the plan fingerprint (graph,
mesh, profile with its node size), every solve option except ``profile``
(in the fingerprint), ``time_limit`` and ``server``, and a hash of the code. A second
run re-solves only the layouts whose key changed; a run killed half-way
keeps the layouts it finished. A cached plan that was not proven optimal is
reused only from a search that gave each layout at least the share this one
would (``time_limit * jobs / layouts``). The bound has its own key (graph
fingerprint, prepare options, pins, baseline), so a run that changes only
the memory limit still cuts with it.

Time. ``time_limit`` is the whole search's, trace included: a deadline. A layout's solve
gets its share of what is left, ``(deadline - now) * jobs / (layouts not yet
solving)``, never past the deadline; a layout not started by the deadline, or
built too close to it (:data:`MIN_SOLVE_S`), is ``skipped``. Builds are not
interruptible, so with worker processes the search stops the workers still
busy :data:`STOP_GRACE_SHARE` of the limit past the deadline and marks their
layouts ``skipped`` (in one process, ``jobs=1``, a build under way ends first).
The 405B search on 512 GPUs returned after 612-642 s of a 600 s limit while the
last layouts got twice what was left (a share of ``jobs`` workers' time with
fewer layouts left than workers) and 5 s each once built past the deadline.

>>> # plan = search_mesh(model, inputs, devices=64, devices_per_node=8, profile="h100-sxm-80gb",
>>> #                    memory_limit=80 * 2**30, mixed_precision=True, time_limit=600)
>>> # plan.fingerprint.mesh_shape, [r["outcome"] for r in plan.options["mesh_search"]["layouts"]]
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import multiprocessing
import os
import queue as queue_errors
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from hw_profiles import HardwareProfile
from hw_profiles import load as load_profile

from autoshard.plan.cache_folder import cache_folder
from autoshard.plan.format import Plan
from autoshard.plan.options import BUILD_FIELDS, SolveOptions, solve_options
from autoshard.search.layout_cache import LayoutCache, code_version, layout_cache_key
from autoshard.plan.layout_report import LayoutResult
from autoshard.search.solve import InfeasibleMemoryError, prepare, solve_prepared
from autoshard.search.mesh_layouts import (MeshLayout, check_devices, devices_per_node_of, enumerate_layouts,
                                    profile_for_nodes)
from autoshard.search.mesh_stages import (ModelShape, context_layouts_for, held_memory_refusal, layout_kind,
                                          merged_pins, model_shape, name_context_dim, pipeline_bound_s,
                                          pipeline_first, pipeline_layouts_for, plain_memory_refusal,
                                          solve_pipeline_layout, take_turns, work_bound_s)

__all__ = ["MIN_SOLVE_S", "CUT_TOLERANCE", "SearchStatus", "NoLayoutError", "search_mesh", "layout_bound"]

log = logging.getLogger(__name__)

MIN_SOLVE_S = 1.0
"""A layout whose build ends less than this before the deadline is ``skipped``: its solve would
end past the deadline (the time limit bounds the whole search: a layout solved within it got at
least this long)."""

STOP_GRACE_SHARE = 0.02
"""Share of the time limit the search waits past its deadline for the layouts still solving
(each ends its solve by the deadline, then assembles its plan); then their workers are stopped
and the layouts are ``skipped``."""

CUT_TOLERANCE = 1e-9
"""Relative margin by which a bound must exceed the best step to cut (module docstring)."""

_NOT_IN_KEY = ("profile", "time_limit", "server")
"""Options that do not change a layout's result beyond its fingerprint (the profile is
in it; the service returns the plan a local solve would) or that the search shares out."""
_BOUND_SOLVE_OPTIONS = ("pins", "baseline", "tp_table")
"""Solve options that change the bound (they pin strategies)."""


class NoLayoutError(ValueError):
    """No layout could be solved (every one failed or was skipped)."""


@dataclass(frozen=True, slots=True)
class SearchStatus:
    """Progress of a search: ``phase`` is ``trace`` then ``layouts``."""

    phase: str
    done: int
    total: int
    best: LayoutResult | None = None
    """The fastest solved layout so far."""
    last: LayoutResult | None = None
    """The layout that just finished."""


def layout_bound(prep: Any, options: SolveOptions) -> float:
    """The lower bound on the step of any plan on ``prep``'s graph under the
    pins of ``options`` (``pins``, ``baseline``; module docstring)."""
    from autoshard.search.baselines import baseline_pins
    from autoshard.search.pins import resolve_pins

    graph = prep.graph
    names: dict[str, str] = {}
    if options.baseline is not None:
        names.update(baseline_pins(graph, options.baseline, options.tp_table))
    names.update(options.pins)
    pinned = resolve_pins(graph, names) if names else {}
    total = 0.0
    for i, node in enumerate(graph.nodes):
        costs = node.compute_s
        if i in pinned:
            total += float(costs[pinned[i]])
        elif len(costs):
            finite = [float(c) for c in costs if math.isfinite(float(c))]
            total += min(finite) if finite else 0.0
    return total


# ---------------------------------------------------------------------------------------------- workers


@dataclass
class _Work:
    """What every worker needs (inherited by fork, never pickled)."""

    traced: Any
    profile: HardwareProfile
    layouts: tuple[MeshLayout, ...]
    options: SolveOptions
    """Every layout's options (``profile`` is :attr:`profile`; ``time_limit`` its share)."""
    deadline: float
    """``time.monotonic()`` past which no layout starts (one clock for forked processes)."""
    time_limit: float
    jobs: int
    incumbent: Any
    """``.value``: the best step found so far (shared memory across workers)."""
    unsolved: Any
    """``.value``: layouts whose solve has not started (shared, with ``get_lock()``)."""
    emit: Callable[[int, str], None]
    """Hands one finished layout to the search's process."""
    seed_memo: dict[Any, Any] = field(default_factory=dict)
    """Seeds of 3-D layouts by coarse mesh, per process (``prepare(seed_memo=)``)."""
    model: Any = None
    """The model and its example inputs: what a pp layout's pipeline search cuts into blocks."""
    inputs: Any = None
    shape: ModelShape | None = None
    work_bound_s: float = 0.0
    """(c2) of the trace on the search's device count (``mesh_stages.work_bound_s``): the same for every layout."""


_WORK: _Work | None = None


def _solve_group(indices: Sequence[int], cached_bounds: Sequence[float | None]) -> None:
    """Solve layouts ``indices`` of :data:`_WORK` one after another, emitting each."""
    for i, bound in zip(indices, cached_bounds):
        _WORK.emit(i, _solve_layout(i, bound))


def _solve_layout(index: int, cached_bound: float | None) -> str:
    """Build, bound and solve layout ``index`` of :data:`_WORK`; the outcome as JSON
    (``{"result": LayoutResult, "plan": plan dict or None, "time_limit_s": its solve's}``)."""
    work = _WORK
    layout = work.layouts[index]
    t0 = time.monotonic()
    limit = 0.0

    def done(outcome: str, plan: Plan | None = None, **fields: Any) -> str:
        if not limit:  # it never reached its solve: its share goes to the others
            with work.unsolved.get_lock():
                work.unsolved.value -= 1
        result = LayoutResult(layout.shape, layout.dim_names, outcome, seconds=round(time.monotonic() - t0, 3),
                              **fields)
        if outcome == "solved":  # this worker's next layout cuts with it before the search's process hears of it
            work.incumbent.value = min(work.incumbent.value, result.step_s)
        return json.dumps({"result": result.to_dict(), "plan": None if plan is None else plan.to_dict(),
                           "time_limit_s": limit}, allow_nan=False)

    def failed(exc: Exception, **fields: Any) -> str:
        # one layout's failure (a pin or baseline it cannot take, a rule's refusal) is its row,
        # not the end of the others' work
        log.debug("mesh search: layout %s failed", layout.text, exc_info=True)
        text = _one_line(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {_one_line(exc)}"
        return done("error", reason=text, **fields)

    best = work.incumbent.value
    if cached_bound is not None and cached_bound >= best * (1 + CUT_TOLERANCE):
        return done("cut", bound_s=cached_bound, cached=True,
                    reason=f"bound {cached_bound * 1e3:.3f} ms (cached) >= best {best * 1e3:.3f} ms")
    if t0 >= work.deadline:
        return done("skipped", reason="time limit reached before it started", bound_s=cached_bound)
    if layout_kind(layout) == "pp":
        return _solve_pipeline(layout, work, done, failed)
    refusal = plain_memory_refusal(work.traced, layout, work.options, work.profile)
    if refusal:  # (m1), mesh_stages: no plan of this device count fits, whatever its build would say
        return done("no_fit", reason=refusal)
    if work.work_bound_s >= best * (1 + CUT_TOLERANCE):  # (c2), mesh_stages: no plan of N devices is faster
        return done("cut", bound_s=work.work_bound_s, reason=f"work bound {work.work_bound_s * 1e3:.3f} ms >= best "
                    f"{best * 1e3:.3f} ms (before its build)")
    options = work.options
    if layout_kind(layout) == "cp":  # the sequence split on cp; its own seed (the shared ones are unpinned)
        options = options.with_changes(pins=merged_pins(options.pins, layout, work.shape))
    try:
        # a seed's share is of what each layout gets (the same for every layout: seeds are shared),
        # and never past the deadline
        each = min(_seed_time_limit(work), work.deadline - t0)
        prep = prepare(None, None, layout.shape, layout.dim_names, options.with_changes(time_limit=each),
                       traced=work.traced, seed_memo=work.seed_memo if options is work.options else None)
        bound = max(layout_bound(prep, options), work.work_bound_s)  # both bound every plan of the layout
    except Exception as exc:  # noqa: BLE001 - see failed()
        return failed(exc)
    best = work.incumbent.value
    if bound >= best * (1 + CUT_TOLERANCE):
        return done("cut", bound_s=bound, reason=f"bound {bound * 1e3:.3f} ms >= best {best * 1e3:.3f} ms")
    remaining = work.deadline - time.monotonic()
    if remaining < MIN_SOLVE_S:  # built too late to solve before the deadline: no solve starts past it
        return done("skipped", bound_s=bound, reason=f"time limit reached while it was built ({remaining:.1f} s left)")
    with work.unsolved.get_lock():  # this layout's share of what is left: the rest split evenly
        left = max(work.unsolved.value, 1)
        work.unsolved.value -= 1
    # with fewer layouts left than workers, a share would outlast the deadline: it ends there
    limit = min(work.time_limit, remaining * work.jobs / left, remaining)
    try:
        plan = solve_prepared(prep, options.with_changes(time_limit=limit))
    except InfeasibleMemoryError as exc:
        return done("no_fit", bound_s=bound, reason=_one_line(exc))
    except Exception as exc:  # noqa: BLE001 - see failed()
        return failed(exc, bound_s=bound)
    return done("solved", plan, step_s=plan.estimate.step_s, peak_memory_bytes=plan.estimate.peak_memory_bytes,
                bound_s=bound, solver_status=plan.solver.status, portfolio=plan.options.get("portfolio"))


def _solve_pipeline(layout: MeshLayout, work: _Work, done: Callable[..., str], failed: Callable[..., str]) -> str:
    """A pp layout: cut by (p2), else priced by the pipeline search (``autoshard.search.mesh_stages``)."""
    from autoshard.plan.pipeline_section import PipelineError

    bound, best = pipeline_bound_s(work.shape, layout.devices, work.profile), work.incumbent.value
    if bound >= best * (1 + CUT_TOLERANCE):
        return done("cut", bound_s=bound, reason=f"matmul bound {bound * 1e3:.3f} ms >= best {best * 1e3:.3f} ms")
    refusal = held_memory_refusal(work.model, work.traced.blocks, layout, work.options, work.profile)
    if refusal:
        return done("no_fit", bound_s=bound, reason=refusal)
    remaining = work.deadline - time.monotonic()
    # its share of what is left (done() counts it as started: its share then goes to the others)
    limit = min(work.time_limit, remaining * work.jobs / max(work.unsolved.value, 1), remaining)
    try:
        out = solve_pipeline_layout(work.model, work.inputs, work.traced, layout, work.options, time_limit=limit,
                                    incumbent_s=lambda: work.incumbent.value, seed_memo=work.seed_memo,
                                    seed_time_limit=_seed_time_limit(work))
    except (InfeasibleMemoryError, PipelineError) as exc:
        return done("no_fit", bound_s=bound, reason=_one_line(exc))
    except Exception as exc:  # noqa: BLE001 - see _solve_layout's failed()
        return failed(exc, bound_s=bound)
    if out.plan is None:  # priced, slower than the incumbent: no plan built
        return done("cut", bound_s=bound, reason=f"pipeline ({out.schedule}) {out.step_s * 1e3:.3f} ms "
                    f">= best {work.incumbent.value * 1e3:.3f} ms")
    return done("solved", out.plan, step_s=out.step_s, peak_memory_bytes=out.peak_memory_bytes, bound_s=bound,
                solver_status=out.plan.solver.status, reason=f"pipeline {out.schedule}")


def _seed_time_limit(work: _Work) -> float:
    """The time limit a layout's build gets for its seed: the same for every layout of the search,
    so that the layouts (and the pp layouts' record solves) with one coarse mesh share its seed."""
    return min(work.time_limit, work.time_limit * work.jobs / len(work.layouts))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class _Value:
    """``multiprocessing.Value``'s interface for the in-process search."""

    def __init__(self, value: float) -> None:
        self.value = value

    def get_lock(self) -> contextlib.nullcontext:
        return contextlib.nullcontext()


def _groups(todo: Sequence[int], layouts: Sequence[MeshLayout], search: str,
            pp_first: bool = False, node_size: int | None = None) -> list[list[int]]:
    """The tasks: layouts seeded from the same coarse mesh together, the rest
    alone; larger tasks and more mesh dims first (the longest jobs first keep
    every worker busy to the end, and finer meshes split compute at least as
    well, so a good plan is known early to cut with), then the innermost dim nearest
    the node size (``node_size``: the fast links carry that dim whole); the kinds taking
    turns, and the plain layouts' mesh-dim counts too (405B: the 2-D layouts were all skipped at
    the deadline behind the 3-D groups); ``pp_first``: every pp layout before the others
    (``mesh_stages.pipeline_first``)."""
    from costmodel.mesh import MeshSpec

    from autoshard.graph.restrict import choose_search, coarse_groups, coarse_mesh

    by_seed: dict[Any, list[int]] = {}
    for i in todo:
        shape = layouts[i].shape
        if layout_kind(layouts[i]) == "plain" and choose_search(shape, search) == "seeded":
            coarse = coarse_mesh(MeshSpec(shape), coarse_groups(shape))
            key: Any = (coarse.shape, coarse.strides)
        else:
            key = i
        by_seed.setdefault(key, []).append(i)
    def inner_gap(g: list[int]) -> float:
        return abs(math.log(layouts[g[0]].shape[-1] / node_size)) if node_size else 0.0

    def turn(g: list[int]) -> str:
        kind = layout_kind(layouts[g[0]])
        return f"{kind}{len(layouts[g[0]].shape)}" if kind == "plain" else kind

    ordered = sorted(by_seed.values(), key=lambda g: (-len(g), -len(layouts[g[0]].shape), inner_gap(g), g[0]))
    if pp_first:  # the pp layouts in their own order (the fewest stages first), then the rest taking turns
        first = sorted((g for g in ordered if layout_kind(layouts[g[0]]) == "pp"), key=lambda g: g[0])
        rest = [g for g in ordered if layout_kind(layouts[g[0]]) != "pp"]
        return first + take_turns(rest, [turn(g) for g in rest])
    return take_turns(ordered, [turn(g) for g in ordered])


# ---------------------------------------------------------------------------------------------- search


def _default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def search_mesh(
    model: Any,
    example_inputs: Sequence[Any] | Mapping[str, Any],
    devices: int,
    devices_per_node: int | None = None,
    options: SolveOptions | None = None,
    *,
    jobs: int | None = None,
    cache_dir: str | os.PathLike[str] | bool | None = None,
    max_dims: int = 3,
    progress: Callable[[SearchStatus], None] | None = None,
    traced: Any = None,
    pipeline: bool = True,
    context: bool | None = None,
    **changes: Any,
) -> Plan:
    """The fastest plan over the mesh layouts of ``devices`` devices in nodes of
    ``devices_per_node`` (default: the profile's), its shape and dim names in
    ``plan.fingerprint`` and every layout's outcome in
    ``plan.options["mesh_search"]`` (module docstring).

    ``options``: the :class:`~autoshard.plan.options.SolveOptions` of every
    layout (keyword ``changes`` of its fields build or change it);
    ``time_limit`` is the whole search's. ``traced``: the model already traced
    (``trace_joint(model, example_inputs)``; ``model`` and ``example_inputs`` are then unused).
    ``jobs``: worker processes (default: the cores this process may use).
    ``pipeline``: also try pp layouts (needs ``model``, not only ``traced``); ``context``: cp
    layouts where the batch has fewer sequences than devices (None), always (True) or never (False)
    (:mod:`autoshard.search.mesh_stages`).
    ``cache_dir``: layout cache folder (default
    :func:`autoshard.plan.cache_folder.default_cache_dir`; ``False``: no cache).
    Raises :class:`~autoshard.search.solve.InfeasibleMemoryError` when no layout
    fits the memory limit, :class:`NoLayoutError` when none could be solved.

    >>> from examples.models import mlp
    >>> plan = search_mesh(*mlp.tiny(), devices=4, profile="cpu-gloo", time_limit=60, jobs=1, cache_dir=False)
    >>> [r["outcome"] for r in plan.options["mesh_search"]["layouts"]]
    ['solved', 'solved']
    """
    from autoshard.trace import trace_joint

    start = time.monotonic()
    devices, node_size = check_devices(devices, devices_per_node)
    jobs = _default_jobs() if jobs is None else int(jobs)
    if jobs < 1:
        raise ValueError(f"jobs: must be at least 1, got {jobs}")
    opts = solve_options(options, changes)
    time_limit = opts.time_limit
    prof, node_size, layouts = _profile_and_layouts(opts, devices, node_size, max_dims)
    total = len(layouts)  # until the trace says which pp / cp layouts the model has

    def report(phase: str, done: int, best: LayoutResult | None = None, last: LayoutResult | None = None) -> None:
        if progress is not None:
            progress(SearchStatus(phase, done, 1 if phase == "trace" else total, best, last))

    report("trace", 0)
    if traced is None:
        traced = trace_joint(model, example_inputs, target_device=opts.device_type or prof.device_type, stamp=True)
    trace_s = time.monotonic() - start
    shape = model_shape(traced)
    extra, pp_first = _stage_layouts(model, traced, shape, devices, node_size, opts, prof, pipeline, context)
    layouts = (*layouts, *extra)
    total = len(layouts)
    report("trace", 1)

    folder = cache_folder(cache_dir)
    cache = LayoutCache(folder)
    result_keys, bound_keys = _layout_cache_keys(traced, layouts, prof, opts, folder)
    best = _Incumbent(total)
    # what each layout gets from a search of this size: an unproven cached plan is taken only
    # from a search that gave it at least as much (a proven one always)
    share_all = min(time_limit, time_limit * jobs / total)
    cached_bounds = _take_cached_results(cache, result_keys, bound_keys, best, share_all)
    _cut_by_cached_bounds(best, cached_bounds, layouts)
    todo = [i for i in range(total) if best.results[i] is None]
    report("layouts", total - len(todo), best.row())

    def finished(i: int, text: str) -> None:
        data = json.loads(text)
        row = LayoutResult.from_dict(data["result"])
        best.accept(i, row, data["plan"])
        if row.bound_s is not None and not row.cached:
            cache.put(bound_keys[i], {"bound_s": row.bound_s})
        if row.outcome in ("solved", "no_fit"):
            cache.put(result_keys[i], {"result": row.to_dict(), "plan": data["plan"], "budget_s": share_all,
                                       "time_limit_s": data["time_limit_s"], "solver_status": row.solver_status})
        _WORK.incumbent.value = best.step_s()
        log.info("mesh search: %s %s %s after %.1f s (%.1f s on it)%s", row.text, ",".join(row.dim_names), row.outcome,
                 time.monotonic() - start, row.seconds or 0.0, f": {row.reason}" if row.reason else "")
        report("layouts", sum(r is not None for r in best.results), best.row(), row)

    if todo:
        _run(todo, _groups(todo, layouts, opts.search, pp_first, node_size), cached_bounds, finished, jobs,
             _Work(traced, prof, layouts, opts.with_changes(profile=prof), start + time_limit, time_limit, 1,
                   _Value(best.step_s()), _Value(len(todo)), finished, model=model, inputs=example_inputs,
                   shape=shape, work_bound_s=_work_bound(traced, devices, prof, layouts, todo)))
    summary = {"devices": devices, "devices_per_node": node_size, "profile": prof.name, "jobs": jobs,
               "time_limit_s": time_limit, "trace_s": round(trace_s, 3)}
    return _chosen_plan(best, devices, summary, start)


def _work_bound(traced: Any, devices: int, prof: HardwareProfile, layouts: Sequence[MeshLayout],
                todo: Sequence[int]) -> float:
    """(c2) when a plain or cp layout is left to cut with it (405B: 0.6 s of walking the trace), else 0."""
    if not any(layout_kind(layouts[i]) != "pp" for i in todo):
        return 0.0
    return work_bound_s(traced, devices, prof)


def _stage_layouts(model: Any, traced: Any, shape: ModelShape, devices: int, node_size: int, opts: SolveOptions,
                   prof: Any, pipeline: bool, context: bool | None) -> tuple[list[MeshLayout], bool]:
    """The cp and pp layouts of the trace (``mesh_stages``), and whether the pp ones go first
    (``mesh_stages.pipeline_first``)."""
    extra = [] if context is False else context_layouts_for(devices, node_size, shape, always=bool(context))
    if not (pipeline and model is not None):
        return extra, False
    staged = pipeline_layouts_for(devices, node_size, n_blocks=shape.n_blocks)
    return extra + staged, bool(staged) and pipeline_first(model, traced.blocks, node_size, opts, prof)


class _Incumbent:
    """Every layout's result so far, and the fastest solved one (its plan as a dict); ties go to
    the layout listed first."""

    def __init__(self, total: int) -> None:
        self.results: list[LayoutResult | None] = [None] * total
        self.plan: dict[str, Any] | None = None
        self.index: int | None = None

    def accept(self, i: int, result: LayoutResult, plan: dict[str, Any] | None) -> None:
        self.results[i] = result
        best = self.row()
        if result.outcome == "solved" and (best is None or result.step_s < best.step_s
                                           or (result.step_s == best.step_s and i < self.index)):
            self.plan, self.index = plan, i

    def row(self) -> LayoutResult | None:
        return None if self.index is None else self.results[self.index]

    def step_s(self) -> float:
        return math.inf if self.index is None else self.results[self.index].step_s


def _profile_and_layouts(opts: SolveOptions, devices: int, node_size: int | None,
                         max_dims: int) -> tuple[HardwareProfile, int, tuple[MeshLayout, ...]]:
    """The profile for nodes of ``node_size`` devices, the node size it settles on, and the layouts to try."""
    prof = opts.profile if isinstance(opts.profile, HardwareProfile) else load_profile(opts.profile)
    prof = profile_for_nodes(prof, node_size)
    node_size = devices_per_node_of(prof, devices, node_size)
    return prof, node_size, tuple(enumerate_layouts(devices, node_size, max_dims=max_dims))


def _layout_cache_keys(traced: Any, layouts: Sequence[MeshLayout], prof: HardwareProfile, opts: SolveOptions,
                       folder: Any) -> tuple[list[str], list[str]]:
    """Each layout's cache key of its result and of its bound (the bound's key leaves out
    the options that do not change it)."""
    from autoshard.plan.fingerprint import make_fingerprint

    code = code_version() if folder is not None else ""
    key_opts = {k: v for k, v in opts.fields().items() if k not in _NOT_IN_KEY}
    bound_opts = {k: v for k, v in key_opts.items() if k in BUILD_FIELDS or k in _BOUND_SOLVE_OPTIONS}
    fingerprints = [make_fingerprint(traced, lay.shape, lay.dim_names, prof) for lay in layouts]
    return ([layout_cache_key("result", fp, key_opts, code) for fp in fingerprints],
            [layout_cache_key("bound", fp, bound_opts, code) for fp in fingerprints])


def _take_cached_results(cache: LayoutCache, result_keys: Sequence[str], bound_keys: Sequence[str],
                         best: _Incumbent, share_all: float) -> list[float | None]:
    """Accept the cached results a search of this size may reuse (they are the incumbent that
    cuts the others); the cached bounds of the layouts left."""
    cached_bounds: list[float | None] = [None] * len(result_keys)
    for i, key in enumerate(result_keys):
        record = cache.get(key)
        if record is not None and (record.get("solver_status") == "optimal"
                                   or float(record.get("budget_s", 0.0)) >= share_all * (1 - 1e-9)):
            best.accept(i, replace(LayoutResult.from_dict(record["result"]), cached=True, seconds=0.0),
                        record.get("plan"))
            continue
        bound = cache.get(bound_keys[i])
        if bound is not None:
            cached_bounds[i] = float(bound["bound_s"])
    return cached_bounds


def _cut_by_cached_bounds(best: _Incumbent, cached_bounds: Sequence[float | None],
                          layouts: Sequence[MeshLayout]) -> None:
    """Mark ``cut`` the layouts whose cached bound is no better than the incumbent, before anything is built."""
    for i, bound in enumerate(cached_bounds):
        if best.results[i] is None and bound is not None and bound >= best.step_s() * (1 + CUT_TOLERANCE):
            best.results[i] = LayoutResult(layouts[i].shape, layouts[i].dim_names, "cut", bound_s=bound,
                                           cached=True, reason=f"bound {bound * 1e3:.3f} ms (cached) >= "
                                           f"best {best.step_s() * 1e3:.3f} ms")


def _chosen_plan(best: _Incumbent, devices: int, summary: dict[str, Any], start: float) -> Plan:
    """The fastest layout's plan with the search's ``summary`` and every layout's row in its
    options; raises when no layout was solved."""
    rows = [replace(r, chosen=(i == best.index)) for i, r in enumerate(best.results)]
    summary = {**summary, "seconds": round(time.monotonic() - start, 3), "layouts": [r.to_dict() for r in rows]}
    if best.index is None:
        detail = "; ".join(f"{r.text}: {r.outcome} ({r.reason})" for r in rows)
        if any(r.outcome == "no_fit" for r in rows):
            raise InfeasibleMemoryError(f"no layout of {devices} devices fits: {detail}")
        raise NoLayoutError(f"no layout of {devices} devices was solved: {detail}")
    plan = name_context_dim(Plan.from_dict(best.plan))  # the dim of its sequence split named cp
    return replace(plan, options={**plan.options, "mesh_search": summary})


def _run(todo: list[int], groups: list[list[int]], cached_bounds: list[float | None],
         finished: Callable[[int, str], None], jobs: int, work: _Work) -> None:
    """Solve the groups here (one worker or no fork) or on forked workers, handing
    every layout to ``finished`` as it ends; on an error or an interrupt the
    workers are stopped (what finished is cached)."""
    global _WORK
    parallel = jobs > 1 and len(groups) > 1 and "fork" in multiprocessing.get_all_start_methods()
    if not parallel:
        _WORK = work
        try:
            for group in groups:
                _solve_group(group, [cached_bounds[i] for i in group])
        finally:
            _WORK = None
        return
    context = multiprocessing.get_context("fork")
    workers = min(jobs, len(groups))
    results = context.Queue()
    work = replace(work, jobs=workers, incumbent=context.Value("d", work.incumbent.value, lock=False),
                   unsolved=context.Value("i", work.unsolved.value), emit=lambda i, text: results.put((i, text)))
    _WORK = work  # what the forked workers inherit (here it only keeps the shared incumbent)
    executor = ProcessPoolExecutor(max_workers=workers, mp_context=context)
    stop_at = work.deadline + STOP_GRACE_SHARE * work.time_limit
    pending = set(todo)
    try:
        futures = [executor.submit(_solve_group, g, [cached_bounds[i] for i in g]) for g in groups]
        while pending:
            try:
                i, text = results.get(timeout=max(0.0, min(0.2, stop_at - time.monotonic())))
            except queue_errors.Empty:
                for future in futures:  # a worker that died (killed, out of memory) ends the search
                    if future.done() and future.exception() is not None:
                        raise future.exception()
                if time.monotonic() >= stop_at:  # the deadline bounds the search: what runs is stopped
                    _stop_workers(executor)
                    for i in sorted(pending):
                        finished(i, _stopped(work.layouts[i]))
                    pending.clear()
                continue
            pending.discard(i)
            finished(i, text)
    except BaseException:
        _stop_workers(executor)
        raise
    finally:
        _WORK = None
    executor.shutdown(wait=True)
    results.close()


def _stop_workers(executor: ProcessPoolExecutor) -> None:
    """Kill the workers this search forked and drop the work they have not started."""
    for process in list((getattr(executor, "_processes", None) or {}).values()):
        if process.is_alive():
            process.kill()
    executor.shutdown(wait=False, cancel_futures=True)


def _stopped(layout: MeshLayout) -> str:
    """The outcome (as a worker sends it) of a layout whose worker was stopped at the deadline."""
    row = LayoutResult(layout.shape, layout.dim_names, "skipped",
                       reason="time limit reached while it was built or solved: stopped")
    return json.dumps({"result": row.to_dict(), "plan": None, "time_limit_s": 0.0})
