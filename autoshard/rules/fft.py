"""Fast Fourier transforms: ``_fft_r2c``, ``_fft_c2c``, ``_fft_c2r`` (what
``torch.fft.*`` dispatch to), each over a list of transformed dims.

A transform mixes every element along its dims, so those stay whole; every
other dim is a batch of independent transforms and splits. The DFT is linear
over the reals (``c2r`` reads the Hermitian half and drops what the
symmetry makes redundant, which is still real-linear), and the
normalization is a constant scale, so sum and average partials pass:
``F(a + b) = F(a) + F(b)``. Max and min do not (complex values have no
order; a real output of ``c2r`` mixes signs).

Compute: ``5 n log2 n`` FLOPs per transformed batch of ``n`` points (the
radix-2 count; a roofline input, not a simulation).

>>> import torch
>>> from autoshard.rules.core import OpCall, TensorMeta
>>> x, y = TensorMeta((4, 8), torch.float32), TensorMeta((4, 5), torch.complex64)
>>> [str(s) for s in fft_rule(OpCall(torch.ops.aten._fft_r2c.default, (x, [1], 0, True), {}, (x,), (y,), {"dim": [1]}))]
['S*(0) <- S*(0)', 'P(sum) <- P(sum)', 'P(avg) <- P(avg)']
"""

from __future__ import annotations

import math

import torch

from autoshard.rules.compute import io_bytes
from autoshard.rules.core import P, P_AVG, OpCall, OpCompute, S, SingleDimStrategy
from autoshard.rules.registry import RuleRegistry, SampleInput
from autoshard.rules.samples import Sampler

__all__ = ["fft_rule", "fft_compute", "register"]

aten = torch.ops.aten


def _transformed(call: OpCall) -> set[int]:
    n = call.inputs[0].ndim
    return {d % n for d in call.arg("dim", [])} if n else set()


def fft_rule(call: OpCall) -> list[SingleDimStrategy]:
    """Batch dims (not transformed) split; sum and average partials pass."""
    dims = _transformed(call)
    n = call.inputs[0].ndim
    return [SingleDimStrategy(S(d), S(d)) for d in range(n) if d not in dims] + [
        SingleDimStrategy(k, k) for k in (P, P_AVG)
    ]


def fft_compute(call: OpCall) -> OpCompute:
    """``5 n log2 n`` per batch, ``n`` the product of the transformed sizes
    (the larger of input and output, for r2c/c2r)."""
    dims = _transformed(call)
    x, out = call.inputs[0], call.outputs[0]
    n = max(math.prod(x.shape[d] for d in dims), math.prod(out.shape[d] for d in dims), 1)
    batches = max(out.numel, x.numel) / n
    return OpCompute("reduction", 5.0 * batches * n * math.log2(max(n, 2)), io_bytes(call))


# ------------------------------------------------------------------ samples


def _dims(sampler: Sampler, n: int) -> list[int]:
    """Sorted, non-negative: what ``torch.fft`` passes (the kernels assert it)."""
    return sorted(sampler.rng.sample(range(n), sampler.randint(1, n)))


def _complex(sampler: Sampler, shape: tuple[int, ...]) -> torch.Tensor:
    dtype = sampler.choice((torch.complex64, torch.complex128))
    return torch.complex(sampler.randn(shape, torch.float64), sampler.randn(shape, torch.float64)).to(dtype)


def _r2c_samples(sampler: Sampler):
    for _ in range(3):
        shape = sampler.shape(min_ndim=2)
        x = sampler.randn(shape, sampler.float_dtype((torch.float64, torch.float32)))
        yield SampleInput((x, _dims(sampler, len(shape)), sampler.randint(0, 2), sampler.choice((True, False))), {})


def _c2c_samples(sampler: Sampler):
    for _ in range(3):
        shape = sampler.shape(min_ndim=2)
        yield SampleInput((_complex(sampler, shape), _dims(sampler, len(shape)), sampler.randint(0, 2),
                           sampler.choice((True, False))), {})


def _c2r_samples(sampler: Sampler):
    for _ in range(3):
        shape = sampler.shape(min_ndim=2)
        dims = _dims(sampler, len(shape))
        last = 2 * (shape[dims[-1]] - 1) + sampler.randint(0, 1)  # even or odd signal length
        yield SampleInput((_complex(sampler, shape), dims, sampler.randint(0, 2), max(last, 1)), {})


def register(registry: RuleRegistry) -> None:
    """Add the FFT rules to ``registry``."""
    rule = registry.family("fft")
    rule(aten._fft_r2c.default, compute=fft_compute, samples=_r2c_samples)(fft_rule)
    rule(aten._fft_c2c.default, compute=fft_compute, samples=_c2c_samples)(fft_rule)
    rule(aten._fft_c2r.default, compute=fft_compute, samples=_c2r_samples)(fft_rule)
