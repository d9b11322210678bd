"""The registry API: loading, lookup, enumeration entry point, no-rule ops,
compute descriptions, caching, coverage of the example models."""

from __future__ import annotations

import logging

import pytest
import torch
from torch._ops import OpOverload

from costmodel.placements import Partial, Replicate, Shard
from autoshard.rules import FAMILIES, OpStrategy, RuleError, RuleRegistry, TensorMeta, load_rules, to_meta
from autoshard.rules.core import COMPUTE_KINDS, S, SingleDimStrategy
from autoshard.rules.compute import elementwise

aten = torch.ops.aten
F32 = torch.float32


@pytest.fixture(scope="module")
def rules() -> RuleRegistry:
    return load_rules()


def test_load_rules_builds_a_fresh_registry_each_call() -> None:
    first, second = load_rules(), load_rules()
    assert first is not second
    assert first.ops() == second.ops()
    assert len(first.ops()) > 200


def test_importing_a_family_module_registers_nothing() -> None:
    import autoshard.rules.pointwise  # noqa: F401

    assert RuleRegistry().ops() == []


def test_every_family_registers_rules_under_its_name(rules: RuleRegistry) -> None:
    assert set(rules.families()) == set(FAMILIES)
    for op in rules.ops():
        assert rules.rule_for(op).op is op


def test_second_rule_for_the_same_op_is_refused_naming_the_op() -> None:
    registry = RuleRegistry()
    rule = registry.family("demo")
    rule(aten.neg.default, compute=elementwise())(lambda call: [])
    with pytest.raises(RuleError, match="aten.neg.default"):
        rule(aten.neg.default, compute=elementwise())(lambda call: [])


def test_rule_for_returns_none_for_an_op_without_rule(rules: RuleRegistry) -> None:
    assert rules.rule_for(aten.logaddexp2.default) is None
    assert rules.rule_for(aten.mm.default).family == "matmul"


def test_op_without_rule_gets_replicate_only_and_one_warning_per_registry(caplog: pytest.LogCaptureFixture) -> None:
    registry = load_rules()
    x = TensorMeta((4, 8), F32)
    with caplog.at_level(logging.WARNING, logger="autoshard.rules"):
        first = registry.strategies(aten.logaddexp2.default, (x, x), {}, (2, 2))
        registry.strategies(aten.logaddexp2.default, (x, x), {}, (4,))
        registry.strategies(aten.logaddexp2.default, (TensorMeta((8,), F32),) * 2, {}, (2,))
    warnings = [r for r in caplog.records if "aten.logaddexp2.default" in r.getMessage()]
    assert len(warnings) == 1
    assert [str(s) for s in first] == ["RR <- RR, RR"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="autoshard.rules"):
        load_rules().strategies(aten.logaddexp2.default, (x, x), {}, (2,))
    assert len([r for r in caplog.records if "aten.logaddexp2.default" in r.getMessage()]) == 1


def test_strategies_start_with_all_replicate_and_are_frozen(rules: RuleRegistry) -> None:
    a, b = TensorMeta((64, 32), F32), TensorMeta((32, 16), F32)
    strategies = rules.strategies(aten.mm.default, (a, b), {}, (2, 4))
    assert strategies[0] == OpStrategy(((Replicate(), Replicate()),), ((Replicate(), Replicate()),) * 2)
    assert all(isinstance(s, OpStrategy) for s in strategies)
    with pytest.raises(AttributeError):
        strategies[0].output_placements = ()  # type: ignore[misc]


def test_strategies_are_cached_and_callers_cannot_corrupt_the_cache(rules: RuleRegistry) -> None:
    x = TensorMeta((8, 8), F32)
    first = rules.strategies(aten.relu.default, (x,), {}, (2, 2))
    first.clear()
    second = rules.strategies(aten.relu.default, (x,), {}, (2, 2))
    assert len(second) > 1


def test_strategies_refuse_real_tensors_and_bad_meshes(rules: RuleRegistry) -> None:
    with pytest.raises(RuleError, match="TensorMeta"):
        rules.strategies(aten.relu.default, (torch.zeros(2),), {}, (2,))
    with pytest.raises(RuleError, match="mesh_shape"):
        rules.strategies(aten.relu.default, (TensorMeta((2,), F32),), {}, (0,))


def test_masked_outputs_have_no_placement(rules: RuleRegistry) -> None:
    g, x = TensorMeta((4, 6, 8), F32), TensorMeta((4, 6, 8), F32)
    stat, w = TensorMeta((4, 6, 1), F32), TensorMeta((8,), F32)
    args = (g, x, [8], stat, stat, w, w, [True, False, True])
    for s in rules.strategies(aten.native_layer_norm_backward.default, args, {}, (2,)):
        assert s.output_placements[1] is None
        assert len(s.input_placements) == 6


def test_strategies_accept_out_meta_for_data_dependent_outputs(rules: RuleRegistry) -> None:
    x = TensorMeta((4, 8), F32)
    strategies = rules.strategies(aten.relu.default, (x,), {}, (2,), out_meta=TensorMeta((4, 8), F32))
    assert "S(1) <- S(1)" in [str(s) for s in strategies]


