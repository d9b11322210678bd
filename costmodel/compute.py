"""Compute time of one op on one device: a roofline with efficiency curves.

For an op of kind ``k`` doing ``F`` FLOPs and moving ``B`` bytes of HBM traffic
in dtype ``t`` on a device with peak ``P[t]`` FLOP/s and bandwidth ``W`` B/s:

    time = max(F / (P[t] * e_k(F)),  B / (W * e_mem(B))) / e_run(r) + fresh(O) + launch

* ``e_k(F)`` (matmul, attention, attention_backward): the profile's curve of
  points ``(flops, fraction)``, interpolated linearly in ``log10(F)`` and held
  constant beyond its ends: small GEMMs reach a small fraction of peak. A
  matmul in dtype ``t`` uses the profile's curve for ``t`` where it has one
  (``efficiency.matmul_by_dtype``: bf16 and fp8 GEMMs saturate at other sizes
  than fp32 ones), else ``efficiency.matmul``; the backward of fused attention
  uses ``efficiency.attention_backward`` where given, else ``attention``.
* a GEMM (``matmul``) also pays ``c * B`` inside its compute term, where ``c``
  is the profile's ``device.matmul_byte_s`` (0 where absent)::

      compute = F / (P[t] * e_k(F)) + c * B

  The kernel packs its operands into panels, a cost per byte, not per FLOP, so
  the FLOP rate a GEMM reaches is ``1 / (1 + I_0 / I)`` of its FLOP term's with
  ``I = F / B`` its arithmetic intensity and ``I_0 = c * P[t] * e_k(F)``: square
  GEMMs (``I`` = 85 FLOP/B at 512^3 fp32) barely notice it, thin ones do
  (``16 x 512 x 2048``: ``I`` = 7.7). Measured on a 2-core Xeon VM, one thread,
  FLOP rate over the 512^3 one's: ``I`` 3.9 / 7.7 / 14.8 / 27.7 / 41 ->
  0.54 / 0.66-0.83 / 0.82 / 0.90 / 0.93, which ``I_0`` = 2.6 gives as
  0.60 / 0.75 / 0.85 / 0.91 / 0.94 (``benchmarks/results/calibration.md``).
  Fused attention does not pay it (its operands are not packed that way).
* ``e_run(r)`` (elementwise, reduction, copy): the profile's ``run`` curve at
  the op's innermost contiguous run of ``r`` elements (``r`` = infinity, the
  default, is a contiguous op: factor 1). Transposed or strided operands, a
  broadcast inside the row, a reduction over a middle dim: the kernel walks
  short runs, and pays per run, not per byte.
* ``e_mem(B)``: the profile's memory efficiency. Datasheet profiles give one
  fraction; measured profiles give a curve over the working set ``B``
  (interpolated the same way, in ``log10(B)``), because a working set that
  fits a cache streams several times faster than DRAM/HBM: pricing every
  size at one DRAM rate made small elementwise ops on CPU up to 5x too slow.
* elementwise and reduction ops run on the vector units: their compute term uses
  the FP32 (non-tensor) peak times ``e_vec``, the profile's vector efficiency
  (measured profiles: transcendental and normalisation ops reach a few
  percent of a CPU's GEMM peak, and are compute-bound there), or the memory
  efficiency when the profile has none (datasheet profiles: such ops are then
  nearly always memory-bound). A profile may give an op its own fraction
  (``efficiency.vector_by_op``, keyed by the aten op; pass ``op``): gelu,
  silu and softmax cost several times apart per FLOP as the rules count them.
* fp32 attention (and its backward) on an NVIDIA GPU with a TF32 peak runs against a third
  of that peak (:data:`FP32_ATTENTION_TF32_PASSES`: the memory-efficient kernel multiplies fp32
  as 3xTF32 on tensor cores), not the fp32 (SIMT) peak, which priced it 2.7x too slow.
* ``copy`` is ``B / (W * e_mem(B)) + launch``; ``view`` (no data moves) is 0, the
  only free kind.
* ``fresh(O)`` = ``sum(o for o in O if o >= A) / W_f`` over the op's output
  sizes ``O``, where the profile has ``device.fresh_pages`` (``A``, ``W_f``):
  on CPU, glibc's malloc maps every allocation of 32 MiB or more afresh and
  unmaps it on free, so each call faults in and zeroes its large outputs
  (measured: a 32 MiB clone takes 9x a 31.98 MiB one). Without the term the
  calibration fitted that cost into the memory curve, which then priced every
  op with a large working set (but small outputs) several times too slow.
* ``launch`` is the profile's floor on any kernel; an op with a Python-scalar
  operand (``mul(x, 0.5)``, ``add.Scalar``) pays ``launch_scalar_s`` instead
  where the profile has it (the scalar is wrapped into a tensor per call).

Local re-layouts of a redistribution (slices, zero fills, transposes, padding)
are copies: :func:`local_copy_time_s` counts a read and a write of every byte,
:func:`local_fill_time_s` a write only. None of them is free.

>>> from hw_profiles import load
>>> h100 = load("h100-sxm-80gb")
>>> t = op_time_s("matmul", flops=2 * 4096**3, bytes_accessed=3 * 4096**2 * 2, dtype="bf16", profile=h100)
>>> round(t * 1e3, 3)  # ms for a 4096^3 bf16 GEMM (LLaMA-shaped GEMMs of these FLOPs on one H100: 0.19-0.20)
0.198
"""

