"""Estimated peak memory against PyTorch's own trackers.

The all-replicated plan on one rank must be within 10 % of MemTracker's peak
of a real CPU step (steady state: the second step, optimizer state held); the
FSDP baseline is compared with FSDP2 ``fully_shard`` under FSDPMemTracker on a
fake process group, within 15 %. The measuring helpers and the full table are
in ``benchmarks/memory_fidelity.py`` (ratios quoted from its run on torch 2.13
CPU). Memory is deterministic: the ratios do not depend on the machine.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from benchmarks.memory_fidelity import (Config, estimate, measure_checkpointed, measure_fsdp,  # noqa: E402
                                        measure_replicated)

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


def _fsdp(config: Config, world_size: int, gather: str,
          bucket_bytes: int | None = None) -> tuple[float, dict[str, float], dict[str, int]]:
    plan, breakdown = estimate(config, world_size, "fsdp", gather=gather, bucket_bytes=bucket_bytes)
    measured = measure_fsdp(config, world_size)
    return plan.estimate.peak_memory_bytes / measured["Total"], breakdown, measured


def test_fsdp_baseline_lays_activations_out_data_parallel_as_fsdp2() -> None:
    """The FSDP baseline runs its ops data parallel (it used not to: the solver
    all-gathered the tokens and ran the activations replicated, 1.62x FSDP2's
    peak); its activations and temporaries at their highest (at the loss, where
    FSDP2's peak is) are FSDP2's."""
    config = Config("gpt2", overrides={"batch_size": 8})
    ratio, _, measured = _fsdp(config, 4, "fsdp2")
    _, breakdown = estimate(config, 4, "fsdp", gather="fsdp2", breakdown_at="activations")
    activations = measured["Activation"] + measured["Temp"]
    assert abs(breakdown["activations"] / activations - 1) <= FSDP_TOLERANCE, breakdown
    assert abs(ratio - 1) <= FSDP_TOLERANCE, f"estimate / measured = {ratio:.3f}"


@pytest.mark.parametrize("config", [Config("gpt2", overrides={"batch_size": 8}), Config("llama3", overrides={"batch_size": 8})],
                         ids=lambda c: c.name.replace(" ", ","))
def test_fsdp_parameter_dominated_counts_gathered_parameters(config: Config) -> None:
    """Parameter-dominated: the peak is the sharded state plus the gathered
    parameters. Priced with FSDP2's gathers (a block's parameters, the next
    block's prefetched, the root's all step) the estimate is FSDP2's peak
    (without gathered parameters it was 0.70); autoshard's runtime gathers per
    reader and holds less (both without gradient buckets, as FSDP2 runs)."""
    ratio, breakdown, measured = _fsdp(config, 4, "fsdp2")
    assert abs(ratio - 1) <= FSDP_TOLERANCE, f"estimate / measured = {ratio:.3f}"
    assert breakdown["copies"] > 0.5 * (measured["Unsharded Param"] + measured["All Gather"])
    per_reader, _, _ = _fsdp(config, 4, "reader", bucket_bytes=0)
    assert per_reader < ratio


@pytest.mark.parametrize("config", [Config("gpt2", overrides={"batch_size": 8}), Config("llama3", overrides={"batch_size": 8})],
                         ids=lambda c: c.name.replace(" ", ","))
def test_priced_as_fsdp2_runs_the_peak_is_fsdp2s_within_5_percent(config: Config) -> None:
    """Priced as FSDP2 runs (its block-wise gathers and reductions, a parameter gathered once per
    pass): the peak is FSDPMemTracker's within 5 % (1.075 and 0.978 before the reductions were
    modelled; the estimate's peak may fall at a unit's reduction, FSDP2's at the loss)."""
    ratio, _, _ = _fsdp(config, 4, "fsdp2")
    assert abs(ratio - 1) <= 0.05, f"estimate / measured = {ratio:.3f}"


def test_fsdp_data_parallel_activation_heavy() -> None:
    """Activations dominating, the runtime's own per-reader gathers: sharded
    state, activations and copies match FSDP2 (measured 1.11 at N=4; the loss
    takes a zero-padded copy of the log-probabilities that FSDP2 does not)."""
    ratio, _, _ = _fsdp(Config("gpt2", overrides={"batch_size": 16, "seq_len": 64}), 4, "reader")
    assert abs(ratio - 1) <= FSDP_TOLERANCE, f"estimate / measured = {ratio:.3f}"


@pytest.mark.parametrize("config", [
    Config("gpt2", overrides={"batch_size": 16, "seq_len": 64}),
    Config("llama3", overrides={"batch_size": 32, "seq_len": 64}),
], ids=lambda c: c.name.replace(" ", ","))
def test_full_recomputation_matches_memtracker_with_checkpointed_blocks(config: Config) -> None:
    """A plan that recomputes every block (``full``) against a real step with
    ``torch.utils.checkpoint`` around the same blocks (measured 1.000 and 0.919),
    and it holds less than the plan that keeps everything."""
    plan, breakdown = estimate(config, 1, "ddp", recompute="full")
    assert plan.recompute and plan.estimate.recompute_s > 0
    measured = measure_checkpointed(config)["Total"]
    ratio = plan.estimate.peak_memory_bytes / measured
    assert breakdown["Total"] == pytest.approx(plan.estimate.peak_memory_bytes)
    assert abs(ratio - 1) <= FSDP_TOLERANCE, f"estimate / measured = {ratio:.3f}"
    assert plan.estimate.peak_without_recompute_bytes > plan.estimate.peak_memory_bytes
