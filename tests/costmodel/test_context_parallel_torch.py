"""torch's own context parallelism priced as it ran for torchtitan (``costmodel.context_parallel_torch``),
on cases worked out by hand from torch's ``_templated_ring_attention`` (torch 1963fc8, 2024-12-23).

Notation: ``cp`` ranks, chunks of ``c`` tokens, each rank ``2c`` rows; X = B H 2c D elements of the
local q (and out), K = B H_kv 2c D of the local K (and V); bf16 inputs (2 bytes), fp32 merges (4).
"""

from __future__ import annotations

import doctest

import pytest

import costmodel.context_parallel_torch as context_parallel_torch
from costmodel.collectives import collective_time_s
from costmodel.compute import op_time_s
from costmodel.context_parallel import AttentionShape, ChunkLayout, ContextParallelError, attention_parts
from costmodel.context_parallel_torch import price_torch_context_attention, torch_ring_steps
from costmodel.mesh import MeshSpec
from hw_profiles import load

H100 = load("h100-sxm-80gb")
SHAPE = AttentionShape(batch=1, heads=8, kv_heads=8, seq_len=16384, head_dim=128)  # cp 2: c = 4096
X = K = 8 * 8192 * 128


def _mem(nbytes: float) -> float:
    return op_time_s("elementwise", flops=0.0, bytes_accessed=nbytes, dtype="torch.float32", profile=H100)


def _attention(q_rows: int, k_rows: int, pairs: int, backward: bool = False) -> float:
    flops = 4.0 * 8 * pairs * 128
    q_bytes, kv_bytes = 8 * q_rows * 128 * 2, 2 * 8 * k_rows * 128 * 2
    if backward:
        return op_time_s("attention_backward", flops=2.5 * flops, bytes_accessed=4 * q_bytes + 2 * kv_bytes,
                         dtype="bf16", profile=H100)
    return op_time_s("attention", flops=flops, bytes_accessed=2 * q_bytes + kv_bytes, dtype="bf16", profile=H100)


