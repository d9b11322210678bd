r"""Mesh search: solve a model on every mesh layout of ``N`` devices and keep the fastest plan.

``search_mesh(model, inputs, devices=64, devices_per_node=8)`` traces the
model once (the trace does not depend on the mesh), then for every layout of
``autoshard.plan.layouts`` builds the strategy graph on that mesh, bounds it,
and solves it with the same options as ``autoshard solve --mesh`` would
(memory limit, pins, the expert-layout portfolio, and any other option of
:func:`~autoshard.plan.solve.prepare` or
:func:`~autoshard.plan.solve.solve_prepared`, passed through by name). The
plan with the smallest estimated step wins (ties: the first layout in
enumeration order); every layout's outcome is in
``plan.options["mesh_search"]["layouts"]`` (``autoshard.plan.layout_report``).

Cutting layouts that cannot win. Let ``c_v(k)`` be the cost of strategy ``k``
of node ``v`` (the busiest rank's compute time of an op, a parameter's
optimizer update) and ``A_v`` the strategies a pin leaves it (all if
unpinned). Any plan on the layout picks ``k_v in A_v`` for every node, and its
estimate is

    step = sum_v c_v(k_v) + comm + relayout,   comm >= 0, relayout >= 0

(``autoshard.plan.assemble``: compute is the node costs at the choice,
collectives and local re-layouts are times, never negative; gradient buckets
change only ``comm``). Dropping the edges, the memory limit and the ties
relaxes the problem, so

    bound = sum_v min_{k in A_v} c_v(k)  <=  step   of every plan on the layout,

the expert layouts of the portfolio included (they only add pins). Once a
plan with step ``s*`` is known, a layout whose ``bound >= s*`` cannot beat it
and is not solved (outcome ``cut``). The bound is taken on the graph that
``prepare`` builds for the layout, which is the graph its own solve would
use (on 3-D meshes, after the seeded restriction: a restriction only removes
strategies, so it is a bound on what ``autoshard solve --mesh`` returns for
that layout, which is what the search compares). It bounds compute only:
the communication a layout forces depends on the strategies, and no
strategy-free bound on it is valid (all-replicate communicates nothing).
So it cuts layouts whose *compute* cannot be spread well (sizes the mesh
dims do not divide), not layouts that are merely slow to communicate. It
costs a build (the solve is what it saves); a cached bound
cuts a layout before it is built.

Parallel, resumable. Layouts are built and solved in ``jobs`` forked worker
processes that inherit the one trace (Linux; elsewhere, or with ``jobs=1``,
in this process, one after another). Each finished layout is written at once
to a cache (``<cache_dir>/layouts``, :class:`autoshard.service.cache.ResultCache`:
atomic files, bounded, least recently used out first) under a key of
everything that decides it: the plan fingerprint (graph, mesh, profile with
its node size), every prepare and solve option except ``time_limit``,
``progress`` and ``server``, and a hash of the code that builds, prices and
solves. A second run re-solves only the layouts whose key changed; a run
killed half-way keeps the layouts it finished. A cached plan that was not
proven optimal is reused only from a search that gave each layout at least
the share this one would (``time_limit * jobs / layouts``).
The bound has its own key (graph fingerprint, prepare options, pins,
baseline), so a run that changes only the memory limit still cuts with it.

Time. ``time_limit`` is the whole search's: every layout's solve gets
``time_limit * jobs / (layouts to solve)`` at most and never runs past the
deadline (but at least :data:`MIN_SOLVE_S`); a layout not started by then is
``skipped``. Builds are not interruptible, so a search can end later than the
limit by one build per worker.

>>> # plan = search_mesh(model, inputs, devices=64, devices_per_node=8, profile="h100-sxm-80gb",
>>> #                    memory_limit=80 * 2**30, mixed_precision=True, time_limit=600)
>>> # plan.fingerprint.mesh_shape, [r["outcome"] for r in plan.options["mesh_search"]["layouts"]]
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import logging
import math
import multiprocessing
import os
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from hw_profiles import HardwareProfile
from hw_profiles import load as load_profile

from autoshard.plan.format import Plan
from autoshard.plan.layout_report import LayoutResult
from autoshard.plan.layouts import (MeshLayout, check_devices, devices_per_node_of, enumerate_layouts,
                                    profile_for_nodes)

__all__ = ["MIN_SOLVE_S", "SearchStatus", "NoLayoutError", "search_mesh", "layout_bound", "split_options",
           "layout_cache_key"]

log = logging.getLogger(__name__)

MIN_SOLVE_S = 1.0
"""A layout built past the deadline still gets this long to solve (its build is paid)."""

CUT_TOLERANCE = 1e-9
"""A layout is cut when its bound exceeds the best step by this much (relative):
the bound and the step are sums in different orders, so a layout that can at
best tie is solved rather than cut on a rounding."""

CACHE_FORMAT = "autoshard.layout_result/1"
_NOT_OPTIONS = ("model", "example_inputs", "mesh_shape", "dim_names", "traced", "prep", "profile", "progress",
                "time_limit")
"""Parameters of prepare / solve_prepared the search sets itself."""
_NOT_IN_KEY = ("server",)
"""Options that do not change a result (the service returns the plan a local solve would)."""
_BOUND_SOLVE_OPTIONS = ("pins", "baseline", "tp_table")
"""Solve options that change the bound (they pin strategies)."""


class NoLayoutError(ValueError):
    """No layout could be solved (every one failed, was skipped or did not fit)."""


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


def split_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(prepare options, solve options)``: each option goes to the function
    that has a parameter of its name (both when both do), so a new option of
    either passes through the search unchanged. ``TypeError`` naming an option
    neither takes, or one the search sets itself."""
    from autoshard.plan.solve import prepare, solve_prepared

    prep_params = set(inspect.signature(prepare).parameters)
    solve_params = set(inspect.signature(solve_prepared).parameters)
    prep_opts, solve_opts = {}, {}
    for name, value in options.items():
        if name in _NOT_OPTIONS:
            raise TypeError(f"search_mesh: {name!r} is set by the search, not an option")
        if name not in prep_params and name not in solve_params:
            raise TypeError(f"search_mesh: unknown option {name!r} (not a parameter of prepare or solve_prepared)")
        if name in prep_params:
            prep_opts[name] = value
        if name in solve_params:
            solve_opts[name] = value
    return prep_opts, solve_opts


