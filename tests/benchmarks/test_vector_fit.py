"""benchmarks/vector_fit.py: a measurements file in, both fits' errors out."""

from __future__ import annotations

import json
from pathlib import Path

from autoshard.calibrate.measure_compute import ComputeSample
from benchmarks import vector_fit


def _measurements(path: Path) -> None:
    launch = 2e-6
    samples = [ComputeSample("launch", "add", "1", "fp32", 1, 12, launch, 0.0)]
    for n in (64, 256, 1024):
        flops = 2.0 * n**3
        samples.append(ComputeSample("matmul", "mm", f"{n}x{n}x{n}", "fp32", flops, 12.0 * n * n,
                                     launch + flops / 1e11, 0.0))
    for n in (2**10, 2**16, 2**22):
        samples.append(ComputeSample("memory", "add", str(n), "fp32", n, 12.0 * n, launch + 12.0 * n / 2e10, 0.0))
    for op, ns_per_flop in (("silu", 0.14), ("gelu", 0.56)):  # 4x apart (CPU: 5x), both compute-bound
        for n in (2**14, 2**18, 2**22):
            flops = 8.0 * n
            samples.append(ComputeSample("vector", op, f"{n // 256}x256", "fp32", flops, 8.0 * n,
                                         launch + flops * ns_per_flop * 1e-9, 0.0))
    path.write_text(json.dumps({"compute": [s.to_dict() for s in samples]}))


def test_the_per_op_fit_reproduces_ops_that_one_fraction_cannot(tmp_path, capsys):
    path = tmp_path / "m.json"
    _measurements(path)
    assert vector_fit.main([str(path)]) == 0
    out = capsys.readouterr().out
    per_op = next(line for line in out.splitlines() if line.startswith("per op"))
    one = next(line for line in out.splitlines() if line.startswith("one fraction"))
    max_of = lambda line: float(line.split("max ")[1].split("%")[0])  # noqa: E731
    assert max_of(per_op) < 3.0 and max_of(one) > 25.0
    assert out.count("| silu |") == 3 and out.count("| gelu |") == 3