@pytest.mark.parametrize(
    "op, args, kind",
    [
        (aten.mm.default, (TensorMeta((8, 4), F32), TensorMeta((4, 2), F32)), "matmul"),
        (aten.add.Tensor, (TensorMeta((8, 4), F32), TensorMeta((8, 4), F32)), "elementwise"),
        (aten.sum.dim_IntList, (TensorMeta((8, 4), F32), [1]), "reduction"),
        (aten.view.default, (TensorMeta((8, 4), F32), [32]), "view"),
        (aten.cat.default, ([TensorMeta((8, 4), F32)] * 2, 0), "copy"),
        (aten._scaled_dot_product_flash_attention_for_cpu.default, (TensorMeta((2, 4, 8, 16), F32),) * 3, "attention"),
    ],
)
def test_compute_kind_names_the_kind_the_cost_model_prices(rules: RuleRegistry, op: OpOverload, args: tuple, kind: str) -> None:
    compute = rules.compute_kind(op, args)
    assert compute.kind == kind and kind in COMPUTE_KINDS
    assert compute.flops >= 0 and compute.bytes_accessed >= 0


def test_matmul_compute_counts_two_flops_per_multiply_add(rules: RuleRegistry) -> None:
    compute = rules.compute_kind(aten.mm.default, (TensorMeta((8, 4), F32), TensorMeta((4, 2), F32)))
    assert compute.flops == 2 * 8 * 4 * 2
    assert compute.bytes_accessed == 4 * (8 * 4 + 4 * 2 + 8 * 2)


def test_strategy_compute_prices_the_largest_local_shard(rules: RuleRegistry) -> None:
    a, b = TensorMeta((64, 32), F32), TensorMeta((32, 16), F32)
    strategies = rules.strategies(aten.mm.default, (a, b), {}, (8,))
    row = next(s for s in strategies if s.input_placements[0] == (Shard(0),))
    k_split = next(s for s in strategies if s.output_placements[0] == (Partial("sum"),) and s.input_placements[0] == (Shard(1),))
    whole = rules.compute_kind(aten.mm.default, (a, b)).flops
    assert rules.strategy_compute(aten.mm.default, (a, b), {}, (8,), row).flops == whole / 8
    assert rules.strategy_compute(aten.mm.default, (a, b), {}, (8,), k_split).flops == whole / 8


def test_to_meta_replaces_tensors_in_nested_args() -> None:
    assert to_meta(([torch.zeros(2, 3)], 1)) == ([TensorMeta((2, 3), F32)], 1)


def test_rule_with_wrong_number_of_placements_is_an_error_naming_the_op() -> None:
    registry = RuleRegistry()
    registry.family("demo")(aten.neg.default, compute=elementwise())(lambda call: [SingleDimStrategy(S(0), (S(0), S(0)))])
    with pytest.raises(RuleError, match="aten.neg.default"):
        registry.strategies(aten.neg.default, (TensorMeta((4,), F32),), {}, (2,))


@pytest.mark.parametrize("model", ["mlp", "gpt2", "llama3", "moe", "convnet", "vit"])
def test_every_op_of_the_example_models_has_a_rule_and_enumerates(rules: RuleRegistry, traced_tiny, model: str) -> None:
    traced = traced_tiny(model)
    missing = set()
    for info in traced.nodes.values():
        if not isinstance(info.op, OpOverload):
            continue
        if rules.rule_for(info.op) is None:
            missing.add(str(info.op))
            continue
        strategies = rules.strategies(info.op, info.args, info.kwargs, (2, 2), out_meta=info.outputs)
        assert strategies, info.name
    assert not missing


def test_op_without_rule_and_data_dependent_output_still_gets_replicate_only() -> None:
    x = TensorMeta((4,), F32)
    assert [str(s) for s in load_rules().strategies(aten.nonzero.default, (x,), {}, (2,))] == ["R <- R"]


def test_op_with_rule_and_data_dependent_output_asks_for_out_meta(rules: RuleRegistry) -> None:
    x, mask = TensorMeta((4, 8), F32), TensorMeta((4,), torch.bool)
    with pytest.raises(ValueError, match="out_meta"):
        rules.strategies(aten.index.Tensor, (x, [mask]), {}, (2,))
    given = rules.strategies(aten.index.Tensor, (x, [mask]), {}, (2,), out_meta=TensorMeta((3, 8), F32))
    assert "S(1) <- S(1), R" in [str(s) for s in given]


def test_enumerating_a_llama_sized_node_list_on_8x8_enumerates_each_signature_once(traced_tiny) -> None:
    # ~7,000 op nodes, as a 32-layer LLaMA-8B joint graph has; repeated layers
    # share call signatures, which the registry caches (what keeps this fast:
    # timed in benchmarks/strategy_counts.py, not here).
    infos = [i for i in traced_tiny("llama3").nodes.values() if isinstance(i.op, OpOverload)] * 15
    registry = load_rules()
    first = [registry.strategies(info.op, info.args, info.kwargs, (8, 8), out_meta=info.outputs) for info in infos]
    assert len(infos) > 6000
    distinct = len(registry._strategy_cache)
    assert distinct <= len(infos) // 15  # one enumeration per distinct call, not per node
    again = [registry.strategies(info.op, info.args, info.kwargs, (8, 8), out_meta=info.outputs) for info in infos]
    assert all(len(a) == len(b) and all(x is y for x, y in zip(a, b)) for a, b in zip(first, again))
    assert len(registry._strategy_cache) == distinct


def test_a_rule_that_raises_is_one_rule_error_naming_the_op_and_the_call() -> None:
    from autoshard.rules.compute import elementwise
    from autoshard.rules.registry import Rule, RuleError

    def broken(call):
        return [call.inputs[0].shape[5]]  # IndexError, as the 0-D scatter rule once did

    registry = RuleRegistry()
    registry.add(Rule(torch.ops.aten.neg.default, "demo", broken, elementwise()))
    with pytest.raises(RuleError, match=r"aten\.neg\.default failed on aten\.neg\.default\(float32\[4\]\) for mesh \(2,\): IndexError"):
        registry.strategies(torch.ops.aten.neg.default, (TensorMeta((4,), torch.float32),), {}, (2,))
