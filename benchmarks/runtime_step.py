"""Step time of autoshard's runtime vs hand-written PyTorch parallelism, on CPU/gloo.

4 gloo ranks on loopback (one thread each), meshes ``2x2`` and ``4``, per model
(MLP ``mlp.small`` shrunk, LLaMA ``llama3.tiny`` widened so that compute is
not negligible):

* the solver's plan (``solve_prepared(prep)``, default memory limit of the
  ``cpu-gloo`` profile) and the expert baselines through autoshard's runtime
  (``solve_prepared(prep, baseline=...)``: ``as-ddp``, ``as-fsdp``, ``as-tp``,
  ``as-fsdp+tp``), each with its cost-model prediction ``plan.estimate.step_s``;
* hand-written PyTorch on the same model, batch and ranks:
  ``torch-ddp`` (``DistributedDataParallel`` over the 4 ranks), ``torch-fsdp2``
  (``fully_shard`` per block and root over the 4 ranks), ``torch-tp``
  (``parallelize_module`` with Colwise/Rowwise plans on the ``tp`` mesh dim,
  gradients of the data-parallel dim all-reduced in one bucket by hand).

A step is forward + backward + ``AdamW.step()`` + ``zero_grad``; the table
gives the median over ``--steps`` steps after ``--warmup``, the max over ranks
(each step starts after a barrier), and also the forward+backward part alone.
Then: the Spearman rank correlation of predicted vs measured step times of
autoshard's plans, the solved plan vs the fastest hand-written baseline, and
autoshard's DDP plan vs ``DistributedDataParallel``.

    python benchmarks/runtime_step.py                      # both models, both meshes (~3-4 min on 2 cores)
    python benchmarks/runtime_step.py --models mlp --meshes 4 --steps 5
    python benchmarks/runtime_step.py --calibrate-first    # price with a profile measured now, on this host

Predictions are only as good as the profile: ``--profile`` names the one to
price with (default ``cpu-gloo``), ``--calibrate-first`` measures one in the
same run (``autoshard calibrate-hardware --quick`` on 4 ranks, ~2-4 min) and
prices with it; the output names the profile, its calibration load and the
load now.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

PROFILE = "cpu-gloo"
MESHES = {"2x2": ((2, 2), ("dp", "tp")), "4": ((4,), ("tp",))}
# mlp: 4 blocks of 512 -> 2048 -> 512, batch 64; llama: 2 layers, dim 256, vocab 2048, batch 8 x 64
MODELS = {
    "mlp": ("mlp.small", {"dim": 512, "hidden_dim": 2048, "n_layers": 4, "batch_size": 64}),
    "llama3": ("llama3.tiny", {"dim": 256, "n_layers": 2, "n_heads": 8, "n_kv_heads": 4, "vocab_size": 2048,
                               "multiple_of": 64, "max_seq_len": 128, "batch_size": 8, "seq_len": 64}),
}
TP_PLANS = {
    "mlp": {"layers.*.w1": "col", "layers.*.w2": "row"},
    "llama3": {"layers.*.attention.wq": "col", "layers.*.attention.wk": "col", "layers.*.attention.wv": "col",
               "layers.*.attention.wo": "row", "layers.*.feed_forward.w1": "col",
               "layers.*.feed_forward.w3": "col", "layers.*.feed_forward.w2": "row"},
}
AUTOSHARD = ("solved", "ddp", "fsdp", "tp", "fsdp+tp")


def _factory(name: str):
    import importlib

    module, fn = name.rsplit(".", 1)
    return getattr(importlib.import_module(f"examples.models.{module}"), fn)


def _example(model_key: str, device: str | None = None):
    factory, kwargs = MODELS[model_key]
    return _factory(factory)(**kwargs, **({"device": device} if device else {}))


# ----------------------------------------------------------------------------- planning (parent)
def make_plans(models: list[str], meshes: list[str], out: Path, time_limit: float) -> dict[tuple[str, str, str], dict]:
    from costmodel.steps import COLLECTIVE_STEPS

    from autoshard.plan.solve import prepare, solve_prepared

    plans = {}
    for mk in models:
        for mesh_key in meshes:
            shape, names = MESHES[mesh_key]
            model, inputs = _example(mk, "meta")
            t = time.perf_counter()
            prep = prepare(model, inputs, shape, names, profile=PROFILE)
            print(f"# planned {mk} on {mesh_key}: prepare {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
            for kind in AUTOSHARD:
                try:
                    plan = solve_prepared(prep, baseline=None if kind == "solved" else kind, time_limit=time_limit)
                except Exception as exc:  # noqa: BLE001 - a baseline that does not apply
                    print(f"# {mk} {mesh_key} {kind}: {exc}", file=sys.stderr)
                    continue
                path = out / f"{mk}-{mesh_key}-{kind}.json"
                plan.save(path)
                bucketed = {m for b in plan.buckets for m in b.members}  # a bucket issues one collective
                colls = [st for r in plan.redistributions for st in r.steps
                         if st.collective in COLLECTIVE_STEPS and r.to not in bucketed] + list(plan.buckets)
                sharded_mm = sum(1 for n in plan.nodes if n.op == "aten.mm.default" and n.out and "S" in (n.out[0] or ""))
                plans[(mk, mesh_key, kind)] = {"path": str(path), "predicted_s": plan.estimate.step_s,
                                               "portfolio": plan.options.get("portfolio"), "collectives": len(colls),
                                               "sharded_mm": sharded_mm,
                                               "mm": sum(1 for n in plan.nodes if n.op == "aten.mm.default")}
    return plans


# ----------------------------------------------------------------------------- ranks
def _timed(step, steps: int, warmup: int) -> tuple[float, float]:
    """Median step and forward+backward times of ``step()`` (returns fwd+bwd seconds)."""
    full, fb = [], []
    for i in range(warmup + steps):
        dist.barrier()
        t = time.perf_counter()
        fwd_bwd = step()
        elapsed = time.perf_counter() - t
        if i >= warmup:
            full.append(elapsed)
            fb.append(fwd_bwd)
    return statistics.median(full), statistics.median(fb)


def _train_step(model, opt, batch):
    def step():
        t = time.perf_counter()
        loss = model(*batch)
        loss.backward()
        fb = time.perf_counter() - t
        opt.step()
        opt.zero_grad(set_to_none=True)
        return fb
    return step


def _batch_slice(inputs, rank: int, parts: int):
    return tuple(x.chunk(parts, 0)[rank] for x in inputs)


def _autoshard(mk, mesh_key, plan_path, traced, steps, warmup):
    from torch.distributed.device_mesh import init_device_mesh

    from autoshard.runtime import shard

    shape, names = MESHES[mesh_key]
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    model, inputs = _example(mk)
    sharded = shard(model, mesh, plan_path, inputs, traced=traced)
    opt = torch.optim.AdamW(sharded.parameters(), lr=1e-4)
    return _timed(_train_step(sharded, opt, inputs), steps, warmup)


def _torch_ddp(mk, mesh_key, steps, warmup):
    from torch.nn.parallel import DistributedDataParallel

    model, inputs = _example(mk)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    batch = _batch_slice(inputs, dist.get_rank(), dist.get_world_size())
    return _timed(_train_step(ddp, opt, batch), steps, warmup)


def _torch_fsdp2(mk, mesh_key, steps, warmup):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model, inputs = _example(mk)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = _batch_slice(inputs, dist.get_rank(), dist.get_world_size())
    return _timed(_train_step(model, opt, batch), steps, warmup)


def _torch_tp(mk, mesh_key, steps, warmup):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    shape, names = MESHES[mesh_key]
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
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
    dp = mesh.size() // tp_mesh.size()
    dp_group = mesh.get_group("dp") if dp > 1 else None
    coord = mesh.get_coordinate()
    batch = _batch_slice(inputs, coord[0], dp) if dp > 1 else inputs
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    params = [p for p in model.parameters()]

    def step():
        t = time.perf_counter()
        loss = model(*batch)
        loss.backward()
        if dp_group is not None:  # data parallel over dp: one bucket, averaged
            grads = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in params]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=dp_group)
            flat /= dp
            offset = 0
            for g in grads:
                g.copy_(flat[offset: offset + g.numel()].view_as(g))
                offset += g.numel()
        fb = time.perf_counter() - t
        opt.step()
        opt.zero_grad(set_to_none=True)
        return fb

    return _timed(step, steps, warmup)


HANDWRITTEN = {"torch-ddp": _torch_ddp, "torch-fsdp2": _torch_fsdp2, "torch-tp": _torch_tp}


def _worker(rank: int, world: int, init_file: str, out_dir: str, plans: dict, models: list[str], meshes: list[str],
            steps: int, warmup: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    from autoshard.trace import trace_joint

    results = {}
    try:
        for mk in models:
            model, inputs = _example(mk)
            traced = trace_joint(model, inputs)
            for mesh_key in meshes:
                for kind in AUTOSHARD:
                    info = plans.get((mk, mesh_key, kind))
                    if info is None:
                        continue
                    results[(mk, mesh_key, f"as-{kind}")] = _autoshard(mk, mesh_key, info["path"], traced, steps, warmup)
                for name, fn in HANDWRITTEN.items():
                    if name != "torch-tp" and mesh_key != meshes[0]:
                        # DDP and FSDP2 run over all 4 ranks: the same job on either mesh
                        results[(mk, mesh_key, name)] = results[(mk, meshes[0], name)]
                        continue
                    results[(mk, mesh_key, name)] = fn(mk, mesh_key, steps, warmup)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


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
        done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        if done.returncode:
            raise SystemExit(f"runtime_step: --calibrate-first: the calibration failed (exit {done.returncode})")
    calib = load(profile).calibration
    during = calib.load.text() if calib.load else "load not recorded"
    now = " ".join(f"{v:.2f}" for v in os.getloadavg())
    name = "calibrated in this run" if args.calibrate_first else profile
    return profile, (f"Profile: {name} (calibrated {calib.date or '-'}; {during}). Load average now (1/5/15 min): "
                     f"{now}.")


def main(argv: list[str] | None = None) -> int:
    global PROFILE
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mlp,llama3")
    parser.add_argument("--meshes", default="2x2,4")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--time-limit", type=float, default=8.0, help="solver seconds per plan")
    parser.add_argument("--profile", default=PROFILE, help="hardware profile (name or path) to price with")
    parser.add_argument("--calibrate-first", action="store_true",
                        help="calibrate this host (--quick, 4 ranks) first and price with that profile")
    args = parser.parse_args(argv)
    models, meshes = args.models.split(","), args.meshes.split(",")
    world = 4
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        PROFILE, profile_line = select_profile(args, Path(tmp))
        print(f"# {profile_line}", file=sys.stderr, flush=True)
        plans = make_plans(models, meshes, Path(tmp), args.time_limit)
        planned = time.perf_counter() - start
        ctx = mp.start_processes(_worker, args=(world, str(Path(tmp) / "store"), tmp, plans, models, meshes,
                                                args.steps, args.warmup), nprocs=world, start_method="spawn")
        del ctx
        per_rank = [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=False) for r in range(world)]
    measured = {k: (max(r[k][0] for r in per_rank), max(r[k][1] for r in per_rank)) for k in per_rank[0]}

    print(f"## Runtime step time, CPU/gloo, {world} ranks x 1 thread on {os.cpu_count()} cores "
          f"({platform.processor() or platform.machine()}), torch {torch.__version__}")
    print(f"\nMedian of {args.steps} steps after {args.warmup} warm-up, max over ranks; step = forward + backward + "
          f"AdamW; predicted = plan.estimate.step_s with profile {PROFILE}. Planning took {planned:.0f} s, "
          f"total {time.perf_counter() - start:.0f} s. {profile_line}\n")
    summary = []
    for mk in models:
        for mesh_key in meshes:
            rows = [(name, measured[(mk, mesh_key, name)]) for name in
                    [f"as-{k}" for k in AUTOSHARD] + list(HANDWRITTEN) if (mk, mesh_key, name) in measured]
            print(f"### {mk} ({MODELS[mk][1]}), mesh {mesh_key}\n")
            print("| variant | predicted ms | measured step ms | measured fwd+bwd ms | collectives / step | "
                  "matmuls on shards |")
            print("|---|---:|---:|---:|---:|---:|")
            pred, meas = [], []
            for name, (step_s, fb_s) in rows:
                info = plans.get((mk, mesh_key, name[3:])) if name.startswith("as-") else None
                p = f"{info['predicted_s'] * 1e3:.2f}" if info else "-"
                note = f" (= {info['portfolio']})" if info and info.get("portfolio") else ""
                extra = f"{info['collectives']} | {info['sharded_mm']}/{info['mm']}" if info else "- | -"
                print(f"| {name}{note} | {p} | {step_s * 1e3:.2f} | {fb_s * 1e3:.2f} | {extra} |")
                if info:
                    pred.append(info["predicted_s"])
                    meas.append(step_s)
            rho = spearman(pred, meas)
            solved = measured.get((mk, mesh_key, "as-solved"), (math.nan,))[0]
            fastest_name, fastest = min(((n, measured[(mk, mesh_key, n)][0]) for n in HANDWRITTEN
                                         if (mk, mesh_key, n) in measured), key=lambda t: t[1])
            ddp, as_ddp = measured[(mk, mesh_key, "torch-ddp")], measured.get((mk, mesh_key, "as-ddp"))
            summary.append((mk, mesh_key, rho, solved, fastest_name, fastest, as_ddp, ddp))
            print()
    print("### Targets\n")
    print("| model | mesh | Spearman (autoshard plans) | solved ms | fastest hand-written ms | solved <= fastest | "
          "as-ddp / torch-ddp (step) | (fwd+bwd) |")
    print("|---|---|---:|---:|---:|---|---:|---:|")
    for mk, mesh_key, rho, solved, fname, fastest, as_ddp, ddp in summary:
        ratio = f"{as_ddp[0] / ddp[0]:.2f}" if as_ddp else "-"
        ratio_fb = f"{as_ddp[1] / ddp[1]:.2f}" if as_ddp else "-"
        print(f"| {mk} | {mesh_key} | {rho:.2f} | {solved * 1e3:.2f} | {fname} {fastest * 1e3:.2f} | "
              f"{'yes' if solved <= fastest else 'no'} | {ratio} | {ratio_fb} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
