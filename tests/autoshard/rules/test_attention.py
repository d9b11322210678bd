"""Softmax and attention: which dims can be split."""

import torch

from costmodel.placements import Shard
from autoshard.rules import TensorMeta, load_rules

aten = torch.ops.aten
F32 = torch.float32
SDPA = aten._scaled_dot_product_flash_attention_for_cpu.default


def _q_splits(causal: bool) -> set:
    q = TensorMeta((2, 4, 8, 16), F32)
    strategies = load_rules().strategies(SDPA, (q, q, q, 0.0, causal), {}, (2,))
    return {s.input_placements[0] for s in strategies if s.exchange is None}  # local ops (not context parallel)


def test_attention_splits_batch_and_heads_always_and_queries_only_without_causal_mask() -> None:
    assert {(Shard(0),), (Shard(1),), (Shard(2),)} <= _q_splits(False)
    assert (Shard(2),) not in _q_splits(True) and (Shard(1),) in _q_splits(True)


def test_softmax_never_splits_its_own_dim() -> None:
    x = TensorMeta((4, 8), F32)
    strategies = load_rules().strategies(aten._softmax.default, (x, -1, False), {}, (2,))
    assert {str(s) for s in strategies} == {"R <- R", "S(0) <- S(0)"}