from __future__ import annotations

import math
from typing import Sequence

from hw_profiles import HardwareProfile
from hw_profiles.profile import DTYPE_ALIASES

__all__ = [
    "OP_KINDS",
    "ComputeError",
    "efficiency",
    "memory_efficiency",
    "run_efficiency",
    "op_time_s",
    "matmul_time_s",
    "local_copy_time_s",
    "cold_copy_time_s",
    "local_fill_time_s",
    "local_slice_time_s",
    "transpose_time_s",
]

OP_KINDS = ("matmul", "elementwise", "reduction", "attention", "attention_backward", "copy", "view")


class ComputeError(ValueError):
    """Bad arguments to a compute-cost function (names the argument)."""


def efficiency(curve: tuple[tuple[float, float], ...], flops: float) -> float:
    """Fraction of peak at ``flops`` on a curve of ``(flops, fraction)`` points,
    linear in log10(flops), constant beyond the ends.

    >>> efficiency(((1e9, 0.35), (1e12, 0.75)), 1e10) > 0.35
    True
    """
    if not curve:
        raise ComputeError("efficiency: empty curve")
    if flops <= curve[0][0]:
        return curve[0][1]
    if flops >= curve[-1][0]:
        return curve[-1][1]
    x = math.log10(flops)
    for (f0, e0), (f1, e1) in zip(curve, curve[1:]):
        if flops <= f1:
            x0, x1 = math.log10(f0), math.log10(f1)
            return e0 + (e1 - e0) * (x - x0) / (x1 - x0)
    return curve[-1][1]  # unreachable: flops < last point


def memory_efficiency(profile: HardwareProfile, nbytes: float) -> float:
    """Fraction of ``memory_bandwidth_Bps`` reached with a working set of
    ``nbytes`` (the profile's scalar, or its curve at ``nbytes``).

    >>> from hw_profiles import load
    >>> round(memory_efficiency(load("h100-sxm-80gb"), 2**30), 3)  # measured on one H100: 3.10 of 3.85 TB/s
    0.805
    """
    return efficiency(profile.device.efficiency.memory_curve, max(float(nbytes), 1.0))


def run_efficiency(profile: HardwareProfile, run_elems: float) -> float:
    """Fraction of the contiguous speed reached with innermost runs of
    ``run_elems`` elements (1.0 for contiguous ops or profiles without a
    ``run`` curve).

    >>> from hw_profiles import load
    >>> run_efficiency(load("h200-sxm-141gb"), 1.0)  # a datasheet profile: no run curve
    1.0
    >>> run_efficiency(load("h100-sxm-80gb"), 1.0)  # measured: element-wise strided walks
    0.662
    """
    curve = profile.device.efficiency.run
    if not curve or math.isinf(run_elems):
        return 1.0
    return efficiency(curve, max(float(run_elems), 1.0))


def _memory_s(nbytes: float, profile: HardwareProfile, cold: bool = False) -> float:
    """``cold``: at the curve's rate beyond the caches where slower (:func:`cold_copy_time_s`)."""
    if not nbytes:
        return 0.0
    eff = memory_efficiency(profile, nbytes)
    if cold:
        eff = min(eff, memory_efficiency(profile, math.inf))
    return nbytes / (profile.device.memory_bandwidth_Bps * eff)


