"""``autoshard demo``: the pieces built so far, end to end on small examples.

1. Trace a tiny LLaMA-style model (joint forward + backward on fake tensors),
   check that every op has a sharding rule, and count the strategies per node
   on a 2x2 mesh.
2. Price a few reshardings on an 8x8 H100 mesh with the redistribution planner.
3. Solve a shipped strategy-graph problem (a 2-layer transformer priced by
   the cost model) with both backends and check the answer independently.
4. Model -> plan: ``autoshard.solve`` of a small LLaMA-style model on a 2x2
   (dp, tp) H100 mesh, its placements and the expert baselines beside it.

The sharded run on a real mesh is ``examples/train.py`` under ``torchrun``
(the second half of the README's main job).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

EXAMPLE_SPEC = "examples.models.llama3:tiny"
EXAMPLE_PROBLEM = Path("problems", "transformer_2_layers.json")
"""Relative to the ``examples`` package, which ``pip install`` does not
install: the demo finds it in the current folder or a ``--path`` folder."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``autoshard demo``."""
    from autoshard.model_spec import add_path_argument

    parser.add_argument("--time-limit", type=float, default=20.0, metavar="S",
                        help="seconds per solve (default %(default)g)")
    add_path_argument(parser)


def _example_problem(paths: list[str]) -> Path:
    """The shipped problem, beside the ``examples`` package the spec resolves to."""
    import importlib

    from autoshard.model_spec import import_factory

    import_factory(EXAMPLE_SPEC, paths)  # one line naming --path when examples/ is not importable
    path = Path(importlib.import_module("examples").__file__).parent / EXAMPLE_PROBLEM
    if not path.is_file():
        raise ValueError(f"{path}: missing (the examples/ folder of an autoshard checkout has it)")
    return path


def run(args: argparse.Namespace) -> int:
    from autoshard.cli_values import check_seconds

    check_seconds(args.time_limit, "--time-limit")
    paths = getattr(args, "path", [])
    problem_path = _example_problem(paths)
    from rich.console import Console
    from rich.table import Table

    from autoshard.sizes import format_bytes

    console = Console()
    console.rule("1. trace + rules: examples.models.llama3:tiny")
    from autoshard.coverage import compute_coverage, load_example
    from autoshard.rules import load_rules
    from autoshard.trace import trace_joint

    start = time.perf_counter()
    model, inputs = load_example(EXAMPLE_SPEC, paths=paths)
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

    console.rule("2. cost model: reshardings of a 64 MiB bf16 tensor on an 8x8 H100 mesh")
    from costmodel.mesh import MeshSpec
    from costmodel.redistribute import plan_redistribute
    from hw_profiles import load

    profile, mesh = load("h100-sxm-80gb"), MeshSpec((8, 8), ("dp", "tp"))
    table = Table("from", "to", "steps", "time (us)")
    for src, dst in (("S(0)S(0)", "RR"), ("P(sum)P(sum)", "RR"), ("P(sum)R", "S(0)R"), ("S(0)R", "S(1)R"),
                     ("RR", "P(sum)R")):
        plan = plan_redistribute(src, dst, mesh, (8192, 4096), 2, profile)
        steps = "; ".join(f"{s.collective}{list(s.mesh_dims)}" for s in plan.steps)
        table.add_row(src, dst, steps, f"{plan.cost_s * 1e6:.1f}")
    console.print(table)

    console.rule(f"3. solver: {problem_path.name}")
    from solver import evaluate, load_problem, solve

    problem = load_problem(problem_path)
    # "compiling": numba compiles the solver's kernels on a machine's first run
    # (then loads them from its disk cache); shown apart, it is not solve time
    table = Table("backend", "status", "cost s", "bound s", "peak/limit", "solve s", "compile s", "check")
    for backend in ("cbc", "cpsat"):
        solution = solve(problem, backend=backend, time_limit=args.time_limit)
        check = evaluate(problem, solution.choice)
        compiled = float(solution.stats.get("compile_seconds") or 0.0)
        table.add_row(backend, solution.status.value, f"{solution.cost:.5g}", f"{solution.lower_bound:.5g}",
                      f"{solution.peak_memory_bytes / problem.memory_limit:.3f}",
                      f"{solution.seconds - compiled:.2f}", f"{compiled:.2f}",
                      "ok" if check.feasible and check.cost == solution.cost else "MISMATCH")
    console.print(f"{problem.num_nodes} nodes, {problem.num_edges} edges")
    console.print(table)
    console.rule("4. model -> plan: examples.models.llama3:tiny (dim 256, batch 8 x 64) on 2x2 (dp, tp), H100")
    from autoshard.plan.options import SolveOptions
    from autoshard.plan.solve import compare_baselines, prepare, solve_prepared

    overrides = {"dim": 256, "n_heads": 8, "batch_size": 8, "seq_len": 64, "device": "meta"}
    model, inputs = load_example(EXAMPLE_SPEC, overrides, paths=paths)
    options = SolveOptions(profile="h100-sxm-80gb", time_limit=args.time_limit)
    prep = prepare(model, inputs, (2, 2), ("dp", "tp"), options)
    plan = solve_prepared(prep, options)
    counts: dict[str, int] = {}
    for placement in plan.params.values():
        counts[placement] = counts.get(placement, 0) + 1
    console.print(f"{len(prep.graph.nodes)} graph nodes, {len(prep.graph.edges)} edges "
                  f"({len(prep.graph.matrices)} distinct matrices); solver {plan.solver.status} in "
                  f"{plan.solver.seconds:.2f} s; parameter placements: "
                  + ", ".join(f"{p} x{c}" for p, c in sorted(counts.items())) + f"; inputs: {dict(plan.inputs)}")
    table = Table("layout", "step (ms)", "compute (ms)", "comm (ms)", "peak memory")
    rows = [("solved", plan)] + [(r.name, r.plan) for r in compare_baselines(prep, options)]
    for name, result in rows:
        if result is None:
            table.add_row(name, "n/a", "", "", "")
            continue
        e = result.estimate
        table.add_row(name, f"{e.step_s * 1e3:.3f}", f"{e.compute_s * 1e3:.3f}",
                      f"{(e.comm_s + e.relayout_s) * 1e3:.3f}", format_bytes(e.peak_memory_bytes))
    console.print(table)
    console.rule("next")
    console.print("Run a plan on a real mesh: torchrun --standalone --nproc-per-node 4 examples/train.py "
                  "(4 CPU processes, gloo, 2x2 mesh; loss per step beside the single-device loss).")
    return 0
