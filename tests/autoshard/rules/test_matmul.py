"""Matmul-like rules derived from einsum equations."""

import torch

from autoshard.rules import TensorMeta, load_rules
from autoshard.rules.core import P, R, S, SingleDimStrategy
from autoshard.rules.matmul import einsum_rule, grouped_mm_reference
from autoshard.rules.registry import Rule
from autoshard.validation.validator import validate_rule

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


# ------------------------------------------------------------------ _grouped_mm

BF16 = torch.bfloat16
RULES = load_rules()
GROUPED = aten._grouped_mm.default


def _labels(args, kwargs=None, out=None) -> list[str]:
    return [str(s) for s in RULES.strategies(GROUPED, args, kwargs or {}, (2,), out_meta=out)]


def _offs(*ends: int) -> torch.Tensor:
    return torch.tensor(ends, dtype=torch.int32)


def test_grouped_mm_reference_matches_the_cpu_kernel_on_aligned_shapes() -> None:
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, BF16):
        cases = [
            (torch.randn(8, 16, generator=g), torch.randn(3, 16, 8, generator=g), _offs(2, 2, 8)),  # MoE experts
            (torch.randn(3, 8, 16, generator=g), torch.randn(3, 16, 8, generator=g), None),
            (torch.randn(3, 8, 16, generator=g), torch.randn(16, 24, generator=g), _offs(8, 16, 24)),
            (torch.randn(8, 24, generator=g), torch.randn(24, 8, generator=g), _offs(8, 16, 24)),
        ]
        for a, b, offs in cases:
            want = GROUPED(a.to(dtype), b.to(dtype), offs)
            got = grouped_mm_reference(a.to(dtype), b.to(dtype), offs)
            assert got.dtype == want.dtype and torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2)


def test_grouped_mm_moe_layout_splits_hidden_dims_never_experts_or_tokens() -> None:
    # Mixtral: tokens [T, H] grouped by offs, experts [E, H, F] -> [T, F]
    a, b, offs = TensorMeta((16, 32), BF16), TensorMeta((4, 32, 64), BF16), TensorMeta((4,), torch.int32)
    assert _labels((a, b, offs)) == [
        "R <- R, R, R", "S(1) <- R, S(2), R", "P(sum) <- S(1), S(1), R", "P(sum) <- P(sum), R, R", "P(sum) <- R, P(sum), R",
    ]


def test_grouped_mm_batched_layout_splits_experts_and_tokens() -> None:
    a, b = TensorMeta((4, 16, 32), BF16), TensorMeta((4, 32, 64), BF16)
    labels = _labels((a, b))
    assert "S(0) <- S(0), S(0)" in labels  # expert parallel
    assert "S(1) <- S(1), R" in labels  # tokens
    assert "P(sum) <- S(2), S(1)" in labels  # row parallel


def test_grouped_mm_ragged_columns_split_tokens_and_contraction() -> None:
    a, b, offs = TensorMeta((4, 16, 32), BF16), TensorMeta((32, 64), BF16), TensorMeta((4,), torch.int32)
    labels = _labels((a, b, offs))
    assert "S(0) <- S(1), R, R" in labels and "P(sum) <- S(2), S(0), R" in labels
    assert not any(label.startswith("S(1)") for label in labels)  # the grouped columns stay whole


def test_grouped_mm_rule_validates_on_every_layout() -> None:
    report = validate_rule(RULES.rule_for(GROUPED), RULES, cases=5, seed=3)
    assert report.ok, "\n".join(str(f) for f in report.failures[:3])
    assert report.strategies_checked > 50


def test_validator_catches_experts_split_in_the_moe_layout() -> None:
    good = RULES.rule_for(GROUPED)

    def experts_split(call):
        if call.inputs[0].ndim == 2 and call.inputs[1].ndim == 3:
            return [SingleDimStrategy(P, (R, S(0), S(0)))]  # offsets are absolute: wrong
        return []

    bad = Rule(GROUPED, "bad", experts_split, good.compute, samples=good.samples, reference=good.reference)
    assert not validate_rule(bad, RULES, cases=3).ok


def test_addr_and_addbmm_are_einsums_with_a_bias() -> None:
    rules = load_rules()
    v, w, bias = TensorMeta((4,), torch.float32), TensorMeta((6,), torch.float32), TensorMeta((4, 6), torch.float32)
    outer = [str(s) for s in rules.strategies(aten.addr.default, (bias, v, w), {}, (2,))]
    assert "S(0) <- S(0), S(0), R" in outer and "S(1) <- S(1), R, S(0)" in outer and len(outer) == 5
    b1, b2, out = TensorMeta((2, 4, 8), torch.float32), TensorMeta((2, 8, 6), torch.float32), TensorMeta((4, 6), torch.float32)
    batched = [str(s) for s in rules.strategies(aten.addbmm.default, (out, b1, b2), {}, (2,))]
    assert "P(sum) <- P(sum), S(0), S(0)" in batched and "P(sum) <- P(sum), S(2), S(1)" in batched
    assert rules.compute_kind(aten.addbmm.default, (out, b1, b2)).flops == 2.0 * 2 * 4 * 8 * 6
