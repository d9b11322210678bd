r"""Float8 linear layers as torchao trains them: the price of one matmul and its casts.

torchao's float8 training (``torchao.float8.Float8Linear``, the ``tensorwise`` recipe
torchtitan's ``--model.converters float8`` uses) runs each of a linear layer's three
matmuls (forward ``y = x W^T``, input gradient ``dx = dy W``, weight gradient
``dW = dy^T x``) as ``torch._scaled_mm`` on float8 operands (e4m3 for ``x`` and ``W``,
e5m2 for ``dy``) with a bf16 output, at the device's fp8 tensor-core rate. Each float8
operand is made by **dynamic tensorwise scaling**: one ``amax = max(|t|)`` over the whole
tensor (a reduction reading the bf16 tensor), then a cast ``t * (fp8_max / amax)`` to
float8 (reading bf16, writing one byte an element). Both are memory-bound: priced as
``costmodel.compute`` prices a reduction and an elementwise op.

**One matmul** ``(m x k) @ (k x n)`` with operands ``A`` and ``B``
(:func:`float8_matmul_s`):

    t = T_mm(fp8, 2 m n k FLOPs, m k + k n + 2 m n bytes)
        + sum over the cast operands X in {A, B} of  T_red(|X|, 2 |X| bytes) + T_ew(|X|, 3 |X| bytes)

``T_mm`` is ``op_time_s("matmul", dtype="fp8")``: the profile's fp8 peak and its
``efficiency.matmul_by_dtype.fp8`` curve (the h100 profiles ship both; a profile without
an fp8 peak raises :class:`Float8Error` naming it). Which operands pay a cast
(:func:`cast_operands`): an activation or gradient operand always (torchao recasts
``x`` and ``dy`` for each matmul that reads them: tensorwise scales are per tensor, but
the transposed float8 layout the weight gradient needs is a second cast); a weight
operand pays its cast per use, except with **float8 all-gather** (torchao's
``enable_fsdp_float8_all_gather``): FSDP casts each weight shard to float8 *before*
the all-gather, once per gather, and the gathered weight is already float8 (its cast is
priced on the shard: ``shard_numel``), and the all-gather carries one byte an element
(:func:`float8_gather_bytes`).

What it leaves out: torch.compile fusing an ``amax`` into the op that made the tensor
(priced as its own pass: an upper bound on the casts), the per-step all-reduce of the
weights' ``amax`` (``precompute_float8_dynamic_scale_for_fsdp``: one small collective a
step), and the output layer (torchtitan keeps it bf16: the caller picks the matmuls).

>>> from hw_profiles import load
>>> h100 = load("h100-sxm-96gb-500w")
>>> from costmodel.compute import matmul_time_s
>>> bf16 = matmul_time_s(8192, 16384, 16384, dtype="bf16", profile=h100)
>>> fp8 = float8_matmul_s(8192, 16384, 16384, h100, cast_a=True, cast_b=True)
>>> 0.5 < fp8 / bf16 < 0.8   # twice the peak, less its lower efficiency, plus two casts
True
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.compute import op_time_s
from hw_profiles import HardwareProfile

__all__ = ["Float8Error", "Float8Matmul", "FP8_ITEMSIZE", "float8_matmul_s", "float8_matmul", "cast_s",
           "cast_operands", "float8_gather_bytes", "has_fp8"]

FP8_ITEMSIZE = 1
"""Bytes of one float8 element (e4m3 and e5m2)."""

HP_ITEMSIZE = 2
"""Bytes of one element of the high-precision (bf16) tensor a cast reads."""


class Float8Error(ValueError):
    """A float8 price asked of a profile that cannot give it (names the profile)."""


@dataclass(frozen=True, slots=True)
class Float8Matmul:
    """One float8 matmul's price, its parts apart."""

    matmul_s: float
    """``torch._scaled_mm`` at the fp8 rate."""
    casts_s: float
    """The ``amax`` reductions and casts of its cast operands."""

    @property
    def total_s(self) -> float:
        return self.matmul_s + self.casts_s