def _canonical_options(prep_opts: Mapping[str, Any], solve_opts: Mapping[str, Any]) -> dict[str, Any]:
    """Every option of prepare and solve_prepared with its value (the default
    when not given; an empty mapping as None), so that equal solves get equal
    keys however they were asked for (``pins={}`` and no pins)."""
    from autoshard.plan.solve import prepare, solve_prepared

    out: dict[str, Any] = {}
    for fn, given in ((prepare, prep_opts), (solve_prepared, solve_opts)):
        for name, param in inspect.signature(fn).parameters.items():
            if name in _NOT_OPTIONS or name in _NOT_IN_KEY or param.kind in (param.VAR_POSITIONAL,
                                                                               param.VAR_KEYWORD):
                continue
            value = given.get(name, param.default)
            if value is inspect.Parameter.empty:
                continue
            out[name] = None if isinstance(value, Mapping) and not value else value
    return out


def layout_bound(prep: Any, solve_options: Mapping[str, Any]) -> float:
    """The lower bound on the step of any plan on ``prep``'s graph under the
    pins of ``solve_options`` (``pins``, ``baseline``; module docstring)."""
    from autoshard.plan.baselines import baseline_pins
    from autoshard.plan.pins import resolve_pins

    graph = prep.graph
    names: dict[str, str] = {}
    if solve_options.get("baseline") is not None:
        names.update(baseline_pins(graph, solve_options["baseline"], solve_options.get("tp_table")))
    names.update(solve_options.get("pins") or {})
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


# ---------------------------------------------------------------------------------------------- cache


def _code_version() -> str:
    """sha256 of the sources that build, price and solve a layout."""
    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for folder in ("solver", "costmodel", "hw_profiles", "autoshard/graph", "autoshard/rules", "autoshard/plan"):
        for path in sorted((root / folder).rglob("*")):
            if path.suffix in (".py", ".json") and path.is_file():
                h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:20]


def _jsonable(value: Any) -> Any:
    if isinstance(value, HardwareProfile):
        return value.fingerprint
    return repr(value)


def layout_cache_key(kind: str, fingerprint: Any, options: Mapping[str, Any], code: str) -> str:
    """sha256 hex of a layout's ``kind`` of record (``result`` or ``bound``),
    its plan fingerprint, the options that decide it and the code version."""
    what = {"kind": kind, "fingerprint": fingerprint.to_dict(), "options": dict(options), "code": code}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=_jsonable).encode()).hexdigest()


