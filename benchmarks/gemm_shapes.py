"""GEMMs of the benchmark models' shapes on 4 gloo ranks, against the `here` correction's
two GEMM models: the FLOP term alone scaled by the square GEMMs' median ratio (before
2026-12-06) and the FLOP term plus a cost per byte packed (``device.matmul_byte_s``), both
fitted on the correction's own reference GEMMs timed in the same run (issue 54 item 6).

Every rank times every GEMM at once, as the correction times its references
(``autoshard.calibrate.timing.measure``: one thread a rank, lockstep, trials of >= 20 ms,
5 interleaved rounds, the fastest kept). The held-out shapes are the per-rank GEMMs of
``benchmarks/runtime_step.py``'s MLP (data-parallel: 16 rows; TP x DP: 32 rows, half the
hidden dim) and LLaMA (128 tokens a rank; dim 256, FFN 768, vocab 2048), forward and both
gradients, and squares off the reference sizes. Printed: per shape, measured / priced under
each model, and the median and worst abs(measured / priced - 1).

    python benchmarks/gemm_shapes.py
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/gemm_shapes.py`: re-executed as the module

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from benchmarks.common.gloo import spawn
from benchmarks.common.timing import load_average

REFERENCES = ((128, 128, 128, "matmul"), (512, 512, 512, "matmul"), (16, 512, 2048, "matmul_thin"),
              (16, 2048, 512, "matmul_thin"))
"""(m, k, n, family) of the correction's reference GEMMs (``autoshard.calibrate.first_use``)."""
HELD_OUT = ((512, 16, 2048), (2048, 16, 512), (32, 512, 1024), (32, 1024, 512), (512, 32, 1024),
            (128, 256, 256), (128, 256, 128), (128, 256, 768), (128, 768, 256), (256, 128, 768),
            (128, 256, 2048), (2048, 128, 256), (256, 128, 256), (64, 64, 64), (256, 256, 256), (1024, 1024, 1024))
"""(m, k, n): MLP data-parallel and TP x DP shards, LLaMA's per-rank GEMMs, other squares."""
ROUNDS = 5


def _time_all(rank: int, world: int, shapes: list[tuple[int, int, int]]) -> list[float]:
    """Seconds per call of ``mm`` of each shape (and a 1-element add first), fastest of the rounds."""
    import torch.distributed as dist

    from autoshard.calibrate.first_use import SETTINGS
    from autoshard.calibrate.timing import Job, measure

    torch.set_num_threads(1)
    job = Job(rank=rank, world=world, local_world=world, backend=dist.get_backend())
    calls = [lambda a=torch.ones(1), b=torch.ones(1): torch.add(a, b)]
    calls += [lambda a=torch.randn(m, k), b=torch.randn(k, n): torch.mm(a, b) for m, k, n in shapes]
    best = [float("inf")] * len(calls)
    for _ in range(ROUNDS):
        for i, fn in enumerate(calls):
            best[i] = min(best[i], measure(job, fn, SETTINGS).seconds)
    return best


def _models(measured: list[float]) -> dict[str, object]:
    """The corrected profiles of both GEMM models, fitted on the reference GEMMs' times."""
    from costmodel.compute import matmul_time_s, op_time_s
    from hw_profiles import load
    from hw_profiles.correction import ProfileCorrection, ReferenceTime

    base = load("cpu-gloo")
    launch = ReferenceTime("add 1", "launch", 1.0, op_time_s("elementwise", flops=1, bytes_accessed=12,
                                                             dtype="fp32", profile=base), measured[0])
    refs = [ReferenceTime(f"mm {m}x{k}x{n}", fam, 2.0 * m * k * n,
                          matmul_time_s(m, n, k, dtype="fp32", profile=base, itemsize=4), t,
                          bytes_accessed=4.0 * (m * k + k * n + m * n))
            for (m, k, n, fam), t in zip(REFERENCES, measured[1:])]
    squares = tuple([launch] + [r for r in refs if r.family == "matmul"])
    return {"FLOPs alone (square GEMMs' ratio)": ProfileCorrection("x", {}, "d", squares).apply(base),
            "FLOPs + bytes packed (with the thin GEMMs)": ProfileCorrection("x", {}, "d", (launch, *refs)).apply(base)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    args = parser.parse_args(argv)
    from costmodel.compute import matmul_time_s

    shapes = [(m, k, n) for m, k, n, _ in REFERENCES] + list(HELD_OUT)
    before = load_average()
    with tempfile.TemporaryDirectory(prefix="gemm_shapes_") as tmp:
        measured = spawn(args.ranks, _time_all, (shapes,), Path(tmp), timeout=None)
    seconds = [max(col) for col in zip(*measured)]  # the slowest rank, as a step waits for it
    models = _models(seconds)
    print(f"load before {before}, after {load_average()}; {args.ranks} ranks x 1 thread\n")
    names = list(models)
    print("| m x k x n | FLOP/B | measured us | " + " | ".join(f"meas / priced: {n}" for n in names) + " |")
    print("|---|---:|---:|" + "---:|" * len(names))
    errors: dict[str, list[float]] = {n: [] for n in names}
    for i, (m, k, n) in enumerate(shapes):
        t = seconds[1 + i]
        ratios = [t / matmul_time_s(m, n, k, dtype="fp32", profile=models[name], itemsize=4) for name in names]
        if i >= len(REFERENCES):
            for name, r in zip(names, ratios):
                errors[name].append(abs(r - 1))
        tag = " (reference)" if i < len(REFERENCES) else ""
        intensity = 2.0 * m * k * n / (4.0 * (m * k + k * n + m * n))
        print(f"| {m}x{k}x{n}{tag} | {intensity:.1f} | {t * 1e6:.0f} | " + " | ".join(f"{r:.2f}" for r in ratios) + " |")
    print()
    for name in names:
        e = errors[name]
        print(f"held-out ({len(e)}): {name}: median abs(meas/priced - 1) {statistics.median(e):.3f}, "
              f"worst {max(e):.3f}; matmul_byte_s {models[name].device.matmul_byte_s:.3g} s/B")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