def has_fp8(profile: HardwareProfile) -> bool:
    """Whether ``profile`` has an fp8 peak (a device with fp8 tensor cores).

    >>> from hw_profiles import load
    >>> has_fp8(load("h100-sxm-80gb")), has_fp8(load("cpu-gloo"))
    (True, False)
    """
    try:
        profile.device.peak_flops_for("fp8")
    except KeyError:
        return False
    return True


def cast_s(numel: float, profile: HardwareProfile) -> float:
    """Seconds to scale one bf16 tensor of ``numel`` elements to float8 dynamically:
    its ``amax`` (a reduction reading it) and the cast (reading it, writing one byte
    an element), module docstring.

    >>> from hw_profiles import load
    >>> cast_s(0, load("h100-sxm-80gb")) > 0   # two kernel launches
    True
    """
    amax = op_time_s("reduction", flops=float(numel), bytes_accessed=HP_ITEMSIZE * float(numel), dtype="bf16",
                     profile=profile)
    cast = op_time_s("elementwise", flops=2.0 * numel, bytes_accessed=(HP_ITEMSIZE + FP8_ITEMSIZE) * float(numel),
                     dtype="bf16", profile=profile)
    return amax + cast


def float8_matmul(m: int, n: int, k: int, profile: HardwareProfile, *, cast_a: bool = True,
                  cast_b: bool = True, b_cast_numel: float | None = None) -> Float8Matmul:
    """:class:`Float8Matmul` of ``(m x k) @ (k x n)`` (module docstring); ``cast_a`` / ``cast_b``:
    which operands pay a cast here; ``b_cast_numel``: the elements ``B``'s cast reads when
    not ``k n`` (a weight cast on its FSDP shard before a float8 all-gather).

    >>> from hw_profiles import load
    >>> p = float8_matmul(4096, 4096, 4096, load("h100-sxm-80gb"), cast_a=False, cast_b=False)
    >>> p.casts_s
    0.0
    """
    if not has_fp8(profile):
        raise Float8Error(f"profile {profile.name!r}: no fp8 peak (device.peak_flops.fp8): float8 linears "
                          "cannot be priced on it")
    mm = op_time_s("matmul", flops=2.0 * m * n * k,
                   bytes_accessed=float(FP8_ITEMSIZE * (m * k + k * n) + HP_ITEMSIZE * m * n),
                   dtype="fp8", profile=profile)
    casts = (cast_s(m * k, profile) if cast_a else 0.0) + (
        cast_s(k * n if b_cast_numel is None else b_cast_numel, profile) if cast_b else 0.0)
    return Float8Matmul(mm, casts)


def float8_matmul_s(m: int, n: int, k: int, profile: HardwareProfile, *, cast_a: bool = True,
                    cast_b: bool = True) -> float:
    """Seconds of :func:`float8_matmul` (module docstring)."""
    return float8_matmul(m, n, k, profile, cast_a=cast_a, cast_b=cast_b).total_s


def cast_operands(a_is_weight: bool, b_is_weight: bool, *, float8_all_gather: bool) -> tuple[bool, bool]:
    """Which of a linear layer's matmul operands pay a cast at the matmul (module docstring):
    activations and gradients always; a weight unless FSDP gathered it in float8 (cast on
    its shard before the gather instead).

    >>> cast_operands(False, True, float8_all_gather=True), cast_operands(False, False, float8_all_gather=True)
    ((True, False), (True, True))
    """
    return (not (a_is_weight and float8_all_gather), not (b_is_weight and float8_all_gather))


def float8_gather_bytes(nbytes: float, itemsize: int) -> float:
    """Bytes a weight all-gather of ``nbytes`` in elements of ``itemsize`` bytes carries when FSDP
    gathers it in float8 (``enable_fsdp_float8_all_gather``): one byte an element.

    >>> float8_gather_bytes(2**20, 2)
    524288.0
    """
    if itemsize < 1:
        raise Float8Error(f"itemsize: must be >= 1 byte, got {itemsize}")
    return float(nbytes) * FP8_ITEMSIZE / itemsize

