"""Pointwise table: broadcasting, partial groups and their reasons."""

import torch

from autoshard.rules.core import OpCall, TensorMeta
from autoshard.rules.pointwise import ADDITIVE, GROUPS, broadcast_dim, pointwise_rule

aten = torch.ops.aten
F32 = torch.float32


def test_broadcast_dim_replicates_broadcast_inputs() -> None:
    assert broadcast_dim((4, 8), (8,), 1) == 0
    assert broadcast_dim((4, 8), (8,), 0) is None
    assert broadcast_dim((4, 8), (1, 8), 0) is None


def test_add_with_broadcast_bias_splits_the_bias_only_along_its_own_dim() -> None:
    x, b = TensorMeta((4, 8), F32), TensorMeta((8,), F32)
    labels = [str(s) for s in pointwise_rule(ADDITIVE)(OpCall(aten.add.Tensor, (x, b), {}, (x, b), (x,)))]
    assert labels[:2] == ["S*(0) <- S*(0), R", "S*(1) <- S*(1), S*(0)"]
    assert "P(sum) <- P(sum), R" not in labels  # the bias would be added once per rank


def test_every_group_states_its_reason_and_no_op_is_in_two_groups() -> None:
    seen = set()
    for group in GROUPS:
        assert len(group.why) > 20
        for entry in group.ops:
            assert entry.op not in seen
            seen.add(entry.op)
