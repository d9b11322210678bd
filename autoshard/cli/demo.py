"""``autoshard demo``: every layer of autoshard, end to end on small examples.

1. Trace a tiny LLaMA-style model (joint forward + backward on fake tensors),
   check that every op has a sharding rule, and count the strategies per node
   on a 2x2 mesh.
2. Price a few reshardings on an 8x8 H100 mesh with the redistribution planner.
3. Solve a shipped strategy-graph problem (a 2-layer transformer priced by
   the cost model) with both backends and check the answer independently.
   A machine's first solve compiles the solver's numba kernels inside its
   time limit; a solve that this left unproven runs again.
4. Model -> plan: ``autoshard.solve`` of a small LLaMA-style model on a 2x2
   (dp, tp) H100 mesh, its placements and the expert baselines (each with
   the recomputation policies users run) beside it.

Tables stay within 80 columns: costs in ms, short headers.

The sharded run on a real mesh is ``examples/train.py`` under ``torchrun``
(the second half of the README's main job).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

EXAMPLE_SPEC = "examples.models.llama3:tiny"
DEFAULT_TIME_LIMIT = 40.0
"""Seconds per solve. A proven solve ends early; section 4's plan is proven by
toulbar2 in about 3 s on a free 2-core machine, but it gets only part of the
limit (the expert layouts and the overlap rounds keep theirs), so 20 s left it
unproven on a busy machine."""
EXAMPLE_PROBLEM = Path("problems", "transformer_2_layers.json")
"""Relative to the ``examples`` package, which ``pip install`` does not
install: the demo finds it in the current folder or a ``--path`` folder."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``autoshard demo``."""
    from autoshard.trace.model_spec import add_path_argument

    parser.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT, metavar="S",
                        help="seconds per solve (default %(default)g)")
    add_path_argument(parser)


def _example_problem(paths: list[str]) -> Path:
    """The shipped problem, beside the ``examples`` package the spec resolves to."""
    import importlib

    from autoshard.trace.model_spec import import_factory

    import_factory(EXAMPLE_SPEC, paths)  # one line naming --path when examples/ is not importable
    path = Path(importlib.import_module("examples").__file__).parent / EXAMPLE_PROBLEM
    if not path.is_file():
        raise ValueError(f"{path}: missing (the examples/ folder of an autoshard checkout has it)")
    return path


def run(args: argparse.Namespace) -> int:
    from autoshard.cli.values import check_seconds

    check_seconds(args.time_limit, "--time-limit")
    paths = getattr(args, "path", [])
    problem_path = _example_problem(paths)
    from rich.console import Console

    console = Console()
    trace_section(console, paths)
    reshard_section(console)
    solver_section(console, problem_path, args.time_limit)
    plan_section(console, paths, args.time_limit)
    console.rule("next")
    console.print("Run a plan on a real mesh: torchrun --standalone --nproc-per-node 4 examples/train.py "
                  "(4 CPU processes, gloo; autoshard solves the meshes 4 and 2x2 and keeps the faster; "
                  "loss per step beside the single-device loss).")
    return 0


def trace_section(console, paths: list[str]) -> None:
    """1. Trace the tiny LLaMA, check rule coverage, count strategies on 2x2."""
    console.rule("1. trace + rules: examples.models.llama3:tiny")
    from autoshard.rules import load_rules
    from autoshard.validation.coverage import compute_coverage
    from autoshard.trace import trace_joint
    from autoshard.trace.model_spec import load_model

    start = time.perf_counter()
    model, inputs = load_model(EXAMPLE_SPEC, paths=paths)
    traced = trace_joint(model, inputs)
    rules = load_rules()
    report = compute_coverage(traced, rules, model="llama3:tiny", trace_s=time.perf_counter() - start)
    counts = []
    for info in traced.nodes.values():
        if info.op is not None and rules.rule_for(info.op) is not None:
            counts.append(len(rules.strategies(info.op, info.args, info.kwargs, (2, 2), out_meta=info.outputs)))
    console.print(f"{len(traced.nodes)} graph nodes, {len(traced.params)} parameters; rules cover "
                  f"{report.covered_ops}/{report.total_ops} ops ({report.percent:.0f} %); strategies per op node "
                  f"on a 2x2 mesh: mean {sum(counts) / max(len(counts), 1):.1f}, max {max(counts, default=0)}")


