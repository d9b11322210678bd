"""The `here` correction's thin reference GEMMs: priced in its own family, with its bytes, so the
correction can split a machine's GEMM speed into FLOPs and bytes packed (``matmul_byte_s``)."""

from __future__ import annotations

from autoshard.calibrate import first_use
from hw_profiles import load


def test_the_thin_gemm_is_a_reference_of_its_own_family_and_the_squares_stay_matmul() -> None:
    families = {}
    for op in first_use.reference_ops():
        if op.label.startswith("mm "):
            families[op.label] = first_use._price(op, op.make(), load("cpu-gloo"))[0]
    assert families == {"mm 128x128x128": "matmul", "mm 512x512x512": "matmul", "mm 16x512x2048": "matmul_thin",
                        "mm 16x2048x512": "matmul_thin"}


def test_every_reference_gemm_carries_the_bytes_the_rules_count() -> None:
    assert first_use._gemm_bytes() == {
        "mm 128x128x128": 4.0 * 3 * 128**2, "mm 512x512x512": 4.0 * 3 * 512**2,
        "mm 16x512x2048": 4.0 * (16 * 512 + 512 * 2048 + 16 * 2048),
        "mm 16x2048x512": 4.0 * (16 * 2048 + 2048 * 512 + 16 * 512)}
