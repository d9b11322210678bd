"""The ops timed on one H100 (``calibrate-hardware --check`` of the shipped profile on
LLaMA-1B-shaped ops, ``benchmarks/results/h100-2026-11-27/check-shipped-h100-llama1b-ops.md``)
priced again with today's ``h100-sxm-80gb``: error per kind against the same measurements.

The model items are re-traced here as that check traced them (``model_ops``: the example on meta,
one rank, views excluded) and matched to the report's rows by label and count; the synthetic items
are rebuilt on CPU tensors only for their shapes. Not a held-out check any more for the largest
GEMMs: the rebuilt profile's bf16 curve above 8.6e9 FLOPs was read off these same rows.

    python -m benchmarks.h100_heldout_reprice
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/h100_heldout_reprice.py`: re-executed as the module

import re
import statistics
import sys
from pathlib import Path

REPORT = Path(__file__).resolve().parent / "results" / "h100-2026-11-27" / "check-shipped-h100-llama1b-ops.md"
MODEL = ("examples.models.llama3:llama3_1b", {"n_layers": 1, "batch_size": 2, "seq_len": 2048, "dtype": "bfloat16"})


def measured_rows(text: str) -> list[tuple[str, str, str, int, float]]:
    """(kind, label, source, count, measured seconds) of every compute row of a check report."""
    units = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 8 or cells[0] != "compute":
            continue
        number, unit = re.fullmatch(r"([0-9.]+) (us|ms|s)", cells[6]).groups()
        rows.append((cells[1], cells[2], cells[3], int(cells[4]), float(number) * units[unit]))
    return rows


def predictions(profile_name: str) -> dict[tuple[str, int], list[float]]:
    """(label, count) -> predicted seconds, in trace order, for the model and synthetic items."""
    import torch

    from autoshard.calibrate.heldout import _predict, model_ops, synthetic_ops
    from autoshard.rules import load_rules
    from hw_profiles import load

    profile = load(profile_name)
    rules = load_rules()
    out: dict[tuple[str, int], list[float]] = {}
    for spec in model_ops(MODEL[0], MODEL[1], profile):
        out.setdefault((spec.label, spec.count), []).append(spec.predicted_s)
    for spec in synthetic_ops("full"):
        args, kwargs = spec.make(torch.device("cpu"))
        _, seconds = _predict(spec, args, kwargs, spec.op(*args, **kwargs), profile, rules)
        out.setdefault((spec.label, spec.count), []).append(seconds)
    return out


def main(argv: list[str] | None = None) -> int:
    import logging

    logging.basicConfig(level=logging.ERROR)
    profile = (argv or sys.argv[1:] or ["h100-sxm-80gb"])[0]
    rows = measured_rows(REPORT.read_text())
    predicted = predictions(profile)
    errors: dict[str, list[float]] = {}
    missing = []
    for kind, label, source, count, seconds in rows:
        key = (label, count)
        if not predicted.get(key):
            missing.append(label)
            continue
        errors.setdefault(kind, []).append(predicted[key].pop(0) / seconds - 1)
    everything = [e for v in errors.values() for e in v]
    print(f"profile {profile}: {len(everything)} of {len(rows)} measured rows matched ({len(missing)} not)")
    print("| kind | items | median abs error | p90 abs error | bias (median) |\n|---|---:|---:|---:|---:|")
    for kind, errs in sorted(errors.items()) + [("all", everything)]:
        absolute = sorted(abs(e) for e in errs)
        p90 = absolute[min(len(absolute) - 1, int(0.9 * len(absolute)))]
        print(f"| {kind} | {len(errs)} | {statistics.median(absolute):.0%} | {p90:.0%} | {statistics.median(errs):+.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
