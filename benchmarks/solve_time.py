"""Model -> plan at scale: LLaMA-3 8B / 70B shapes on 1-D, 2-D and 3-D meshes.

For every configuration (run in its own process, so peak RSS is its own):
trace / build / solve seconds, graph size (problem nodes and edges, distinct
edge matrices) and the solver's reduced size, peak RSS, and the plan's step
time and peak memory beside every expert baseline (DDP, FSDP, TP, FSDP+TP)
priced by the same cost model, each with the recomputation policies users
run (none, selective, every second block, full: the cheapest that fits is
shown). Models are built on meta in bf16 with an fp32 master copy and fp32
AdamW state (``mixed_precision``), H100 profile, memory limit 80 GiB; the
plan chooses what to recompute (``--recompute auto``). The ``b2`` rows are
torchtitan's 8B run (local batch 2 x 8192) and its 64-GPU and 70B cousins.
3-D meshes use the seeded search (``autoshard.graph.restrict``). Not a test.

    python -m benchmarks.solve_time                   # every row
    python -m benchmarks.solve_time --layers          # solve time vs layers (8x8), plot
    python -m benchmarks.solve_time --only 8b-2048:8x8
    python -m benchmarks.solve_time --growth          # graph size with and without recomputation states
    python -m benchmarks.solve_time -o solve_time.md       # the report also written to a file
    python -m benchmarks.solve_time --tiny            # tiny HF models, 2x2 cpu-gloo, none / auto, stage timings
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/solve_time.py`: re-executed as the module

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common.models import load

CONFIGS = {
    "8b-2048": ("llama3_8b", {"seq_len": 2048}),
    "8b-8192": ("llama3_8b", {"seq_len": 8192}),
    "70b-2048": ("llama3_70b", {"seq_len": 2048, "batch_per_gpu": 0.5}),
    # torchtitan's LLaMA-3-8B run: local batch 2 x 8192 (global 16 x 8192 on 8 GPUs), and on 64 GPUs
    "8b-8192-b2": ("llama3_8b", {"seq_len": 8192, "batch_per_gpu": 2}),
    # 70B, one sequence of 8192 per GPU (global 64 x 8192 on 2x4x8)
    "70b-8192": ("llama3_70b", {"seq_len": 8192}),
}
RUNS = [("8b-2048", "8"), ("8b-2048", "8x8"), ("8b-2048", "2x4x8"), ("8b-8192", "8"), ("8b-8192", "8x8"),
        ("8b-8192", "2x4x8"), ("70b-2048", "2x4x8"), ("8b-8192-b2", "8"), ("8b-8192-b2", "8x8"),
        ("70b-8192", "2x4x8")]
TIME_LIMITS = {"8b-8192-b2": 30.0, "70b-8192": 110.0}
"""Time limit per config: it bounds the whole call, trace to plan (default 60 s, as the rows
measured before recomputation; the b2 rows 30 s; 70B 110 s, so that the call ends inside the
120 s target with the model's construction: a quarter of it for the seed's coarse solve)."""
DIM_NAMES = {1: "dp", 2: "dp,tp", 3: "pp,dp,tp"}


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children (the CBC solver runs as one)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def build_llama(config: str, batch: int, *, n_layers: int | None = None) -> tuple:
    """The model of ``CONFIGS[config]`` on meta in bf16 with a global batch of ``batch`` sequences.

    >>> model, inputs = build_llama("8b-8192", 16, n_layers=1)
    >>> tuple(inputs[0].shape)
    (16, 8192)
    """
    factory, overrides = CONFIGS[config]
    overrides = {k: v for k, v in overrides.items() if k != "batch_per_gpu"}
    overrides.update(dtype="bfloat16", device="meta", batch_size=batch)
    if n_layers is not None:
        overrides["n_layers"] = n_layers
    return load(f"llama3.{factory}", overrides)


def run_one(config: str, mesh_text: str, *, n_layers: int | None = None, baselines: bool = True,
            time_limit: float | None = None, recompute: str = "auto") -> dict:
    """One configuration in this process; returns the row."""
    from autoshard.search.solve import compare_baselines, prepare, solve_prepared

    mesh = tuple(int(m) for m in mesh_text.split("x"))
    # one sequence per GPU by default (torchtitan's 8B/70B recipes use a local batch of 1-2)
    batch = max(1, int(math.prod(mesh) * CONFIGS[config][1].get("batch_per_gpu", 1)))
    names = tuple(DIM_NAMES.get(len(mesh), ",".join(f"d{i}" for i in range(len(mesh)))).split(","))
    t0 = time.perf_counter()
    cpu0 = _cpu_s()
    model, inputs = build_llama(config, batch, n_layers=n_layers)
    limit = time_limit if time_limit is not None else TIME_LIMITS.get(config, 60.0)
    # the one time limit covers a seeded search's coarse solve too (a quarter of it)
    started = time.perf_counter()  # the time limit bounds trace to plan, as autoshard.solve's does
    prep = prepare(model, inputs, mesh, names, profile="h100-sxm-80gb", mixed_precision=True, recompute=recompute,
                   time_limit=limit)
    try:
        plan = solve_prepared(prep, time_limit=limit, memory_limit=80 * 2**30, recompute=recompute, started=started)
    except ValueError as exc:  # no plan fits
        return {"config": config, "mesh": mesh_text, "error": str(exc).splitlines()[0][:200]}
    total = time.perf_counter() - t0
    cpu = _cpu_s() - cpu0
    graph = prep.graph
    row = {
        "config": config, "mesh": mesh_text, "layers": n_layers or len(model.layers), "batch": batch,
        # seeded search: the coarse build and solve count as build and solve
        "trace_s": prep.timings["trace_s"], "build_s": prep.timings["build_s"] + prep.timings.get("seed_build_s", 0.0),
        "solve_s": plan.solver.seconds + prep.timings.get("seed_solve_s", 0.0),
        **{k: round(float(plan.solver.timings.get(k, 0.0)), 2) for k in ("plan_s", "overlap_s", "portfolio_s")},
        "total_s": round(total, 2), "cpu_s": round(cpu, 1), "nodes": len(graph.nodes), "edges": len(graph.edges),
        "matrices": len(graph.matrices), "strategies_mean": round(graph.stats.strategies_mean, 1),
        "reduced_vars": plan.solver.reduced_variables, "status": plan.solver.status,
        "step_s": plan.estimate.step_s, "peak_gib": plan.estimate.peak_memory_bytes / 2**30,
        "recompute_s": plan.estimate.recompute_s, "recomputed": len(plan.recompute),
        "portfolio": plan.options.get("portfolio"), "gap": plan.solver.gap,
        "rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "search": prep.options.get("search", "full"), "baselines": {},
    }
    if baselines:
        for result in compare_baselines(prep, memory_limit=80 * 2**30, time_limit=120):  # shared by the rows
            if result.plan is None:
                continue
            entry = {"step_s": result.plan.estimate.step_s, "peak_gib": result.plan.estimate.peak_memory_bytes / 2**30,
                     "fits": result.plan.estimate.fits, "recompute": result.recompute}
            best = row["baselines"].get(result.name)
            # per layout: the cheapest policy that fits, else the smallest peak
            if best is None or (entry["fits"], -entry["step_s"] if entry["fits"] else -entry["peak_gib"]) > \
                    (best["fits"], -best["step_s"] if best["fits"] else -best["peak_gib"]):
                row["baselines"][result.name] = entry
    return row


TINY_MODELS = ("hf_mistral", "hf_llama", "hf_gpt2", "hf_bert", "hf_whisper")
"""``examples.models.hf`` factories timed by ``--tiny`` (as given: no overrides)."""

STAGES = ("trace_s", "seed_build_s", "seed_solve_s", "build_s", "solve_s", "plan_s", "overlap_s", "portfolio_s")


def run_tiny(name: str, recompute: str, time_limit: float = 60.0) -> dict:
    """One tiny Hugging Face model to a plan on 2x2 with cpu-gloo through ``autoshard.solve`` (the
    whole call that ``time_limit`` bounds), in this process; the stage timings, wall time and the
    load average around it (a busy machine says so in the row)."""
    import os

    import autoshard

    model, inputs = load(f"hf.{name}")
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    plan = autoshard.solve(model, inputs, mesh_shape=(2, 2), dim_names=("dp", "tp"), profile="cpu-gloo",
                           recompute=recompute, time_limit=time_limit)
    wall = time.perf_counter() - t0
    timings = plan.solver.timings
    return {"model": name, "recompute": recompute, "time_limit": time_limit, "wall_s": round(wall, 2),
            **{k: round(float(timings[k]), 2) for k in STAGES if k in timings},
            "status": plan.solver.status, "step_ms": plan.estimate.step_s * 1e3, "recomputed": len(plan.recompute),
            "portfolio": plan.options.get("portfolio"), "load": round(max(load_before, os.getloadavg()[0]), 1)}


def tiny_table(rows: list[dict]) -> str:
    lines = ["| model | recompute | wall to plan s | trace s | build s | solve s | plan s | overlap s | portfolio s "
             "| status | step ms | recomputed ops | load (1 min) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r.get('model')} | {r.get('recompute')} | error: {r['error']} |")
            continue
        lines.append(f"| {r['model']} | {r['recompute']} | {r['wall_s']:.1f} | {r.get('trace_s', 0):.1f} "
                     f"| {r.get('build_s', 0):.1f} | {r.get('solve_s', 0):.1f} | {r.get('plan_s', 0):.2f} "
                     f"| {r.get('overlap_s', 0):.1f} | {r.get('portfolio_s', 0):.1f} | {r['status']} "
                     f"| {r['step_ms']:.3f} | {r['recomputed']} | {r['load']} |")
    return "\n".join(lines)


def _child(args: list[str], child: bool = True) -> dict:
    out = subprocess.run([sys.executable, "-m", "benchmarks.solve_time", *(["--child"] if child else []), *args],
                         capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> str:
    lines = ["| model | mesh | batch | search | trace s | build s | solve s | plan / overlap / portfolio s | total s | CPU s | nodes / edges / matrices | strategies | reduced vars | RSS GiB | status | step s | recompute s (ops) | peak GiB | DDP | FSDP | TP | FSDP+TP |",
             "|---|---|---:|---|---:|---:|---:|---|---:|---:|---|---:|---:|---:|---|---:|---:|---:|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r.get('config')} | {r.get('mesh')} | error: {r['error']} |")
            continue

        def base(name: str) -> str:
            b = r["baselines"].get(name)
            if b is None:
                return "n/a"
            policy = f", {b['recompute']}" if b.get("recompute", "none") != "none" else ""
            return f"{b['step_s']:.3f} s, {b['peak_gib']:.1f} GiB{policy}{'' if b['fits'] else ' (no fit)'}"

        status = r["status"] + (f" ({r['portfolio']})" if r.get("portfolio") else "")
        lines.append(
            f"| {r['config']} | {r['mesh']} | {r['batch']} | {r['search']} | {r['trace_s']:.1f} | {r['build_s']:.1f} | {r['solve_s']:.1f} "
            f"| {r.get('plan_s', 0):.1f} / {r.get('overlap_s', 0):.1f} / {r.get('portfolio_s', 0):.1f} "
            f"| {r['total_s']:.1f} | {r.get('cpu_s', float('nan')):.1f} | {r['nodes']} / {r['edges']} / {r['matrices']} | {r['strategies_mean']} "
            f"| {r['reduced_vars']} | {r['rss_gib']:.2f} | {status} | {r['step_s']:.3f} "
            f"| {r.get('recompute_s', 0.0):.3f} ({r.get('recomputed', 0)}) | {r['peak_gib']:.1f} "
            f"| {base('ddp')} | {base('fsdp')} | {base('tp')} | {base('fsdp+tp')} |")
    return "\n".join(lines)


def growth_table(rows: list[tuple[str, str, dict, dict]]) -> str:
    """Graph and problem size without (``--recompute none``) and with recomputation states."""
    lines = ["| model | mesh | states | nodes | edges | matrices | strategies (mean) | reduced vars | build s | solve s |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for config, mesh, plain, states in rows:
        for label, r in (("none", plain), ("auto", states)):
            if "error" in r:
                lines.append(f"| {config} | {mesh} | {label} | error: {r['error']} |")
                continue
            lines.append(f"| {config} | {mesh} | {label} | {r['nodes']} | {r['edges']} | {r['matrices']} "
                         f"| {r['strategies_mean']} | {r['reduced_vars']} | {r['build_s']:.1f} | {r['solve_s']:.1f} |")
    return "\n".join(lines)


def layers_sweep(mesh: str, counts: list[int], plot: Path) -> str:
    rows = [_child(["8b-2048", mesh, "--n-layers", str(n), "--no-baselines"]) for n in counts]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if "error" not in r]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for key, label in (("trace_s", "trace"), ("build_s", "build"), ("solve_s", "solve")):
        ax.plot([r["layers"] for r in ok], [r[key] for r in ok], marker="o", label=label)
    ax.set_xlabel("layers (LLaMA-3-8B shape)")
    ax.set_ylabel("seconds")
    ax.set_xscale("log", base=2)
    ax.set_title(f"model -> plan on {mesh} (2 cores)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(plot, dpi=110)
    lines = ["| layers | trace s | build s | solve s | reduced vars | status |", "|---:|---:|---:|---:|---:|---|"]
    lines += [f"| {r['layers']} | {r['trace_s']:.1f} | {r['build_s']:.1f} | {r['solve_s']:.2f} | {r['reduced_vars']} | {r['status']} |"
              for r in ok]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("CONFIG", "MESH"), help=argparse.SUPPRESS)
    parser.add_argument("--n-layers", type=int)
    parser.add_argument("--no-baselines", action="store_true")
    parser.add_argument("--recompute", default="auto", help="the plan's recomputation policy (default auto)")
    parser.add_argument("--growth", action="store_true",
                        help="graph and problem size with and without recomputation states (8B 8192, 8 and 8x8)")
    parser.add_argument("-o", "--output", help="also write the table (markdown) here")
    parser.add_argument("--only", nargs="+", metavar="CONFIG:MESH", help="e.g. 8b-2048:8x8")
    parser.add_argument("--layers", action="store_true", help="solve time vs number of layers, with a plot")
    parser.add_argument("--plot", default="benchmarks/solve_time_vs_layers.png")
    parser.add_argument("--tiny", nargs="*", metavar="MODEL", help=f"tiny HF models (default {', '.join(TINY_MODELS)})")
    parser.add_argument("--tiny-child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--time-limit", type=float, default=60.0, help="--tiny: the whole call's time limit")
    args = parser.parse_args(argv)
    import logging

    logging.basicConfig(level=logging.ERROR)
    if args.child:
        row = run_one(*args.child, n_layers=args.n_layers, baselines=not args.no_baselines, recompute=args.recompute)
        print(json.dumps(row))
        return 0
    if args.tiny_child:
        print(json.dumps(run_tiny(*args.tiny_child, time_limit=args.time_limit)))
        return 0
    if args.tiny is not None:
        rows = []
        for name in args.tiny or TINY_MODELS:
            for recompute in ("none", "auto"):
                row = _child(["--tiny-child", name, recompute, "--time-limit", str(args.time_limit)], child=False)
                rows.append({"model": name, "recompute": recompute, **row})
                print(f"done {name} {recompute}: {row}", file=sys.stderr)
        return _emit(tiny_table(rows), args.output)
    if args.layers:
        print(layers_sweep("8x8", [1, 2, 4, 8, 16, 32], Path(args.plot)))
        return 0
    if args.growth:
        grows = []
        for config, mesh in [("8b-8192", "8"), ("8b-8192", "8x8")]:  # rows that fit without recomputation
            plain = _child([config, mesh, "--no-baselines", "--recompute", "none"])
            states = _child([config, mesh, "--no-baselines"])
            grows.append((config, mesh, plain, states))
            print(f"done {config} on {mesh}", file=sys.stderr)
        text = growth_table(grows)
    else:
        runs = [tuple(s.split(":")) for s in args.only] if args.only else RUNS
        rows = []
        for config, mesh in runs:
            row = _child([config, mesh])
            row.setdefault("config", config)
            row.setdefault("mesh", mesh)
            rows.append(row)
            print(f"done {config} on {mesh}", file=sys.stderr)
        text = table(rows)
    return _emit(text, args.output)


def _emit(text: str, output: str | None) -> int:
    """Print the table and write it atomically to ``output`` when given; the exit status."""
    print(text)
    if output:
        from solver.io import write_text_atomic

        write_text_atomic(output, text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
