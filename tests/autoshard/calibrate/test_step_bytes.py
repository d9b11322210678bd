"""The step's cost per byte (``step_byte_s``): two reference steps of different bytes per op
split a step's excess over its ops alone into a part per op and a part per byte
(``hw_profiles.correction``, ``autoshard.calibrate.reference_step``)."""

from __future__ import annotations

import json

import pytest

from hw_profiles import load
from hw_profiles.correction import ProfileCorrection, ReferenceTime, family_ratios

from autoshard.calibrate.reference_step import COLD, SMALL, reference_step, step_bytes

BASE = load("cpu-gloo")


def _steps(per_op_s: float, per_byte_s: float) -> tuple[ReferenceTime, ...]:
    """The two reference steps as a machine with that excess per op and per byte would time them."""
    out = []
    for size, alone_s in ((SMALL, 2.5e-3), (COLD, 9.0e-3)):
        _, _, ops = reference_step(size)
        nbytes = step_bytes(size)
        out.append(ReferenceTime(f"reference step {size}", "step", float(ops), alone_s,
                                 alone_s + per_op_s * ops + per_byte_s * nbytes, bytes_accessed=nbytes))
    return tuple(out)


@pytest.mark.parametrize("per_op_s, per_byte_s", [(1.5e-5, 9e-11), (0.0, 1e-10), (2e-5, 0.0)])
def test_a_known_excess_per_op_and_per_byte_is_recovered(per_op_s, per_byte_s) -> None:
    ratios = family_ratios(_steps(per_op_s, per_byte_s))
    assert ratios["step_op_s"] == pytest.approx(per_op_s, abs=1e-9)
    assert ratios["step_byte_s"] == pytest.approx(per_byte_s, abs=1e-15)


def test_the_corrected_profile_carries_both_figures_and_they_survive_json() -> None:
    c = ProfileCorrection(BASE.fingerprint, {"cpu": "x"}, "2026-12-05T00:00:00Z", _steps(1e-5, 9e-11))
    corrected = c.apply(BASE)
    assert corrected.device.step_op_s == pytest.approx(1e-5) and corrected.device.step_byte_s == pytest.approx(9e-11)
    again = ProfileCorrection.from_dict(json.loads(json.dumps(c.to_dict())))
    assert again.apply(BASE).device == corrected.device
    assert type(corrected).from_dict(corrected.to_dict()).device.step_byte_s == pytest.approx(9e-11)


def test_one_step_without_bytes_prices_per_op_only_as_before() -> None:
    """A correction cached before the second reference step: its one step gives ``step_op_s`` alone."""
    old = ReferenceTime("reference step (41 ops)", "step", 41.0, 2.56e-3, 3.28e-3)
    ratios = family_ratios((old,))
    assert "step_byte_s" not in ratios and ratios["step_op_s"] == pytest.approx((3.28e-3 - 2.56e-3) / 41)
    assert ProfileCorrection(BASE.fingerprint, {}, "d", (old,)).apply(BASE).device.step_byte_s == 0.0


def test_the_cold_step_touches_more_bytes_per_op_than_the_small_one() -> None:
    """What makes the two steps' excesses separable: their bytes per op differ."""
    (_, _, small_ops), (_, _, cold_ops) = reference_step(SMALL), reference_step(COLD)
    assert step_bytes(COLD) / cold_ops > 2 * step_bytes(SMALL) / small_ops


def test_an_excess_growing_faster_than_the_bytes_is_priced_at_the_cold_steps_rate() -> None:
    """The cache-resident step's bytes are partly warm: its excess per byte is below the cold
    step's, which is the regime of a real step (working set far beyond the caches)."""
    warm, cold = _steps(0.0, 0.0)
    warm = ReferenceTime(warm.label, "step", warm.size, warm.predicted_s, warm.predicted_s + 40e-6 * 2**-20
                         * warm.bytes_accessed, bytes_accessed=warm.bytes_accessed)
    cold = ReferenceTime(cold.label, "step", cold.size, cold.predicted_s, cold.predicted_s + 180e-6 * 2**-20
                         * cold.bytes_accessed, bytes_accessed=cold.bytes_accessed)
    ratios = family_ratios((warm, cold))
    assert ratios["step_op_s"] == 0.0 and ratios["step_byte_s"] * 2**20 == pytest.approx(180e-6)
