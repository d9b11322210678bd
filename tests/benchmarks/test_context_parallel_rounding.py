"""The whole-K/V kinds' dK/dV rounding simulation of ``benchmarks.context_parallel --rounding``: its
per-rank shares are the runtime's (``context_attention._whole_backward``, rounded as it hands them
over), and the errors it reports behave as the kinds' precision note says."""

from __future__ import annotations

import pytest
import torch

from benchmarks.context_parallel import rounding_errors, whole_kv_shares
from costmodel.context_parallel import ChunkLayout

from autoshard.runtime.context_attention import CPConfig, _whole_backward, _WholeBlocks, sequence_shard

SHAPE = (1, 2, 256, 32)
U = 2.0**-8
"""bf16's unit roundoff."""


def test_the_simulated_shares_are_what_the_runtime_hands_over_rounded_to_bf16() -> None:
    gen = torch.Generator().manual_seed(1)
    q, k, v, dout = (torch.randn(*SHAPE, generator=gen).to(torch.bfloat16) for _ in range(4))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, 0.0, True)
    cp = 4
    shares = whole_kv_shares(dout, q, k, v, out, lse, cp)
    for rank, (dk, dv) in enumerate(shares):
        config = CPConfig("", rank, ChunkLayout(cp), True, None, None, "cpu", False, SHAPE[2], whole_kv=True)
        mine = [sequence_shard(t, cp, rank, dim=2) for t in (dout, q, out, lse)]
        _, dk_rt, dv_rt = _whole_backward(*mine, _WholeBlocks((k, v), config))
        assert torch.equal(dk.to(torch.bfloat16), dk_rt) and torch.equal(dv.to(torch.bfloat16), dv_rt)


def test_one_rank_has_nothing_to_round_twice_and_fp32_differs_only_in_summation_order() -> None:
    alone = rounding_errors(1, SHAPE)
    assert all(r["rms_once"] == r["rms_hops"] and r["max_once"] == r["max_hops"] for r in alone.values())
    wide = rounding_errors(8, SHAPE, dtype=torch.float32)
    assert all(r["max_once"] < 1e-5 and r["max_hops"] < 1e-5 for r in wide.values())


@pytest.mark.parametrize("cp", [4, 8])
def test_bf16_hops_add_at_most_2cp_minus_1_roundings_of_the_largest_magnitude(cp: int) -> None:
    errors = rounding_errors(cp, SHAPE)
    for r in errors.values():
        assert r["max_hops"] <= r["max_once"] + (2 * cp - 1) * U
        assert r["rms_hops"] < 3 * r["rms_once"]  # the kernel's own bf16 error is of the same order