def test_docstring_examples_pass():
    result = doctest.testmod(context_parallel_torch, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_one_sdpa_call_a_step_head_chunk_before_us_tail_query_after():
    # rank 2 of 4: step 0 both local chunks causal; steps 1, 2 (senders 1, 0 hold earlier chunks):
    # all queries against the sender's head chunk; step 3 (sender 3): our tail against both chunks
    steps = torch_ring_steps(4, 2, 8 * 5)
    assert [(s.query_rows, s.key_rows, s.causal, s.partial) for s in steps] == [
        (10, 10, True, False), (10, 5, False, False), (10, 5, False, False), (5, 10, False, True)]


@pytest.mark.parametrize("cp", [2, 3, 4, 8])
def test_every_rank_computes_exactly_the_load_balanced_visible_pairs(cp):
    length = 2 * cp * 16
    for rank in range(cp):
        steps = torch_ring_steps(cp, rank, length)
        parts = attention_parts(ChunkLayout(cp), rank, length, causal=True)
        assert sum(s.pairs for s in steps) == sum(p.pairs for p in parts)
        assert len(steps) == cp


def test_forward_is_the_calls_and_their_fp32_merges_with_the_gather_beside_the_first_call():
    # cp 2 across nodes (the gather is not free). Per rank: K, V made contiguous and concatenated
    # (2 x 8 K bytes), the all-gather issued, step 0's causal 2c call and its out converted (6 X),
    # the wait, step 1's call and its merge, the out back to bf16 (6 X). A full merge (rank 1):
    # convert 6 X, then out - out_b (12 X), sigmoid * that (8 X), out - that (12 X); a partial one
    # (rank 0, the tail's half): 19 X on half the rows, and the cat that re-assembles out (8 X)
    mesh = MeshSpec((2, 8), ("cp", "tp"))
    cost = price_torch_context_attention(SHAPE, mesh=mesh, cp_mesh_dim=0, profile=H100)
    gather = collective_time_s("all_gather", 2 * (2 * K * 2), (0,), mesh, H100)
    step0 = _attention(8192, 8192, 8192 * 8193 // 2)
    full, partial = _attention(8192, 4096, 2 * 4096 ** 2), _attention(4096, 8192, 2 * 4096 ** 2)
    before = _mem(8 * K) + _mem(8 * K)
    expected = [before + max(step0 + _mem(6 * X), gather) + call + _mem(merge) + _mem(6 * X)
                for call, merge in ((partial, 19 * X + 8 * X), (full, 38 * X))]
    assert cost.forward_s == pytest.approx(max(expected), rel=1e-12)
    assert cost.forward_comm_s == pytest.approx(gather)
    assert cost.variant == "torch_all_gather" and cost.load_balanced


def test_dk_dv_travel_a_hop_a_step_in_fp32_and_the_last_hop_is_exposed():
    mesh = MeshSpec((4,))
    cost = price_torch_context_attention(SHAPE, mesh=mesh, cp_mesh_dim=0, profile=H100)
    local_kv = 2 * (SHAPE.seq_len // 4) * 8 * 128 * 2
    gather = collective_time_s("all_gather", 4 * local_kv, (0,), mesh, H100)
    hop = collective_time_s("permute", 2 * local_kv, (0,), mesh, H100)  # fp32: twice the bf16 bytes
    assert cost.backward_comm_s == pytest.approx(gather + 4 * hop)
    # contention 0: the last hop is issued before the last dQ update (13 X4 bytes at most, the
    # partial one; X4 = B H 2c D at cp 4) and waited by the conversions after it: the rest is exposed
    x4 = 8 * (SHAPE.seq_len // 4) * 128
    assert cost.backward_s >= cost.backward_compute_s + hop - _mem(13 * x4) > cost.backward_compute_s


def test_the_all_to_all_rotater_passes_kv_every_step_and_holds_two_blocks():
    mesh = MeshSpec((4,))
    cost = price_torch_context_attention(SHAPE, mesh=mesh, cp_mesh_dim=0, profile=H100, rotate="all_to_all")
    local_kv = 2 * (SHAPE.seq_len // 4) * 8 * 128 * 2
    assert cost.forward_comm_s == pytest.approx(3 * collective_time_s("permute", local_kv, (0,), mesh, H100))
    assert cost.kv_buffer_bytes == 2 * local_kv
    gathered = price_torch_context_attention(SHAPE, mesh=mesh, cp_mesh_dim=0, profile=H100)
    assert gathered.kv_buffer_bytes == 4 * local_kv


def test_merging_in_the_inputs_dtype_moves_fewer_bytes():
    args = {"mesh": MeshSpec((4,)), "cp_mesh_dim": 0, "profile": H100}
    f32 = price_torch_context_attention(SHAPE, **args)
    bf16 = price_torch_context_attention(SHAPE, convert_to_f32=False, **args)
    assert bf16.forward_compute_s < f32.forward_compute_s and bf16.backward_compute_s < f32.backward_compute_s


def test_torch_costs_more_than_its_kernels_alone():
    # the per-step merges and accumulations are not free: against the calls' own sum (rank 0)
    cost = price_torch_context_attention(SHAPE, mesh=MeshSpec((2,)), cp_mesh_dim=0, profile=H100)
    kernels = _attention(8192, 8192, 8192 * 8193 // 2) + _attention(4096, 8192, 2 * 4096 ** 2)
    assert cost.forward_compute_s > kernels + _mem(27 * X)


@pytest.mark.parametrize("kwargs,message", [
    ({"rotate": "ring"}, "rotate: 'ring' is not one of all_gather, all_to_all"),
    ({"cp_mesh_dim": 1}, "cp_mesh_dim: 1 is not a mesh dim"),
])
def test_bad_arguments_are_one_error_naming_them(kwargs, message):
    args = {"mesh": MeshSpec((4,)), "cp_mesh_dim": 0, "profile": H100} | kwargs
    with pytest.raises(ContextParallelError, match=message):
        price_torch_context_attention(SHAPE, **args)


def test_a_sequence_the_chunks_do_not_divide_is_named():
    with pytest.raises(ContextParallelError, match="seq_len: 100 does not split into 8 equal chunks"):
        torch_ring_steps(4, 0, 100)
