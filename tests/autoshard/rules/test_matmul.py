"""Matmul-like rules derived from einsum equations."""

import torch

from autoshard.rules import TensorMeta, load_rules
from autoshard.rules.matmul import einsum_rule

aten = torch.ops.aten
F32 = torch.float32


def test_mm_einsum_gives_rows_cols_and_contraction_to_partial() -> None:
    assert [str(s) for s in einsum_rule("mk,kn->mn")] == [
        "S*(0) <- S*(0), R", "S*(1) <- R, S*(1)", "P(sum) <- S*(1), S*(0)", "P(sum) <- P(sum), R", "P(sum) <- R, P(sum)",
    ]


def test_bmm_splits_the_batch_on_every_tensor() -> None:
    assert "S*(0) <- S*(0), S*(0)" in [str(s) for s in einsum_rule("bmk,bkn->bmn")]


def test_addmm_bias_is_partial_whenever_the_output_is() -> None:
    bias, a, b = TensorMeta((16,), F32), TensorMeta((8, 4), F32), TensorMeta((4, 16), F32)
    for s in load_rules().strategies(aten.addmm.default, (bias, a, b), {}, (2,)):
        out = s.output_placements[0][0]
        if type(out).__name__ == "Partial":
            assert s.input_placements[0][0] == out
        if str(out) == "S(0)":  # rows: the bias row vector is broadcast
            assert str(s.input_placements[0][0]) == "R"
