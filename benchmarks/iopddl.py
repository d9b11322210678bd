"""Run the solver on the IOPDDL contest instances at the contest time limits.

Each instance runs as its own ``python -m solver`` process (so loading counts
against the limit, as in the contest), and its answer is scored by an
evaluator written here from the contest's rules (half-open intervals,
duplicate edges summed, 1e18 = forbidden), independent of the solver's code.

    python benchmarks/iopddl.py                 # all instances, contest limits
    python benchmarks/iopddl.py --quick         # a quarter of each limit
    python benchmarks/iopddl.py --only V,A -o results.md

Prints a markdown table (and writes it with ``-o``), plus a JSON file of the
raw results beside it.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/iopddl.py`: re-executed as the module

import argparse
import csv
import gzip
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "iopddl"
FORBIDDEN = 1e18


def contest_score(data: dict, choice: list[int]) -> tuple[float, float, bool]:
    """(cost, peak memory, feasible) by the contest's rules, from the raw JSON."""
    prob = data["problem"]
    nodes, edges = prob["nodes"], prob["edges"]
    if len(choice) != len(nodes["costs"]):
        return math.inf, math.inf, False
    cost = 0
    forbidden = False
    for i, s in enumerate(choice):
        c = nodes["costs"][i][s]
        forbidden |= c >= FORBIDDEN
        cost += c
    for (u, v), flat in zip(edges["nodes"], edges["costs"]):
        c = flat[choice[u] * len(nodes["costs"][v]) + choice[v]]
        forbidden |= c >= FORBIDDEN
        cost += c
    events: dict[int, int] = {}
    for (start, end), usage, s in zip(nodes["intervals"], nodes["usages"], choice):
        if start < end and usage[s]:
            events[start] = events.get(start, 0) + usage[s]
            events[end] = events.get(end, 0) - usage[s]
    peak = running = 0
    for t in sorted(events):
        running += events[t]
        peak = max(peak, running)
    limit = prob.get("usage_limit")
    feasible = not forbidden and (limit is None or peak <= limit)
    return float(cost), float(peak), feasible


def run_one(name: str, path: Path, limit_s: float, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "solution.json"
        cmd = [sys.executable, "-m", "solver", str(path), "--time-limit", str(limit_s), "-o", str(out),
               "--backend", args.backend, "--seed", str(args.seed), "--quiet"]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        start = time.perf_counter()
        # its own session, so that a timeout kills the solver's children (CBC) too
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            _, stderr = proc.communicate(timeout=limit_s + 60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return {"instance": name, "error": f"no answer within {limit_s + 60:.0f} s", "wall_s": limit_s + 60}
        wall = time.perf_counter() - start
        if not out.exists():
            return {"instance": name, "error": stderr.strip()[-300:], "wall_s": wall}
        solution = json.loads(out.read_text())
    data = json.loads(gzip.decompress(path.read_bytes()))
    cost, peak, feasible = contest_score(data, solution["choice"]) if solution["choice"] else (math.inf, math.inf, False)
    stats = solution.get("stats", {})
    reduced = stats.get("reduction", {}).get("after") or {}
    return {
        "instance": name,
        "nodes": len(data["problem"]["nodes"]["costs"]),
        "edges": len(data["problem"]["edges"]["nodes"]),
        "reduced_vars": reduced.get("variables"),
        "reduced_edges": reduced.get("edges"),
        "method": stats.get("method"),
        "first_feasible_s": stats.get("first_feasible_seconds"),
        "status": solution["status"],
        "cost": cost,
        "solver_cost": solution["cost"],
        "lower_bound": solution["lower_bound"],
        "peak_over_limit": peak / data["problem"]["usage_limit"],
        "feasible": feasible,
        "wall_s": wall,
        "limit_s": limit_s,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a quarter of each contest limit")
    parser.add_argument("--only", help="comma-separated instance letters")
    parser.add_argument("--backend", default="cbc")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-o", "--output", help="write the markdown table here (and .json beside it)")
    args = parser.parse_args()
    records = {row["instance"]: row for row in csv.DictReader(open(DATA / "best_known.csv"))}
    only = set(args.only.split(",")) if args.only else None
    results = []
    for name, rec in records.items():
        if only and name not in only:
            continue
        limit = float(rec["time_limit_s"]) / (4 if args.quick else 1)
        row = run_one(name, DATA / f"asplos-2025-iopddl-{name}.json.gz", limit, args)
        best = float(rec["best_known_cost"])
        row["best_known"] = best
        row["winner_ratio"] = float(rec["contest_winner_cost"]) / best
        if "cost" in row and row["feasible"] and row["wall_s"] <= limit + 1.0:
            row["ratio"] = row["cost"] / best
            row["score"] = best / row["cost"]
        else:
            row["ratio"], row["score"] = math.inf, 0.0
        results.append(row)
        print(f"{name}: ratio {row['ratio']:.4f} (winner {row['winner_ratio']:.4f}) "
              f"status {row.get('status')} wall {row['wall_s']:.1f}s / {limit:.0f}s", file=sys.stderr, flush=True)
    table = render(results, args)
    print(table)
    if args.output:
        Path(args.output).write_text(table + "\n")
        Path(args.output).with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


def render(results: list[dict], args: argparse.Namespace) -> str:
    head = ("| inst | nodes | edges | reduced vars / edges | limit s | first feasible s | status | cost / best known "
            "| bound / best known | peak / limit | winner / best known |")
    lines = [head, "|" + "---|" * 11]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['instance']} | error: {r['error']} |")
            continue
        bound = r["lower_bound"] / r["best_known"] if r.get("lower_bound") else float("nan")
        lines.append(
            f"| {r['instance']} | {r['nodes']} | {r['edges']} | {r['reduced_vars']} / {r['reduced_edges']} "
            f"| {r['limit_s']:.0f} | {r['first_feasible_s']} | {r['status']} | {r['ratio']:.4f} | {bound:.4f} "
            f"| {r['peak_over_limit']:.4f} | {r['winner_ratio']:.4f} |"
        )
    ratios = [r["ratio"] for r in results if math.isfinite(r.get("ratio", math.inf))]
    if ratios and len(ratios) == len(results):
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        wgeo = math.exp(sum(math.log(r["winner_ratio"]) for r in results) / len(results))
        lines.append("")
        lines.append(f"Geometric mean cost / best known: **{geo:.4f}** (contest winner on the same instances: "
                     f"{wgeo:.4f}); contest score {sum(r['score'] for r in results):.3f} of {len(results)}; "
                     f"{'quick (1/4 limits)' if args.quick else 'contest limits'}, backend {args.backend}, seed "
                     f"{args.seed}, {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
                     f"Python {platform.python_version()}.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