def reshard_section(console) -> None:
    """2. Price a few reshardings of a 64 MiB bf16 tensor on an 8x8 H100 mesh."""
    from rich.table import Column, Table

    console.rule("2. cost model: reshardings of a 64 MiB bf16 tensor on an 8x8 H100 mesh")
    from costmodel.mesh import MeshSpec
    from costmodel.redistribute import plan_redistribute
    from hw_profiles import load

    profile, mesh = load("h100-sxm-80gb"), MeshSpec((8, 8), ("dp", "tp"))
    table = Table("from", "to", "steps", Column("time us", justify="right", no_wrap=True))
    for src, dst in (("S(0)S(0)", "RR"), ("P(sum)P(sum)", "RR"), ("P(sum)R", "S(0)R"), ("S(0)R", "S(1)R"),
                     ("RR", "P(sum)R")):
        plan = plan_redistribute(src, dst, mesh, (8192, 4096), 2, profile)
        steps = "; ".join(f"{s.collective}{list(s.mesh_dims)}" for s in plan.steps)
        table.add_row(src, dst, steps, f"{plan.cost_s * 1e6:.1f}")
    console.print(table)


def solver_section(console, problem_path: Path, time_limit: float) -> None:
    """3. Solve the shipped problem with both backends; each answer re-checked by ``solver.evaluate``."""
    from rich.table import Column, Table

    from autoshard.sizes import format_bytes
    from solver import load_problem

    console.rule(f"3. solver: {problem_path.name}")
    problem = load_problem(problem_path)
    console.print(f"{problem.num_nodes} nodes, {problem.num_edges} edges, memory limit "
                  f"{format_bytes(problem.memory_limit)}; costs are step seconds, shown in ms")
    table = Table("backend", "status", *(Column(h, justify="right", no_wrap=True)
                                         for h in ("cost ms", "bound ms", "peak/limit", "solve s")), "check")
    notes = []
    for backend in ("cbc", "cpsat"):
        solution, check, compiled, rerun = _solve_checked(problem, backend, time_limit)
        if compiled > 0:
            notes.append(f"{backend}: numba compiled the solver's kernels in {compiled:.1f} s (first run on "
                         "this machine only; cached on disk) " + (
                             "and left the solve unproven, so it ran again with them" if rerun else
                             "inside this solve's time limit"))
        table.add_row(backend, solution.status.value, _ms(solution.cost), _ms(solution.lower_bound),
                      f"{solution.peak_memory_bytes / problem.memory_limit:.3f}",
                      f"{solution.seconds - _compile_s(solution):.2f}", check)
    console.print(table)
    for note in notes:
        console.print(note)


