"""A plan's predicted step beside its measured step, part by part (CPU/gloo, every rank at once).

For each autoshard plan of ``benchmarks/runtime_step.py`` (``--kinds``, one mesh), priced
with the default CPU correction (``--profile-correction here``, a fresh
``AUTOSHARD_CACHE_DIR`` measures it): the predicted parts, read from the strategy graph at
the plan's placements (each op node's compute at its chosen strategy, summed per aten op;
the optimizer tail; the relayout copies; the exposed communication, ``plan.estimate``), and
the measured parts on 4 gloo ranks (one thread each): the step, its forward+backward and
its optimizer + zero_grad (timers, max over ranks, median of ``--steps``), and from
``torch.profiler`` (every rank, then the busiest) the self CPU time per aten op, the
collectives' issue and wait, and what is left of the forward+backward outside any op
(Python, the step program's interpreter, autograd glue).

Also per rank: the CPU seconds of the main thread and of the whole process per step (the
other threads: gloo's), and the main thread's CPU inside every aten call. Findings (issue 54
item 6): ``benchmarks/results/calibration.md``.

    python benchmarks/step_parts.py --models mlp --kinds solved,ddp
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/step_parts.py`: re-executed as the module

import argparse
import collections
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks import runtime_step as rs
from benchmarks.common.gloo import spawn
from benchmarks.common.timing import load_average

WAITS = ("wait_tensor", "c10d::wait", "_wait")
ISSUES = ("allreduce", "all_reduce", "allgather", "all_gather", "reduce_scatter", "_reduce_scatter", "broadcast",
          "alltoall", "all_to_all")
OPTIMIZER = ("adam", "_foreach", "lerp", "addcdiv", "addcmul")


def predicted_parts(graph: Any, plan: Any) -> dict[str, Any]:
    """Predicted seconds per aten op (each op node at the plan's strategy) and the estimate's parts."""
    from autoshard.assembly.engine_pricing import chosen_strategies

    per_op: dict[str, float] = collections.defaultdict(float)
    counts: dict[str, int] = collections.defaultdict(int)
    for node, (g, k) in zip(plan.nodes, chosen_strategies(graph, plan)):
        per_op[node.op] += float(g.compute_s[k])
        counts[node.op] += 1
    est = plan.estimate
    ops = sum(per_op.values())
    return {"per_op": dict(per_op), "counts": dict(counts), "ops_s": ops, "step_s": est.step_s,
            "tail_s": max(0.0, est.compute_s - ops), "relayout_s": est.relayout_s, "comm_s": est.comm_s,
            "exposed_s": est.exposed_comm_s or 0.0, "recompute_s": est.recompute_s,
            "step_op_s": graph.profile.device.step_op_s}


def make(models: list[str], mesh_key: str, kinds: tuple[str, ...], out: Path, correction: str) -> dict:
    """Plans of every kind (``runtime_step``'s), each with its predicted parts."""
    from autoshard.search.solve import prepare, solve_prepared

    plans = {}
    shape, names = rs.MESHES[mesh_key]
    for mk in models:
        model, inputs = rs._example(mk, "meta")
        prep = prepare(model, inputs, shape, names, profile=rs.PROFILE, optimizer_impl="fused",
                       profile_correction=correction)
        print(f"# {mk}: correction {prep.options['profile_correction'].get('ratios')}", file=sys.stderr)
        for kind in kinds:
            plan = solve_prepared(prep, baseline=None if kind == "solved" else kind, time_limit=8.0)
            path = out / f"{mk}-{mesh_key}-{kind}.json"
            plan.save(path)
            plans[(mk, mesh_key, kind)] = {"path": str(path), "predicted": predicted_parts(prep.graph, plan)}
    return plans


def _kind(key: str) -> str:
    low = key.lower()
    if any(w in low for w in WAITS):
        return "wait"
    if any(w in low for w in ISSUES):
        return "issue"
    if any(w in low for w in OPTIMIZER):
        return "optimizer"
    return "op"


def _profiled(model, opt, inputs, steps: int) -> dict[str, Any]:
    """Self CPU seconds per aten op and per kind inside forward+backward, and of the optimizer, per step."""
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.common.models import loss_of

    per_op: dict[str, float] = collections.defaultdict(float)
    kinds: dict[str, float] = collections.defaultdict(float)
    fb_wall = opt_wall = 0.0
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            dist.barrier()
            t0 = time.perf_counter()
            with torch.profiler.record_function("## fb"):
                loss_of(model, inputs).backward()
            t1 = time.perf_counter()
            with torch.profiler.record_function("## opt"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            fb_wall += t1 - t0
            opt_wall += time.perf_counter() - t1
    for ev in prof.key_averages():
        if ev.key.startswith("##") or ev.key in ("aten::barrier", "c10d::barrier") or ev.key.startswith("Profiler"):
            continue
        per_op[ev.key] += ev.self_cpu_time_total / 1e6 / steps
        kinds[_kind(ev.key)] += ev.self_cpu_time_total / 1e6 / steps
    return {"per_op": dict(per_op), "kinds": dict(kinds), "fb_wall_s": fb_wall / steps, "opt_wall_s": opt_wall / steps}


class _OpClock(TorchDispatchMode):
    """Per aten op: wall and main-thread CPU seconds inside the call (the rank's own work, whatever
    the other ranks and threads take of the cores meanwhile)."""

    def __init__(self) -> None:
        super().__init__()
        self.wall: dict[str, float] = collections.defaultdict(float)
        self.cpu: dict[str, float] = collections.defaultdict(float)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        w, c = time.perf_counter(), time.thread_time()
        out = func(*args, **(kwargs or {}))
        key = f"aten::{func.__name__.split('.')[0]}" if func.namespace == "aten" else str(func)
        self.cpu[key] += time.thread_time() - c
        self.wall[key] += time.perf_counter() - w
        return out


def _op_clock(step, steps: int) -> dict[str, Any]:
    """:class:`_OpClock` over ``steps`` steps, per step."""
    clock = _OpClock()
    dist.barrier()
    with clock:
        for _ in range(steps):
            step()
    return {"op_cpu": {k: v / steps for k, v in clock.cpu.items()}, "op_wall": {k: v / steps for k, v in clock.wall.items()}}


def _cpu_use(step, steps: int) -> dict[str, float]:
    """Per step: wall seconds, CPU seconds of this rank's main thread and of the whole process (its
    other threads: gloo's, the autograd engine's), unprofiled."""
    dist.barrier()
    wall, main, proc = time.perf_counter(), time.thread_time(), time.process_time()
    for _ in range(steps):
        step()
    return {"wall_s": (time.perf_counter() - wall) / steps, "main_cpu_s": (time.thread_time() - main) / steps,
            "proc_cpu_s": (time.process_time() - proc) / steps}


def _worker(rank: int, world: int, plans: dict, steps: int, warmup: int) -> dict:
    from benchmarks.common.timing import time_rounds
    from torch.distributed.device_mesh import init_device_mesh

    from autoshard.runtime import shard
    from autoshard.trace import trace_joint

    results = {}
    traced = {}
    for (mk, mesh_key, kind), info in plans.items():
        if mk not in traced:
            traced[mk] = trace_joint(*rs._example(mk), target_device="cpu")
        shape, names = rs.MESHES[mesh_key]
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        model, inputs = rs._example(mk)
        sharded = shard(model, mesh, info["path"], inputs, traced=traced[mk])
        opt = rs._optimizer(sharded.parameters(), "fused")
        step = rs.train_step(sharded, inputs, opt)
        timed = time_rounds({"s": step}, rounds=steps, warmup=warmup)["s"]
        cpu = {**_cpu_use(step, steps), **_op_clock(step, steps)}
        prof = _profiled(sharded, opt, inputs, steps)
        results[(mk, mesh_key, kind)] = {"step_s": timed.step_s, "fb_s": timed.part_s, **cpu, **prof}
        print(f"# measured {mk} {mesh_key} {kind} (rank {rank})", file=sys.stderr, flush=True)
    return results


def report(plans: dict, ranks: list[dict]) -> list[str]:
    out = []
    for key, info in plans.items():
        p = info["predicted"]
        meas = [r[key] for r in ranks]
        busiest = max(meas, key=lambda m: m["kinds"].get("op", 0.0))
        step, fb = meas[0]["step_s"], meas[0]["fb_s"]
        ops_meas = max(m["kinds"].get("op", 0.0) for m in meas)
        glue = statistics.median(m["fb_wall_s"] - sum(v for k, v in m["kinds"].items() if k != "optimizer")
                                 for m in meas)
        out += [f"### {' '.join(key)}", "",
                f"step: predicted {p['step_s'] * 1e3:.1f} ms, measured {step * 1e3:.1f} ms (pred/meas "
                f"{p['step_s'] / step:.2f}); fwd+bwd measured {fb * 1e3:.1f}, optimizer+zero_grad {(step - fb) * 1e3:.1f}",
                f"predicted parts: ops {p['ops_s'] * 1e3:.1f} (step_op_s {p['step_op_s'] * 1e6:.1f} us each, "
                f"{sum(p['counts'].values())} ops), optimizer tail {p['tail_s'] * 1e3:.1f}, relayout "
                f"{p['relayout_s'] * 1e3:.1f}, recompute {p['recompute_s'] * 1e3:.1f}, comm {p['comm_s'] * 1e3:.1f} "
                f"(exposed {p['exposed_s'] * 1e3:.1f})",
                "measured (profiled, per rank: ops / issue / wait / optimizer / glue ms): " + "; ".join(
                    f"{m['kinds'].get('op', 0) * 1e3:.1f} / {m['kinds'].get('issue', 0) * 1e3:.1f} / "
                    f"{m['kinds'].get('wait', 0) * 1e3:.1f} / {m['kinds'].get('optimizer', 0) * 1e3:.1f} / "
                    f"{(m['fb_wall_s'] - sum(v for k, v in m['kinds'].items() if k != 'optimizer')) * 1e3:.1f}"
                    for m in meas),
                "CPU per step (wall / main thread / process ms, per rank): " + "; ".join(
                    f"{m['wall_s'] * 1e3:.1f} / {m['main_cpu_s'] * 1e3:.1f} / {m['proc_cpu_s'] * 1e3:.1f}" for m in meas)
                + f"; all ranks' CPU / (2 cores x wall) {sum(m['proc_cpu_s'] for m in meas) / (2 * meas[0]['wall_s']):.2f}",
                f"busiest rank's ops {ops_meas * 1e3:.1f} ms against {p['ops_s'] * 1e3:.1f} predicted "
                f"({ops_meas / p['ops_s']:.2f}x); glue (median rank) {glue * 1e3:.1f} ms", "",
                "| aten op | calls | predicted ms | measured ms (busiest rank) | meas / pred | main-thread CPU ms (median rank) |",
                "|---|---:|---:|---:|---:|---:|"]
        names = {op: "aten::" + op.split(".")[1] for op in p["per_op"]}
        rows = []
        for op, pred in p["per_op"].items():
            m = busiest["per_op"].get(names[op], 0.0)
            rows.append((m, op, pred))
        for m, op, pred in sorted(rows, reverse=True)[:14]:
            cpu = statistics.median(r["op_cpu"].get(names[op], 0.0) for r in meas)
            out.append(f"| {op} | {p['counts'][op]} | {pred * 1e3:.2f} | {m * 1e3:.2f} | {m / pred if pred else 0:.2f} "
                       f"| {cpu * 1e3:.2f} |")
        cpu_kinds: dict[str, float] = collections.defaultdict(float)
        for k, v in meas[0]["op_cpu"].items():
            cpu_kinds[_kind(k)] += v
        out.append("rank 0 main-thread CPU inside aten calls per step, by kind (ms): " + ", ".join(
            f"{k} {v * 1e3:.1f}" for k, v in sorted(cpu_kinds.items())) + "; wall inside them: " + ", ".join(
            f"{k} {sum(v for n, v in meas[0]['op_wall'].items() if _kind(n) == k) * 1e3:.1f}" for k in sorted(cpu_kinds)))
        out.append("")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mlp,llama3")
    parser.add_argument("--mesh", default="2x2", choices=sorted(rs.MESHES))
    parser.add_argument("--kinds", default=",".join(rs.AUTOSHARD))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--profile-correction", default="here", choices=("off", "here", "calibrate"))
    args = parser.parse_args(argv)
    load = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        plans = make(args.models.split(","), args.mesh, tuple(args.kinds.split(",")), Path(tmp),
                     args.profile_correction)
        ranks = spawn(4, _worker, (plans, args.steps, args.warmup), Path(tmp) / "ranks", timeout=None,
                      collective_timeout_s=900)
    print(f"load before {load}, after {load_average()}")
    print("\n".join(report(plans, ranks)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
