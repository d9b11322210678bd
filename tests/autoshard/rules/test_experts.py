"""Rules of the experts stand-in: strategy counts, the expert-parallel strategy where experts
divide, its price, and every local strategy checked on simulated shards."""

from __future__ import annotations

import pytest
import torch

import autoshard.trace.experts  # noqa: F401  defines autoshard::experts and its backward
from autoshard.rules import Rule, SingleDimStrategy, TensorMeta, load_rules
from autoshard.rules.core import R, S
from autoshard.rules.experts import EXCHANGE, expert_parallel_price, expert_parallel_strategies
from autoshard.validation.validator import validate_rule
from costmodel.expert_parallel import expert_exchange_price
from costmodel.mesh import MeshSpec
from costmodel.placements import Shard
from hw_profiles import load

F32 = torch.float32
EXPERTS = torch.ops.autoshard.experts.default
BACKWARD = torch.ops.autoshard.experts_backward.default
HIDDEN, INDEX, WEIGHTS = TensorMeta((16, 32), F32), TensorMeta((16, 2), torch.int64), TensorMeta((16, 2), F32)
GATE_UP, DOWN = TensorMeta((8, 24, 32), F32), TensorMeta((8, 32, 12), F32)
FORWARD_ARGS = (HIDDEN, INDEX, WEIGHTS, GATE_UP, DOWN, "silu")
BACKWARD_ARGS = (HIDDEN, *FORWARD_ARGS)


@pytest.fixture(scope="module")
def registry():
    return load_rules()


def test_forward_has_replicate_tokens_tp_columns_and_linear_strategies(registry) -> None:
    labels = [str(s) for s in registry.strategies(EXPERTS, FORWARD_ARGS, {}, (2,)) if s.exchange is None]
    assert labels == [
        "R <- R, R, R, R, R",
        "S(0) <- S(0), S(0), S(0), R, R",
        "P(sum) <- R, R, R, _S(1,sf=2), S(2)",
        "S(1) <- R, R, R, R, S(1)",
        "P(sum) <- R, R, P(sum), R, R",
        "P(sum) <- R, R, R, R, P(sum)",
    ]
    assert not any("S(1), S(2)" in label for label in labels)  # a plain S(1) of [gate; up] would mix the halves
    assert len([s for s in registry.strategies(EXPERTS, FORWARD_ARGS, {}, (2, 2)) if s.exchange is None]) == 36


def test_expert_parallel_offered_on_every_mesh_dim_that_divides_experts_and_tokens(registry) -> None:
    # (2, 4): 8 experts and 16 tokens divide on both dims; the other dim replicates or splits tokens
    ep = [s for s in registry.strategies(EXPERTS, FORWARD_ARGS, {}, (2, 4)) if s.exchange is not None]
    assert sorted({s.exchange for s in ep}) == [(EXCHANGE, 0), (EXCHANGE, 1)]
    assert "RS(0) <- RS(0), RS(0), RS(0), RS(0), RS(0) [expert_dispatch@1]" in [str(s) for s in ep]
    assert "S(0)S(0) <- S(0)S(0), S(0)S(0), S(0)S(0), RS(0), RS(0) [expert_dispatch@1]" in [str(s) for s in ep]
    for s in ep:  # the experts split on E on the exchange's dim; on the other, whole or h split
        dim = s.exchange[1]
        assert [str(p[dim]) for p in s.input_placements[3:]] == ["S(0)", "S(0)"]
        other = [str(p[1 - dim]) for p in s.input_placements[3:]]
        assert other in (["R", "R"], ["_S(1,sf=2)", "S(2)"])
    # 8 experts do not divide over 3 ranks; a size-1 dim carries no exchange
    assert not [s for s in registry.strategies(EXPERTS, FORWARD_ARGS, {}, (3,)) if s.exchange is not None]
    assert {s.exchange for s in registry.strategies(EXPERTS, FORWARD_ARGS, {}, (1, 2)) if s.exchange} == {
        (EXCHANGE, 1)}
    backward = [s for s in registry.strategies(BACKWARD, (TensorMeta((16, 32), F32), *FORWARD_ARGS), {}, (4,))
                if s.exchange is not None]
    assert [str(s) for s in backward] == [
        "S(0), S(0), S(0), S(0) <- S(0), S(0), S(0), S(0), S(0), S(0) [expert_dispatch@0]"]