def plan_section(console, paths: list[str], time_limit: float) -> None:
    """4. ``autoshard.solve`` of a small LLaMA on 2x2 (dp, tp), H100, beside the expert layouts."""
    console.rule("4. model -> plan: llama3:tiny (dim 256, batch 8x64), 2x2 (dp, tp), H100")
    from autoshard.search.solve import compare_baselines, prepare, solve_prepared
    from autoshard.trace.model_spec import load_model

    overrides = {"dim": 256, "n_heads": 8, "batch_size": 8, "seq_len": 64, "device": "meta"}
    model, inputs = load_model(EXAMPLE_SPEC, overrides, paths=paths)
    prep = prepare(model, inputs, (2, 2), ("dp", "tp"), profile="h100-sxm-80gb")
    plan = solve_prepared(prep, time_limit=time_limit)
    counts: dict[str, int] = {}
    for placement in plan.params.values():
        counts[placement] = counts.get(placement, 0) + 1
    console.print(f"{len(prep.graph.nodes)} graph nodes, {len(prep.graph.edges)} edges "
                  f"({len(prep.graph.matrices)} distinct matrices); solver {plan.solver.status} in "
                  f"{plan.solver.seconds:.2f} s; parameter placements: "
                  + ", ".join(f"{p} x{c}" for p, c in sorted(counts.items())) + f"; inputs: {dict(plan.inputs)}")
    note = unproven_note(plan.solver.status, plan.solver.gap, time_limit)
    if note:
        console.print(note)
    console.print("The solved plan beside the expert layouts, each with the recomputation policies users run:")
    rows = [("solved", str(plan.options.get("recompute", "auto")), plan, None)]
    rows += [(r.name, r.recompute, r.plan, r.error) for r in compare_baselines(prep, time_limit=time_limit)]
    console.print(layout_table(rows))


def unproven_note(status: str, gap: float | None, time_limit: float) -> str | None:
    """One line saying what an unproven plan is and how to get a proof (None when proven).

    >>> unproven_note("optimal", 0.0, 40)
    >>> unproven_note("feasible", 0.02, 40)[:48]
    'not proven optimal within --time-limit 40 (gap 2'
    """
    if status == "optimal":
        return None
    gap_text = "" if gap is None else f" (gap {gap:.1%})"
    return (f"not proven optimal within --time-limit {time_limit:g}{gap_text}: the search ran out of its share "
            "of the time on this machine; the plan is the best found and never worse than the expert layouts "
            "below; a longer --time-limit lets it finish")


def layout_table(rows):
    """The step, compute, communication and peak of each ``(name, recompute policy, plan or None, error)``;
    a layout with no plan gets ``n/a`` and its reason in the table's caption."""
    from rich.table import Column, Table

    from autoshard.sizes import format_bytes

    numbers = [Column(h, justify="right", no_wrap=True) for h in ("step ms", "compute ms", "comm ms", "peak")]
    table = Table("layout", "recompute", *numbers)
    reasons = []
    for name, policy, result, error in rows:
        if result is None:
            table.add_row(name, policy, "n/a", "", "", "")
            reasons.append(f"{name} ({policy}): {error}")
            continue
        e = result.estimate
        table.add_row(name, policy, f"{e.step_s * 1e3:.3f}", f"{e.compute_s * 1e3:.3f}",
                      f"{(e.comm_s + e.relayout_s) * 1e3:.3f}", format_bytes(e.peak_memory_bytes))
    if reasons:
        table.caption = "n/a: " + "; ".join(reasons)
    return table


def _compile_s(solution) -> float:
    """Seconds the solve spent compiling numba kernels (not solve time)."""
    return float(solution.stats.get("compile_seconds") or 0.0)


def _ms(seconds: float | None) -> str:
    """Step seconds as milliseconds with 4 significant digits (the table stays narrow)."""
    return "n/a" if seconds is None else f"{seconds * 1e3:.4g}"


def _solve_checked(problem, backend: str, time_limit: float):
    """(solution, check word, compile seconds, whether it ran again) of one solve, re-checked by ``solver.evaluate``.

    A machine's first solve compiles the numba kernels inside its time limit
    (about 10-20 s on 2 cores); when that left the solve unproven, it is run
    once more with the kernels now cached, so that the demo shows the solver
    and not the compiler.
    """
    from solver import Status, evaluate, solve

    solution = solve(problem, backend=backend, time_limit=time_limit)
    compiled = _compile_s(solution)
    rerun = compiled > 0 and solution.status is not Status.OPTIMAL
    if rerun:
        solution = solve(problem, backend=backend, time_limit=time_limit)
    check = evaluate(problem, solution.choice)
    word = "ok" if check.feasible and check.cost == solution.cost else "MISMATCH"
    return solution, word, compiled, rerun
