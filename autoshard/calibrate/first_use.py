"""Correct a CPU profile on the machine where it is used, at first use: a few
seconds of reference ops, timed on every rank of the job at once (as a step
runs them), against what the profile predicts for the same ops
(``hw_profiles.correction`` has the math; ``correction_cache`` keeps the
result per machine).

The reference set is small and fixed: a launch (1-element add), two square GEMMs
(128^3 and 512^3 fp32) and two thin ones (16 x 512 x 2048 and 16 x 2048 x 512: the
cost per byte a GEMM packs, ``device.matmul_byte_s``), elementwise adds over a cache-resident and a
DRAM-sized working set, a copy, a reduction, two vector-bound ops (silu,
softmax), two reference steps (``autoshard.calibrate.reference_step``: the same
ops as a small MLP's forward and backward, one cache-resident and one whose operands
are cold in the step, against those ops timed alone: what an op, and a byte it
touches, cost in a step beyond its time alone) and, where the job has
ranks, all_reduces of 64 KiB, 1 MiB and 16 MiB, all_gathers and reduce_scatters
of 1 MiB and 16 MiB over all of them, and eight pairs of a gap of compute and an
all_reduce back to back (how late a collective starts after the ranks computed
unsynchronised: the profile's ``overlap.skew_s``). Each op is priced as a plan prices it (``autoshard.rules``'
FLOPs and bytes, ``costmodel.compute.op_time_s``), and sits in the family of the
term that bounds it in the profile (a memory-bound elementwise op corrects the
memory curve, a compute-bound one the vector rate).

A few seconds of timing are a snapshot of that minute: rank 0 samples the
runnable threads of other processes meanwhile (``autoshard.calibrate.load``),
and a correction measured under foreign load (a mean of 0.5 threads or more)
is used with a warning and never cached on disk (one measured at a load average
of 5 priced the benchmark steps 1.4-2.4x too slow). The process keeps it in memory
for :data:`LOADED_REUSE_S` (``here`` only; ``remeasure`` measures again): under load
the measurement itself takes 40-46 s instead of a few (one given-mesh ``autoshard``
call on a loaded 2-core host: 42-46 s with it, 0.2 s without), and re-measuring it on
every call of one script only paid that again for another snapshot of the same load.
``autoshard()`` itself asked twice per call: every rank measures together, then rank 0's
solve asks again and, finding nothing on disk, started ranks of its own to measure anew.

Where the ranks come from: inside a job (a process group of ``ranks`` ranks)
every rank measures together; offline, :func:`corrected_profile` starts
``ranks`` local processes for the few seconds it takes (a CPU profile is
"one rank of a job on this host": alone, a rank would run twice as fast as
four sharing two cores).

>>> sorted({op.label.split()[0] for op in reference_ops()})[:3]
['add', 'copy_', 'mm']
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import math
import os
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from costmodel.collectives import collective_time_s, latency_part_s
from costmodel.compute import op_time_s
from costmodel.mesh import MeshSpec
from hw_profiles import HardwareProfile
from hw_profiles.correction import ProfileCorrection, ReferenceTime

from autoshard.calibrate.correction_cache import load_cached, machine_key, save_cached
from autoshard.calibrate.load import FOREIGN_THRESHOLD, monitor_for
from autoshard.calibrate.reference_step import COLD, SMALL, reference_step, step_bytes
from autoshard.calibrate.timing import Job, Settings, measure
from autoshard.plan.options import PROFILE_CORRECTIONS

__all__ = ["MODES", "RefOp", "reference_ops", "measure_correction", "corrected_profile", "calibrated_profile",
           "resolve_mode"]

MODES = PROFILE_CORRECTIONS
"""``profile_correction`` values: ``here`` (correct for this machine, cached),
``remeasure`` (measure again, replace the cached one), ``off``, ``auto`` (``here``
where the plan runs on the machine that solves it and the profile is a CPU
profile: :func:`autoshard.autoshard`; ``off`` for offline solves)."""

SETTINGS = Settings(warmup=0, trials=2, min_trial_s=0.02, max_item_s=0.5)
"""One visit of a reference op: two trials of at least 20 ms (all ranks start each after a barrier)."""
STEP_SETTINGS = Settings(warmup=0, trials=4, min_trial_s=0.04, max_item_s=2.0)
"""One visit of the step figures' calls (the reference step and its ops, the skew pairs and their
parts): longer, since each figure is a small difference of two totals (two corrections five minutes
apart with two trials of 20 ms gave a skew of 2.7 ms and of 0)."""
ROUNDS = 5
"""Visits of every reference op, interleaved (:func:`_interleaved`); the fastest and the median are kept."""
LOADED_ROUNDS = 3
"""The rounds after which a measurement already under foreign load stops (:func:`_interleaved`): it will
not be cached, and under load each round took 8-9 s of the 42-46 s a correction took; the fastest and
median of three are kept. A quiet measurement always runs :data:`ROUNDS`."""
COLLECTIVES = (("all_reduce", (2**16, 2**20, 2**24)), ("all_gather", (2**20, 2**24)),
               ("reduce_scatter", (2**20, 2**24)))
"""Collective kinds and message sizes (the per-rank buffer ``S`` of ``costmodel.collectives``:
all_gather's output, reduce_scatter's input) over all the job's ranks: each kind's latency and
bandwidth ratios are fitted over its sizes (``hw_profiles.correction``). The largest is 16 MiB:
on 4 gloo ranks sharing 2 cores a collective of 4 MiB is still mostly latency (~5 ms of ~8), and
a fit whose largest message was 4 MiB priced a 16 MiB all_reduce at 11 ms (measured: 30 ms)."""
STEP_SIZES = (SMALL, COLD)
"""The reference steps (layers, width, batch): one cache-resident, one whose operands are cold in the
step (``autoshard.calibrate.reference_step``); their excesses give ``step_op_s`` and ``step_byte_s``."""
IN_STEP_PAIRS = 8
"""(gap of compute, all_reduce) pairs of the ``collective_step`` reference."""
GAP_OPS = 8
"""GEMM + mul + add triples in a gap (128 x 512 x 512 each: ~10 ms on 4 ranks sharing 2 cores, longer
than a scheduler slice, so that the measured skew is the most a step's collective pays)."""
IN_STEP_BYTES = 2**19
THIN_GEMMS = ("mm 16x512x2048", "mm 16x2048x512")
"""The thin reference GEMMs' labels: family ``matmul_thin`` (``hw_profiles.correction``)."""
LOADED_REUSE_S = 600.0
"""How long this process reuses a correction measured under foreign load (never written to disk): the
calls of one script or job within minutes of each other meet the same load; a long-lived process
measures again once it is older, the load having likely changed."""
_LOADED: dict[str, tuple[float, ProfileCorrection]] = {}
"""Corrections measured under foreign load in this process: (``time.monotonic()`` when measured,
correction) by canonical machine key (:func:`corrected_profile`)."""
aten = torch.ops.aten
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RefOp:
    """One reference op: how to run it and how to price it."""

    label: str
    op: Any
    make: Callable[[], tuple]
    """Builds the arguments (real tensors)."""


def _t(*shape: int) -> Callable[[], torch.Tensor]:
    return lambda: torch.randn(*shape)


def reference_ops() -> list[RefOp]:
    """The fixed compute set (module docstring)."""
    return [
        RefOp("add 1", aten.add.Tensor, lambda: (torch.ones(1), torch.ones(1))),
        RefOp("mm 128x128x128", aten.mm.default, lambda: (_t(128, 128)(), _t(128, 128)())),
        RefOp("mm 512x512x512", aten.mm.default, lambda: (_t(512, 512)(), _t(512, 512)())),
        # thin: a data-parallel shard's rows (the benchmark MLP's 16 a rank); packing per byte shows.
        # Two orientations: on 4 ranks sharing 2 cores one 16-row shape ran 1.3x another of the same
        # FLOPs and bytes (benchmarks/gemm_shapes.py); the fit takes their mean behaviour
        RefOp(THIN_GEMMS[0], aten.mm.default, lambda: (_t(16, 512)(), _t(512, 2048)())),
        RefOp(THIN_GEMMS[1], aten.mm.default, lambda: (_t(16, 2048)(), _t(2048, 512)())),
        RefOp("add 65536", aten.add.Tensor, lambda: (_t(65536)(), _t(65536)())),
        RefOp("add 4194304", aten.add.Tensor, lambda: (_t(4194304)(), _t(4194304)())),
        # a copy into a kept buffer: a clone would time the allocator's page faults, not the stream
        RefOp("copy_ 1048576", aten.copy_.default, lambda: (_t(1048576)(), _t(1048576)())),
        RefOp("sum 256x16384", aten.sum.dim_IntList, lambda: (_t(256, 16384)(), [1])),
        RefOp("silu 4096x256", aten.silu.default, lambda: (_t(4096, 256)(),)),
        RefOp("softmax 1024x256", aten._softmax.default, lambda: (_t(1024, 256)(), -1, False)),
    ]


def _price(op: RefOp, args: tuple, profile: HardwareProfile) -> tuple[str, float, float]:
    """(family, size, predicted seconds) of ``op`` on ``profile``, as a plan prices it."""
    from autoshard.rules import load_rules
    from autoshard.rules.core import to_meta

    work = load_rules().compute_kind(op.op, to_meta(args), {})
    out = op.op(*args)
    out_bytes = (float(out.numel() * out.element_size()),)
    predicted = op_time_s(work.kind, flops=work.flops, bytes_accessed=work.bytes_accessed, dtype="fp32",
                          profile=profile, output_bytes=out_bytes, op=str(op.op))
    if op.label == "add 1":
        return "launch", 1.0, predicted
    if work.kind == "matmul":
        return ("matmul_thin" if op.label in THIN_GEMMS else "matmul"), work.flops, predicted
    vector_only = op_time_s(work.kind, flops=work.flops, bytes_accessed=0.0, dtype="fp32", profile=profile,
                            op=str(op.op))
    memory_only = op_time_s(work.kind, flops=0.0, bytes_accessed=work.bytes_accessed, dtype="fp32", profile=profile)
    if vector_only > memory_only:  # the vector term bounds it in this profile
        return "vector", work.flops, predicted
    return "memory", work.bytes_accessed, predicted


def _gemm_bytes() -> dict[str, float]:
    """The bytes each reference GEMM accesses, as the rules price them, by label."""
    from autoshard.rules import load_rules
    from autoshard.rules.core import to_meta

    rules = load_rules()
    return {op.label: float(rules.compute_kind(op.op, to_meta(op.make()), {}).bytes_accessed)
            for op in reference_ops() if op.op is aten.mm.default}


def _interleaved(job: Job, calls: list[Callable[[], Any]], settings: list[Settings],
                 loaded: Callable[[], bool] | None = None) -> tuple[list[float], list[float]]:
    """Seconds per call of each of ``calls``, measured in :data:`ROUNDS` rounds that
    visit every call in turn: ``(fastest round, median round)`` of each. Rounds: a burst
    of other work on the host lands on one round of every family, not on one family.
    Ops are compared with the profile at their fastest round (what the profile's own
    calibration keeps, its fastest pass, and what ``calibrate-hardware --check`` measures);
    the reference step at its median round against its ops' fastest: a step runs at the
    machine's typical speed, and that excess is a cost of the step, not of its ops (priced
    as ``step_op_s``, not by slowing every op down). ``loaded()`` (every rank calls it, and
    every rank gets the same answer): after :data:`LOADED_ROUNDS` rounds, True ends the
    measurement there."""
    for fn in calls:  # warm-up: allocator, caches, connections
        fn()
    rounds: list[list[float]] = [[] for _ in calls]
    for k in range(ROUNDS):
        if k >= LOADED_ROUNDS and loaded is not None and loaded():
            break
        for i, fn in enumerate(calls):
            rounds[i].append(measure(job, fn, settings[i]).seconds)
    return [min(r) for r in rounds], [statistics.median(r) for r in rounds]


def _latency_part(kind: str, nbytes: int, world: int, profile: HardwareProfile) -> float:
    """The part of ``kind``'s price over ``world`` ranks its latency terms make (one tier: a
    host's ranks; ``costmodel.collectives.latency_part_s``)."""
    tier = profile.interconnect[0]
    if len(profile.interconnect) > 1:  # several tiers: the tier of a group of this host's ranks
        tier = next((t for t in profile.interconnect if t.ranks is None or t.ranks >= world), tier)
    return latency_part_s(kind, float(nbytes), world, tier)


def _collective_call(kind: str, nbytes: int, world: int) -> Callable[[], Any]:
    """One ``kind`` over all ranks with the per-rank buffer ``nbytes`` (fp32), as the runtime issues it."""
    if kind == "all_reduce":
        buf = torch.zeros(nbytes // 4)
        return lambda: dist.all_reduce(buf)
    full, shard = torch.zeros(nbytes // 4), torch.zeros(nbytes // 4 // world)
    if kind == "all_gather":
        return lambda: dist.all_gather_into_tensor(full, shard)
    return lambda: dist.reduce_scatter_tensor(shard, full)


def _in_step_calls() -> list[Callable[[], Any]]:
    """The ``collective_step`` reference, then its gap of compute alone and its all_reduce alone."""
    x, w, buf = torch.randn(128, 512), torch.randn(512, 512) / 512**0.5, torch.zeros(IN_STEP_BYTES // 4)

    def gap() -> torch.Tensor:  # small ops one after another, as a step runs them between collectives
        y = x
        for _ in range(GAP_OPS):
            y = aten.add.Tensor(aten.mul.Tensor(aten.mm.default(y, w), 0.5), 0.1)
        return y

    def pairs() -> None:
        for _ in range(IN_STEP_PAIRS):
            gap()
            dist.all_reduce(buf)
    return [pairs, gap, lambda: dist.all_reduce(buf)]


def measure_correction(job: Job, profile: HardwareProfile, key: dict[str, Any]) -> ProfileCorrection:
    """Time the reference set on every rank of ``job`` at once (every rank calls
    this) and return the correction (the same on every rank: times are max over ranks)."""
    started = time.perf_counter()
    load_before = os.getloadavg()
    monitor = monitor_for(job, threads=1)  # rank 0 samples other processes' runnable threads
    if monitor is not None:
        monitor.start()
    priced, calls = [], []
    for op in reference_ops():
        args = op.make()
        priced.append((op.label, *_price(op, args, profile)))
        calls.append(lambda op=op, args=args: op.op(*args))
    steps = [(size, *reference_step(size)) for size in STEP_SIZES]  # (size, step, parts, ops)
    for _, step, parts, _ in steps:
        calls += [lambda step=step: step()] + [fn for fn, _ in parts]
    n_step_calls = sum(1 + len(parts) for _, _, parts, _ in steps)
    n_colls = 0
    if job.world > 1:
        mesh = MeshSpec((job.world,))
        for kind, sizes in COLLECTIVES:
            for nbytes in sizes:
                predicted = collective_time_s(kind, float(nbytes), (0,), mesh, profile)
                latency = _latency_part(kind, nbytes, job.world, profile)
                priced.append((f"{kind} {job.world} ranks {nbytes} B", "collective", float(nbytes), predicted,
                               min(latency, predicted)))
                calls.append(_collective_call(kind, nbytes, job.world))
                n_colls += 1
        calls += _in_step_calls()
    n = len(reference_ops())
    settings = [SETTINGS] * len(calls)
    settings[n:n + n_step_calls] = [STEP_SETTINGS] * n_step_calls  # the reference steps and their ops
    if n_colls:
        settings[-3:] = [STEP_SETTINGS] * 3  # the skew pairs and their parts

    cut: list[bool] = []

    def loaded() -> bool:  # rank 0's monitor decides, so that every rank stops after the same round
        seen = monitor is not None and monitor.record().foreign
        cut.append(job.max_over_ranks([1.0 if seen else 0.0])[0] > 0)
        return cut[-1]

    seconds, typical = _interleaved(job, calls, settings, loaded)
    load = {"before": [round(v, 2) for v in load_before], "after": [round(v, 2) for v in os.getloadavg()],
            "rounds": LOADED_ROUNDS if any(cut) else ROUNDS}
    if monitor is not None:
        monitor.stop()
        load["foreign_load"] = monitor.record().foreign_load
    rest = seconds[:n] + seconds[n + n_step_calls:n + n_step_calls + n_colls]
    times = tuple(ReferenceTime(label, family, size, predicted, measured, *latency)
                  for (label, family, size, predicted, *latency), measured in zip(priced, rest))
    gemm_bytes = _gemm_bytes()  # the GEMM fit splits FLOPs from bytes (``hw_profiles.correction``)
    times = tuple(dataclasses.replace(t, bytes_accessed=gemm_bytes[t.label]) if t.label in gemm_bytes else t
                  for t in times)
    at = n
    for size, _, parts, ops in steps:  # each step against its own ops timed alone, in the same rounds
        step_s, alone = typical[at], seconds[at + 1:at + 1 + len(parts)]
        times += (ReferenceTime(f"reference step {'x'.join(map(str, size))} ({ops} ops)", "step", float(ops),
                                sum(t * count for t, (_, count) in zip(alone, parts)), step_s,
                                bytes_accessed=step_bytes(size)),)
        at += 1 + len(parts)
    if n_colls:  # (gap, all_reduce) pairs back to back against the two timed alone: the ranks' skew
        pairs, gap_s, ar_s = typical[-3:]  # a difference of typical times: the skew a step meets
        times += (ReferenceTime(f"{IN_STEP_PAIRS} x ({GAP_OPS} x (mm 128x512x512, mul, add) + all_reduce "
                                f"{IN_STEP_BYTES} B)", "collective_step", float(IN_STEP_PAIRS),
                                IN_STEP_PAIRS * (gap_s + ar_s), pairs),)
    return ProfileCorrection(
        profile=profile.fingerprint, machine=key, times=times,
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        load=load, seconds=round(time.perf_counter() - started, 2))


def _job_here() -> Job:
    """This process's job: the initialized default process group (CPU), else one process."""
    if dist.is_available() and dist.is_initialized():
        world = dist.get_world_size()
        return Job(rank=dist.get_rank(), world=world, local_world=int(os.environ.get("LOCAL_WORLD_SIZE", world)),
                   backend=dist.get_backend())
    return Job.single()


def _child_main(argv: list[str]) -> int:
    """``python -m autoshard.calibrate.first_use RANK WORLD STORE PROFILE.json KEY_JSON OUT.json``:
    one of the local ranks :func:`_measure_spawned` starts."""
    rank, world, store, profile_path, key_json, out = argv
    torch.set_num_threads(1)  # as the ranks of a CPU job run (one thread each)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=int(rank), world_size=int(world))
    try:
        profile = HardwareProfile.from_dict(json.loads(Path(profile_path).read_text()))
        job = Job(rank=int(rank), world=int(world), local_world=int(world), backend="gloo")
        correction = measure_correction(job, profile, json.loads(key_json))
        if int(rank) == 0:
            Path(out).write_text(json.dumps(correction.to_dict()))
    finally:
        dist.destroy_process_group()
    return 0


def _measure_spawned(profile: HardwareProfile, ranks: int, key: dict[str, Any]) -> ProfileCorrection:
    """Start ``ranks`` local processes that measure together (offline use). Plain
    subprocesses, not multiprocessing: a caller's script need not guard its ``__main__``."""
    import sys

    with tempfile.TemporaryDirectory() as tmp:
        out, profile_path = os.path.join(tmp, "correction.json"), os.path.join(tmp, "profile.json")
        Path(profile_path).write_text(json.dumps(profile.to_dict()))
        args = [os.path.join(tmp, "store"), profile_path, json.dumps(key), out]
        procs = [subprocess.Popen([sys.executable, "-m", "autoshard.calibrate.first_use", str(r), str(ranks), *args],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for r in range(ranks)]
        errors = [p.communicate(timeout=600)[1] for p in procs]
        if any(p.returncode for p in procs) or not os.path.exists(out):
            last = next((e.decode(errors="replace").strip().splitlines()[-1] for e, p in zip(errors, procs)
                         if p.returncode and e.strip()), "no output")
            raise RuntimeError(f"profile correction: a measuring rank failed: {last}")
        return ProfileCorrection.from_dict(json.loads(Path(out).read_text()))


def _broadcast_json(data: Any) -> Any:
    """Rank 0's ``data`` on every rank, as JSON bytes (no pickles)."""
    raw = json.dumps(data).encode() if dist.get_rank() == 0 else b""
    size = torch.tensor([len(raw)])
    dist.broadcast(size, 0)
    buf = torch.zeros(int(size.item()), dtype=torch.uint8)
    if dist.get_rank() == 0:
        buf.copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
    dist.broadcast(buf, 0)
    return json.loads(bytes(buf.tolist()).decode())


def resolve_mode(mode: str, profile: HardwareProfile, *, runs_here: bool) -> str:
    """``auto`` -> ``here`` for a CPU profile whose plan runs where it is solved
    (``runs_here``), else ``off``; other modes as given (``ValueError`` for an unknown one).

    >>> from hw_profiles import load
    >>> resolve_mode("auto", load("cpu-gloo"), runs_here=False), resolve_mode("auto", load("cpu-gloo"), runs_here=True)
    ('off', 'here')
    """
    if mode not in MODES:
        raise ValueError(f"profile_correction: unknown {mode!r} (expected one of {', '.join(MODES)})")
    if mode == "auto":
        return "here" if runs_here and profile.device_type == "cpu" else "off"
    return mode


def corrected_profile(profile: HardwareProfile, *, ranks: int, mode: str = "here", folder: Path | None = None,
                      collective: bool = False, steps_only: bool = False) -> tuple[HardwareProfile, dict[str, Any]]:
    """``profile`` corrected for this machine and what was done, for ``plan.options``
    (``{"mode": "off"}`` when ``mode`` is ``off``). ``ranks``: the job's ranks on this
    host. ``collective``: every rank of the initialized process group calls this
    together (they measure together on a cache miss; rank 0's cache decides);
    otherwise this process alone decides, and measures on ``ranks`` processes it starts.
    ``steps_only``: apply only the step figures (``step_op_s``, ``skew_s``), as ``calibrate`` does
    for the profile it has just measured here.

    >>> from hw_profiles import load
    >>> corrected_profile(load("cpu-gloo"), ranks=4, mode="off")[1]
    {'mode': 'off'}
    """
    if mode == "off":
        return profile, {"mode": "off"}
    if mode == "calibrate":  # this machine's own profile first, then its step figures (same path, "here")
        calibrated, calibration = calibrated_profile(profile, ranks=ranks, folder=folder, collective=collective)
        corrected, record = corrected_profile(calibrated, ranks=ranks, mode="here", folder=folder,
                                              collective=collective, steps_only=True)
        return corrected, {**record, "mode": "calibrate", "calibration": calibration}
    if mode not in ("here", "remeasure"):
        raise ValueError(f"profile_correction: expected here, remeasure, calibrate or off here, got {mode!r}")
    key = machine_key(profile.fingerprint, ranks=ranks)
    memo_key = json.dumps(key, sort_keys=True)
    job = _job_here() if collective else Job.single()
    in_job = job.world > 1
    cached = load_cached(key, folder) if mode == "here" and job.rank == 0 else None
    reused = False  # rank 0 found a correction measured under load by this process, recently
    if cached is None and mode == "here" and job.rank == 0:
        at, loaded = _LOADED.get(memo_key, (-math.inf, None))
        if loaded is not None and time.monotonic() - at <= LOADED_REUSE_S:
            cached, reused = loaded, True
    if in_job:  # every rank takes rank 0's decision: a miss is measured by all of them
        flag = torch.tensor([0 if cached is None else 2 if reused else 1])
        dist.broadcast(flag, 0)
        hit, reused = bool(flag.item()), int(flag.item()) == 2
    else:
        hit = cached is not None
    source = "measured under foreign load earlier in this process, not cached" if reused else "cache"
    if not hit:
        if in_job:
            correction = measure_correction(job, profile, key)
        else:  # one thread per rank, as a CPU job's ranks run (this process may run more: one rank too)
            correction = _measure_spawned(profile, ranks, key)
        source = "measured"
        foreign = float(correction.load.get("foreign_load", 0.0))
        if foreign >= FOREIGN_THRESHOLD:  # a snapshot of someone else's burst: never kept on disk
            source = "measured under foreign load, not cached"
            if job.rank == 0:
                _LOADED[memo_key] = (time.monotonic(), correction)
                log.warning("profile correction measured while other processes kept %.1f threads runnable "
                            "(>= %.1f): its times include their load; not cached (this process reuses it "
                            "for %.0f s)", foreign, FOREIGN_THRESHOLD, LOADED_REUSE_S)
        elif job.rank == 0:
            _LOADED.pop(memo_key, None)  # a quiet measurement replaces the loaded one
            save_cached(correction, folder)
    elif in_job:  # the others read what rank 0 read
        correction = ProfileCorrection.from_dict(_broadcast_json(cached.to_dict() if cached is not None else None))
    else:
        correction = cached
    if steps_only:
        correction = correction.step_figures_only()
    record = {"mode": mode, "source": source, "date": correction.date, "machine": dict(correction.machine),
              "ratios": correction.summary(), "load": dict(correction.load)}
    return correction.apply(profile), record


CALIBRATION = "quick"
"""The ``calibrate-hardware`` mode of a first-use calibration (``profile_correction="calibrate"``;
tests set ``tiny``): on 4 gloo ranks sharing 2 cores ~2 minutes, once per machine."""


def _calibration_key(profile: HardwareProfile, ranks: int) -> dict[str, Any]:
    return {**machine_key(profile.fingerprint, ranks=ranks), "calibration": CALIBRATION}


def _calibrate_spawned(profile: HardwareProfile, ranks: int) -> HardwareProfile:
    """``calibrate-hardware --quick`` on ``ranks`` local processes of one thread each, ``profile``
    as the base (figures it does not measure are copied from it); the profile it writes."""
    import sys

    with tempfile.TemporaryDirectory() as tmp:
        base, out = os.path.join(tmp, "base.json"), os.path.join(tmp, "calibrated.json")
        Path(base).write_text(json.dumps(profile.to_dict()))
        cmd = [sys.executable, "-m", "autoshard.cli", "calibrate-hardware", f"--{CALIBRATION}",
               "--nproc-per-node", str(ranks), "--threads", "1", "--base", base, "-o", out,
               "--name", f"{profile.name}-calibrated-here"]
        log.info("calibrating this machine on %d ranks (%s), once: %s", ranks, CALIBRATION, " ".join(cmd[2:]))
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=3600)
        if done.returncode or not os.path.exists(out):
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"profile correction: the calibration of this machine failed: {last}")
        return HardwareProfile.from_dict(json.loads(Path(out).read_text()))


def calibrated_profile(profile: HardwareProfile, *, ranks: int, folder: Path | None = None,
                       collective: bool = False) -> tuple[HardwareProfile, dict[str, Any]]:
    """This machine's own profile for ``ranks`` ranks on it (``calibrate-hardware`` with
    :data:`CALIBRATION` on local processes, ``profile`` as the base), cached per machine like
    corrections, and what was done. ``collective``: every rank of the job calls this; rank 0
    calibrates on a miss while the others wait, and every rank takes rank 0's profile. A
    calibration measured under foreign load is used once and not cached."""
    from autoshard.calibrate.correction_cache import load_cached_profile, save_cached_profile

    key = _calibration_key(profile, ranks)
    job = _job_here() if collective else Job.single()
    source, calibrated, error = "cache", None, None
    if job.rank == 0:
        try:
            calibrated = load_cached_profile(key, folder)
            if calibrated is None:
                calibrated, source = _calibrate_spawned(profile, ranks), "measured"
                load = calibrated.calibration.load
                if load is not None and load.foreign:
                    source = "measured under foreign load, not cached"
                    log.warning("the calibration of this machine ran beside other processes' work: used for "
                                "this plan only, not cached")
                else:
                    save_cached_profile(key, calibrated, folder)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            if job.world == 1:
                raise
            error = str(exc)  # the other ranks wait for rank 0: they fail with its error, not a timeout
    if job.world > 1:
        shared = _broadcast_json({"error": error} if error else
                                 {"profile": calibrated.to_dict(), "source": source} if job.rank == 0 else None)
        if "error" in shared:
            raise RuntimeError(shared["error"])
        calibrated, source = HardwareProfile.from_dict(shared["profile"]), shared["source"]
    assert calibrated is not None
    return calibrated, {"source": source, "mode": CALIBRATION, "date": calibrated.calibration.date,
                        "profile": calibrated.fingerprint}


if __name__ == "__main__":
    import sys

    raise SystemExit(_child_main(sys.argv[1:]))
