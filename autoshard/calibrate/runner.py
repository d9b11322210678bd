"""One calibration or one accuracy check, as every rank of the job runs it.

Why one runner for both: the check must measure exactly as the calibration
did (same protocol, same contention, same groups), or its errors would mix
model error with measurement drift. Every rank runs the same list of items
in the same order (the timing protocol issues collectives); rank 0 shows a
progress bar with an ETA, fits, writes, and prints.

>>> Options(output=None, check=None).mode
'full'
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Sequence

from costmodel.mesh import MeshSpec
from hw_profiles import HardwareProfile

from autoshard.calibrate import fit as fitting
from autoshard.calibrate.check_scope import kernel_profile, scope_lines
from autoshard.calibrate.heldout import (DEFAULT_MODEL, CheckItem, collective_check_items, compute_check_items,
                                         model_ops, reference_check_items, synthetic_ops)
from autoshard.calibrate.measure_collectives import CollectiveSample, Groups, collective_items, default_mesh
from autoshard.calibrate.load import monitor_for
from autoshard.calibrate.measure_compute import LAUNCH_SCALAR_OPS, ComputeSample, Item, compute_items, primary_dtype
from autoshard.calibrate.output import assemble_profile, check_profile, initial_interconnect, write_profile
from autoshard.calibrate.report import markdown_report, plot_report
from autoshard.calibrate.measure_overlap import measure_contention, unmeasured_overlap
from autoshard.calibrate.timing import Job, Settings

__all__ = ["MODE_SETTINGS", "MODE_ROUNDS", "Options", "Bar", "run_items", "calibrate", "check", "device_sources"]

MODE_SETTINGS = {
    "full": Settings(warmup=2, trials=5, min_trial_s=0.05, max_item_s=1.0),
    "quick": Settings(warmup=1, trials=3, min_trial_s=0.02, max_item_s=0.5),
    "tiny": Settings(warmup=1, trials=2, min_trial_s=0.002, max_item_s=0.2),
}
MODE_ROUNDS = {"full": 3, "quick": 2, "tiny": 1}
"""Passes over the whole item list; an item's time is that of its fastest pass."""


@dataclass(frozen=True, slots=True)
class Options:
    """What ``autoshard calibrate-hardware`` was asked to do."""

    output: str | None
    """Profile to write (calibration), or None."""
    check: str | None
    """Profile to check (``--check``), or None: check the new profile when a
    report or plot is asked for."""
    mode: str = "full"
    """``full``, ``quick`` or ``tiny`` (tests)."""
    mesh: MeshSpec | None = None
    base: HardwareProfile | None = None
    name: str | None = None
    threads: int = 1
    measurements: str | None = None
    """Also write the raw samples here (JSON)."""
    report: str | None = None
    plot: str | None = None
    model: tuple[str, dict] | None = None
    """Example model (``MODULE:FACTORY``, overrides) whose ops the check
    times; None: ``heldout.DEFAULT_MODEL`` (its plain ``tiny`` in tiny mode)."""
    command: str = ""
    """The command line, for the report."""


class Bar:
    """Rich progress bar with ETA on rank 0; silent elsewhere."""

    def __init__(self, job: Job, total: float, headline: str = "") -> None:
        self.progress = None
        if job.rank == 0:
            if headline:  # one line before the bar (the bar itself only shows on a terminal)
                print(f"calibrate-hardware: {headline}", file=sys.stderr, flush=True)
            from rich.console import Console
            from rich.progress import (BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)

            console = Console(stderr=True)
            self.progress = Progress(TextColumn("{task.description:<11}"), BarColumn(), TaskProgressColumn(),
                                     TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                     TextColumn("{task.fields[detail]}"), console=console,
                                     transient=not console.is_terminal)
            self.task = self.progress.add_task("calibrate", total=max(total, 1e-9), detail="")

    def __enter__(self) -> "Bar":
        if self.progress:
            self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.progress:
            self.progress.__exit__(*exc)

    def step(self, phase: str, label: str, advance: float = 0.0) -> None:
        if self.progress:
            self.progress.update(self.task, description=phase, detail=label[:48], advance=advance)


FAIL_RANK_ENV = "AUTOSHARD_CALIBRATE_TEST_FAIL_RANK"
"""Test hook: the rank named here raises half-way through its items."""


