"""Which mesh? The mesh search on LLaMA-3 8B and 70B at 64 H100s in nodes of 8.

For each model (its own process, so its peak RSS is its own): the search
(``autoshard.search.mesh_search.search_mesh``: every layout of 64 devices in
nodes of 8, bf16 parameters with an fp32 master copy and fp32 AdamW state as
``benchmarks/solve_time.py`` prices them, memory limit 80 GiB, no cache) with
its wall time, the layouts considered / cut / solved, the chosen one; then the
torchtitan-style layouts a person would pick by hand, priced by the same cost
model on the same trace: FSDP over all 64 (1-D mesh, ``fsdp`` pins) and
FSDP+TP with TP 8 inside a node (``8x8`` mesh ``dp,tp``, ``fsdp+tp`` pins).
Writes ``benchmarks/results/mesh_choice.md``. Not a test.

    python -m benchmarks.mesh_choice                  # both models
    python -m benchmarks.mesh_choice --only 8b --time-limit 600
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/mesh_choice.py`: re-executed as the module

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common.models import load

CONFIGS = {
    # one sequence of 2048 tokens per GPU, as benchmarks/solve_time.py
    "8b": ("llama3_8b", {"seq_len": 2048, "batch_size": 64}),
    # half a sequence per GPU: one per GPU does not fit 80 GiB without activation
    # recomputation, which the strategy graph does not model yet
    "70b": ("llama3_70b", {"seq_len": 2048, "batch_size": 32}),
}
DEVICES, PER_NODE = 64, 8
LIMIT = 80 * 2**30
HAND = (("FSDP", (64,), ("dp",), "fsdp"), ("FSDP+TP (TP 8 in a node)", (8, 8), ("dp", "tp"), "fsdp+tp"))


def run_one(config: str, time_limit: float, jobs: int | None) -> dict:
    """One model in this process; returns the row."""
    from autoshard.plan.layout_report import layouts_table
    from autoshard.search.mesh_search import search_mesh
    from autoshard.search.solve import prepare, solve_prepared
    from autoshard.trace import trace_joint

    factory, overrides = CONFIGS[config]
    model, inputs = load(f"llama3.{factory}", overrides, dtype="bfloat16", device="meta")
    load_before = os.getloadavg()
    cpu0 = _cpu_s()
    t0 = time.perf_counter()
    plan = search_mesh(model, inputs, DEVICES, PER_NODE, profile="h100-sxm-80gb", time_limit=time_limit, jobs=jobs,
                       cache_dir=False, mixed_precision=True, memory_limit=LIMIT)
    wall = time.perf_counter() - t0
    cpu = _cpu_s() - cpu0
    load_after = os.getloadavg()
    search = plan.options["mesh_search"]
    rows = search["layouts"]
    chosen = next(r for r in rows if r["chosen"])
    row = {"config": config, "model": factory, **overrides, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
           "trace_s": search["trace_s"],
           "jobs": search["jobs"], "time_limit_s": time_limit, "load": [round(x, 1) for x in (*load_before,
                                                                                               *load_after)],
           "considered": len(rows), **{o: sum(r["outcome"] == o for r in rows) for o in
                                       ("solved", "cut", "no_fit", "skipped", "error")},
           "chosen": {"shape": chosen["shape"], "dim_names": chosen["dim_names"], "step_s": chosen["step_s"],
                      "peak_gib": chosen["peak_memory_bytes"] / 2**30, "status": chosen["solver_status"]},
           "table": "\n".join(layouts_table(plan.options)), "hand": []}
    traced = trace_joint(model, inputs, target_device="cuda")  # H100 plans hold the CUDA kernels, as the search's do
    for name, shape, names, baseline in HAND:
        t = time.perf_counter()
        prep = prepare(model, inputs, shape, names, profile="h100-sxm-80gb", mixed_precision=True, traced=traced)
        try:
            hand = solve_prepared(prep, memory_limit=LIMIT, baseline=baseline, time_limit=120)
            row["hand"].append({"name": name, "mesh": "x".join(map(str, shape)), "step_s": hand.estimate.step_s,
                                "peak_gib": hand.estimate.peak_memory_bytes / 2**30, "status": hand.solver.status,
                                "seconds": round(time.perf_counter() - t, 1)})
        except ValueError as exc:  # does not fit 80 GiB, or does not apply
            row["hand"].append({"name": name, "mesh": "x".join(map(str, shape)), "error": " ".join(str(exc).split())})
    row["rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return row


def _cpu_s() -> float:
    """CPU seconds of this process and of its finished children (the search's workers)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _child(config: str, time_limit: float, jobs: int | None) -> dict:
    argv = [sys.executable, "-m", "benchmarks.mesh_choice", "--child", config, "--time-limit", str(time_limit)]
    if jobs is not None:
        argv += ["--jobs", str(jobs)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=7200)
    if out.returncode != 0:
        return {"config": config, "error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(rows: list[dict], command: str) -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lines = ["# Mesh choice: LLaMA-3 8B and 70B on 64 H100s in nodes of 8", "",
             f"Command: `{command}`  ",
             f"Machine: {platform.machine()}, {cores} cores, Python {platform.python_version()}; "
             f"date {datetime.date.today().isoformat()}.  ",
             "Model: bf16 parameters, fp32 master copy and fp32 AdamW state (`mixed_precision`), sequences of "
             "2048 tokens; H100 profile (datasheet), 8 GPUs per node, memory limit 80 GiB per GPU; no layout "
             "cache. Hand-chosen layouts are priced by the same cost model: the expert pins, activations free.",
             "", "| model | batch | layouts | cut | solved | no fit | skipped | error | chosen | step s | peak GiB "
             "| FSDP (64) step s | FSDP+TP (8x8) step s | chosen vs best hand | search wall s | search CPU s | jobs "
             "| load avg before / after | RSS GiB |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        if "error" in r and "chosen" not in r:
            lines.append(f"| {r['config']} | error: {r['error']} |")
            continue
        hand = {h["name"]: h for h in r["hand"]}

        def step(name: str) -> str:
            h = hand.get(name, {})
            return f"{h['step_s']:.4f}" if "step_s" in h else f"no plan ({h.get('error', '?')[:60]})"

        fits = [h["step_s"] for h in r["hand"] if "step_s" in h]
        versus = f"{r['chosen']['step_s'] / min(fits):.4f}" if fits else "-"
        c = r["chosen"]
        lines.append(
            f"| {r['model']} | {r['batch_size']} | {r['considered']} | {r['cut']} | {r['solved']} | {r['no_fit']} "
            f"| {r['skipped']} | {r['error']} | {'x'.join(map(str, c['shape']))} ({','.join(c['dim_names'])}) "
            f"| {c['step_s']:.4f} | {c['peak_gib']:.1f} | {step(HAND[0][0])} | {step(HAND[1][0])} | {versus} "
            f"| {r['wall_s']:.0f} | {r['cpu_s']:.0f} | {r['jobs']} | {r['load'][0]} / {r['load'][3]} "
            f"| {r['rss_gib']:.2f} |")
    for r in rows:
        if "table" in r:
            lines += ["", f"## {r['model']}, batch {r['batch_size']}: every layout", r["table"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", metavar="CONFIG", help=argparse.SUPPRESS)
    parser.add_argument("--only", nargs="+", choices=sorted(CONFIGS), help="models to run (default: all)")
    parser.add_argument("--time-limit", type=float, default=600.0, help="the whole search's (default %(default)g s)")
    parser.add_argument("--jobs", type=int, help="worker processes (default: the cores)")
    parser.add_argument("-o", "--output", default="benchmarks/results/mesh_choice.md")
    args = parser.parse_args(argv)
    import logging

    logging.basicConfig(level=logging.ERROR)
    if args.child:
        print(json.dumps(run_one(args.child, args.time_limit, args.jobs)))
        return 0
    rows = []
    for config in args.only or list(CONFIGS):
        rows.append(_child(config, args.time_limit, args.jobs))
        print(f"done {config}: {json.dumps({k: v for k, v in rows[-1].items() if k != 'table'})}", file=sys.stderr)
    text = report(rows, "python -m benchmarks.mesh_choice " + " ".join(argv if argv is not None else sys.argv[1:]))
    from solver.io import write_text_atomic

    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.output, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
