"""The mesh search with pipeline and context-parallel layouts on the issues' large problems.

One configuration per call (each its own process, so its peak RSS is its own):

- ``8b-long``: LLaMA-3 8B, 4 sequences of 131,072 tokens, 64 H100 80 GB in nodes of 8, mixed
  precision, 80 GiB (issue 56's target: >= 35 % MFU, counting ``6 N + 6 x layers x dim x seq``
  FLOPs per token over 989 TFLOP/s per GPU as ``benchmarks/context_parallel.py`` does);
  cp layouts tried, pp layouts not (``--pp`` adds them).
- ``405b``: LLaMA-3.1 405B, 256 sequences of 8192, 512 H100 96 GB 500 W in nodes of 8, mixed
  precision (issue 55's target: a plan that fits, >= 128 tokens/s/GPU, < 10 min); pp layouts
  tried, cp layouts not (``--cp`` adds them).
- ``8b-8``: LLaMA-3 8B, 8 sequences of 2048 on 8 H100 80 GB (one node): the layouts of today
  (no pp on one node, no cp with a sequence per GPU).

Prints one JSON line (the search's wall and CPU seconds, ``found_s``: the seconds after which
the chosen layout's plan was in hand (the search then goes on to its deadline with the other
layouts), the outcome counts, the chosen layout, its step, tokens/s/GPU and MFU) and the table of
every layout. ``--verbose`` logs each layout as it ends. Not a test.

    python -m benchmarks.mesh_stages 8b-long --time-limit 240
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/mesh_stages.py`: re-executed as the module

import argparse
import json
import os
import resource
import sys
import time

from benchmarks.common.models import load

CONFIGS = {
    "8b-long": {"factory": "llama3_8b", "overrides": {"batch_size": 4, "seq_len": 131072, "max_seq_len": 131072},
                "devices": 64, "profile": "h100-sxm-80gb", "memory_limit": 80 * 2**30, "pipeline": False,
                "context": True},
    "405b": {"factory": "llama3_405b", "overrides": {"batch_size": 256, "seq_len": 8192}, "devices": 512,
             "profile": "h100-sxm-96gb-500w", "memory_limit": None, "pipeline": True, "context": False},
    "8b-8": {"factory": "llama3_8b", "overrides": {"batch_size": 8, "seq_len": 2048}, "devices": 8,
             "profile": "h100-sxm-80gb", "memory_limit": 80 * 2**30, "pipeline": True, "context": None},
}
PER_NODE = 8
PEAK_BF16 = 989e12
"""H100 SXM dense bf16 FLOP/s (datasheet), the MFU denominator (as ``benchmarks/context_parallel.py``)."""


def flops_per_token(model, seq: int) -> float:
    """``6 N + 6 x layers x dim x seq`` (causal attention), ``N`` every parameter (issue 56's count)."""
    params = sum(p.numel() for p in model.parameters())
    return 6.0 * params + 6.0 * len(model.layers) * model.tok_embeddings.embedding_dim * seq


def run(config: str, time_limit: float, jobs: int | None, pipeline: bool | None, context: bool | None) -> dict:
    from autoshard.plan.layout_report import layouts_table
    from autoshard.search.mesh_search import search_mesh

    cfg = CONFIGS[config]
    model, inputs = load(f"llama3.{cfg['factory']}", cfg["overrides"], dtype="bfloat16", device="meta")
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    cpu0 = _cpu_s()
    limit = {} if cfg["memory_limit"] is None else {"memory_limit": cfg["memory_limit"]}  # None: the profile's
    found: dict[tuple, float] = {}  # (shape, dims) of each layout that became the best -> when

    def progress(status) -> None:
        if status.best is not None:
            found.setdefault((status.best.shape, status.best.dim_names), time.perf_counter() - t0)

    plan = search_mesh(model, inputs, cfg["devices"], PER_NODE, profile=cfg["profile"], time_limit=time_limit,
                       jobs=jobs, cache_dir=False, mixed_precision=True, progress=progress, **limit,
                       pipeline=cfg["pipeline"] if pipeline is None else pipeline,
                       context=cfg["context"] if context is None else context)
    wall, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    rows = plan.options["mesh_search"]["layouts"]
    chosen = next(r for r in rows if r["chosen"])
    seq, batch = cfg["overrides"]["seq_len"], cfg["overrides"]["batch_size"]
    tokens_per_gpu_s = batch * seq / (chosen["step_s"] * cfg["devices"])
    mfu = flops_per_token(model, seq) * tokens_per_gpu_s / PEAK_BF16
    found_s = found.get((tuple(chosen["shape"]), tuple(chosen["dim_names"])))
    return {"config": config, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "time_limit_s": time_limit,
            "found_s": None if found_s is None else round(found_s, 1),
            "load": [round(x, 1) for x in (*load_before, *os.getloadavg())], "layouts": len(rows),
            **{o: sum(r["outcome"] == o for r in rows) for o in ("solved", "cut", "no_fit", "skipped", "error")},
            "chosen": "x".join(map(str, chosen["shape"])) + f" ({','.join(plan.fingerprint.dim_names)})",
            "step_s": chosen["step_s"], "peak_gib": chosen["peak_memory_bytes"] / 2**30,
            "tokens_per_gpu_s": round(tokens_per_gpu_s, 1), "mfu": round(mfu, 4),
            "schedule": plan.pipeline.schedule if plan.pipeline else None,
            "rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
            "table": "\n".join(layouts_table(plan.options))}


def _cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", choices=sorted(CONFIGS))
    parser.add_argument("--time-limit", type=float, default=240.0, help="the whole search's (default %(default)g s)")
    parser.add_argument("--jobs", type=int, help="worker processes (default: the cores)")
    parser.add_argument("--pp", action=argparse.BooleanOptionalAction, default=None, help="try pp layouts")
    parser.add_argument("--cp", action=argparse.BooleanOptionalAction, default=None, help="try cp layouts")
    parser.add_argument("--verbose", action="store_true", help="log each layout as it ends")
    args = parser.parse_args(argv)
    import logging

    logging.basicConfig(level=logging.ERROR, format="%(asctime)s %(name)s %(message)s")
    if args.verbose:
        logging.getLogger("autoshard.search.mesh_search").setLevel(logging.INFO)
    try:
        row = run(args.config, args.time_limit, args.jobs, args.pp, args.cp)
    except ValueError as exc:  # no layout fits / none solved: the search's one line
        print(json.dumps({"config": args.config, "error": " ".join(str(exc).split())}))
        return 1
    table = row.pop("table")
    print(json.dumps(row))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
