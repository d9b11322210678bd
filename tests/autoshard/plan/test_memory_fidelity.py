"""Estimated peak memory against PyTorch's own trackers (issue 17).

The all-replicated plan on one rank must be within 10 % of MemTracker's peak
of a real CPU step (steady state: the second step, optimizer state held); the
FSDP baseline is compared with FSDP2 ``fully_shard`` under FSDPMemTracker on a
fake process group. The measuring helpers and the full table are in
``benchmarks/memory_fidelity.py``; the ratios in the xfail reasons come from
its run on torch 2.13 CPU.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from benchmarks.memory_fidelity import Config, estimate, measure_fsdp, measure_replicated  # noqa: E402

REPLICATED_TOLERANCE = 0.10
FSDP_TOLERANCE = 0.15


@pytest.mark.parametrize("config", [
    Config("mlp"),
    Config("gpt2"),
    Config("llama3"),
    Config("llama3", overrides={"batch_size": 32, "seq_len": 64}),  # activations ~95 % of the peak
], ids=lambda c: c.name.replace(" ", ","))
def test_all_replicated_estimate_matches_memtracker(config: Config) -> None:
    plan, breakdown = estimate(config, 1, "ddp")
    measured = measure_replicated(config)["Total"]
    ratio = plan.estimate.peak_memory_bytes / measured
    assert breakdown["Total"] == pytest.approx(plan.estimate.peak_memory_bytes)
    assert abs(ratio - 1) <= REPLICATED_TOLERANCE, f"{config.name}: estimate / measured = {ratio:.3f}"


def _fsdp_ratio(config: Config, world_size: int, *, data_parallel: bool) -> float:
    plan, _ = estimate(config, world_size, "fsdp", data_parallel=data_parallel)
    return plan.estimate.peak_memory_bytes / measure_fsdp(config, world_size)["Total"]


@pytest.mark.xfail(strict=True, reason=(
    "fsdp baseline as solved / FSDP2 = 1.62 (gpt2 tiny, batch 8, N=4): with only parameters and the batch "
    "pinned, the solver on cpu-gloo all-gathers the tokens and runs the activations replicated (saving the "
    "gradient reduce-scatters), which FSDP2 does not do"))
def test_fsdp_baseline_matches_fsdp2() -> None:
    ratio = _fsdp_ratio(Config("gpt2", overrides={"batch_size": 8}), 4, data_parallel=False)
    assert abs(ratio - 1) <= FSDP_TOLERANCE, f"estimate / measured = {ratio:.3f}"


@pytest.mark.xfail(strict=True, reason=(
    "fsdp-dp / FSDP2 = 0.70 (gpt2 tiny, batch 8, N=4): our model holds no all-gathered parameter and no "
    "reduce-scatter buffer; FSDP2 holds a block's unsharded parameters plus the prefetched block's all-gather "
    "output (0.121 MiB here); adding them gives 1.01"))
def test_fsdp_data_parallel_parameter_dominated() -> None:
    ratio = _fsdp_ratio(Config("gpt2", overrides={"batch_size": 8}), 4, data_parallel=True)
    assert abs(ratio - 1) <= FSDP_TOLERANCE, f"estimate / measured = {ratio:.3f}"


def test_fsdp_data_parallel_activation_heavy() -> None:
    """With FSDP2's data-parallel activation layout and activations dominating,
    sharded state plus activations match (measured 0.955 at N=4)."""
    ratio = _fsdp_ratio(Config("gpt2", overrides={"batch_size": 16, "seq_len": 64}), 4, data_parallel=True)
    assert abs(ratio - 1) <= FSDP_TOLERANCE, f"estimate / measured = {ratio:.3f}"
