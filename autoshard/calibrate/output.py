"""From fitted figures to a profile file on disk, safely.

Why this much care: a hardware profile silently steers every plan the solver
makes. A broken timer (a NaN, a zero, 1e20 B/s) or a half-written file must
never replace a good profile. So:

* :func:`assemble_profile` writes every figure with its source and the fit
  error (``calibration.fit_error``, largest relative error of each fit over
  its points, plus median/p90/max in the figure's ``source`` text);
* :func:`check_profile` validates the result with ``hw_profiles.validate``
  (finite, positive, plausible; the message names the field) and returns
  warnings where a measured figure beats the ``--base`` profile's datasheet
  (faster than the hardware can be: usually a timing bug or caching);
* :func:`write_profile` writes it atomically (temporary file + rename in the
  same folder: ``solver.io.write_text_atomic``), only once the whole run has
  completed, so an interrupted or failed run leaves the previous file
  byte-identical; :func:`write_measurements` writes the raw samples
  (``--measurements``) the same way, as ``autoshard.calibration-measurements/1``.

>>> from hw_profiles import load
>>> check_profile(load("cpu-gloo").to_dict(), base=None)
[]
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
from typing import Any, Mapping, Sequence

import torch

from costmodel.compute import efficiency
from hw_profiles import FORMAT, HardwareProfile, validate
from hw_profiles.profile import COLLECTIVE_KINDS

from autoshard.calibrate.fit import FitError
from autoshard.calibrate.timing import Job

__all__ = ["MEASUREMENTS_FORMAT", "host_description", "device_name", "memory_bytes", "initial_interconnect",
           "assemble_profile", "foreign_load_warning", "check_profile", "write_profile", "measurements_dict", "write_measurements", "to_json"]

MEASUREMENTS_FORMAT = "autoshard.calibration-measurements/1"
"""The ``format`` of the ``--measurements`` file (docs/formats.md)."""


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def host_description() -> str:
    return f"{platform.node()} ({cpu_model()}, {host_cores()} cores, {platform.machine()})"


def device_name(job: Job, threads: int) -> str:
    """What one rank is: a GPU, or a CPU process sharing the host's cores."""
    if job.is_cuda:
        return torch.cuda.get_device_name(job.device)
    share = f", one of {job.local_world} ranks on {host_cores()} cores" if job.local_world > 1 else ""
    return f"CPU process, {threads} thread{'s' if threads > 1 else ''} ({cpu_model()}){share}"


def memory_bytes(job: Job) -> tuple[int, str]:
    """Device memory of one rank, and its source."""
    if job.is_cuda:
        return int(torch.cuda.get_device_properties(job.device).total_memory), "measured: CUDA total_memory"
    with open("/proc/meminfo") as handle:
        total = int(next(line for line in handle if line.startswith("MemTotal")).split()[1]) * 1024
    return total // max(job.local_world, 1), f"measured: /proc/meminfo MemTotal / {job.local_world} ranks on the host"


_PLACEHOLDER = {"alpha_s": 1e-5, "alpha_per_step_s": 0.0, "beta_s_per_byte": 1e-9}


def initial_interconnect(job: Job, base: HardwareProfile | None) -> tuple[list[dict], int]:
    """The tiers of the profile (innermost first) with placeholder figures on
    the ones this job measures, and how many those are. One host: one tier
    (``loopback`` on CPU; on GPUs the base's inner tier, the base's outer
    tiers copied). Several hosts: an intra-host tier of ``LOCAL_WORLD_SIZE``
    ranks and the ``network``. One process measures none: the base's tiers."""
    kinds = {k: dict(_PLACEHOLDER) for k in COLLECTIVE_KINDS}
    copied = [t.to_dict() for t in base.interconnect] if base else []
    if job.world == 1:
        if not base:
            raise ValueError("a single process measures no collectives: run under torchrun (2+ ranks) "
                             "or give --base PROFILE to copy the interconnect figures from")
        for tier in copied:
            tier["source"] = f"not measured (single process): copied from profile {base.name}"
            for fit in tier["collectives"].values():
                fit["source"] = f"not measured: copied from profile {base.name}"
        return copied, 0
    hosts = job.world // max(job.local_world, 1)
    if hosts > 1:
        inner = copied[0]["tier"] if len(copied) > 1 else ("loopback" if not job.is_cuda else "intra_node")
        outer = copied[-1]["tier"] if len(copied) > 1 else "network"
        return [{"tier": inner, "ranks": job.local_world, "collectives": kinds},
                {"tier": outer, "ranks": None, "collectives": {k: dict(v) for k, v in kinds.items()}}], 2
    if job.is_cuda and len(copied) > 1 and copied[0]["ranks"] and copied[0]["ranks"] >= job.world:
        for tier in copied[1:]:
            tier["source"] = f"not measured (one host): copied from profile {base.name}"
            for fit in tier["collectives"].values():
                fit["source"] = f"not measured: copied from profile {base.name}"
        return [{"tier": copied[0]["tier"], "ranks": copied[0]["ranks"], "collectives": kinds}, *copied[1:]], 1
    return [{"tier": "loopback" if not job.is_cuda else "intra_node", "ranks": None, "collectives": kinds}], 1


