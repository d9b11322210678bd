"""torchtitan's 8B run with the Hugging Face LLaMA against the example model.

Both models are built with LLaMA-3-8B shapes on meta in bf16, global batch
16 x 8192, and solved as torchtitan's 8B run is (mesh 8, ``h100-sxm-80gb``,
mixed precision, the profile's default memory limit, ``recompute="auto"``,
``time_limit=45`` over the whole call, trace included), one model per
process. Each row: the plan's status, step, peak, seconds and recomputed ops;
with ``--baselines``, the plan a person would write (FSDP over 8, every
parameter ``S(0)``, with torchtitan's selective and full checkpointing per
decoder layer) priced on the same trace; with ``--ops``, the step's compute
per op family (forward, backward, recomputed), which shows where two graphs
differ. Not a test.

    python -m benchmarks.hf_llama8b --model hf --baselines --ops
    python -m benchmarks.hf_llama8b --model example
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/hf_llama8b.py`: re-executed as the module

import argparse
import json
import os
import resource
import time

from benchmarks.common.models import load

MODELS = {
    "hf": ("examples.models.hf:hf_llama3_8b", {"attn_implementation": "sdpa"}),
    "example": ("examples.models.llama3:llama3_8b", {}),
}
MESH, DIMS, PROFILE, TIME_LIMIT = (8,), ("dp",), "h100-sxm-80gb", 45.0


def build(which: str, n_layers: int | None = None) -> tuple:
    """(model, inputs) of ``MODELS[which]`` at 16 x 8192 in bf16 on meta."""
    spec, extra = MODELS[which]
    overrides = {**extra, "batch_size": 16, "seq_len": 8192, "dtype": "bfloat16", "device": "meta"}
    if n_layers is not None:
        overrides["num_hidden_layers" if which == "hf" else "n_layers"] = n_layers
    return load(spec, overrides)


def _row(plan) -> dict:
    e = plan.estimate
    return {"status": plan.solver.status, "step_s": round(e.step_s, 4), "compute_s": round(e.compute_s, 4),
            "recompute_s": round(e.recompute_s, 4), "exposed_comm_s": e.exposed_comm_s,
            "peak_gib": round(e.peak_memory_bytes / 2**30, 2), "fits": e.fits, "recomputed": len(plan.recompute),
            "gap": plan.solver.gap, "bound": getattr(plan.solver, "lower_bound", None),
            "portfolio": plan.options.get("portfolio"), "solver_s": round(plan.solver.seconds, 1)}


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children (the portfolio's child among them)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def run(which: str, *, baselines: bool, time_limit: float, n_layers: int | None) -> dict:
    from autoshard.search.solve import prepare, solve_prepared

    cpu0 = _cpu_s()
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    model, inputs = build(which, n_layers)
    started = time.perf_counter()
    prep = prepare(model, inputs, MESH, DIMS, profile=PROFILE, mixed_precision=True, recompute="auto",
                   time_limit=time_limit)
    plan = solve_prepared(prep, time_limit=time_limit, recompute="auto", started=started)
    row = {"model": which, "seconds": round(time.perf_counter() - started, 1), "cpu_s": round(_cpu_s() - cpu0, 1),
           "load": [round(load0, 1), round(os.getloadavg()[0], 1)], "build_model_s": round(started - t0, 1),
           "trace_s": round(prep.timings["trace_s"], 1), "build_s": round(prep.timings["build_s"], 1),
           "nodes": len(prep.graph.nodes), "plan": _row(plan)}
    if baselines:
        for policy in ("selective", "full"):
            base = solve_prepared(prep, baseline="fsdp", recompute=policy, memory_limit=1e30, time_limit=60)
            row[f"fsdp-{policy}"] = _row(base)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), required=True)
    parser.add_argument("--baselines", action="store_true", help="also price FSDP 8 with selective and full AC")
    parser.add_argument("--time-limit", type=float, default=TIME_LIMIT)
    parser.add_argument("--layers", type=int, default=None, help="fewer decoder layers (a quick look)")
    args = parser.parse_args(argv)
    import logging

    logging.basicConfig(level=logging.ERROR)
    print(json.dumps(run(args.model, baselines=args.baselines, time_limit=args.time_limit, n_layers=args.layers)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
