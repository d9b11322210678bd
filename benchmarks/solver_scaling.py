"""Solver scaling on transformer-shaped synthetic graphs (``synthetic_graphs.py``).

For ~1,000, ~10,000 and ~60,000 nodes and each backend: problem size before
and after the reductions (nodes, edges, integer-program columns), build and
solve time, status, objective, bound and gap, plus the time to the first
feasible solution. Not a test: run it and paste the table into the README.

    python benchmarks/solver_scaling.py                 # all sizes, both backends
    python benchmarks/solver_scaling.py --sizes 1000 --backends cbc
    python benchmarks/solver_scaling.py --ties          # with repeated-layer ties
    python benchmarks/solver_scaling.py --reductions-only   # time the exact reductions alone
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/solver_scaling.py`: re-executed as the module

import argparse
import os
import platform
import sys
import time

import numpy as np

from benchmarks.synthetic_graphs import transformer_problem
from solver import solve
from solver.reduction_kernels import compile_kernels
from solver.reductions import reduce_problem

NODES_PER_LAYER = 24
LIMITS = {1000: 60.0, 10000: 60.0, 60000: 300.0}


def program_columns(problem) -> int:
    return problem.num_choices() + sum(int(np.isfinite(e.cost).sum()) for e in problem.edges)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,60000")
    parser.add_argument("--backends", default="cbc,cpsat")
    parser.add_argument("--ties", action="store_true", help="tie the same node of every layer")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-limit", type=float, default=None, help="override the per-size limits")
    parser.add_argument("--reductions-only", action="store_true",
                        help="time reduce_problem alone (best of --repeat runs), no search")
    parser.add_argument("--repeat", type=int, default=3, help="runs per size with --reductions-only")
    args = parser.parse_args()
    if args.reductions_only:
        return time_reductions(args)
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        t = time.perf_counter()
        problem = transformer_problem(layers=max(1, round(size / NODES_PER_LAYER)), seed=args.seed, ties=args.ties)
        generate_s = time.perf_counter() - t
        for backend in args.backends.split(","):
            limit = args.time_limit or LIMITS.get(size, 300.0)
            events: list[tuple[float, str]] = []
            solution = solve(problem, backend=backend, time_limit=limit, seed=args.seed,
                             progress=lambda e: events.append((e["seconds"], e["stage"])))
            st = solution.stats
            red = st.get("reduction", {})
            exact = st.get("exact", {})
            rows.append({
                "size": size, "backend": backend, "nodes": problem.num_nodes, "edges": problem.num_edges,
                "columns_before": program_columns(problem),
                "vars_after": (red.get("after") or {}).get("variables"),
                "edges_after": (red.get("after") or {}).get("edges"),
                "columns_after": st.get("compiled", {}).get("program_columns"),
                "reduce_s": red.get("seconds"), "build_s": exact.get("build_seconds"),
                "first_feasible_s": st.get("first_feasible_seconds"), "seconds": solution.seconds,
                "status": solution.status.value, "cost": solution.cost, "bound": solution.lower_bound,
                "gap": solution.gap, "method": st.get("method"), "generate_s": generate_s,
            })
            r = rows[-1]
            print(f"{size} {backend}: {r['status']} cost={r['cost']:.6g} gap={r['gap']} in {r['seconds']:.1f}s",
                  file=sys.stderr, flush=True)
    print("| nodes | edges | backend | vars / edges after reduction | program columns before -> after | "
          "reduce s | build s | first feasible s | total s | status | objective (s) | bound | gap |")
    print("|" + "---|" * 13)
    for r in rows:
        gap = "n/a" if r["gap"] is None else f"{100 * r['gap']:.3f} %"
        bound = "n/a" if r["bound"] is None else f"{r['bound']:.6g}"
        print(f"| {r['nodes']} | {r['edges']} | {r['backend']} | {r['vars_after']} / {r['edges_after']} | "
              f"{r['columns_before']} -> {r['columns_after']} | {r['reduce_s']} | {r['build_s']} | "
              f"{r['first_feasible_s']} | {r['seconds']:.1f} | {r['status']} | {r['cost']:.6g} | {bound} | {gap} |")
    print(f"\n{'with' if args.ties else 'without'} ties; {os.cpu_count()} cores, "
          f"{platform.processor() or platform.machine()}, Python {platform.python_version()}")
    return 0


def time_reductions(args: argparse.Namespace) -> int:
    """Reduction time per size: kernel compilation (first call in this process) apart, best of --repeat."""
    compile_s = compile_kernels()
    print(f"kernels compiled or loaded from numba's cache in {compile_s:.2f} s (not part of the times below)")
    print("| nodes | edges | vars / edges after reduction | reduce s (best of {}) | all runs s | load avg |"
          .format(args.repeat))
    print("|" + "---|" * 6)
    for size in (int(s) for s in args.sizes.split(",")):
        problem = transformer_problem(layers=max(1, round(size / NODES_PER_LAYER)), seed=args.seed, ties=args.ties)
        runs = []
        for _ in range(args.repeat):
            _, report = reduce_problem(problem)
            runs.append(report.seconds)
        after = report.after
        print(f"| {problem.num_nodes} | {problem.num_edges} | {after.variables} / {after.edges} | {min(runs):.2f} | "
              f"{', '.join(f'{r:.2f}' for r in runs)} | {os.getloadavg()[0]:.1f} |", flush=True)
    print(f"\n{'with' if args.ties else 'without'} ties; {os.cpu_count()} cores, "
          f"{platform.processor() or platform.machine()}, Python {platform.python_version()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