def assemble_profile(*, name: str, job: Job, threads: int, device: Mapping[str, Any], device_sources: Mapping[str, str],
                     interconnect: list[dict], tier_sources: Mapping[str, str],
                     collective_errors: Mapping[tuple[str, str], FitError], compute_errors: Mapping[str, FitError],
                     measured_tiers: int, method: str, load: Any = None,
                     overlap: Mapping[str, Any] | None = None) -> dict:
    """The profile dict: ``device`` figures and sources, the interconnect with
    a ``source`` on every fitted entry, ``calibration`` metadata (with
    ``load``, a ``hw_profiles.LoadRecord``, and a warning when it was foreign)
    and ``overlap`` (``autoshard.calibrate.measure_overlap``), measured or said not to be."""
    mem, mem_source = memory_bytes(job)
    tiers = []
    for index, tier in enumerate(interconnect):
        tier = json.loads(json.dumps(tier))
        if index < measured_tiers:
            measured = {}
            for kind in COLLECTIVE_KINDS:
                err = collective_errors.get((tier["tier"], kind))
                if err is None or kind not in tier["collectives"]:
                    continue
                fit = tier["collectives"][kind]
                fit = {key: fit.get(key, 0.0) for key in ("alpha_s", "alpha_per_step_s", "beta_s_per_byte")
                       if key != "alpha_per_step_s" or fit.get(key)}
                fit["source"] = f"measured: alpha-beta fit over {err.points} sizes and groups; {err.text()}"
                measured[kind] = fit
            tier["collectives"] = measured
            tier["source"] = tier_sources.get(tier["tier"], "measured")
        tiers.append(tier)
    fit_error = {key: _ceil4(err.max) for key, err in compute_errors.items()}
    fit_error.update({f"{t}.{k}": _ceil4(err.max) for (t, k), err in collective_errors.items()})
    calibration: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": host_description(),
        "torch": torch.__version__,
        "method": method,
        "ranks": job.world,
        "fit_error": fit_error,
    }
    if load is not None:
        calibration["load"] = load.to_dict()
        if load.foreign:
            calibration["warnings"] = [foreign_load_warning(load)]
    launch_scalar = {key: device[key] for key in ("launch_scalar_s", "fresh_pages") if key in device}
    return {
        "format": FORMAT,
        "name": name,
        "source": "measured",
        "device": {
            "name": device_name(job, threads),
            "memory_bytes": mem,
            "peak_flops": dict(device["peak_flops"]),
            "memory_bandwidth_Bps": device["memory_bandwidth_Bps"],
            "launch_s": device["launch_s"],
            **launch_scalar,
            "efficiency": dict(device["efficiency"]),
            "sources": {"name": f"measured on {host_description()}", "memory_bytes": mem_source, **device_sources},
        },
        "interconnect": tiers,
        "calibration": calibration,
        **({"overlap": dict(overlap)} if overlap is not None else {}),
    }


def foreign_load_warning(load: Any) -> str:
    """The warning a calibration under foreign load stores and prints.

    >>> from hw_profiles import LoadRecord
    >>> foreign_load_warning(LoadRecord(2, 4, (6.0, 5.0, 5.0), (7.0, 6.0, 5.0), foreign_load=2.5, foreign=True))[:40]
    'measured under foreign load: other proce'
    """
    return (f"measured under foreign load: other processes kept {load.foreign_load:.2f} threads runnable on average "
            f"(threshold {load.threshold:g}; load average {load.before[0]:.2f} before, {load.after[0]:.2f} after, "
            f"{load.cores} cores, the job's own threads {load.own_threads}); the figures are slower than this host "
            "when quiet: re-run the calibration on a quiet host before shipping them")