def run_items(job: Job, items: Sequence[Item], settings: Settings, bar: Bar, phase: str, *, rounds: int = 1) -> list:
    """Run every item ``rounds`` times (same order on every rank; odd rounds
    backwards, so that a burst of outside load does not always hit the same
    items; long items, ``repeat=False``, once), advancing the bar; each
    result's time is that of its fastest pass: load from outside the job
    (other users of a shared host) only ever adds time, and a pass that a
    burst of it hit is the one to drop."""
    runs: list[list[list]] = [[] for _ in items]
    fail_rank = os.environ.get(FAIL_RANK_ENV)
    order = list(range(len(items)))
    for r in range(rounds):
        for count, index in enumerate(order if r % 2 == 0 else order[::-1]):
            item = items[index]
            if r and not item.repeat:
                continue
            if fail_rank is not None and int(fail_rank) == job.rank and r == 0 and count == len(items) // 2:
                raise RuntimeError(f"injected failure on rank {job.rank} ({FAIL_RANK_ENV})")
            bar.step(phase, item.label)
            runs[index].append(item.run(job, settings))
            bar.step(phase, item.label, item.weight)
    out: list = []
    for per_round in runs:
        for results in zip(*per_round):  # the same samples every round (an item's list has a fixed length)
            out.append(results[0].with_seconds(min(x.seconds for x in results)))
    return out


ERROR_GROUPS = {
    "launch": lambda s, primary: s.kind == "launch",
    "matmul": lambda s, primary: s.kind == "matmul" and s.dtype == primary,
    "matmul_other_dtypes": lambda s, primary: s.kind == "matmul" and s.dtype != primary,
    "memory": lambda s, primary: s.kind == "memory",
    "vector": lambda s, primary: s.kind == "vector",
    "attention": lambda s, primary: s.kind == "attention" and s.op != "sdpa_bwd",
    "attention_backward": lambda s, primary: s.kind == "attention" and s.op == "sdpa_bwd",
    "access": lambda s, primary: s.kind == "access",
}
"""The fit-error groups of a calibration (``calibration.fit_error`` keys)."""


def device_sources(samples: Sequence[ComputeSample], primary: str, errors: dict[str, fitting.FitError],
                   mode: str, device: dict | None = None) -> dict[str, str]:
    """The ``device.sources`` text of a measured profile (``device``: the fitted
    figures, whose optional fields get a source only where they were fitted)."""
    def shapes(kind: str, dtype: str | None = None) -> str:
        chosen = [s for s in samples if s.kind == kind and (dtype is None or s.dtype == dtype)]
        return f"{len(chosen)} {kind} samples" if chosen else f"no {kind} samples"

    def err(key: str, what: str) -> str:
        return f"; {what} {errors[key].text()}" if key in errors else ""

    others = sorted({s.dtype for s in samples if s.kind == "matmul"} - {primary})
    mem = [s.bytes_accessed for s in samples if s.kind == "memory"]
    text = {
        "peak_flops": f"measured: best aten.mm rate in {primary} ({shapes('matmul', primary)}, square and skinny); "
                      + (f"{', '.join(others)}: best rate of their own square GEMMs; " if others else "")
                      + ("tf32 = fp32 (CPUs have no TF32)" if "tf32" not in others and primary == "fp32" else ""),
        "memory_bandwidth_Bps": "measured: best bandwidth of out-of-place aten.add / aten.clone (allocation included) "
                                f"and copies into kept buffers over working sets {min(mem):.3g}-{max(mem):.3g} B; "
                                "the memory curve scales it down for working sets that do not fit a cache "
                                "(outputs that get fresh pages left out of it: fresh_pages)",
        "fresh_pages": "measured: clones of 16-128 MiB against copies of the same size into a buffer allocated once; "
                       "their difference per output byte, median over the clones of 32 MiB and more",
        "launch_s": "measured: median of 1-element calls of aten add, neg and sum (dispatch, allocation, kernel)"
                    + err("launch", "launch (both floors)"),
        "launch_scalar_s": "measured: median of 1-element calls with a Python-scalar operand: aten mul by a "
                           "Python float, mul.Scalar, add.Scalar (the scalar is wrapped into a tensor per call)",
        "efficiency": f"measured ({mode} mode): matmul {primary} {errors['matmul'].text()}"
                      + err("matmul_other_dtypes", f"matmul {', '.join(others)} (curves per dtype)")
                      + f"; memory {errors['memory'].text()}"
                      + err("vector", "vector (silu, gelu, softmax, log-softmax, layer norm and their backwards, rsqrt, "
                                      "exp, tanh, sigmoid; each op its own fraction, vector_by_op; FLOPs as the rules "
                                      "count them)")
                      + err("attention", "attention (causal sdpa forward, causal FLOPs)")
                      + err("attention_backward", "attention_backward (causal sdpa backward)")
                      + err("access", "run (copies of strided views and transposes, adds broadcast inside the "
                                      "row, middle-dim sums, ops on expanded inputs)"),
    }
    if not any(s.kind == "launch" and s.op in LAUNCH_SCALAR_OPS for s in samples):
        del text["launch_scalar_s"]
    if device is None or "fresh_pages" not in device:
        del text["fresh_pages"]
    return {k: v.rstrip("; ") for k, v in text.items()}