class _Cache:
    """Records of finished layouts on disk (or nowhere, without a folder)."""

    def __init__(self, folder: Path | None) -> None:
        self.store = None
        if folder is not None:
            from autoshard.service.cache import ResultCache

            self.store = ResultCache(folder / "layouts", max_bytes=4 << 30)

    def get(self, key: str) -> dict[str, Any] | None:
        text = self.store.get(key) if self.store is not None else None
        if text is None:
            return None
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            return None
        return data if isinstance(data, dict) and data.get("format") == CACHE_FORMAT else None

    def put(self, key: str, record: Mapping[str, Any]) -> None:
        if self.store is None:
            return
        try:
            self.store.put(key, json.dumps({"format": CACHE_FORMAT, **record}, allow_nan=False))
        except (OSError, ValueError) as exc:  # a full or read-only cache must not lose the search
            log.warning("mesh search: cannot write the layout cache (%s)", exc)


# ---------------------------------------------------------------------------------------------- workers


@dataclass
class _Work:
    """What every worker needs (inherited by fork, never pickled)."""

    traced: Any
    profile: HardwareProfile
    layouts: tuple[MeshLayout, ...]
    prep_opts: Mapping[str, Any]
    solve_opts: Mapping[str, Any]
    deadline: float
    """``time.monotonic()`` past which no layout starts (one clock for forked processes)."""
    time_limit: float
    jobs: int
    incumbent: Any
    """``.value``: the best step found so far (shared memory across workers)."""
    unsolved: Any
    """``.value``: layouts whose solve has not started (shared, with ``get_lock()``)."""


_WORK: _Work | None = None


