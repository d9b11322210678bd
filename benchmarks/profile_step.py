"""Where a step of autoshard's layouts goes, next to its torch twin (torch.profiler, CPU/gloo).

For each (model, mesh): the autoshard layouts (``as-ddp``, ``as-fsdp``, the
solved plan) and the hand-written ones (``torch-ddp``, ``torch-fsdp2``), built
as ``benchmarks/runtime_step.py`` builds them, warmed up, then each profiled for
``--steps`` steps in turn on 4 gloo ranks. Per variant, on rank 0: the step
time (median, max over ranks, unprofiled rounds), and from the profile the
self CPU time per group of ops (matmuls, elementwise, copies and
concatenations, allocation, collectives issued, waits, optimizer, Python /
autograd glue), the collectives issued per step, and the waits split by the
waited tensor's shape (a scalar loss all-reduce vs a gradient bucket).
``--optimizer default`` steps torch's for-loop AdamW (as a user's default).

    python benchmarks/profile_step.py --models mlp --meshes 4
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/profile_step.py`: re-executed as the module

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

import torch.distributed as dist

from benchmarks import runtime_step as rs
from benchmarks.common.gloo import spawn
from benchmarks.common.timing import load_average

GROUPS = (  # (group, substrings of profiler event names), first match wins
    ("wait", ("wait_tensor", "wait")),
    ("collective", ("c10d", "gloo", "all_reduce", "all_gather", "reduce_scatter", "allreduce", "allgather")),
    ("matmul", ("mm", "matmul", "linear", "addmm", "bmm", "baddbmm", "_efficient_attention", "flash_attention",
                "scaled_dot_product")),
    ("copy/cat", ("copy_", "cat", "contiguous", "clone", "_to_copy", "reshape", "index_select", "narrow")),
    ("alloc", ("empty", "zeros", "zero_", "fill_", "ones", "new_")),
    ("optimizer", ("adam", "Optimizer", "_fused")),
)


def _group(name: str) -> str:
    low = name.lower()
    for group, keys in GROUPS:
        if any(k.lower() in low for k in keys):
            return group
    return "other ops"


def _profile(step, steps: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(steps):
            dist.barrier()
            step()
    by_group: dict[str, float] = collections.defaultdict(float)
    colls: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    top = []
    for ev in prof.key_averages():
        if ev.key.startswith("ProfilerStep") or ev.key in ("aten::barrier", "c10d::barrier"):
            continue
        by_group[_group(ev.key)] += ev.self_cpu_time_total / steps
        low = ev.key.lower()
        if any(k in low for k in ("all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter",
                                  "all_to_all")) and "wait" not in low:
            colls[ev.key][0] += ev.count // steps
        top.append((ev.self_cpu_time_total / steps, ev.count / steps, ev.key))
    top.sort(reverse=True)
    # which collective the step waits on: a scalar (the loss) or a gradient bucket, told apart by shape
    waits = sorted(((ev.self_cpu_time_total / steps, ev.count / steps, ev.input_shapes)
                    for ev in prof.key_averages(group_by_input_shape=True) if "wait" in ev.key.lower()
                    and ev.key not in ("aten::barrier", "c10d::barrier")), reverse=True)
    return {"groups": dict(by_group), "collectives": {k: v[0] for k, v in colls.items()}, "top": top[:18],
            "total_us": sum(by_group.values()), "waits": waits[:6]}


def _worker(rank, world, plans, models, meshes, steps, warmup, kinds, opt_kind="fused") -> dict:
    results = {}
    for mk, mesh_key, variants in rs.step_variants(plans, models, meshes, kinds, opt_kind,
                                                   handwritten=("torch-ddp", "torch-fsdp2")):
        times = rs.round_robin(variants, steps, warmup)
        for name, step in variants.items():
            prof = _profile(step, steps)
            results[(mk, mesh_key, name)] = {"step_s": times[name][0], "fb_s": times[name][1], **prof}
        print(f"# profiled {mk} on {mesh_key}", file=sys.stderr, flush=True)
    return results if rank == 0 else {}


def report(results: dict, models, meshes) -> list[str]:
    out = []
    groups = [g for g, _ in GROUPS] + ["other ops"]
    for mk in models:
        for mesh_key in meshes:
            rows = {k[2]: v for k, v in results.items() if k[:2] == (mk, mesh_key)}
            out += [f"#### {mk}, mesh {mesh_key}: self CPU ms per step on rank 0 (profiled), step ms unprofiled", "",
                    "| variant | step ms | fwd+bwd ms | " + " | ".join(groups) + " | profiled total | collectives |",
                    "|---|" + "---:|" * (len(groups) + 4) + "---|"]
            for name, r in rows.items():
                colls = ", ".join(f"{k.split('::')[-1]} x{n}" for k, n in sorted(r["collectives"].items()) if n)
                out.append(f"| {name} | {r['step_s'] * 1e3:.1f} | {r['fb_s'] * 1e3:.1f} | "
                           + " | ".join(f"{r['groups'].get(g, 0) / 1e3:.1f}" for g in groups)
                           + f" | {r['total_us'] / 1e3:.1f} | {colls} |")
            out.append("")
            for name, r in rows.items():
                out.append(f"top self-CPU events of {name} (ms/step, calls/step): " + "; ".join(
                    f"{k} {t / 1e3:.1f} ({c:.0f})" for t, c, k in r["top"][:10]))
                if r.get("waits"):
                    out.append(f"waits of {name} by input shape (ms/step, calls/step): " + "; ".join(
                        f"{shapes} {t / 1e3:.1f} ({c:.0f})" for t, c, shapes in r["waits"]))
                out.append("")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mlp,llama3")
    parser.add_argument("--meshes", default="2x2,4")
    parser.add_argument("--kinds", default="ddp,fsdp,solved")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--optimizer", choices=sorted(rs.OPTIMIZERS), default="fused")
    args = parser.parse_args(argv)
    models, meshes, kinds = args.models.split(","), args.meshes.split(","), tuple(args.kinds.split(","))
    load_before = load_average()
    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        plans = rs.make_plans(models, meshes, Path(tmp), 8.0, kinds=kinds,
                              optimizer_impl="fused" if args.optimizer == "fused" else "auto")
        results = spawn(4, _worker, (plans, models, meshes, args.steps, args.warmup, kinds, args.optimizer),
                        Path(tmp) / "ranks",
                        timeout=None, collective_timeout_s=900)[0]
    print(f"load average before {load_before}, after {load_average()}; {time.perf_counter() - t:.0f} s")
    print("\n".join(report(results, models, meshes)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
