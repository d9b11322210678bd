"""What ``autoshard solve`` prints or writes besides the plan, on one mesh or
on the mesh a search chose: the expert layouts priced beside the plan
(``--compare-baselines``) and the problem file an ``autoshard serve`` solves
to the same plan (``--dump-problem``).
"""

from __future__ import annotations

from typing import Any

from autoshard.sizes import format_bytes

__all__ = ["print_baselines", "dump_problem"]

MIN_COMPARE_S = 1.0
"""Below this much left of the time limit, the expert layouts are not priced."""


def print_baselines(prep: Any, plan: Any, options: Any) -> None:
    """The expert layouts on ``prep``'s mesh, each with its recomputation policies, priced
    beside ``plan`` (``--compare-baselines``) in what the solve (or the search) left of
    ``--time-limit``."""
    from autoshard.search.solve import compare_baselines, solve_stage_seconds

    used = plan.options.get("mesh_search", {}).get("seconds") or solve_stage_seconds(plan)
    left = options.time_limit - float(used)
    if left < MIN_COMPARE_S:
        print(f"\n--compare-baselines: not priced, the solve took the whole --time-limit ({options.time_limit:g} s)")
        return
    rows = compare_baselines(prep, options.with_changes(time_limit=left))
    print("\n| layout | recompute | step ms | compute ms | comm ms | recompute ms | peak memory | fits |\n"
          "|---|---|---:|---:|---:|---:|---:|---|")
    print(_row("solved", plan, options.recompute))
    for r in rows:
        print(_row(r.name, r.plan, r.recompute) if r.plan
              else f"| {r.name} | {r.recompute} | - | - | - | - | - | {r.error} |")


def _row(name: str, plan: Any, recompute: str) -> str:
    e = plan.estimate
    return (f"| {name} | {recompute} | {e.step_s * 1e3:.3f} | {e.compute_s * 1e3:.3f} "
            f"| {(e.comm_s + e.relayout_s) * 1e3:.3f} | {e.recompute_s * 1e3:.3f} "
            f"| {format_bytes(e.peak_memory_bytes)} | {'yes' if e.fits else 'no'} |")


def dump_problem(prep: Any, plan: Any, options: Any, path: str) -> None:
    """Write :func:`autoshard.search.solve.problem_request` atomically at ``path`` (``--dump-problem``)."""
    import json

    from autoshard.search.solve import problem_request
    from solver.io import write_text_atomic

    write_text_atomic(path, json.dumps(problem_request(prep, plan, options), allow_nan=False) + "\n")
