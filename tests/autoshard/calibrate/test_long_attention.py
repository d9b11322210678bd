"""Long-sequence attention samples of a calibration: on a GPU, ``--quick`` times one causal sequence
of 8,192 and 32,768 tokens (32 heads of 128, bf16, forward and backward) so the attention curves
reach the FLOPs of long-context training; the CPU skips them; the fit carries them into the curve."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from autoshard.calibrate import measure_compute
from autoshard.calibrate.fit import fit_device, predict_compute
from autoshard.calibrate.measure_compute import LONG_ATTENTION, ComputeSample, compute_items
from autoshard.calibrate.timing import Job, Settings
from hw_profiles import HardwareProfile, load


def _gpu_items(monkeypatch, mode: str, free_bytes: int) -> list:
    """The items a CUDA job of ``mode`` would measure, with ``free_bytes`` free on the device
    (only the sizes are read here; nothing runs on the device)."""
    monkeypatch.setattr(measure_compute, "available_bytes", lambda job: free_bytes // 4)
    return compute_items(Job(device=torch.device("cuda", 0)), mode)


def _long(items) -> list:
    return [i for i in items if i.label.startswith("attention") and "x32x" in i.label]


def test_a_gpu_quick_calibration_times_one_sequence_of_8k_and_32k_tokens_forward_and_backward(monkeypatch) -> None:
    items = _long(_gpu_items(monkeypatch, "quick", 80 * 2**30))
    assert [i.label for i in items] == [f"attention {p} 1x32x{s}x128" for s in LONG_ATTENTION["quick"]
                                        for p in ("fwd", "bwd")]
    assert not any(i.repeat for i in items)  # tens of ms a call: measured once, not every pass
    assert sum(i.weight for i in items) < 10  # the progress bar's estimate: seconds on a GPU, not hours


def test_the_long_sequences_are_limited_by_device_memory_and_skipped_on_the_cpu(monkeypatch) -> None:
    small = _long(_gpu_items(monkeypatch, "quick", 4 * 2**30))  # 32k's backward needs ~2.1 GB: over a quarter
    assert [i.label for i in small] == ["attention fwd 1x32x8192x128", "attention bwd 1x32x8192x128"]
    assert not _long(_gpu_items(monkeypatch, "tiny", 80 * 2**30))
    monkeypatch.undo()
    assert not _long(compute_items(Job.single(), "quick"))


def test_a_one_sequence_item_measures_its_heads_with_the_causal_flop_count() -> None:
    item = measure_compute._attention_item(4, 64, 16, "fp32", True, heads=4)
    (sample,) = item.run(Job.single(), Settings(warmup=0, trials=1, min_trial_s=0.0))
    assert sample.shape == "1x4x64x16" and sample.op == "sdpa_bwd"
    assert sample.flops == 2.5 * 4.0 * 4 * (64 * 65 / 2) * 16 and sample.seconds > 0


def test_the_fit_extends_the_attention_curves_to_the_long_samples_flops(monkeypatch) -> None:
    longest = max((i for i in _long(_gpu_items(monkeypatch, "quick", 80 * 2**30)) if "bwd" in i.label),
                  key=lambda i: i.weight)
    big = 2.5 * 4.0 * 32 * (32768 * 32769 / 2) * 128  # the 32k backward's FLOPs
    assert longest.weight == pytest.approx(0.5 + big / 2e14)
    data = load("cpu-gloo").to_dict()
    data["device"].update(launch_s=4e-6, peak_flops={"fp32": 1e12}, memory_bandwidth_Bps=1e11)
    data["device"]["efficiency"] = {"matmul": [[1e5, 0.1], [1e8, 1.0]], "memory": 1.0,
                                    "attention": [[1e8, 0.05], [1e10, 0.3], [1e13, 0.8]],
                                    "attention_backward": [[1e8, 0.02], [1e10, 0.2], [2.5e13, 0.6]]}
    truth = HardwareProfile.from_dict(data)

    def sample(kind, op, flops, nbytes):
        s = ComputeSample(kind, op, "-", "fp32", flops, nbytes, 0.0, 0.0, math.inf)
        return dataclasses.replace(s, seconds=predict_compute(s, truth))

    samples = [sample("launch", op, 1.0, 8.0) for op in ("add", "neg", "sum")]
    samples += [sample("matmul", "mm", 2.0 * n**3, 12.0 * n * n) for n in (64, 256, 1024)]
    samples += [sample("memory", "add", n, 12.0 * n) for n in (2**12, 2**20)]
    long_fwd = [4.0 * 32 * (n * (n + 1) / 2) * 128 for n in LONG_ATTENTION["quick"]]
    for flops in (1e8, 1e9, 1e10, *long_fwd):  # the short shapes, then the two long ones
        samples += [sample("attention", "sdpa_fwd", flops, 1e3), sample("attention", "sdpa_bwd", 2.5 * flops, 1e3)]
    eff = fit_device(samples, primary="fp32")["efficiency"]
    assert eff["attention_backward"][-1][0] == pytest.approx(big, rel=0.01)
    assert eff["attention_backward"][-1][1] > 2 * eff["attention_backward"][-3][1]  # not held at 1e10's
    fitted = HardwareProfile.from_dict({**data, "device": {**data["device"], "efficiency": {
        **data["device"]["efficiency"], **{k: eff[k] for k in ("attention", "attention_backward")}}}})
    for s in samples[-4:]:
        assert predict_compute(s, fitted) == pytest.approx(s.seconds, rel=0.05), s
