"""Pointwise table: broadcasting, partial groups and their reasons."""

import torch

from autoshard.rules import load_rules
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


def test_clone_of_complex_carries_no_max_or_min_and_of_int_no_average() -> None:
    rules = load_rules()

    def outs(dtype: torch.dtype) -> set[str]:
        x = TensorMeta((4, 8), dtype)
        return {str(s.output_placements[0][0]) for s in rules.strategies(aten.clone.default, (x,), {}, (2,))}

    assert {"P(sum)", "P(avg)"} <= outs(torch.complex64) and not {"P(max)", "P(min)"} & outs(torch.complex64)
    assert outs(torch.int64) >= {"P(sum)", "P(max)"} and "P(avg)" not in outs(torch.int64)


def test_to_copy_to_int_keeps_only_order_partials() -> None:
    x = TensorMeta((4, 8), F32)
    strategies = load_rules().strategies(aten._to_copy.default, (x,), {"dtype": torch.int32}, (2,))
    assert {str(s.output_placements[0][0]) for s in strategies} == {"R", "S(0)", "S(1)", "P(max)", "P(min)"}
