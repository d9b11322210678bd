"""Context-parallel attention in the cost model: chunk layouts, visible pairs and the price,
on cases worked out by hand (``costmodel.context_parallel``).

Notation: ``cp`` ranks, chunks of ``c`` tokens, ``L`` tokens in all.
"""

from __future__ import annotations

import dataclasses
import doctest
import itertools

import pytest

import costmodel.context_parallel as context_parallel
from costmodel.collectives import collective_time_s
from costmodel.compute import op_time_s
from costmodel.context_parallel import (AttentionShape, ChunkLayout, ContextParallelError, attention_parts,
                                        best_context_attention, price_context_attention, visible_pairs)
from costmodel.mesh import MeshSpec
from hw_profiles import load

H100 = load("h100-sxm-80gb")


def test_docstring_examples_pass():
    result = doctest.testmod(context_parallel, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


# ------------------------------------------------------------------ layouts and pairs


def test_load_balanced_ranks_hold_a_head_and_a_tail_chunk():
    layout = ChunkLayout(4)
    assert [layout.chunks_of(r) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert layout.chunk_order() == (0, 7, 1, 6, 2, 5, 3, 4)
    assert all(layout.owner_of(g) == (r, s) for r in range(4) for s, g in enumerate(layout.chunks_of(r)))
    assert ChunkLayout(4, load_balanced=False).chunk_order() == (0, 1, 2, 3)


def _brute_pairs(a: int, b: int, c: int, causal: bool, window: int | None) -> int:
    def keep(p: int, k: int) -> bool:
        d = p - k
        return (d >= 0 or not causal) and (window is None or abs(d) < window)

    return sum(keep(p, k) for p in range(a, a + c) for k in range(b, b + c))


@pytest.mark.parametrize("causal,window", [(True, None), (False, None), (True, 1), (True, 3), (True, 6),
                                           (False, 2), (False, 5)])
def test_visible_pairs_count_the_mask_of_every_block(causal, window):
    for a, b in itertools.product(range(0, 20, 4), repeat=2):
        assert visible_pairs(a, b, 4, causal=causal, window=window) == _brute_pairs(a, b, 4, causal, window), (a, b)


def test_causal_pairs_per_rank_by_hand():
    # L = 8, cp = 2, load-balanced: c = 2; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
    # rank 0: chunk 0 its diagonal (3); chunk 3: chunks 0, 1, 2 whole (12) and its diagonal (3) = 18
    # rank 1: chunk 1: chunk 0 (4) + diagonal (3); chunk 2: chunks 0, 1 (8) + diagonal (3) = 18
    layout = ChunkLayout(2)
    assert [sum(p.pairs for p in attention_parts(layout, r, 8, causal=True)) for r in range(2)] == [18, 18]
    # contiguous, c = 4: rank 0 its diagonal (10), rank 1 chunk 0 whole (16) and its diagonal (10)
    flat = ChunkLayout(2, load_balanced=False)
    assert [sum(p.pairs for p in attention_parts(flat, r, 8, causal=True)) for r in range(2)] == [10, 26]


def test_parts_put_local_keys_first_and_cover_every_visible_pair_once():
    for cp, causal, window, balanced in itertools.product((1, 2, 3, 4), (True, False), (None, 3, 7), (True, False)):
        layout = ChunkLayout(cp, balanced)
        length = layout.n_chunks * 4
        seen: dict[tuple[int, int], int] = {}
        for rank in range(cp):
            parts = attention_parts(layout, rank, length, causal=causal, window=window)
            flags = [p.local for p in parts]
            assert flags == sorted(flags, reverse=True), "local parts first"
            for part in parts:
                assert part.local == all(layout.owner_of(g)[0] == rank for g in part.key_chunks)
                assert part.query_chunk in layout.chunks_of(rank)
                for g in part.key_chunks:
                    seen[(part.query_chunk, g)] = seen.get((part.query_chunk, g), 0) + 1
                expected = sum(visible_pairs(part.query_chunk * 4, g * 4, 4, causal=causal, window=window)
                               for g in part.key_chunks)
                assert part.pairs == expected
                assert part.mode != "full" or part.pairs == 16 * len(part.key_chunks)
        want = {(q, g) for q in range(layout.n_chunks) for g in range(layout.n_chunks)
                if visible_pairs(q * 4, g * 4, 4, causal=causal, window=window)}
        assert set(seen) == want and set(seen.values()) == {1}


def test_ring_parts_go_by_owner_in_ring_order():
    # rank 1 of 3 (load-balanced, chunks 1 and 4): step j reads rank (1 - j) mod 3's chunks
    parts = attention_parts(ChunkLayout(3), 1, 12, causal=True, group_by="owner")
    steps = [(p.step, tuple(ChunkLayout(3).owner_of(g)[0] for g in p.key_chunks)) for p in parts]
    assert [s for s, _ in steps] == sorted(s for s, _ in steps)
    assert all(set(owners) == {(1 - step) % 3} for step, owners in steps)


# ------------------------------------------------------------------ the price

SHAPE = AttentionShape(batch=1, heads=32, kv_heads=8, seq_len=32768, head_dim=128)
LOCAL_KV = 2 * 1 * 8 * (32768 // 4) * 128 * 2  # K and V of one rank's 8192 tokens, bf16


def _mem(nbytes: float) -> float:
    return op_time_s("elementwise", flops=0.0, bytes_accessed=nbytes, dtype="torch.float32", profile=H100)


def _times(parts, c: int, backward: bool) -> list[float]:
    """Each part by hand: its kernel (4 B H D pairs FLOPs, 2.5x backward, the bytes it reads and
    writes) and the runtime's memory-bound ops beside it, X = B H c D query elements, K = B H_kv c D:
    forward, out bf16 -> fp32 (6 bytes an element) and, after a chunk's first part, the merge
    acc * w + out * w in fp32 (28); backward, dout and out copied dense (8), dq and dk, dv added
    into fp32 accumulators (10: read 4 + 2, write 4). Key chunks of one call concatenated (8 K each)."""
    out, merged = [], set()
    x, k = 32 * c * 128, 8 * c * 128
    for p in parts:
        q_bytes = 32 * c * 128 * 2
        kv_bytes = 2 * 8 * len(p.key_chunks) * c * 128 * 2
        flops = 4.0 * 32 * p.pairs * 128
        cat = 8 * len(p.key_chunks) * k if len(p.key_chunks) > 1 else 0
        if backward:
            out.append(op_time_s("attention_backward", flops=2.5 * flops, bytes_accessed=4 * q_bytes + 2 * kv_bytes,
                                 dtype="bf16", profile=H100)
                       + _mem(8 * x + cat + 10 * (x + 2 * len(p.key_chunks) * k)))
        else:
            merge = 6 * x + (28 * x if p.query_chunk in merged else 0)
            merged.add(p.query_chunk)
            out.append(op_time_s("attention", flops=flops, bytes_accessed=2 * q_bytes + kv_bytes, dtype="bf16",
                                 profile=H100) + _mem(cat + merge))
    return out


# one rank's rows: 2 chunks of 4096; the forward's cat of the fp32 outs (8) and back to bf16 (6); the
# backward's fp32 zeros of dq, dk/dv and the [4, ...] buffer, the arrived dK/dV added (12), back to bf16 (6)
ROWS_X, ROWS_KV = 32 * 8192 * 128, 2 * 8 * 8192 * 128
FORWARD_REST = _mem(8 * ROWS_X + 6 * ROWS_X)
BACKWARD_REST = _mem(4 * (ROWS_X + ROWS_KV + 4 * ROWS_KV) + 12 * ROWS_KV + 6 * (ROWS_X + ROWS_KV))


@pytest.mark.parametrize("mesh,dim", [(MeshSpec((4,)), 0), (MeshSpec((4, 8), ("cp", "tp")), 0)],
                         ids=["nvlink", "across-nodes"])
def test_all_gather_forward_is_the_local_parts_beside_the_gather_then_the_remote_ones(mesh, dim):
    # contention 0 (H100): forward = max(local parts, gather) + remote parts, slowest rank;
    # backward (K/V kept) = remote parts + max(local parts, reduce-scatter)
    cost = price_context_attention(SHAPE, mesh=mesh, cp_mesh_dim=dim, profile=H100)
    gather = collective_time_s("all_gather", 4 * LOCAL_KV, (dim,), mesh, H100)
    scatter = collective_time_s("reduce_scatter", 4 * 2 * LOCAL_KV, (dim,), mesh, H100)  # dK/dV in fp32
    forward, backward = [], []
    for rank in range(4):
        parts = attention_parts(ChunkLayout(4), rank, SHAPE.seq_len, causal=True)
        n = sum(p.local for p in parts)
        f, b = _times(parts, 4096, False), _times(parts, 4096, True)
        forward.append(max(sum(f[:n]), gather) + sum(f[n:]) + FORWARD_REST)
        backward.append(sum(b[n:]) + max(sum(b[:n]), scatter) + BACKWARD_REST)
    assert cost.forward_comm_s == pytest.approx(gather) and cost.backward_comm_s == pytest.approx(scatter)
    assert cost.forward_s == pytest.approx(max(forward), rel=1e-12)
    assert cost.backward_s == pytest.approx(max(backward), rel=1e-12)
    assert cost.kv_buffer_bytes == 4 * LOCAL_KV == cost.held_kv_bytes
    assert cost.backward_buffer_bytes == 4 * LOCAL_KV + 4 * 2 * LOCAL_KV  # gathered bf16 K/V, fp32 dK/dV buffer


def test_dk_dv_leave_in_the_fp32_accumulators_the_runtime_sends():
    # the runtime accumulates 16-bit dK/dV in fp32 and sends those: the reduce-scatter and the
    # ring's accumulator hops carry twice the bytes of the bf16 K/V that went out
    mesh = MeshSpec((4, 8), ("cp", "tp"))
    gathered = price_context_attention(SHAPE, mesh=mesh, cp_mesh_dim=0, profile=H100)
    ring = price_context_attention(SHAPE, mesh=mesh, cp_mesh_dim=0, profile=H100, variant="ring")
    assert gathered.backward_comm_s == pytest.approx(
        collective_time_s("reduce_scatter", 4 * 2 * LOCAL_KV, (0,), mesh, H100))
    hop, grad_hop = (collective_time_s("permute", n, (0,), mesh, H100) for n in (LOCAL_KV, 2 * LOCAL_KV))
    assert ring.backward_comm_s == pytest.approx(3 * hop + 4 * grad_hop)
    assert ring.backward_buffer_bytes == LOCAL_KV + 2 * 2 * LOCAL_KV


def test_merges_and_accumulations_cost_memory_time_beside_the_kernels():
    # one rank, no exchange: the kernels alone would be the whole price; the runtime still merges
    # the parts in fp32 and accumulates the backward's grads in fp32
    shape = AttentionShape(batch=1, heads=32, kv_heads=8, seq_len=8192, head_dim=128)
    cost = price_context_attention(shape, mesh=MeshSpec((1,)), cp_mesh_dim=0, profile=H100)
    parts = attention_parts(ChunkLayout(1), 0, 8192, causal=True)
    kernels = [op_time_s("attention", flops=4.0 * 32 * p.pairs * 128,
                         bytes_accessed=2 * 32 * 4096 * 128 * 2 + 2 * 8 * len(p.key_chunks) * 4096 * 128 * 2,
                         dtype="bf16", profile=H100) for p in parts]
    assert cost.forward_compute_s > sum(kernels) + _mem(28 * 32 * 4096 * 128) > sum(kernels)


def test_gathering_again_in_the_backward_frees_the_kv_and_pays_a_gather():
    mesh = MeshSpec((4, 8), ("cp", "tp"))  # cp across nodes: the collectives are not free
    kept = price_context_attention(SHAPE, mesh=mesh, cp_mesh_dim=0, profile=H100)
    again = price_context_attention(SHAPE, mesh=mesh, cp_mesh_dim=0, profile=H100, keep_gathered=False)
    gather = collective_time_s("all_gather", 4 * LOCAL_KV, (0,), mesh, H100)
    assert again.held_kv_bytes == 0 and kept.held_kv_bytes == 4 * LOCAL_KV
    assert again.backward_comm_s == pytest.approx(kept.backward_comm_s + gather)
    assert again.forward_s == kept.forward_s and again.backward_s > kept.backward_s


def test_without_load_balancing_the_last_rank_does_most_of_the_causal_work():
    flat = price_context_attention(SHAPE, mesh=MeshSpec((4,)), cp_mesh_dim=0, profile=H100, load_balanced=False)
    lb = price_context_attention(SHAPE, mesh=MeshSpec((4,)), cp_mesh_dim=0, profile=H100)
    c = SHAPE.seq_len // 4
    # contiguous: rank r sees r whole chunks and its diagonal; load-balanced: a quarter of the triangle each
    assert flat.forward_pairs_by_rank == tuple(r * c * c + c * (c + 1) // 2 for r in range(4))
    assert lb.forward_pairs_by_rank == (SHAPE.seq_len * (SHAPE.seq_len + 1) // 2 // 4,) * 4
    assert flat.forward_compute_s > 1.5 * lb.forward_compute_s
    assert flat.step_s > lb.step_s


def test_non_causal_work_is_even_in_both_layouts():
    for balanced in (True, False):
        cost = price_context_attention(SHAPE, mesh=MeshSpec((4,)), cp_mesh_dim=0, profile=H100, causal=False,
                                       load_balanced=balanced)
        assert cost.forward_pairs_by_rank == (SHAPE.seq_len ** 2 // 4,) * 4


def test_a_sliding_window_cuts_the_work_to_the_band():
    w = 1024
    cost = price_context_attention(SHAPE, mesh=MeshSpec((4,)), cp_mesh_dim=0, profile=H100, window=w)
    band = sum(min(p + 1, w) for p in range(SHAPE.seq_len))  # query p sees keys max(0, p - w + 1) .. p
    assert sum(cost.forward_pairs_by_rank) == band


def test_ring_passes_one_block_per_step_and_holds_two():
    mesh = MeshSpec((4,))
    ring = price_context_attention(SHAPE, mesh=mesh, cp_mesh_dim=0, profile=H100, variant="ring")
    step = collective_time_s("permute", LOCAL_KV, (0,), mesh, H100)
    assert ring.forward_comm_s == pytest.approx(3 * step)
    grad_step = collective_time_s("permute", 2 * LOCAL_KV, (0,), mesh, H100)  # fp32 dK/dV
    assert ring.backward_comm_s == pytest.approx(3 * step + 4 * grad_step)  # K/V 3 hops, dK/dV 3 hops and home
    assert ring.kv_buffer_bytes == LOCAL_KV and ring.held_kv_bytes == 0
    # forward: step j's compute beside the pass of the next block, so at least the compute and
    # at most the compute plus every pass
    assert ring.forward_compute_s - 1e-12 <= ring.forward_s <= ring.forward_compute_s + ring.forward_comm_s + 1e-12


def test_the_best_variant_is_the_cheaper_one():
    mesh = MeshSpec((4, 8), ("cp", "tp"))
    costs = [price_context_attention(SHAPE, mesh=mesh, cp_mesh_dim=0, profile=H100, variant=v)
             for v in ("all_gather", "ring")]
    best = best_context_attention(SHAPE, mesh=mesh, cp_mesh_dim=0, profile=H100)
    assert best.step_s == min(c.step_s for c in costs)


def test_contention_on_cpu_ranks_exposes_the_gather():
    # cpu-gloo: kappa well above 0 (ranks share cores), so the gather that hides behind the local
    # parts with kappa 0 costs kappa * d more: both streams run at 1 / (1 + kappa) while it is in flight
    cpu = load("cpu-gloo")
    shape = AttentionShape(batch=1, heads=4, kv_heads=2, seq_len=1024, head_dim=32, dtype="fp32", itemsize=4)
    args = {"mesh": MeshSpec((2,)), "cp_mesh_dim": 0}
    shared = price_context_attention(shape, profile=cpu, **args)
    dedicated = price_context_attention(shape, profile=dataclasses.replace(cpu, overlap=None), **args)
    assert cpu.contention > 0.5
    # kappa 0: hidden, it is shorter than the local parts
    assert dedicated.forward_s == pytest.approx(dedicated.forward_compute_s)
    assert shared.forward_s - dedicated.forward_s == pytest.approx(cpu.contention * shared.forward_comm_s, rel=1e-9)


@pytest.mark.parametrize("kwargs,message", [
    ({"variant": "ulysses"}, "variant: 'ulysses' is not one of all_gather, ring"),
    ({"cp_mesh_dim": 2}, "cp_mesh_dim: 2 is not a mesh dim"),
    ({"window": 0}, "window: must be a positive int"),
])
def test_bad_arguments_are_one_error_naming_them(kwargs, message):
    args = {"mesh": MeshSpec((4,)), "cp_mesh_dim": 0, "profile": H100} | kwargs
    with pytest.raises(ContextParallelError, match=message):
        price_context_attention(SHAPE, **args)


def test_bad_shapes_are_one_error_naming_the_field():
    with pytest.raises(ContextParallelError, match="kv_heads: 3 does not divide heads 32"):
        AttentionShape(batch=1, heads=32, kv_heads=3, seq_len=8, head_dim=8)
    with pytest.raises(ContextParallelError, match="seq_len: 100 does not split into 8 equal chunks"):
        ChunkLayout(4).chunk_len(100)
    with pytest.raises(ContextParallelError, match="cp: must be a positive int"):
        ChunkLayout(0)


# ------------------------------------------------------------------ whole K/V (the graph gathers and reduces)


@pytest.mark.parametrize("cp,balanced,causal", [(2, True, True), (4, True, True), (4, False, True), (3, False, False)])
def test_whole_kv_parts_cover_every_visible_pair_once_in_consecutive_key_slices(cp, balanced, causal):
    layout, seq = ChunkLayout(cp, balanced), 8 * cp
    c = layout.chunk_len(seq)
    for rank in range(cp):
        seen = set()
        for part in context_parallel.whole_kv_parts(layout, rank, seq, causal=causal):
            keys = part.key_chunks
            assert keys == tuple(range(keys[0], keys[0] + len(keys)))  # one slice of K/V, no concatenation
            assert part.mode in ("causal", "full") and part.local
            for k in keys:
                assert (part.query_chunk, k) not in seen
                seen.add((part.query_chunk, k))
            assert part.pairs == sum(visible_pairs(part.query_chunk * c, k * c, c, causal=causal) for k in keys)
        visible = {(q, k) for q in layout.chunks_of(rank) for k in range(layout.n_chunks)
                   if visible_pairs(q * c, k * c, c, causal=causal)}
        assert seen == visible


def test_whole_kv_price_is_the_kernels_alone_with_no_collective_and_whole_fp32_dk_dv_beside():
    shape = AttentionShape(batch=1, heads=32, kv_heads=32, seq_len=65536, head_dim=128)
    mesh = MeshSpec((8,))
    whole = context_parallel.price_whole_kv_attention(shape, mesh=mesh, cp_mesh_dim=0, profile=H100)
    gather = price_context_attention(shape, mesh=mesh, cp_mesh_dim=0, profile=H100, keep_gathered=False)
    assert whole.variant == "whole_kv" and whole.forward_comm_s == whole.backward_comm_s == 0.0
    assert (whole.forward_s, whole.backward_s) == (whole.forward_compute_s, whole.backward_compute_s)
    assert whole.forward_pairs_by_rank == gather.forward_pairs_by_rank  # the same work, balanced
    assert whole.step_s < gather.step_s  # what the gather and reduce-scatter add, and the cat of key chunks
    assert whole.kv_buffer_bytes == whole.held_kv_bytes == 0
    assert whole.backward_buffer_bytes == 2 * 32 * 65536 * 128 * 4  # dK and dV of every key row, fp32


def test_whole_kv_without_load_balancing_prices_the_last_rank_slowest():
    shape = AttentionShape(batch=1, heads=8, kv_heads=8, seq_len=32768, head_dim=128)
    flat = context_parallel.price_whole_kv_attention(shape, mesh=MeshSpec((4,)), cp_mesh_dim=0, profile=H100,
                                                     load_balanced=False)
    lb = context_parallel.price_whole_kv_attention(shape, mesh=MeshSpec((4,)), cp_mesh_dim=0, profile=H100)
    assert flat.forward_pairs_by_rank == tuple(sorted(flat.forward_pairs_by_rank))
    assert len(set(lb.forward_pairs_by_rank)) == 1
    assert flat.forward_s > lb.forward_s and flat.backward_s > lb.backward_s