def _vector_peak(profile: HardwareProfile) -> float:
    try:
        return profile.device.peak_flops_for("fp32")
    except KeyError:
        return max(v for _, v in profile.device.peak_flops)


def op_time_s(
    kind: str,
    *,
    flops: float,
    bytes_accessed: float,
    dtype: str,
    profile: HardwareProfile,
    run_elems: float = math.inf,
    scalar_operand: bool = False,
    output_bytes: Sequence[float] = (),
    op: str | None = None,
) -> float:
    """Seconds for one op of ``kind`` (one of ``OP_KINDS``) on one device.

    ``flops``: floating-point operations (a GEMM ``m x k @ k x n`` is
    ``2*m*n*k``); ``bytes_accessed``: HBM bytes read plus written; ``dtype``: the
    compute dtype (``bf16``, ``torch.float32``, ...); ``run_elems``: the
    innermost contiguous run of an elementwise, reduction or copy kernel
    (default: contiguous); ``scalar_operand``: the op has a Python-scalar
    operand (its launch floor is ``launch_scalar_s``); ``output_bytes``: the
    size of each tensor the op allocates (fresh pages, module docstring);
    ``op``: the aten op (``aten.silu.default``), for its own vector fraction.

    >>> from hw_profiles import load
    >>> op_time_s("view", flops=0, bytes_accessed=1e9, dtype="bf16", profile=load("h100-sxm-80gb"))
    0.0
    """
    if kind not in OP_KINDS:
        raise ComputeError(f"kind: unknown op kind {kind!r} (expected one of {', '.join(OP_KINDS)})")
    if flops < 0 or bytes_accessed < 0:
        raise ComputeError(f"flops/bytes_accessed: must be >= 0, got {flops}, {bytes_accessed}")
    if not run_elems > 0:
        raise ComputeError(f"run_elems: must be > 0, got {run_elems}")
    if kind == "view":
        return 0.0
    device = profile.device
    memory_s = _memory_s(bytes_accessed, profile)
    launch = device.launch_scalar_s if scalar_operand and device.launch_scalar_s is not None else device.launch_s
    launch += _fresh_s(output_bytes, profile)
    if kind in ("matmul", "attention", "attention_backward"):
        try:
            peak = _attention_fp32_peak(profile) if kind != "matmul" and _is_fp32(dtype) else None
            peak = peak or device.peak_flops_for(dtype)
        except KeyError as exc:
            raise ComputeError(f"dtype: {exc.args[0]}") from None
        compute_s = flops / (peak * efficiency(_curve(profile, kind, dtype), flops)) if flops else 0.0
        if kind == "matmul":  # packing: per operand byte (module docstring)
            compute_s += device.matmul_byte_s * bytes_accessed
        return max(compute_s, memory_s) + launch
    if kind == "copy":
        compute_s = 0.0
    else:  # elementwise, reduction: vector units
        vector = device.efficiency.vector_fraction(op) or memory_efficiency(profile, bytes_accessed)
        compute_s = flops / (_vector_peak(profile) * vector) if flops else 0.0
    return max(compute_s, memory_s) / run_efficiency(profile, run_elems) + launch


FP32_ATTENTION_TF32_PASSES = 3
"""TF32 tensor-core products per fp32 one in fp32 attention on NVIDIA GPUs of compute
capability 8.0 and later: CUDA runs fp32 ``scaled_dot_product_attention`` with the
memory-efficient kernel (flash takes 16-bit only), whose fp32 GEMMs are CUTLASS's 3xTF32
(PyTorch ``aten/src/ATen/native/transformers/cuda/mem_eff_attention/gemm_kernel_utils.h``,
``DefaultGemmType<ArchTag, float>`` for ``kMinComputeCapability >= 80``: ``OpClassTensorOp``,
``OpMultiplyAddFastF32``), not the fp32 (SIMT) units."""


def _is_fp32(dtype: str) -> bool:
    return DTYPE_ALIASES.get(str(dtype), str(dtype)) == "fp32"


def _attention_fp32_peak(profile: HardwareProfile) -> float | None:
    """The peak fp32 attention runs against (:data:`FP32_ATTENTION_TF32_PASSES`): a third of
    the TF32 peak on an NVIDIA GPU whose profile has one (every shipped one is sm80 or later),
    else None (the fp32 peak: CPUs, other vendors). Its efficiency is the attention curve's,
    measured for the 16-bit flash kernel: the one-H100 fp32 LLaMA steps priced so came within
    1 % of the measured ones (``benchmarks/results/h100_one_gpu.md``); the kernel itself was
    never timed on its own."""
    device = profile.device
    if not device.name.upper().startswith("NVIDIA") or not any(n == "tf32" for n, _ in device.peak_flops):
        return None
    return device.peak_flops_for("tf32") / FP32_ATTENTION_TF32_PASSES