def _ceil4(value: float) -> float:
    """Round up to 4 decimals: a stored error bound stays a bound."""
    return math.ceil(value * 1e4 - 1e-9) / 1e4


def check_profile(data: Mapping[str, Any], *, base: HardwareProfile | None) -> list[str]:
    """Raise ``ProfileError`` (naming the field) unless ``data`` is a valid,
    plausible profile; return warnings for figures above the base profile's
    datasheet figures (only compared when the base is a datasheet or published
    profile: their peaks are the datasheet's)."""
    validate(data)
    if base is None or base.source not in ("datasheet", "published"):
        return []
    warnings = []
    device = data["device"]
    for dtype, value in device["peak_flops"].items():
        try:
            sheet = base.device.peak_flops_for(dtype)
        except KeyError:
            continue
        if value > sheet:
            warnings.append(f"device.peak_flops.{dtype}: measured {value:.3g} FLOP/s is above the datasheet's "
                            f"{sheet:.3g} ({base.name})")
    memory = device["efficiency"]["memory"]
    curve = tuple(tuple(p) for p in memory) if isinstance(memory, list) else ((1.0, memory),)
    streaming = device["memory_bandwidth_Bps"] * efficiency(curve, curve[-1][0])
    if streaming > base.device.memory_bandwidth_Bps:
        warnings.append(f"device.memory_bandwidth_Bps: streaming bandwidth {streaming:.3g} B/s (largest working set) "
                        f"is above the datasheet's {base.device.memory_bandwidth_Bps:.3g} ({base.name})")
    for i, tier in enumerate(data["interconnect"]):
        try:
            sheet_tier = base.tier(tier["tier"])
        except KeyError:
            continue
        if not sheet_tier.bandwidth_Bps:
            continue
        for kind, fit in tier["collectives"].items():
            if 1.0 / fit["beta_s_per_byte"] > sheet_tier.bandwidth_Bps:
                warnings.append(f"interconnect[{i}].collectives.{kind}.beta_s_per_byte: bus bandwidth "
                                f"{1 / fit['beta_s_per_byte']:.3g} B/s is above the link's {sheet_tier.bandwidth_Bps:.3g} "
                                f"({base.name})")
    return warnings


def write_profile(path: str | os.PathLike[str], data: Mapping[str, Any]) -> None:
    """Validate, then write ``data`` atomically (the old file stays intact
    until the new one is complete)."""
    from solver.io import write_text_atomic

    validate(data)
    write_text_atomic(path, to_json(data) + "\n")


def measurements_dict(mesh: Any, compute: Sequence[Any], collectives: Sequence[Any]) -> dict[str, Any]:
    """The ``--measurements`` file: the mesh (``MeshSpec``) and every compute
    and collective sample (each with ``to_dict``), under its format string so
    that a reader can tell it from a profile."""
    return {"format": MEASUREMENTS_FORMAT, "mesh": mesh.to_dict(), "compute": [s.to_dict() for s in compute],
            "collectives": [s.to_dict() for s in collectives]}


def write_measurements(path: str | os.PathLike[str], mesh: Any, compute: Sequence[Any],
                       collectives: Sequence[Any]) -> None:
    """Write :func:`measurements_dict` atomically."""
    from solver.io import write_text_atomic

    write_text_atomic(path, json.dumps(measurements_dict(mesh, compute, collectives), indent=1) + "\n")


def to_json(value: Any, indent: int = 0) -> str:
    """JSON with two-space indents, but lists of numbers and curves (lists
    of number pairs) on one line, as the shipped profiles are written.

    >>> print(to_json({"a": [[1, 0.5], [2, 1.0]], "b": {"c": None}}))
    {
      "a": [[1, 0.5], [2, 1.0]],
      "b": {
        "c": null
      }
    }
    """
    def flat(v: Any) -> bool:
        return isinstance(v, (int, float, str, bool)) or v is None

    if isinstance(value, list) and all(flat(v) or (isinstance(v, list) and all(map(flat, v))) for v in value):
        return json.dumps(value)
    pad = "  " * (indent + 1)
    if isinstance(value, dict) and value:
        body = ",\n".join(f"{pad}{json.dumps(k)}: {to_json(v, indent + 1)}" for k, v in value.items())
        return "{\n" + body + "\n" + "  " * indent + "}"
    if isinstance(value, list) and value:
        body = ",\n".join(pad + to_json(v, indent + 1) for v in value)
        return "[\n" + body + "\n" + "  " * indent + "]"
    return json.dumps(value)