def test_non_moe_strategies_carry_no_exchange(registry) -> None:
    x = TensorMeta((8, 8), F32)
    assert all(s.exchange is None for s in registry.strategies(torch.ops.aten.mm.default, (x, x), {}, (2, 2)))


def test_backward_strategies_and_compute(registry) -> None:
    args = (TensorMeta((16, 32), F32), *FORWARD_ARGS)
    assert len([s for s in registry.strategies(BACKWARD, args, {}, (2,)) if s.exchange is None]) == 5
    fwd, bwd = registry.compute_kind(EXPERTS, FORWARD_ARGS), registry.compute_kind(BACKWARD, args)
    assert fwd.flops == 16 * 2 * 6 * 32 * 12 and bwd.flops == 3 * fwd.flops


@pytest.mark.parametrize("op", [EXPERTS, BACKWARD], ids=["forward", "backward"])
def test_local_strategies_validate_on_simulated_meshes(registry, op) -> None:
    report = validate_rule(registry.rule_for(op), registry, cases=4, seed=2)
    assert report.ok, "\n".join(str(f) for f in report.failures[:3])
    assert report.strategies_checked > 100


@pytest.mark.parametrize("wrong", ["gate_up plain S(1)", "experts split as a local op"])
def test_validator_catches_what_the_rule_leaves_out(registry, wrong) -> None:
    good = registry.rule_for(EXPERTS)
    strategy = (SingleDimStrategy(S(0), (R, R, R, S(1), Shard(2))) if wrong == "gate_up plain S(1)"
                else SingleDimStrategy(S(0), (S(0), S(0), S(0), S(0), S(0))))
    bad = Rule(EXPERTS, "bad", lambda call: [strategy], good.compute, samples=good.samples, extremes=False)
    assert not validate_rule(bad, registry, cases=3).ok


def test_expert_parallel_strategy_only_where_the_experts_divide(registry) -> None:
    call = registry.op_call(EXPERTS, FORWARD_ARGS, {})
    assert [(str(s.strategy), s.exchange) for s in expert_parallel_strategies(call, ranks=4)] == [
        ("S*(0) <- S*(0), S*(0), S*(0), S*(0), S*(0)", EXCHANGE)]
    assert expert_parallel_strategies(call, ranks=3) == []


def test_expert_parallel_price_is_the_busiest_rank_and_the_exchanges(registry) -> None:
    call = registry.op_call(EXPERTS, FORWARD_ARGS, {})
    mesh, profile = MeshSpec((2, 4)), load("h100-sxm-80gb")
    compute, price = expert_parallel_price(call, mesh_dims=(1,), mesh=mesh, profile=profile)
    local_tokens = 16 // 4
    assert compute.flops == pytest.approx(1.25 * local_tokens * 2 * 6 * 32 * 12)
    assert price == expert_exchange_price(tokens=local_tokens, top_k=2, dim=32, itemsize=4, num_experts=8,
                                          mesh_dims=(1,), mesh=mesh, profile=profile)
    balanced, _ = expert_parallel_price(call, mesh_dims=(1,), mesh=mesh, profile=profile, imbalance=1.0)
    assert balanced.flops < compute.flops


