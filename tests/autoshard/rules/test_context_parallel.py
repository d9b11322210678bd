"""Context-parallel attention strategies (``autoshard.rules.context_parallel``): where they are
offered, their placements (the runtime contract), and the validator leaving them to the runtime."""

from __future__ import annotations

import pytest
import torch

from costmodel.context_parallel import AttentionShape
from costmodel.context_parallel_torch import price_torch_context_attention
from costmodel.mesh import MeshSpec
from hw_profiles import load as load_profile

from autoshard.rules import Rule, SingleDimStrategy, TensorMeta, load_rules
from autoshard.rules.context_parallel import (GATHER, GATHER_BALANCED, RING, WHOLE_KV, WHOLE_KV_BALANCED, admits,
                                              context_exchanges, gathered_kv_bytes, priced_as_torch)
from autoshard.rules.expand import exchange_pricer
from autoshard.validation.validator import validate_rule

aten = torch.ops.aten
CPU = aten._scaled_dot_product_flash_attention_for_cpu.default
CPU_BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
FLASH = aten._scaled_dot_product_flash_attention.default
EFFICIENT = aten._scaled_dot_product_efficient_attention.default
EFFICIENT_BACKWARD = aten._scaled_dot_product_efficient_attention_backward.default
F32 = torch.float32


@pytest.fixture(scope="module")
def registry():
    return load_rules()


def _qkv(seq: int, kv_seq: int | None = None, heads: int = 4, kv_heads: int | None = None) -> tuple:
    q = TensorMeta((2, heads, seq, 8), F32)
    kv = TensorMeta((2, kv_heads or heads, kv_seq or seq, 8), F32)
    return q, kv, kv


def _cp(strategies) -> list[tuple[str, tuple[str, int]]]:
    return [(str(s), s.exchange) for s in strategies if s.exchange is not None]


def test_causal_attention_offers_every_kind_on_every_mesh_dim_with_batch_and_head_companions(registry) -> None:
    call = registry.op_call(CPU, (*_qkv(16), 0.0, True), {})
    found = _cp(registry.strategies(CPU, call.args, call.kwargs, (2, 2), out_meta=call.outputs))
    kinds = {(kind, dim) for _, (kind, dim) in found}
    assert kinds == {(kind, dim) for kind in (GATHER, GATHER_BALANCED, RING, WHOLE_KV, WHOLE_KV_BALANCED)
                     for dim in (0, 1)}
    on_dim0 = sorted(text for text, ex in found if ex == (GATHER, 0))
    tag = " [context_gather@0]"
    assert on_dim0 == ["S(2)R, S(2)R <- S(2)R, S(2)R, S(2)R" + tag,
                       "S(2)S(0), S(2)S(0) <- S(2)S(0), S(2)S(0), S(2)S(0)" + tag,
                       "S(2)S(1), S(2)S(1) <- S(2)S(1), S(2)S(1), S(2)S(1)" + tag]


def test_no_context_split_where_the_sequence_does_not_divide(registry) -> None:
    call = registry.op_call(CPU, (*_qkv(12), 0.0, True), {})
    on_4 = _cp(registry.strategies(CPU, call.args, call.kwargs, (4,), out_meta=call.outputs))
    # 12 rows on 4 ranks, but 8 chunks do not divide 12: no balanced kind
    assert {ex for _, ex in on_4} == {(GATHER, 0), (RING, 0), (WHOLE_KV, 0)}
    odd = registry.op_call(CPU, (*_qkv(6), 0.0, True), {})
    assert _cp(registry.strategies(CPU, odd.args, odd.kwargs, (4,), out_meta=odd.outputs)) == []
    assert admits(call, GATHER_BALANCED, 3) and not admits(call, GATHER_BALANCED, 4)


def test_not_offered_where_inexact_cross_attention_or_dropout(registry) -> None:
    cross = registry.op_call(CPU, (*_qkv(16, kv_seq=8), 0.0, False), {})
    assert context_exchanges(cross) == []
    dropout = registry.op_call(CPU, (*_qkv(16), 0.1, True), {})
    assert context_exchanges(dropout) == []


