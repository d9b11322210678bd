"""FFTs: batch dims split, transformed dims never; sum and average partials pass."""

import torch

from autoshard.rules import TensorMeta, load_rules
from autoshard.rules.core import S, SingleDimStrategy
from autoshard.rules.registry import Rule
from autoshard.validation.validator import validate_rule

aten = torch.ops.aten


def test_r2c_c2c_c2r_split_only_untransformed_dims_and_keep_sum_partials() -> None:
    rules = load_rules()
    x, z = TensorMeta((4, 6, 8), torch.float32), TensorMeta((4, 6, 5), torch.complex64)
    cases = [
        (aten._fft_r2c.default, (x, [2], 0, True)),
        (aten._fft_c2c.default, (z, [2], 0, True)),
        (aten._fft_c2r.default, (z, [2], 0, 8)),
    ]
    for op, args in cases:
        labels = [str(s) for s in rules.strategies(op, args, {}, (2,))]
        assert labels == ["R <- R", "S(0) <- S(0)", "S(1) <- S(1)", "P(sum) <- P(sum)", "P(avg) <- P(avg)"]


def test_a_2d_transform_leaves_one_batch_dim() -> None:
    labels = [str(s) for s in load_rules().strategies(aten._fft_c2c.default, (TensorMeta((4, 6, 8), torch.complex64), [1, 2], 0, True), {}, (2, 2))]
    assert "S(0)S(0) <- S(0)S(0)" in labels and not any("S(1)" in l or "S(2)" in l for l in labels)


def test_fft_compute_counts_five_n_log_n_per_batch() -> None:
    x = TensorMeta((4, 8), torch.complex64)
    compute = load_rules().compute_kind(aten._fft_c2c.default, (x, [1], 0, True))
    assert compute.flops == 5.0 * 4 * 8 * 3 and compute.bytes_accessed == 2 * 4 * 8 * 8


def test_validator_catches_a_split_transformed_dim() -> None:
    real = load_rules().rule_for(aten._fft_c2c.default)
    wrong = Rule(aten._fft_c2c.default, "bad", lambda call: [SingleDimStrategy(S(d), S(d)) for d in call.arg("dim")],
                 real.compute, samples=real.samples)
    assert not validate_rule(wrong, load_rules(), cases=3).ok