def _curve(profile: HardwareProfile, kind: str, dtype: str) -> tuple[tuple[float, float], ...]:
    eff = profile.device.efficiency
    if kind == "attention_backward" and eff.attention_backward:
        return eff.attention_backward
    if kind in ("attention", "attention_backward") and eff.attention:
        return eff.attention
    return eff.matmul_curve(DTYPE_ALIASES.get(str(dtype), str(dtype)))


def matmul_time_s(m: int, n: int, k: int, *, dtype: str, profile: HardwareProfile, itemsize: int = 2) -> float:
    """Seconds for ``(m x k) @ (k x n)``: ``2mnk`` FLOPs, reading both inputs and
    writing the output once."""
    return op_time_s(
        "matmul",
        flops=2.0 * m * n * k,
        bytes_accessed=float(itemsize) * (m * k + k * n + m * n),
        dtype=dtype,
        profile=profile,
    )


def local_copy_time_s(nbytes: float, profile: HardwareProfile) -> float:
    """Seconds to copy ``nbytes`` within device memory (read + write).

    >>> from hw_profiles import load
    >>> local_copy_time_s(0, load("h100-sxm-80gb")) > 0
    True
    """
    if nbytes < 0:
        raise ComputeError(f"nbytes: must be >= 0, got {nbytes}")
    return _memory_s(2.0 * nbytes, profile) + _fresh_s((nbytes,), profile) + profile.device.launch_s


def cold_copy_time_s(nbytes: float, profile: HardwareProfile) -> float:
    """:func:`local_copy_time_s` of bytes no cache holds: read and write at the memory
    curve's rate beyond the caches (its largest size), where that is slower than its
    rate at ``nbytes``. For a bucket's copies (``costmodel.buckets.grouping``): they read
    tensors made earlier in the step, or a buffer the communication thread just wrote,
    into a buffer as large as the bucket, while a calibration times a copy of the same
    buffer over and over, warm in the caches. Inside a step (``benchmarks/profile_step.py``,
    LLaMA, FSDP layout, 4 gloo ranks on 2 cores, 2026-11-29) a gather bucket's 4 MB pack
    ran 0.73 ms and its 720 KB unpacks 0.23 ms each, against 0.33 and 0.03 ms priced at
    their sizes' (cached) rates, near this one (0.8 and 0.14 ms).

    >>> from hw_profiles import load
    >>> cpu = load("cpu-gloo")
    >>> cold_copy_time_s(2**22, cpu) >= local_copy_time_s(2**22, cpu)
    True
    """
    if nbytes < 0:
        raise ComputeError(f"nbytes: must be >= 0, got {nbytes}")
    return _memory_s(2.0 * nbytes, profile, cold=True) + _fresh_s((nbytes,), profile) + profile.device.launch_s


def local_fill_time_s(nbytes: float, profile: HardwareProfile) -> float:
    """Seconds to write ``nbytes`` of a constant (zero fill for ``R -> P(sum)``)."""
    if nbytes < 0:
        raise ComputeError(f"nbytes: must be >= 0, got {nbytes}")
    return _memory_s(float(nbytes), profile) + _fresh_s((nbytes,), profile) + profile.device.launch_s


def _fresh_s(output_bytes: Sequence[float], profile: HardwareProfile) -> float:
    """Fresh pages of the buffers an op or a local re-layout allocates (module docstring)."""
    fresh = profile.device.fresh_pages
    return fresh.seconds(tuple(output_bytes)) if fresh is not None and output_bytes else 0.0


def local_slice_time_s(out_nbytes: float, profile: HardwareProfile) -> float:
    """Seconds to materialize a slice of ``out_nbytes`` (``R -> S(d)``): a copy of
    the kept part, so that later collectives get a contiguous buffer."""
    return local_copy_time_s(out_nbytes, profile)


def transpose_time_s(nbytes: float, profile: HardwareProfile) -> float:
    """Seconds to re-lay out ``nbytes`` with another dim order (a copy)."""
    return local_copy_time_s(nbytes, profile)