def _mesh(job: Job, options: Options) -> MeshSpec:
    return options.mesh or default_mesh(job.world)


def calibrate(job: Job, options: Options) -> dict:
    """Measure, fit and (rank 0) write a profile; every rank returns the dict."""
    settings = MODE_SETTINGS[options.mode]
    items = compute_items(job, options.mode)
    groups = Groups(job, _mesh(job, options)) if job.world > 1 else None
    if groups:
        items += collective_items(groups, options.mode)
    mesh = _mesh(job, options)
    headline = (f"measuring {len(items)} items on {job.world} rank(s) ({options.mode} mode"
                + (f", mesh {'x'.join(map(str, mesh.shape))}" if groups else "") + ")")
    rounds = MODE_ROUNDS[options.mode]
    monitor = monitor_for(job, options.threads)
    if monitor:
        monitor.start()
    try:
        with Bar(job, sum(i.weight * (rounds if i.repeat else 1) for i in items), headline) as bar:
            samples = run_items(job, items, settings, bar, "calibrate", rounds=rounds)
    finally:
        if monitor:
            monitor.stop()
    load = monitor.record() if monitor else None
    compute = [s for s in samples if isinstance(s, ComputeSample)]
    collectives = [s for s in samples if isinstance(s, CollectiveSample)]
    primary = primary_dtype(job)
    device = fitting.fit_device(compute, primary=primary)
    if "tf32" not in device["peak_flops"] and not job.is_cuda:
        device["peak_flops"]["tf32"] = device["peak_flops"]["fp32"]
    if options.base:  # dtypes not measured here (fp8): the base's datasheet figure, said so in sources
        for dtype, value in options.base.device.peak_flops:
            device["peak_flops"].setdefault(dtype, value)
    tiers, measured_tiers = initial_interconnect(job, options.base)
    draft = {"format": "autoshard.hw_profile/1", "name": "draft", "source": "measured",
             "device": {"name": "draft", "memory_bytes": 2**30, **device}, "interconnect": tiers}
    profile = HardwareProfile.from_dict(draft)
    coll_errors: dict = {}
    if collectives:
        profile, coll_errors = fitting.fit_interconnect(collectives, mesh, profile, measured_tiers)
    compute_errors = {}
    for kind, member in ERROR_GROUPS.items():
        chosen = [s for s in compute if member(s, primary)]
        if chosen:
            predicted = [fitting.predict_compute(s, profile) for s in chosen]
            compute_errors[kind] = fitting.FitError.of(fitting.relative_errors(predicted, [s.seconds for s in chosen]))
    sources = device_sources(compute, primary, compute_errors, options.mode, device)
    if options.base:
        extra = sorted({d for d, _ in options.base.device.peak_flops} - {s.dtype for s in compute} - {"tf32"})
        if extra:
            sources["peak_flops"] += f"; {', '.join(extra)}: not measured, datasheet figure of {options.base.name}"
    fitted_tiers = [t.to_dict() for t in profile.interconnect]
    for fitted, draft_tier in zip(fitted_tiers, tiers):
        if "source" in draft_tier:
            fitted["source"] = draft_tier["source"]
    backend = job.backend or "none"
    tier_sources = {t["tier"]: f"measured: {job.world} {backend} ranks ({job.world // max(job.local_world, 1)} "
                               f"host(s)), mesh {'x'.join(map(str, mesh.shape))}, groups "
                               + ", ".join("+".join(mesh.dim_names[d] for d in g) for g in (groups.groups if groups else []))
                    for t in fitted_tiers[:measured_tiers]}
    method = (f"autoshard calibrate-hardware ({options.mode}): {job.world} rank(s), {options.threads} thread(s) per rank, "
              f"compute timed on every rank at once (contended, as in a real step); {MODE_ROUNDS[options.mode]} passes over all items, per "
              f"item and pass {settings.warmup} warm-up calls, {settings.trials} trials of >= {settings.min_trial_s * 1e3:g} ms after a barrier, max over ranks, "
              "outliers (3 MADs) dropped, median over trials, fastest pass; figures fitted through costmodel.compute / costmodel.collectives")
    # measured beside the collectives' fit, after the timed items: every rank takes part
    overlap = measure_contention(job, groups, settings) if groups else unmeasured_overlap(job, options.base)
    data = assemble_profile(name=options.name or "measured", job=job, threads=options.threads, device=device,
                            device_sources=sources, interconnect=fitted_tiers, tier_sources=tier_sources,
                            collective_errors=coll_errors, compute_errors=compute_errors,
                            measured_tiers=measured_tiers, method=method, load=load, overlap=overlap)
    warnings = check_profile(data, base=options.base) + list(data["calibration"].get("warnings", []))
    if not job.all_agree(True):  # every rank got here: the run is complete
        raise RuntimeError("another rank did not complete the calibration")
    if job.rank == 0:
        if options.measurements:
            from autoshard.calibrate.output import write_measurements

            write_measurements(options.measurements, mesh, compute, collectives)
        if options.output:
            write_profile(options.output, data)
        for line in warnings:
            print(f"warning: {line}")
        if load is not None:
            print(f"calibrate-hardware: {load.text()}")
        _print_summary(data, options.output)
    return data