def _solve_layout(index: int, cached_bound: float | None) -> str:
    """Build, bound and solve layout ``index`` of :data:`_WORK`; the outcome as JSON
    (``{"result": LayoutResult, "plan": plan dict or None, "time_limit_s": its solve's}``)."""
    from autoshard.plan.solve import InfeasibleMemoryError, prepare, solve_prepared

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
        return json.dumps({"result": result.to_dict(), "plan": None if plan is None else plan.to_dict(),
                           "time_limit_s": limit}, allow_nan=False)

    if cached_bound is not None and cached_bound >= work.incumbent.value * (1 + CUT_TOLERANCE):
        return done("cut", bound_s=cached_bound, cached=True,
                    reason=f"bound {cached_bound * 1e3:.3f} ms (cached) >= best {work.incumbent.value * 1e3:.3f} ms")
    if t0 >= work.deadline:
        return done("skipped", reason="time limit reached before it started", bound_s=cached_bound)
    try:
        prep = prepare(None, None, layout.shape, layout.dim_names, profile=work.profile, traced=work.traced,
                       **work.prep_opts)
        bound = layout_bound(prep, work.solve_opts)
    except Exception as exc:  # noqa: BLE001 - a pin or baseline this layout cannot take, a rule's refusal:
        # one layout's failure is its row, not the end of the others' work
        log.debug("mesh search: layout %s failed", layout.text, exc_info=True)
        return done("error", reason=_one_line(exc) if isinstance(exc, ValueError) else
                    f"{type(exc).__name__}: {_one_line(exc)}")
    best = work.incumbent.value
    if bound >= best * (1 + CUT_TOLERANCE):
        return done("cut", bound_s=bound, reason=f"bound {bound * 1e3:.3f} ms >= best {best * 1e3:.3f} ms")
    with work.unsolved.get_lock():  # this layout's share of what is left: the rest split evenly
        left = max(work.unsolved.value, 1)
        work.unsolved.value -= 1
    limit = min(work.time_limit, max((work.deadline - time.monotonic()) * work.jobs / left, MIN_SOLVE_S))
    try:
        plan = solve_prepared(prep, time_limit=limit, **work.solve_opts)
    except InfeasibleMemoryError as exc:
        return done("no_fit", bound_s=bound, reason=_one_line(exc))
    except Exception as exc:  # noqa: BLE001 - as above
        log.debug("mesh search: layout %s failed", layout.text, exc_info=True)
        return done("error", bound_s=bound, reason=_one_line(exc) if isinstance(exc, ValueError) else
                    f"{type(exc).__name__}: {_one_line(exc)}")
    return done("solved", plan, step_s=plan.estimate.step_s, peak_memory_bytes=plan.estimate.peak_memory_bytes,
                bound_s=bound, solver_status=plan.solver.status, portfolio=plan.options.get("portfolio"))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class _Value:
    """``multiprocessing.Value``'s interface for the in-process search."""

    def __init__(self, value: float) -> None:
        self.value = value

    def get_lock(self) -> contextlib.nullcontext:
        return contextlib.nullcontext()


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
    *,
    profile: str | HardwareProfile = "h100-sxm-80gb",
    time_limit: float = 600.0,
    jobs: int | None = None,
    cache_dir: str | os.PathLike[str] | bool | None = None,
    max_dims: int = 3,
    progress: Callable[[SearchStatus], None] | None = None,
    **options: Any,
) -> Plan:
    """The fastest plan over the mesh layouts of ``devices`` devices in nodes of
    ``devices_per_node`` (default: the profile's), its shape and dim names in
    ``plan.fingerprint`` and every layout's outcome in
    ``plan.options["mesh_search"]`` (module docstring).

    ``options``: any option of :func:`~autoshard.plan.solve.prepare` or
    :func:`~autoshard.plan.solve.solve_prepared` (``memory_limit``, ``pins``,
    ``optimizer``, ``mixed_precision``, ``server``, ...), given to every layout.
    ``jobs``: worker processes (default: the cores this process may use).
    ``cache_dir``: layout cache folder (default
    :func:`autoshard.runtime.api.default_cache_dir`; ``False``: no cache).
    Raises :class:`~autoshard.plan.solve.InfeasibleMemoryError` when no layout
    fits the memory limit, :class:`NoLayoutError` when none could be solved.

    >>> from examples.models import mlp
    >>> plan = search_mesh(*mlp.tiny(), devices=4, profile="cpu-gloo", time_limit=60, jobs=1, cache_dir=False)
    >>> [r["outcome"] for r in plan.options["mesh_search"]["layouts"]]
    ['solved', 'solved']
    """
    from autoshard.plan.build import make_fingerprint
    from autoshard.plan.solve import InfeasibleMemoryError
    from autoshard.trace import trace_joint

    start = time.monotonic()
    devices, node_size = check_devices(devices, devices_per_node)
    jobs = _default_jobs() if jobs is None else int(jobs)
    if jobs < 1:
        raise ValueError(f"jobs: must be at least 1, got {jobs}")
    if not 0 < time_limit < math.inf:
        raise ValueError(f"time_limit: must be a positive number of seconds, got {time_limit}")
    prep_opts, solve_opts = split_options(options)
    prof = profile if isinstance(profile, HardwareProfile) else load_profile(profile)
    prof = profile_for_nodes(prof, node_size)
    node_size = devices_per_node_of(prof, devices, node_size)
    layouts = tuple(enumerate_layouts(devices, node_size, max_dims=max_dims))

    def report(phase: str, done: int, total: int, best: LayoutResult | None = None,
               last: LayoutResult | None = None) -> None:
        if progress is not None:
            progress(SearchStatus(phase, done, total, best, last))

    report("trace", 0, 1)
    t_trace = time.monotonic()
    traced = trace_joint(model, example_inputs)
    trace_s = time.monotonic() - t_trace
    report("trace", 1, 1)

    if cache_dir is False:
        folder = None
    elif cache_dir in (None, True):
        from autoshard.runtime.api import default_cache_dir

        folder = default_cache_dir()
    else:
        folder = Path(cache_dir)
    cache = _Cache(folder)
    code = _code_version() if folder is not None else ""
    from autoshard.plan.solve import prepare

    key_opts = _canonical_options(prep_opts, solve_opts)
    prepare_params = inspect.signature(prepare).parameters
    bound_opts = {k: v for k, v in key_opts.items() if k in prepare_params or k in _BOUND_SOLVE_OPTIONS}
    fingerprints = [make_fingerprint(traced, lay.shape, lay.dim_names, prof) for lay in layouts]
    result_keys = [layout_cache_key("result", fp, key_opts, code) for fp in fingerprints]
    bound_keys = [layout_cache_key("bound", fp, bound_opts, code) for fp in fingerprints]

    results: list[LayoutResult | None] = [None] * len(layouts)
    best_plan: dict[str, Any] | None = None
    best_index: int | None = None
    # what each layout gets from a search of this size: an unproven cached plan is taken only
    # from a search that gave it at least as much (a proven one always)
    share_all = min(time_limit, time_limit * jobs / len(layouts))
    cached_bounds: list[float | None] = [None] * len(layouts)

    def accept(i: int, result: LayoutResult, plan: dict[str, Any] | None) -> None:
        nonlocal best_plan, best_index
        results[i] = result
        if result.outcome == "solved" and (best_index is None or result.step_s < results[best_index].step_s
                                           or (result.step_s == results[best_index].step_s and i < best_index)):
            best_plan, best_index = plan, i

    for i in range(len(layouts)):  # the cache first: its plans are the incumbent that cuts the others
        record = cache.get(result_keys[i])
        if record is not None and (record.get("solver_status") == "optimal"
                                   or float(record.get("budget_s", 0.0)) >= share_all * (1 - 1e-9)):
            row = LayoutResult.from_dict(record["result"])
            accept(i, replace(row, cached=True, seconds=0.0), record.get("plan"))
            continue
        bound = cache.get(bound_keys[i])
        if bound is not None:
            cached_bounds[i] = float(bound["bound_s"])

    def best_step() -> float:
        return math.inf if best_index is None else results[best_index].step_s

    for i in range(len(layouts)):  # a cached bound cuts before anything is built
        if results[i] is None and cached_bounds[i] is not None and cached_bounds[i] >= best_step() * (1 + CUT_TOLERANCE):
            results[i] = LayoutResult(layouts[i].shape, layouts[i].dim_names, "cut", bound_s=cached_bounds[i],
                                      cached=True, reason=f"bound {cached_bounds[i] * 1e3:.3f} ms (cached) >= best "
                                      f"{best_step() * 1e3:.3f} ms")
    # more mesh dims first: their builds take longest (the longest jobs first keep the workers
    # busy to the end), and their compute splits at least as finely, so a good plan is known early
    todo = sorted((i for i in range(len(layouts)) if results[i] is None), key=lambda i: (-len(layouts[i].shape), i))
    total = len(layouts)
    report("layouts", total - len(todo), total, None if best_index is None else results[best_index])

    def finished(i: int, text: str) -> None:
        data = json.loads(text)
        row = LayoutResult.from_dict(data["result"])
        accept(i, row, data["plan"])
        if row.bound_s is not None:
            cache.put(bound_keys[i], {"bound_s": row.bound_s})
        if row.outcome in ("solved", "no_fit"):
            cache.put(result_keys[i], {"result": row.to_dict(), "plan": data["plan"], "budget_s": share_all,
                                       "time_limit_s": data["time_limit_s"], "solver_status": row.solver_status})
        work.incumbent.value = best_step()
        report("layouts", sum(r is not None for r in results), total,
               None if best_index is None else results[best_index], row)

    global _WORK
    if todo:
        parallel = jobs > 1 and len(todo) > 1 and "fork" in multiprocessing.get_all_start_methods()
        workers = min(jobs, len(todo)) if parallel else 1
        context = multiprocessing.get_context("fork") if parallel else None
        incumbent = context.Value("d", best_step(), lock=False) if parallel else _Value(best_step())
        unsolved = context.Value("i", len(todo)) if parallel else _Value(len(todo))
        work = _Work(traced, prof, layouts, prep_opts, solve_opts, start + time_limit, time_limit, workers,
                     incumbent, unsolved)
        _WORK = work
        try:
            if not parallel:
                for i in todo:
                    finished(i, _solve_layout(i, cached_bounds[i]))
            else:
                _run_parallel(context, workers, todo, cached_bounds, finished)
        finally:
            _WORK = None

    rows = [replace(r, chosen=(i == best_index)) for i, r in enumerate(results)]
    summary = {"devices": devices, "devices_per_node": node_size, "profile": prof.name, "jobs": jobs,
               "time_limit_s": time_limit, "trace_s": round(trace_s, 3),
               "seconds": round(time.monotonic() - start, 3), "layouts": [r.to_dict() for r in rows]}
    if best_index is None:
        no_fit = [r for r in rows if r.outcome == "no_fit"]
        detail = "; ".join(f"{r.text}: {r.outcome} ({r.reason})" for r in rows)
        if no_fit:
            raise InfeasibleMemoryError(f"no layout of {devices} devices fits: {detail}")
        raise NoLayoutError(f"no layout of {devices} devices was solved: {detail}")
    plan = Plan.from_dict(best_plan)
    return replace(plan, options={**plan.options, "mesh_search": summary})


def _run_parallel(context: Any, workers: int, todo: list[int], cached_bounds: list[float | None],
                  finished: Callable[[int, str], None]) -> None:
    """Run the layouts on forked workers, handing each result to ``finished`` as it
    comes; on an interrupt, the workers are stopped (what finished is cached)."""
    executor = ProcessPoolExecutor(max_workers=workers, mp_context=context)
    pending: dict[Future, int] = {}
    try:
        for i in todo:
            pending[executor.submit(_solve_layout, i, cached_bounds[i])] = i
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                finished(pending.pop(future), future.result())
    except BaseException:
        for process in list(getattr(executor, "_processes", {}).values()):  # the workers this search forked
            if process.is_alive():
                process.kill()
        executor.shutdown(wait=False, cancel_futures=True)
        raise
    executor.shutdown(wait=True)
