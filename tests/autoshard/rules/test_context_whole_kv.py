"""The whole-K/V context-parallel kinds (``autoshard.rules.context_parallel``: ``context_whole_kv``,
``context_whole_kv_balanced``): their placements (K/V ``R`` in, dK/dV ``P(sum)`` out on the CP
mesh dim), their price (the attention kernels alone, plus the balanced kind's row moves) and
what they hold beside the op; and, on the example LLaMA with 4 K/V heads for 16 query heads
solved with its attention forced to the kind, that the graph's all-gathers and reduce-scatters
of K/V on the CP dim move the K/V heads' bytes, not the expanded query heads'."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from costmodel.context_parallel import AttentionShape, price_context_attention, price_whole_kv_attention
from costmodel.mesh import MeshSpec
from hw_profiles import load as load_profile

from autoshard.rules import TensorMeta, load_rules
from autoshard.rules.context_parallel import GATHER, WHOLE_KV, WHOLE_KV_BALANCED, gathered_kv_bytes
from autoshard.rules.expand import exchange_pricer

aten = torch.ops.aten
CPU = aten._scaled_dot_product_flash_attention_for_cpu.default
CPU_BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
BF16 = torch.bfloat16
H100 = load_profile("h100-sxm-80gb")


@pytest.fixture(scope="module")
def registry():
    return load_rules()


def _strategy(registry, op, args, kind, mesh_shape, dim=0):
    call = registry.op_call(op, args, {})
    found = [s for s in registry.strategies(op, call.args, call.kwargs, mesh_shape, out_meta=call.outputs)
             if s.exchange == (kind, dim)]
    return call, found


def _backward_args(q, kv, lse):
    return (q, q, kv, kv, q, lse, 0.0, True)


def test_kv_enter_whole_and_dk_dv_leave_partial_on_the_cp_dim_beside_batch_and_head_splits(registry) -> None:
    q, kv = TensorMeta((2, 4, 16, 8), BF16), TensorMeta((2, 2, 16, 8), BF16)
    _, forward = _strategy(registry, CPU, (q, kv, kv, 0.0, True), WHOLE_KV, (2, 2))
    assert sorted(str(s) for s in forward) == [
        "S(2)R, S(2)R <- S(2)R, RR, RR [context_whole_kv@0]",
        "S(2)S(0), S(2)S(0) <- S(2)S(0), RS(0), RS(0) [context_whole_kv@0]",
        "S(2)S(1), S(2)S(1) <- S(2)S(1), RS(1), RS(1) [context_whole_kv@0]"]
    lse = TensorMeta((2, 4, 16), torch.float32)
    _, backward = _strategy(registry, CPU_BACKWARD, _backward_args(q, kv, lse), WHOLE_KV_BALANCED, (2, 2), dim=1)
    assert "RS(2), RP(sum), RP(sum) <- RS(2), RS(2), RR, RR, RS(2), RS(2) [context_whole_kv_balanced@1]" in {
        str(s) for s in backward}


def test_the_price_is_the_kernels_alone_and_the_balanced_kind_adds_its_row_moves(registry) -> None:
    q = TensorMeta((1, 8, 4096, 64), BF16)
    mesh = MeshSpec((4,))
    shape = AttentionShape(batch=1, heads=8, kv_heads=8, seq_len=4096, head_dim=64, dtype=str(BF16))
    for kind, balanced in ((WHOLE_KV, False), (WHOLE_KV_BALANCED, True)):
        call, (strategy, *_) = _strategy(registry, CPU, (q, q, q, 0.0, True), kind, (4,))
        _, seconds = exchange_pricer(kind)(call, strategy, mesh=mesh, profile=H100)
        alone = price_whole_kv_attention(shape, mesh=mesh, cp_mesh_dim=0, profile=H100, load_balanced=balanced)
        if balanced:  # three all-to-alls of the rows: q there, out and lse back
            assert seconds > alone.forward_s
        else:
            assert seconds == alone.forward_s
    gather_call, (gathering, *_) = _strategy(registry, CPU, (q, q, q, 0.0, True), GATHER, (4,))
    _, gathered = exchange_pricer(GATHER)(gather_call, gathering, mesh=mesh, profile=H100)
    flat = price_context_attention(shape, mesh=mesh, cp_mesh_dim=0, profile=H100, load_balanced=False,
                                   keep_gathered=False)
    assert gathered == flat.forward_s > price_whole_kv_attention(shape, mesh=mesh, cp_mesh_dim=0, profile=H100,
                                                                 load_balanced=False).forward_s


def test_only_the_backward_holds_its_whole_fp32_dk_dv_beside_the_op(registry) -> None:
    q, kv = TensorMeta((2, 4, 16, 8), BF16), TensorMeta((2, 2, 16, 8), BF16)
    lse = TensorMeta((2, 4, 16), torch.float32)
    mesh = MeshSpec((4,))
    fwd_call, (fwd, *_) = _strategy(registry, CPU, (q, kv, kv, 0.0, True), WHOLE_KV, (4,))
    bwd_call, (bwd, *_) = _strategy(registry, CPU_BACKWARD, _backward_args(q, kv, lse), WHOLE_KV, (4,))
    assert gathered_kv_bytes(fwd_call, fwd, mesh=mesh) == 0  # the whole K/V are the graph's tensors
    assert gathered_kv_bytes(bwd_call, bwd, mesh=mesh) == 2 * (2 * 2 * 16 * 8) * 4  # dK, dV of every row, fp32


# ------------------------------------------------------------------ a solved plan on the example LLaMA

BATCH, SEQ, HEADS, KV_HEADS, DIM = 1, 16384, 16, 4, 2048
KV_BYTES = BATCH * SEQ * KV_HEADS * (DIM // HEADS) * 2
"""One of K, V (bf16) with its 4 heads; expanded to the 16 query heads it would be 4x."""
_CHAIN = {"view", "_unsafe_view", "unsqueeze", "expand", "clone", "transpose", "mul", "add", "cat", "neg", "slice",
          "sum", "squeeze", "t"}
"""Ops between a K/V projection and the attention (the head view, RoPE, the GQA expansion) and
back (their backward): the tensors whose redistributions are K/V's."""