def test_a_mask_splits_its_query_rows_and_keeps_keys_whole_and_no_balanced_kind(registry) -> None:
    rows = registry.op_call(CPU, (*_qkv(16), 0.0, False), {"attn_mask": TensorMeta((2, 1, 16, 16), F32)})
    assert [(str(s), k) for s, k in context_exchanges(rows)] == [
        ("S*(2), S*(2) <- S*(2), S*(2), S*(2), S*(2)", GATHER), ("S*(2), S*(2) <- S*(2), R, R, S*(2)", WHOLE_KV)]
    broadcast = registry.op_call(CPU, (*_qkv(16), 0.0, False), {"attn_mask": TensorMeta((1, 1, 1, 16), F32)})
    assert [str(s) for s, _ in context_exchanges(broadcast)][0] == "S*(2), S*(2) <- S*(2), S*(2), S*(2), R"
    flat = registry.op_call(CPU, (*_qkv(16), 0.0, False), {"attn_mask": TensorMeta((16, 16), F32)})
    assert [str(s) for s, _ in context_exchanges(flat)][0] == "S*(2), S*(2) <- S*(2), S*(2), S*(2), S*(0)"


def test_backward_splits_every_sequence_tensor_and_gradients(registry) -> None:
    q, k, v = _qkv(16, heads=4, kv_heads=2)  # GQA: fewer K/V heads
    out, lse = TensorMeta(q.shape, F32), TensorMeta((2, 4, 16), F32)
    call = registry.op_call(CPU_BACKWARD, (out, q, k, v, out, lse, 0.0, True), {})
    assert [(str(s), kind) for s, kind in context_exchanges(call)] == [
        ("S*(2), S*(2), S*(2) <- S*(2), S*(2), S*(2), S*(2), S*(2), S*(2)", GATHER),
        ("S*(2), S*(2), S*(2) <- S*(2), S*(2), S*(2), S*(2), S*(2), S*(2)", GATHER_BALANCED),
        ("S*(2), S*(2), S*(2) <- S*(2), S*(2), S*(2), S*(2), S*(2), S*(2)", RING),
        ("S*(2), P(sum), P(sum) <- S*(2), S*(2), R, R, S*(2), S*(2)", WHOLE_KV),
        ("S*(2), P(sum), P(sum) <- S*(2), S*(2), R, R, S*(2), S*(2)", WHOLE_KV_BALANCED)]


def test_cuda_kernels_keep_their_random_state_replicated(registry) -> None:
    flash = registry.op_call(FLASH, (*_qkv(64), 0.0, True, False), {})
    (single, _), *_ = context_exchanges(flash)
    assert str(single) == "S*(2), S*(2), -, -, -, -, R, R, R <- S*(2), S*(2), S*(2)"
    efficient = registry.op_call(EFFICIENT, (*_qkv(64), None, True, 0.0, True), {})
    assert [str(s) for s, _ in context_exchanges(efficient)][0] == "S*(2), S*(2), R, R <- S*(2), S*(2), S*(2)"
    # the efficient kernel pads logsumexp rows to 32: only whole blocks of 32 rows per rank
    assert admits(efficient, GATHER, 2) and not admits(efficient, GATHER, 4)
    padded = registry.op_call(EFFICIENT, (*_qkv(48), None, True, 0.0, True), {})
    assert context_exchanges(padded) == []


def test_both_kinds_have_a_price_function_and_an_unknown_kind_is_named(registry) -> None:
    assert exchange_pricer(GATHER) is exchange_pricer(GATHER_BALANCED)
    with pytest.raises(KeyError, match="'ring' has no price function"):
        exchange_pricer("ring")


def test_validator_checks_the_local_strategies_and_leaves_the_exchanges_to_the_runtime(registry) -> None:
    for op in (CPU, CPU_BACKWARD):
        report = validate_rule(registry.rule_for(op), registry, cases=3, seed=1)
        assert report.ok, "\n".join(str(f) for f in report.failures[:3])


def test_validator_rejects_the_context_split_run_as_a_local_op(registry) -> None:
    good = registry.rule_for(CPU)

    def as_local(call):
        return [SingleDimStrategy(s.outputs, s.inputs) for s, _ in context_exchanges(call)] or good.single_dim(call)

    bad = Rule(CPU, "bad", as_local, good.compute, samples=good.samples)
    assert not validate_rule(bad, registry, cases=6, seed=3).ok