def test_exchange_strategy_price_uses_the_tokens_left_after_every_mesh_dim(registry) -> None:
    from autoshard.rules.experts import exchange_strategy_price

    call = registry.op_call(EXPERTS, FORWARD_ARGS, {})
    mesh, profile = MeshSpec((2, 4)), load("h100-sxm-80gb")
    ep = [s for s in registry.strategies(EXPERTS, FORWARD_ARGS, {}, (2, 4)) if s.exchange == (EXCHANGE, 1)
          and str(s.input_placements[3][0]) == "R"]  # whole experts on dim 0
    by_tokens = {str(s.input_placements[0][0]): s for s in ep}  # tokens replicated or split on dim 0
    whole, _ = exchange_strategy_price(call, by_tokens["R"], mesh=mesh, profile=profile)
    split, exchange_s = exchange_strategy_price(call, by_tokens["S(0)"], mesh=mesh, profile=profile)
    assert whole.flops == pytest.approx(1.25 * (16 // 4) * 2 * 6 * 32 * 12)
    assert split.flops == pytest.approx(whole.flops / 2)
    step = expert_exchange_price(tokens=16 // 8, top_k=2, dim=32, itemsize=4, num_experts=8, mesh_dims=(1,),
                                 mesh=mesh, profile=profile)
    assert exchange_s == pytest.approx(step.forward_s)  # the forward's counts, dispatch and combine
    backward = [s for s in registry.strategies(BACKWARD, BACKWARD_ARGS, {}, (2, 4)) if s.exchange == (EXCHANGE, 1)
                and str(s.input_placements[0][0]) == "S(0)"]
    _, backward_s = exchange_strategy_price(registry.op_call(BACKWARD, BACKWARD_ARGS, {}), backward[0], mesh=mesh,
                                            profile=profile)
    assert backward_s == pytest.approx(step.backward_s) and backward_s > exchange_s  # rows 2d wide, and back
    with pytest.raises(ValueError, match="not an exchange strategy"):
        exchange_strategy_price(call, registry.strategies(EXPERTS, FORWARD_ARGS, {}, (2, 4))[0], mesh=mesh,
                                profile=profile)


def test_expert_parallel_beside_tensor_parallel_splits_every_experts_h(registry) -> None:
    """On a second mesh dim the exchange strategy may split each expert's h (tensor parallel):
    gate and up sliced alike (``_S(1,sf=2)``), ``down`` on h, the output a partial sum; the
    price computes the h slice only."""
    from autoshard.rules.experts import exchange_strategy_memory, exchange_strategy_price

    mesh, profile = MeshSpec((2, 2)), load("h100-sxm-80gb")
    ep_tp = [s for s in registry.strategies(EXPERTS, FORWARD_ARGS, {}, (2, 2)) if s.exchange == (EXCHANGE, 0)
             and str(s.output_placements[0][1]) == "P(sum)"]
    assert [str(s) for s in ep_tp] == [
        "S(0)P(sum) <- S(0)R, S(0)R, S(0)R, S(0)_S(1,sf=2), S(0)S(2) [expert_dispatch@0]"]
    token_split = next(s for s in registry.strategies(EXPERTS, FORWARD_ARGS, {}, (2, 2))
                       if s.exchange == (EXCHANGE, 0) and str(s.output_placements[0][1]) == "R")
    call = registry.op_call(EXPERTS, FORWARD_ARGS, {})
    sliced, _ = exchange_strategy_price(call, ep_tp[0], mesh=mesh, profile=profile)
    whole, _ = exchange_strategy_price(call, token_split, mesh=mesh, profile=profile)
    assert sliced.flops == pytest.approx(whole.flops / 2)  # h / 2 per rank, the same tokens
    assert exchange_strategy_memory(call, ep_tp[0], mesh=mesh, profile=profile) == (2 * 1.25 + 2) * 8 * 2 * 32 * 4
    backward = [str(s) for s in registry.strategies(BACKWARD, BACKWARD_ARGS, {}, (2, 2))
                if s.exchange == (EXCHANGE, 0) and str(s.output_placements[2][1]) == "_S(1,sf=2)"]
    assert backward == ["S(0)P(sum), S(0)P(sum), S(0)_S(1,sf=2), S(0)S(2) <- S(0)R, S(0)R, S(0)R, S(0)R, "
                        "S(0)_S(1,sf=2), S(0)S(2) [expert_dispatch@0]"]
