"""The calibration's vector fit with and without a fraction per op, on one set of samples.

Reads a ``calibrate-hardware --measurements`` file, fits the device figures as
``calibrate-hardware`` does (``autoshard.calibrate.fit.fit_device``), and prints
the fit's relative error over the ``vector`` samples (median, p90, max) priced
with ``efficiency.vector_by_op`` (each op its own fraction) and with the single
``efficiency.vector`` alone (what profiles had before), then each sample's
error. Same samples, same launch floor, peak and memory curve: only the
vector pricing differs.

    autoshard calibrate-hardware --quick --nproc-per-node 1 --threads 1 -o q.json --measurements m.json
    python benchmarks/vector_fit.py m.json

Findings: ``benchmarks/results/calibration_fit.md``.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:
    import _as_module  # noqa: F401 - `python benchmarks/vector_fit.py`: re-executed as the module

import argparse
import json
from pathlib import Path

from autoshard.calibrate.fit import FitError, fit_device, predict_compute, relative_errors
from autoshard.calibrate.measure_compute import ComputeSample
from hw_profiles import HardwareProfile, load


def _samples(path: str) -> list[ComputeSample]:
    return [ComputeSample.from_dict(s) for s in json.loads(Path(path).read_text())["compute"]]


def _profile(device: dict) -> HardwareProfile:
    base = load("cpu-gloo").to_dict()
    return HardwareProfile.from_dict({**base, "device": {**base["device"], **device}})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("measurements", help="a calibrate-hardware --measurements file")
    args = parser.parse_args(argv)
    samples = _samples(args.measurements)
    vector = [s for s in samples if s.kind == "vector"]
    if not vector:
        raise SystemExit("vector_fit: the file has no vector samples")
    device = fit_device(samples, primary="fp32")
    per_op = _profile(device)
    one = _profile({**device, "efficiency": {k: v for k, v in device["efficiency"].items() if k != "vector_by_op"}})
    measured = [s.seconds for s in vector]
    errors = {name: relative_errors([predict_compute(s, p) for s in vector], measured)
              for name, p in (("per op", per_op), ("one fraction", one))}
    print(f"vector {device['efficiency'].get('vector')}, per op {device['efficiency'].get('vector_by_op')}")
    for name, errs in errors.items():
        print(f"{name:12}: {FitError.of(errs).text()}")
    print("| op | shape | measured us | error per op | error one fraction |\n|---|---|---:|---:|---:|")
    for s, a, b in zip(vector, errors["per op"], errors["one fraction"]):
        print(f"| {s.op} | {s.shape} | {s.seconds * 1e6:.1f} | {a:+.0%} | {b:+.0%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