def test_cuda_backwards_split_every_sequence_tensor(registry) -> None:
    q, k, v = _qkv(64)
    out, lse = TensorMeta(q.shape, F32), TensorMeta((2, 4, 64), F32)
    seed = TensorMeta((), torch.int64)
    efficient = registry.op_call(EFFICIENT_BACKWARD, (out, q, k, v, None, out, lse, seed, seed, 0.0,
                                                      [True, True, True, False], True), {})
    assert [str(s) for s, _ in context_exchanges(efficient)][0] == (
        "S*(2), S*(2), S*(2), - <- S*(2), S*(2), S*(2), S*(2), S*(2), S*(2), R, R")
    flash_backward = aten._scaled_dot_product_flash_attention_backward.default
    flash = registry.op_call(flash_backward, (out, q, k, v, out, lse, None, None, 64, 64, 0.0, True,
                                              TensorMeta((2,), torch.uint64), TensorMeta((), torch.uint64)), {})
    assert [str(s) for s, _ in context_exchanges(flash)][0] == (
        "S*(2), S*(2), S*(2) <- S*(2), S*(2), S*(2), S*(2), S*(2), S*(2), R, R")


def _exchange_strategy(registry, op, args, kind, mesh_shape):
    call = registry.op_call(op, args, {})
    found = [s for s in registry.strategies(op, call.args, call.kwargs, mesh_shape, out_meta=call.outputs)
             if s.exchange == (kind, 0)]
    return call, found[0]


def test_the_backward_holds_fp32_dk_dv_beside_the_gathered_kv(registry) -> None:
    # bf16, 4 ranks: one rank's K and V are 2 x (2 x 4 x 4 x 8) x 2 bytes = 1024; the runtime
    # accumulates dK/dV in fp32, so the reduce-scatter's [4, ...] buffer is 4 x 2048 beside 4 x 1024 gathered
    q = TensorMeta((2, 4, 16, 8), torch.bfloat16)
    lse = TensorMeta((2, 4, 16), F32)
    mesh = MeshSpec((4,))
    fwd_call, fwd = _exchange_strategy(registry, CPU, (q, q, q, 0.0, True), GATHER, (4,))
    bwd_call, bwd = _exchange_strategy(registry, CPU_BACKWARD, (q, q, q, q, q, lse, 0.0, True), GATHER, (4,))
    assert gathered_kv_bytes(fwd_call, fwd, mesh=mesh) == 4 * 1024
    assert gathered_kv_bytes(bwd_call, bwd, mesh=mesh) == 4 * 1024 + 4 * 2048
    ring_call, ring = _exchange_strategy(registry, CPU_BACKWARD, (q, q, q, q, q, lse, 0.0, True), RING, (4,))
    assert gathered_kv_bytes(ring_call, ring, mesh=mesh) == 2 * 1024 + 2 * 2048


def test_priced_as_torch_prices_the_balanced_kind_as_torch_runs_it_and_restores_it(registry) -> None:
    q = TensorMeta((1, 4, 64, 8), torch.bfloat16)
    call, strategy = _exchange_strategy(registry, CPU, (q, q, q, 0.0, True), GATHER_BALANCED, (4,))
    mesh, profile = MeshSpec((4,)), load_profile("h100-sxm-80gb")
    price = exchange_pricer(GATHER_BALANCED)
    _, ours = price(call, strategy, mesh=mesh, profile=profile)
    with priced_as_torch("all_to_all"):
        load_rules()  # every graph build loads the rules, which register the kinds' prices again
        _, seconds = exchange_pricer(GATHER_BALANCED)(call, strategy, mesh=mesh, profile=profile)
    shape = AttentionShape(batch=1, heads=4, kv_heads=4, seq_len=64, head_dim=8, dtype="torch.bfloat16")
    torch_cost = price_torch_context_attention(shape, mesh=mesh, cp_mesh_dim=0, profile=profile, rotate="all_to_all")
    assert seconds == torch_cost.forward_s != ours
    assert exchange_pricer(GATHER_BALANCED)(call, strategy, mesh=mesh, profile=profile)[1] == ours  # left: ours again
    with pytest.raises(ValueError, match="rotate: 'ring' is not one of all_gather, all_to_all"):
        with priced_as_torch("ring"):
            pass