def _print_summary(data: dict, path: str | None) -> None:
    device = data["device"]
    peaks = ", ".join(f"{k} {v / 1e9:.4g}" for k, v in device["peak_flops"].items())
    print(f"device: {device['name']}")
    print(f"  peak GFLOP/s: {peaks}; memory {device['memory_bandwidth_Bps'] / 1e9:.4g} GB/s (best); "
          f"launch {device['launch_s'] * 1e6:.3g} us")
    for tier in data["interconnect"]:
        for kind, fit in tier["collectives"].items():
            print(f"  {tier['tier']}.{kind}: alpha {fit['alpha_s'] * 1e6:.4g} us, per step "
                  f"{fit.get('alpha_per_step_s', 0) * 1e6:.4g} us, {1 / fit['beta_s_per_byte'] / 1e9:.4g} GB/s"
                  f"  ({data['calibration']['fit_error'].get(tier['tier'] + '.' + kind, 'copied')})")
    print("  fit error (max relative): " + ", ".join(f"{k} {v:.0%}" for k, v in data["calibration"]["fit_error"].items()
                                                     if "." not in k))
    if path:
        print(f"profile written to {path}")


def check(job: Job, options: Options, profile: HardwareProfile) -> list[CheckItem]:
    """Time the held-out set on every rank and (rank 0) print the report,
    write it (``--report``) and plot it (``--plot``)."""
    settings = MODE_SETTINGS[options.mode]
    device_type = "cuda" if job.is_cuda else "cpu"  # the ops timed are the ones a plan runs on this device
    specs = synthetic_ops(options.mode, device_type)
    model_spec, overrides = options.model or ((DEFAULT_MODEL[0], {}) if options.mode == "tiny" else DEFAULT_MODEL)
    # ops timed alone are priced alone: a correction's step figures are a whole step's costs
    # (check_scope), judged by whole-step prediction, not added to each isolated op
    priced = kernel_profile(profile)
    specs += model_ops(model_spec, overrides, priced, device_type)
    mesh = _mesh(job, options)
    groups = Groups(job, mesh) if job.world > 1 else None
    items = reference_check_items(job, priced, groups) + compute_check_items(specs, priced)
    if groups:
        items += collective_check_items(groups, options.mode, priced)
    started = time.time()
    rounds = MODE_ROUNDS[options.mode]
    monitor = monitor_for(job, options.threads)
    if monitor:
        monitor.start()
    try:
        with Bar(job, sum(i.weight * (rounds if i.repeat else 1) for i in items),
                 f"checking {len(items)} held-out items on {job.world} rank(s)") as bar:
            results: list[CheckItem] = run_items(job, items, settings, bar, "check", rounds=rounds)
    finally:
        if monitor:
            monitor.stop()
    if job.rank == 0:
        calib = profile.calibration
        header = [
            f"- profile: `{profile.name}` ({profile.source}, calibrated {calib.date or '-'} on {calib.ranks or '?'} "
            f"rank(s)); fingerprint `{profile.fingerprint}`",
            f"- check: {job.world} rank(s) ({job.backend or 'single process'}), mesh "
            f"{'x'.join(map(str, mesh.shape))}, {options.threads} thread(s) per rank, mode {options.mode}, "
            f"{time.time() - started:.0f} s",
            f"- held-out model: `{model_spec}` {json.dumps(overrides)} (forward + backward ops, views excluded)",
            f"- machine load during this check: {monitor.record().text()}",
            "- machine load during the calibration: "
            + (calib.load.text() if calib.load else "not recorded (profile calibrated before loads were recorded)"),
        ]
        if monitor.record().foreign:
            header.append("- WARNING: this check ran under foreign load: measured times are slower than the host "
                          "when quiet, errors and drift are skewed by it")
        header += [f"- WARNING (profile): {w}" for w in calib.warnings]
        if options.command:
            header.append(f"- command: `{options.command}`")
        if calib.ranks and calib.ranks != job.world:
            header.append(f"- WARNING: the profile was measured on {calib.ranks} rank(s), this check runs {job.world}: "
                          "compute contention differs")
        text = markdown_report(results, header=header, scope=scope_lines(profile, results))
        print(text)
        if options.report:
            from solver.io import write_text_atomic

            write_text_atomic(options.report, text)
        if options.plot:
            plot_report(results, options.plot, title=f"{profile.name}: predicted vs measured (held-out)")
    return results
