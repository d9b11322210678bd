"""A solved plan's parameter communication apart (``autoshard.assembly.param_comm``).

A pipeline stage gathers its weights once a step and reduces its gradients once (FSDP2 without
resharding between microbatches, as torchtitan and autoshard's pipeline runtime run it); only the
activations' collectives repeat per microbatch. These tests check the split on small solved plans:
which transfers are the parameters', what a stage holds gathered, and that the exposures add up.
"""

from __future__ import annotations

import math

import pytest

from autoshard.assembly.param_comm import param_comm
from autoshard.search.solve import prepare, solve_prepared


def _solved(baseline: str):
    from examples.models import llama3

    model, inputs = llama3.tiny(n_layers=2, batch_size=4, seq_len=32)
    prep = prepare(model, inputs, (2,), ("dp",), profile="h100-sxm-80gb", recompute="none")
    plan = solve_prepared(prep, baseline=baseline, recompute="none", memory_limit=math.inf, time_limit=10)
    return model, prep, plan


def test_fsdp_holds_each_weight_gathered_with_its_gradient_accumulator() -> None:
    model, prep, plan = _solved("fsdp")
    pc = param_comm(prep.graph, plan)
    params = dict(model.named_parameters())
    assert pc.weight_transfers > 0 and pc.gradient_transfers > 0
    block_weights = [n for n in params if n.startswith("layers.") and params[n].dim() == 2]
    assert block_weights and set(block_weights) <= set(pc.held_by_param)
    for name in block_weights:
        p = params[name]
        # fp32 weights gathered over both ranks, and an fp32 gradient of the same shape
        assert pc.held_by_param[name] == pytest.approx(2 * p.numel() * p.element_size())
    assert pc.held_bytes == pytest.approx(sum(pc.held_by_param.values()))


def test_ddp_moves_no_weight_and_reduces_its_gradients() -> None:
    _, prep, plan = _solved("ddp")
    pc = param_comm(prep.graph, plan)
    assert pc.weight_transfers == 0 and pc.held_bytes == 0 and pc.gather_exposed_s == 0
    assert pc.gradient_transfers > 0


@pytest.mark.parametrize("baseline", ["fsdp", "ddp"])
def test_exposures_are_differences_of_one_simulation(baseline: str) -> None:
    """Every figure is a difference of the plan's schedule simulated with fewer transfers: a
    transfer more never shortens a step, so the parameters' whole share bounds its parts; on a
    DDP plan every parameter transfer is a gradient's, so the share is the reductions'."""
    _, prep, plan = _solved(baseline)
    pc = param_comm(prep.graph, plan)
    for value in (pc.per_microbatch_saving_s, pc.activation_exposed_s, pc.gather_exposed_s, pc.reduction_s):
        assert value >= 0.0
    assert pc.per_microbatch_saving_s >= max(pc.gather_exposed_s, pc.reduction_s) - 1e-12
    # an FSDP step waits for its first weights: the gathers are exposed once
    assert (pc.gather_exposed_s > 0) == (baseline == "fsdp")
    if baseline == "ddp":
        assert pc.per_microbatch_saving_s == pytest.approx(pc.reduction_s)



def test_a_weight_gathered_over_two_data_dims_in_two_steps_is_held_whole() -> None:
    """FSDP over ``dp`` and ``cp`` (a context-parallel stage shards over both, as torchtitan's
    ``dp_shard x cp``) where the gathers run as two steps: the weight is held as both leave it,
    not as the first does (16 of 64 bytes here); a gather over ``tp`` is one op's transient."""
    from types import SimpleNamespace as NS

    from autoshard.assembly.param_comm import _held_bytes

    def gather(dims, nbytes):
        return NS(collective="all_gather", mesh_dims=dims, bytes=nbytes)

    edge = ("param:w", "mm", 1)
    plan = NS(fingerprint=NS(dim_names=("dp", "cp", "tp")), gather_buckets=[NS(dtype="bfloat16")],
              buckets=[NS(dtype="float32")],
              redistributions=[NS(tensor="param:w", to="mm", input_index=1,
                                  steps=(gather((0,), 16), gather((1,), 64), gather((2,), 512)))])
    held = _held_bytes(plan, {edge}, {"param:w": "w"}, {0})
    assert held == {"w": 64 * (1 + 2)}  # bf16 weight, fp32 gradient accumulator