def _op(node) -> str:
    return getattr(node.target, "__name__", str(node.target)).split(".")[0]


def _walk(start, step) -> set[str]:
    seen, todo = set(), list(start)
    while todo:
        node = todo.pop()
        if node.name in seen or node.op != "call_function" or _op(node) not in _CHAIN:
            continue
        seen.add(node.name)
        todo.extend(step(node))
    return seen


@pytest.fixture(scope="module")
def solved():
    """The example LLaMA (1 layer, bf16, the sequence pinned split on a mesh of 2 ``cp``) solved
    with every attention node forced to ``context_whole_kv``; the names of the forward K/V chain's
    tensors and of the backward's dK/dV chain."""
    from autoshard.graph.builder import build_graph
    from autoshard.search.solve import prepare, solve_prepared
    from examples.models import llama3

    model, inputs = llama3.tiny(device="meta", dtype="bfloat16", seq_len=SEQ, max_seq_len=SEQ, n_layers=1, dim=DIM,
                                n_heads=HEADS, n_kv_heads=KV_HEADS, batch_size=BATCH, vocab_size=256)
    prep = prepare(model, inputs, (2,), ("cp",), profile="h100-sxm-80gb", recompute="none", device_type="cuda")

    def forced(node, strategies):
        if "attention" not in str(node.target):
            return strategies
        return [s for s in strategies if s.exchange == (WHOLE_KV, 0)]

    graph = build_graph(prep.traced, prep.graph.mesh, prep.graph.profile, optimizer=prep.graph.optimizer,
                        recompute=False, restrict=forced)
    plan = solve_prepared(dataclasses.replace(prep, graph=graph), time_limit=10,
                          pins={"tokens": "S(1)", "labels": "S(1)"})
    fx_graph = prep.traced.graph_module.graph
    forward = next(n for n in fx_graph.nodes if str(n.target) == "aten._scaled_dot_product_flash_attention.default")
    backward = next(n for n in fx_graph.nodes if "flash_attention_backward" in str(n.target))
    k, v = forward.args[1], forward.args[2]
    chains = {"k": _walk([k], lambda n: n.all_input_nodes), "v": _walk([v], lambda n: n.all_input_nodes)}
    grads = [u for u in backward.users if u.args[1] in (1, 2)]  # getitem of dK, dV
    chains["dkv"] = _walk([w for g in grads for w in g.users], lambda n: list(n.users)) | {g.name for g in grads}
    return plan, chains


def _steps(plan, kind: str, key: str, chain: set[str]) -> list[int]:
    return [s.bytes for r in plan.redistributions for s in r.steps
            if s.collective == kind and s.mesh_dims == (0,) and getattr(r, key) in chain]


def test_the_solved_plan_runs_attention_with_whole_kv_on_the_cp_dim(solved) -> None:
    plan, _ = solved
    assert [n.exchange for n in plan.nodes if n.exchange] == [(WHOLE_KV, 0)] * 2


def test_k_is_gathered_before_its_expansion_at_its_own_heads_bytes(solved) -> None:
    plan, chains = solved
    gathers = _steps(plan, "all_gather", "to", chains["k"])
    assert gathers and set(gathers) == {KV_BYTES}  # RoPE's products, before the expansion


def test_dk_dv_are_reduce_scattered_after_the_expansions_sum_at_kv_heads_bytes(solved) -> None:
    plan, chains = solved
    scatters = _steps(plan, "reduce_scatter", "tensor", chains["dkv"])
    assert scatters and set(scatters) == {KV_BYTES}


def test_v_is_gathered_before_its_expansion_at_its_own_heads_bytes(solved) -> None:
    plan, chains = solved
    gathers = _steps(plan, "all_gather", "to", chains["v"])
    assert gathers and set(gathers) == {KV_BYTES}
