"""Step time of autoshard's runtime vs hand-written PyTorch parallelism, on CPU/gloo.

4 gloo ranks on loopback (one thread each), meshes ``2x2`` and ``4``, per model
(MLP ``mlp.small`` shrunk, LLaMA ``llama3.tiny`` widened so that compute is
not negligible; ``--models unseen``: a transformer written outside the
examples, ``benchmarks/common/unseen_model.py``, not in the default run):

* the solver's plan (``solve_prepared(prep)``, default memory limit of the
  ``cpu-gloo`` profile) and the expert baselines through autoshard's runtime
  (``solve_prepared(prep, baseline=...)``: ``as-ddp``, ``as-fsdp``, ``as-tp``,
  ``as-fsdp+tp``), each with its cost-model prediction ``plan.estimate.step_s``
  (the simulated schedule, ``costmodel.overlap``); the solver's plan also with
  ``compile=True`` (``as-solved+compile``: the per-rank step compiled by
  inductor);
* hand-written PyTorch on the same model, batch and ranks:
  ``torch-ddp`` (``DistributedDataParallel`` over the 4 ranks), ``torch-fsdp2``
  (``fully_shard`` per block and root over the 4 ranks), ``torch-tp``
  (``parallelize_module`` with Colwise/Rowwise plans on the ``tp`` mesh dim,
  gradients of the data-parallel dim all-reduced in one bucket by hand).

A step is forward + backward + ``AdamW.step()`` + ``zero_grad``, the same
optimizer for every variant (``AdamW(fused=True)`` by default: torch's CPU
kernel, which also steps DTensor parameters; ``--optimizer default`` for
torch's per-tensor loop). All variants of one (model, mesh) are built first and
then stepped in turn, one step each round, so that they share the machine's
conditions; each step starts after a barrier and is timed as the max over
ranks. The tables give medians over ``--steps`` rounds after ``--warmup``
(the first steps of autoshard's runtime interpret, trace and compile), and the
forward+backward part alone. Then per table: the median |error| and Spearman
rank correlation of predicted vs measured steps of autoshard's plans (the
compiled row excluded: the cost model prices eager kernels); and the targets:
the solved plan vs the fastest hand-written variant, autoshard's DDP and FSDP
layouts vs ``DistributedDataParallel`` and FSDP2.

One rank: the DDP plan on a mesh of 1 (no communication) vs eager PyTorch in
one process, stepped in turn (the runtime's own overhead).

    python benchmarks/runtime_step.py -o benchmarks/results/runtime_step.md   # ~10 min on 2 cores
    python benchmarks/runtime_step.py --models mlp --meshes 4 --steps 5 --no-compile
    python benchmarks/runtime_step.py --models unseen --meshes 4 --kinds ddp --handwritten torch-ddp --no-one-rank
    python benchmarks/runtime_step.py --calibrate-first    # price with a profile measured now, on this host

Predictions are only as good as the profile: ``--profile`` names the one to
price with (default ``cpu-gloo``), ``--calibrate-first`` measures one in the
same run (``autoshard calibrate-hardware --quick`` on 4 ranks, ~2-4 min) and
prices with it; the output names the profile, its calibration load and the
load now.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/runtime_step.py`: re-executed as the module

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist

from benchmarks.common import gloo
from benchmarks.common.models import load
from benchmarks.common.timing import device_sync, load_average, time_rounds, train_step

ROOT = Path(__file__).resolve().parents[1]

PROFILE = "cpu-gloo"
DEVICE = "cpu"
"""Where the ranks' tensors live: ``cuda`` when ``benchmarks/gpu_check.py`` part r runs these comparisons
on 4 gloo ranks sharing one GPU (gloo takes CUDA tensors; NCCL refuses ranks that share a GPU)."""
MESHES = {"2x2": ((2, 2), ("dp", "tp")), "4": ((4,), ("tp",)), "1": ((1,), ("dp",))}
# mlp: 4 blocks of 512 -> 2048 -> 512, batch 64; llama: 2 layers, dim 256, vocab 2048, batch 8 x 64
MODELS = {
    "mlp": ("mlp.small", {"dim": 512, "hidden_dim": 2048, "n_layers": 4, "batch_size": 64}),
    "llama3": ("llama3.tiny", {"dim": 256, "n_layers": 2, "n_heads": 8, "n_kv_heads": 4, "vocab_size": 2048,
                               "multiple_of": 64, "max_seq_len": 128, "batch_size": 8, "seq_len": 64}),
    # a transformer written outside the examples, as a user would (issue 54 item 4): not in the default run
    "unseen": ("benchmarks.common.unseen_model:transformer", {"dim": 256, "n_layers": 2, "vocab_size": 2048,
                                                              "batch_size": 16, "seq_len": 64}),
}
TP_PLANS = {
    "mlp": {"layers.*.w1": "col", "layers.*.w2": "row"},
    "llama3": {"layers.*.attention.wq": "col", "layers.*.attention.wk": "col", "layers.*.attention.wv": "col",
               "layers.*.attention.wo": "row", "layers.*.feed_forward.w1": "col",
               "layers.*.feed_forward.w3": "col", "layers.*.feed_forward.w2": "row"},
    # qkv is fused: its column split hands each rank a mix of q/k/v columns, the kernels and collectives
    # of a permuted split (a timing baseline, not the model's numbers)
    "unseen": {"layers.*.qkv": "col", "layers.*.proj": "row", "layers.*.fc": "col", "layers.*.out": "row"},
}
AUTOSHARD = ("solved", "ddp", "fsdp", "tp", "fsdp+tp")
CORRECTIONS: dict[tuple[str, str], dict] = {}
"""(model, mesh) -> ``plan.options["profile_correction"]`` of its plans."""


def _example(model_key: str, device: str | None = None):
    factory, kwargs = MODELS[model_key]
    device = device or (DEVICE if DEVICE != "cpu" else None)
    return load(factory, kwargs, **({"device": device} if device else {}))


# ----------------------------------------------------------------------------- planning (parent)
def make_plans(models: list[str], meshes: list[str], out: Path, time_limit: float,
               kinds: tuple[str, ...] = AUTOSHARD, optimizer_impl: str = "auto",
               correction: str = "off", device_type: str = "cpu") -> dict[tuple[str, str, str], dict]:
    """Plans of every kind, each priced with the optimizer as the run steps it (``optimizer_impl``:
    ``fused`` for ``--optimizer fused``, else torch's CPU default, the for-loop), with the profile
    corrected for this host first where ``correction`` says so (``here``, ``remeasure``: the
    solve option ``profile_correction``; measured on the mesh's ranks), traced for ``device_type``."""
    from costmodel.redistribute_steps import COLLECTIVE_STEPS

    from autoshard.search.solve import prepare, solve_prepared

    plans = {}
    for mk in models:
        for mesh_key in meshes:
            shape, names = MESHES[mesh_key]
            model, inputs = _example(mk, "meta")
            t = time.perf_counter()
            prep = prepare(model, inputs, shape, names, profile=PROFILE, optimizer_impl=optimizer_impl,
                           profile_correction=correction, device_type=device_type)
            CORRECTIONS[(mk, mesh_key)] = dict(prep.options["profile_correction"])
            if correction != "off":  # the machine's speed then: rows measured later say how far it drifted
                from autoshard.calibrate.correction_cache import load_cached, machine_key
                from hw_profiles import load as load_profile

                calibrated = CORRECTIONS[(mk, mesh_key)].get("calibration", {}).get("profile")  # mode calibrate
                cached = load_cached(machine_key(calibrated or load_profile(PROFILE).fingerprint,
                                                 ranks=math.prod(shape)))
                steps_then = [t.measured_s for t in (cached.times if cached else ()) if t.family == "step"]
                if steps_then:
                    CORRECTIONS[(mk, mesh_key)]["reference_step_s"] = steps_then[0]
            print(f"# planned {mk} on {mesh_key}: prepare {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
            for kind in kinds:
                try:
                    plan = solve_prepared(prep, baseline=None if kind == "solved" else kind, time_limit=time_limit)
                except Exception as exc:  # noqa: BLE001 - a baseline that does not apply
                    print(f"# {mk} {mesh_key} {kind}: {exc}", file=sys.stderr)
                    continue
                path = out / f"{mk}-{mesh_key}-{kind}.json"
                plan.save(path)
                bucketed = {m for b in plan.buckets for m in b.members}  # a bucket issues one collective
                gathered = {tuple(m) for g in plan.gather_buckets for m in g.members}
                colls = [st for r in plan.redistributions for st in r.steps
                         if st.collective in COLLECTIVE_STEPS and r.to not in bucketed
                         and (r.tensor, r.to, r.input_index) not in gathered]
                colls += list(plan.buckets) + list(plan.gather_buckets)
                sharded_mm = sum(1 for n in plan.nodes if n.op == "aten.mm.default" and n.out and "S" in (n.out[0] or ""))
                plans[(mk, mesh_key, kind)] = {"path": str(path), "predicted_s": plan.estimate.step_s,
                                               "portfolio": plan.options.get("portfolio"), "collectives": len(colls),
                                               "peak": plan.estimate.peak_memory_bytes,
                                               "sharded_mm": sharded_mm,
                                               "mm": sum(1 for n in plan.nodes if n.op == "aten.mm.default")}
    return plans


# ----------------------------------------------------------------------------- ranks
OPTIMIZERS = {"fused": {"fused": True}, "default": {}}


def _optimizer(params, kind: str):
    """AdamW; DTensor and plain parameters in separate groups (torch's fused and
    foreach kernels take one kind per call: TP leaves norms plain)."""
    from torch.distributed.tensor import DTensor

    params = list(params)
    groups = [{"params": g} for g in ([p for p in params if isinstance(p, DTensor)],
                                      [p for p in params if not isinstance(p, DTensor)]) if g]
    return torch.optim.AdamW(groups, lr=1e-4, **OPTIMIZERS[kind])


def _train_step(model, opt, batch, after_backward=None):
    return train_step(model, batch, opt, sync=device_sync(DEVICE), after_backward=after_backward)


def _batch_slice(inputs, rank: int, parts: int):
    return tuple(x.chunk(parts, 0)[rank] for x in inputs)


def _autoshard(mk, mesh_key, plan_path, traced, opt_kind, compile_=False):
    from torch.distributed.device_mesh import init_device_mesh

    from autoshard.runtime import shard

    shape, names = MESHES[mesh_key]
    mesh = init_device_mesh(DEVICE, shape, mesh_dim_names=names)
    model, inputs = _example(mk)
    sharded = shard(model, mesh, plan_path, inputs, traced=traced, compile=compile_)
    return _train_step(sharded, _optimizer(sharded.parameters(), opt_kind), inputs)


def _torch_ddp(mk, mesh_key, opt_kind):
    from torch.nn.parallel import DistributedDataParallel

    model, inputs = _example(mk)
    ddp = DistributedDataParallel(model)
    batch = _batch_slice(inputs, dist.get_rank(), dist.get_world_size())
    return _train_step(ddp, _optimizer(ddp.parameters(), opt_kind), batch)


def _torch_fsdp2(mk, mesh_key, opt_kind):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(DEVICE, (dist.get_world_size(),))
    model, inputs = _example(mk)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    batch = _batch_slice(inputs, dist.get_rank(), dist.get_world_size())
    return _train_step(model, _optimizer(model.parameters(), opt_kind), batch)


def _torch_tp(mk, mesh_key, opt_kind):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    shape, names = MESHES[mesh_key]
    mesh = init_device_mesh(DEVICE, shape, mesh_dim_names=names)
    tp_mesh = mesh["tp"]
    model, inputs = _example(mk)
    plan = {}
    for pattern, kind in TP_PLANS[mk].items():
        for i in range(len(model.layers)):
            plan[pattern.replace("*", str(i))] = ColwiseParallel() if kind == "col" else RowwiseParallel()
    parallelize_module(model, tp_mesh, plan)
    if mk == "llama3":  # local heads, as torchtitan does
        for layer in model.layers:
            layer.attention.n_heads //= tp_mesh.size()
            layer.attention.n_kv_heads //= tp_mesh.size()
    if mk == "unseen":
        for layer in model.layers:
            layer.n_heads //= tp_mesh.size()
    dp = mesh.size() // tp_mesh.size()
    dp_group = mesh.get_group("dp") if dp > 1 else None
    coord = mesh.get_coordinate()
    batch = _batch_slice(inputs, coord[0], dp) if dp > 1 else inputs
    params = [p for p in model.parameters()]

    def all_reduce_dp() -> None:  # data parallel over dp: one bucket, averaged
        grads = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=dp_group)
        flat /= dp
        offset = 0
        for g in grads:
            g.copy_(flat[offset: offset + g.numel()].view_as(g))
            offset += g.numel()

    return _train_step(model, _optimizer(params, opt_kind), batch,
                       after_backward=all_reduce_dp if dp_group is not None else None)


HANDWRITTEN = {"torch-ddp": _torch_ddp, "torch-fsdp2": _torch_fsdp2, "torch-tp": _torch_tp}


def round_robin(variants: dict[str, Any], steps: int, warmup: int) -> dict[str, tuple[float, float]]:
    """Median (step, fwd+bwd) seconds of every variant, max over ranks, stepping them in turn."""
    return {name: (t.step_s, t.part_s) for name, t in time_rounds(variants, rounds=steps, warmup=warmup).items()}


def step_variants(plans: dict, models: list[str], meshes: list[str], kinds: tuple[str, ...], opt_kind: str,
                  handwritten: tuple[str, ...] = tuple(HANDWRITTEN), compile_: bool = False,
                  ) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """``(model, mesh, {variant: step})`` per (model, mesh): the autoshard plans of ``kinds``
    found in ``plans`` (the model traced once per model) and the hand-written ``handwritten``."""
    from autoshard.trace import trace_joint

    for mk in models:
        model, inputs = _example(mk)
        traced = trace_joint(model, inputs, target_device=DEVICE)
        for mesh_key in meshes:
            variants = {}
            for kind in kinds:
                info = plans.get((mk, mesh_key, kind))
                if info is not None:
                    variants[f"as-{kind}"] = _autoshard(mk, mesh_key, info["path"], traced, opt_kind)
            if compile_ and (mk, mesh_key, "solved") in plans:
                variants["as-solved+compile"] = _autoshard(mk, mesh_key, plans[(mk, mesh_key, "solved")]["path"],
                                                           traced, opt_kind, compile_=True)
            for name in handwritten:
                variants[name] = HANDWRITTEN[name](mk, mesh_key, opt_kind)
            yield mk, mesh_key, variants


def _machine_speed(rank: int, world: int) -> float:
    """Seconds of the profile correction's reference step (``autoshard.calibrate.reference_step``)
    now, timed as the correction times it (every rank at once, the median of its rounds, max over
    ranks): how fast the machine runs this minute, comparable with the correction's own figure."""
    from autoshard.calibrate.first_use import ROUNDS, STEP_SETTINGS
    from autoshard.calibrate.reference_step import reference_step
    from autoshard.calibrate.timing import Job, measure

    ref, _, _ = reference_step()
    ref()
    job = Job(rank=rank, world=world, local_world=world, backend="gloo")
    return statistics.median(measure(job, ref, STEP_SETTINGS).seconds for _ in range(ROUNDS))


def _worker(rank: int, world: int, plans: dict, models: list[str], meshes: list[str], steps: int, warmup: int,
            opt_kind: str, compile_: bool, device: str = "cpu",
            handwritten: tuple[str, ...] = tuple(HANDWRITTEN)) -> dict:
    global DEVICE
    DEVICE = device  # a spawned process imports this module afresh
    results = {}
    for mk, mesh_key, variants in step_variants(plans, models, meshes, AUTOSHARD, opt_kind, handwritten,
                                                compile_=compile_):
        speed = _machine_speed(rank, world)  # a row measured minutes after the correction: did the machine drift?
        results[(mk, mesh_key, "_reference_step")] = (speed, speed)
        for name, value in round_robin(variants, steps, warmup).items():
            results[(mk, mesh_key, name)] = value
        print(f"# measured {mk} on {mesh_key}", file=sys.stderr, flush=True)
    return results if rank == 0 else {}


def _one_rank(rank: int, world: int, plans: dict, models: list[str], steps: int, warmup: int, opt_kind: str,
              device: str = "cpu") -> dict:
    """The DDP plan on a mesh of 1 vs eager PyTorch, stepped in turn (module docstring)."""
    global DEVICE
    DEVICE = device
    from torch.distributed.device_mesh import init_device_mesh

    from autoshard.runtime import shard

    out = {}
    mesh = init_device_mesh(DEVICE, (1,), mesh_dim_names=("dp",))
    for mk in models:
        model, inputs = _example(mk)
        eager = _train_step(model, _optimizer(model.parameters(), opt_kind), inputs)
        model, inputs = _example(mk)
        sharded = shard(model, mesh, plans[(mk, "1", "ddp")]["path"], inputs)
        ours = _train_step(sharded, _optimizer(sharded.parameters(), opt_kind), inputs)
        out[mk] = round_robin({"eager": eager, "autoshard": ours}, 3 * steps, warmup)
    return out


def measure_all(plans: dict, models: list[str], meshes: list[str], tmp: Path, *, steps: int, warmup: int,
                opt_kind: str, compile_: bool, device: str = "cpu", world: int = 4,
                handwritten: tuple[str, ...] = tuple(HANDWRITTEN), one_rank: bool = True) -> tuple[dict, dict]:
    """Every variant of every (model, mesh) on ``world`` spawned gloo ranks (the autoshard plans in
    ``plans``, the ``handwritten`` ones), then the one-rank comparison unless ``one_rank`` is False
    (``plans`` must hold each model's ``ddp`` plan on mesh ``1``): ``(measured, one)`` as
    :func:`_report` reads them. ``device="cuda"``: every rank's tensors on GPU 0."""
    measured = gloo.spawn(world, _worker, (plans, models, meshes, steps, warmup, opt_kind, compile_, device,
                                           handwritten), tmp / "ranks", timeout=None, device=device,
                          collective_timeout_s=900)[0]
    if not one_rank:
        return measured, {}
    one = gloo.spawn(1, _one_rank, (plans, models, steps, warmup, opt_kind, device), tmp / "one", timeout=None,
                     device=device, collective_timeout_s=900)[0]
    return measured, one


# ----------------------------------------------------------------------------- report
def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""

    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return r

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return num / den if den else float("nan")


def select_profile(args: argparse.Namespace, tmp: Path) -> tuple[str, str]:
    """(profile name or path to price with, a line saying which and under what load)."""
    import subprocess

    from hw_profiles import load

    profile = args.profile
    if args.calibrate_first:
        profile = str(tmp / "calibrated.json")
        cmd = [sys.executable, "-m", "autoshard.cli", "calibrate-hardware", "--nproc-per-node", "4", "--quick",
               "-o", profile]
        print(f"# calibrating first: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
        done = subprocess.run(cmd, cwd=ROOT)  # `python -m` from the root: this checkout's autoshard
        if done.returncode:
            raise SystemExit(f"runtime_step: --calibrate-first: the calibration failed (exit {done.returncode})")
    calib = load(profile).calibration
    during = calib.load.text() if calib.load else "load not recorded"
    now = load_average()
    name = "calibrated in this run" if args.calibrate_first else profile
    return profile, (f"Profile: {name} (calibrated {calib.date or '-'}; {during}). Load average now (1/5/15 min): "
                     f"{now}.")


def main(argv: list[str] | None = None) -> int:
    global PROFILE
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mlp,llama3")
    parser.add_argument("--meshes", default="2x2,4")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--time-limit", type=float, default=8.0, help="solver seconds per plan")
    parser.add_argument("--profile", default=PROFILE, help="hardware profile (name or path) to price with")
    parser.add_argument("--calibrate-first", action="store_true",
                        help="calibrate this host (--quick, 4 ranks) first and price with that profile")
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="fused")
    parser.add_argument("--profile-correction", choices=("off", "here", "remeasure", "calibrate"), default="off",
                        help="correct the profile for this host before pricing (solve option profile_correction)")
    parser.add_argument("--no-compile", action="store_true", help="leave out the compile=True rows")
    parser.add_argument("--kinds", default=",".join(AUTOSHARD),
                        help="autoshard plans to step (a subset of solved,ddp,fsdp,tp,fsdp+tp: a shorter run)")
    parser.add_argument("--handwritten", default=",".join(HANDWRITTEN),
                        help="hand-written variants to step (a subset of torch-ddp,torch-fsdp2,torch-tp)")
    parser.add_argument("--no-one-rank", action="store_true", help="leave out the one-rank comparison")
    parser.add_argument("-o", "--output", help="also write the report (markdown) to this file")
    args = parser.parse_args(argv)
    models, meshes = args.models.split(","), args.meshes.split(",")
    kinds, handwritten = tuple(args.kinds.split(",")), tuple(args.handwritten.split(","))
    unknown = sorted((set(kinds) - set(AUTOSHARD)) | (set(handwritten) - set(HANDWRITTEN)))
    if unknown or not handwritten:
        parser.error(f"--kinds / --handwritten: unknown {', '.join(unknown)}" if unknown else
                     "--handwritten: name at least one")
    world = 4
    start = time.perf_counter()
    load_before = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        PROFILE, profile_line = select_profile(args, Path(tmp))
        print(f"# {profile_line}", file=sys.stderr, flush=True)
        impl = "fused" if args.optimizer == "fused" else "auto"
        fix = args.profile_correction
        if fix == "remeasure":  # once per rank count, up front: every plan of a rank count is priced alike
            from autoshard.calibrate.first_use import corrected_profile
            from hw_profiles import load

            for ranks in (world, 1):
                corrected_profile(load(PROFILE), ranks=ranks, mode="remeasure")
            fix = "here"
        plans = make_plans(models, meshes, Path(tmp), args.time_limit, kinds=kinds, optimizer_impl=impl,
                           correction=fix)
        if not args.no_one_rank:
            plans.update(make_plans(models, ["1"], Path(tmp), args.time_limit, kinds=("ddp",), optimizer_impl=impl,
                                    correction=fix))
        planned = time.perf_counter() - start
        measured, one = measure_all(plans, models, meshes, Path(tmp), steps=args.steps, warmup=args.warmup,
                                    opt_kind=args.optimizer, compile_=not args.no_compile and "solved" in kinds,
                                    handwritten=handwritten, one_rank=not args.no_one_rank)
    lines = _report(args, argv, models, meshes, plans, measured, one, planned, time.perf_counter() - start,
                    load_before, load_average(), profile_line)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        from solver.io import write_text_atomic

        write_text_atomic(args.output, text)
    return 0


def _report(args, argv, models, meshes, plans, measured, one, planned, total, load_before, load_after,
            profile_line) -> list[str]:
    import datetime

    command = "python benchmarks/runtime_step.py " + " ".join(argv if argv is not None else sys.argv[1:])
    out = [f"## Runtime step time, CPU/gloo, 4 ranks x 1 thread on {os.cpu_count()} cores "
           f"({platform.processor() or platform.machine()}), torch {torch.__version__}", "",
           f"Command: `{command.strip()}`; run {datetime.datetime.now().isoformat(timespec='minutes')} on "
           f"{platform.node()}; load average (1, 5, 15 min) before {load_before}, after {load_after}.", "",
           f"Median of {args.steps} rounds after {args.warmup} warm-up, variants stepped in turn, max over ranks; "
           f"step = forward + backward + AdamW ({args.optimizer}) + zero_grad; predicted = plan.estimate.step_s "
           f"(simulated schedule) with profile {PROFILE}. Planning took {planned:.0f} s, total {total:.0f} s. "
           f"{profile_line}", ""]
    summary = []
    for mk in models:
        for mesh_key in meshes:
            names = [f"as-{k}" for k in AUTOSHARD] + ["as-solved+compile"] + list(HANDWRITTEN)
            rows = [(name, measured[(mk, mesh_key, name)]) for name in names if (mk, mesh_key, name) in measured]
            fix = CORRECTIONS.get((mk, mesh_key), {"mode": "off"})
            fix_line = ("Profile correction: off." if fix["mode"] == "off" else
                        f"Profile correction: {fix['mode']} ({fix['source']} {fix['date']}, load {fix['load']}): "
                        f"measured / profile {json.dumps(fix['ratios'])}.")
            speed = measured.get((mk, mesh_key, "_reference_step"))
            if speed is not None:
                at = fix.get("reference_step_s")
                fix_line += (f" Machine speed: the correction's reference step took {speed[0] * 1e3:.2f} ms just "
                             f"before this row" + (f" ({speed[0] / at:.2f}x its {at * 1e3:.2f} ms when the correction "
                                                   f"was measured)" if at else "") + ".")
            out += [f"### {mk} ({MODELS[mk][1]}), mesh {mesh_key}", "", fix_line, "",
                    "| variant | predicted ms | measured step ms | pred / meas | measured fwd+bwd ms | "
                    "collectives / step | matmuls on shards | predicted peak MiB |",
                    "|---|---:|---:|---:|---:|---:|---:|---:|"]
            pred, meas = [], []
            for name, (step_s, fb_s) in rows:
                kind = name[3:] if name.startswith("as-") and not name.endswith("+compile") else None
                info = plans.get((mk, mesh_key, kind)) if kind else None
                p = f"{info['predicted_s'] * 1e3:.2f}" if info else "-"
                ratio = f"{info['predicted_s'] / step_s:.2f}" if info else "-"
                note = f" (= {info['portfolio']})" if info and info.get("portfolio") else ""
                extra = (f"{info['collectives']} | {info['sharded_mm']}/{info['mm']} | {info['peak'] / 2**20:.1f}"
                         if info else "- | - | -")
                out.append(f"| {name}{note} | {p} | {step_s * 1e3:.2f} | {ratio} | {fb_s * 1e3:.2f} | {extra} |")
                if info:
                    pred.append(info["predicted_s"])
                    meas.append(step_s)
            errors = [abs(p / m - 1) for p, m in zip(pred, meas)]
            rho = spearman(pred, meas)
            get = lambda n: measured.get((mk, mesh_key, n), (math.nan, math.nan))  # noqa: E731
            fastest_name, fastest = min(((n, get(n)[0]) for n in HANDWRITTEN if (mk, mesh_key, n) in measured),
                                        key=lambda t: t[1], default=("-", math.nan))
            summary.append((mk, mesh_key, rho, statistics.median(errors) if errors else math.nan, get("as-solved")[0],
                            fastest_name, fastest, get("as-ddp"), get("torch-ddp"), get("as-fsdp"),
                            get("torch-fsdp2"), get("as-solved+compile")[0]))
            out.append("")
    out += ["### Targets", "",
            "| model | mesh | median abs(pred/meas - 1) | Spearman | solved ms | fastest hand-written ms | "
            "solved / fastest | as-ddp / torch-ddp (step, fwd+bwd) | as-fsdp / torch-fsdp2 (step, fwd+bwd) | "
            "solved / solved+compile |",
            "|---|---|---:|---:|---:|---|---:|---|---|---:|"]
    for mk, mesh_key, rho, err, solved, fname, fastest, as_ddp, ddp, as_fsdp, fsdp, comp in summary:
        out.append(f"| {mk} | {mesh_key} | {err:.2f} | {rho:.2f} | {solved * 1e3:.2f} | {fname} {fastest * 1e3:.2f} | "
                   f"{solved / fastest:.2f} | {as_ddp[0] / ddp[0]:.2f}, {as_ddp[1] / ddp[1]:.2f} | "
                   f"{as_fsdp[0] / fsdp[0]:.2f}, {as_fsdp[1] / fsdp[1]:.2f} | "
                   f"{solved / comp if comp == comp else math.nan:.2f} |")
    out += ["", "### One rank (no communication): the DDP plan on a mesh of 1 vs eager PyTorch", "",
            "| model | eager step ms | autoshard step ms | ratio | eager fwd+bwd ms | autoshard fwd+bwd ms | ratio |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for mk in (m for m in models if m in one):  # none with --no-one-rank
        e, a = one[mk]["eager"], one[mk]["autoshard"]
        out.append(f"| {mk} | {e[0] * 1e3:.2f} | {a[0] * 1e3:.2f} | {a[0] / e[0]:.3f} | {e[1] * 1e3:.2f} | "
                   f"{a[1] * 1e3:.2f} | {a[1] / e[1]:.3f} |")
    return out


if __name__ == "__main__":
    raise SystemExit(main())
