"""Ops that Hugging Face models put in the graph beyond the core families.

Every rule here is in family ``hf_ops`` (the module's name, as for every family).

**transformers' grouped matmul**. An fp32 MoE model
(Qwen3-MoE, DeepSeek-V3, Mixtral) traced on CPU runs its experts through
``transformers``' own custom ops, because ``aten._grouped_mm`` does not
compile for fp32 (``transformers/integrations/moe.py``)::

    grouped_mm_fallback(input[m, k], weight[g, k, n], offs[g]) -> out[m, n]
    grouped_mm_fallback_backward(input, weight, offs, grad_out[m, n])
        -> (grad_input[m, k], grad_weight[g, k, n])

Rows ``offs[i-1]:offs[i]`` of ``input`` (tokens sorted by expert) use expert
``weight[i]``; rows past ``offs[-1]`` are zero in ``out`` and ``grad_input``. The
forward is ``aten._grouped_mm``'s 2-D x 3-D layout, ``mk,gkn->mn`` with the
ragged ``m`` and the group ``g`` never split (``offs`` holds absolute row
positions: a rank holding a slice of the rows would need offsets relative to
its slice), so it shares :func:`autoshard.rules.matmul.grouped_mm_rule`. The
backward is two einsums over the same groups, ``grad_input = mn,gkn->mk`` and
``grad_weight = mk,mn->gkn``; per mesh dim:

* ``k`` split: ``input``, ``weight`` and ``grad_input`` split on k, ``grad_out``
  whole, ``grad_weight`` split on k (each rank's rows of ``input^T @ grad_out``);
* ``n`` split: ``weight`` and ``grad_out`` split on n, ``grad_input`` ``P(sum)``
  (n is summed away), ``grad_weight`` split on n;
* linear in ``grad_out``: ``grad_out`` ``P(sum)`` gives both outputs ``P(sum)``;
* ``grad_input`` is linear in ``weight`` and does not read ``input``, and
  ``grad_weight`` the other way round: ``weight`` ``P(sum)`` gives
  ``(P(sum), R)``, ``input`` ``P(sum)`` gives ``(R, P(sum))``.

The ops exist only once ``transformers.integrations.moe`` is imported, so the
rules are registered by name (:class:`autoshard.rules.registry.NamedRule`):
loading the rules imports no ``transformers``.

**aten.new_empty_strided** (as ``new_empty`` in the factory family): the
functionalized form of an in-place copy into a strided view (DeepSeek-V3's
attention). Its values are unset, so it can be made in any placement, like
``empty``: the factory family's :func:`~autoshard.rules.factory.sized_rule`,
with the size localized and the local tensor laid out contiguously. It is
registered here only while ``factory.py`` has no rule for it (its home).

>>> import torch
>>> from autoshard.rules.core import TensorMeta
>>> x, w, offs = TensorMeta((8, 16), torch.float32), TensorMeta((4, 16, 32), torch.float32), TensorMeta((4,), torch.int64)
>>> g = TensorMeta((8, 32), torch.float32)
>>> call = OpCall(None, (x, w, offs, g), {}, (x, w, offs, g), (x, w))  # the rule reads shapes only
>>> [str(s) for s in grouped_mm_backward_rule(call)]
['S*(1), S*(1) <- S*(1), S*(1), R, R', 'P(sum), S*(2) <- R, S*(2), R, S*(1)', 'P(sum), P(sum) <- R, R, R, P(sum)', 'P(sum), R <- R, P(sum), R, R', 'R, P(sum) <- P(sum), R, R, R']
"""

from __future__ import annotations

from typing import Iterator

import torch

from autoshard.rules.compute import allocation, io_bytes
from autoshard.rules.core import OpCall, OpCompute, P, R, S, SingleDimStrategy
from autoshard.rules.factory import sized_rule
from autoshard.rules.matmul import grouped_mm_compute, grouped_mm_rule
from autoshard.rules.registry import RuleRegistry, SampleInput
from autoshard.rules.samples import Sampler

__all__ = ["GROUPED_MM_FALLBACK", "GROUPED_MM_FALLBACK_BACKWARD", "TRANSFORMERS_MOE_MODULE",
           "grouped_mm_backward_rule", "grouped_mm_backward_compute", "register"]

aten = torch.ops.aten

GROUPED_MM_FALLBACK = "transformers.grouped_mm_fallback.default"
GROUPED_MM_FALLBACK_BACKWARD = "transformers.grouped_mm_fallback_backward.default"
TRANSFORMERS_MOE_MODULE = "transformers.integrations.moe"
"""Importing it defines both ops (``torch.library.custom_op``)."""

_DTYPES = (torch.float32, torch.bfloat16)


def grouped_mm_backward_rule(call: OpCall) -> list[SingleDimStrategy]:
    """``grouped_mm_fallback_backward(input, weight, offs, grad_out)``: the
    single-dim strategies of the module docstring (outputs ``grad_input``,
    ``grad_weight``; ``offs`` replicated)."""
    if call.inputs[0].ndim != 2 or call.inputs[1].ndim != 3:
        return []
    return [
        SingleDimStrategy((S(1), S(1)), (S(1), S(1), R, R)),   # k split
        SingleDimStrategy((P, S(2)), (R, S(2), R, S(1))),      # n split: summed away in grad_input
        SingleDimStrategy((P, P), (R, R, R, P)),               # linear in grad_out
        SingleDimStrategy((P, R), (R, P, R, R)),               # grad_input linear in weight, grad_weight unread
        SingleDimStrategy((R, P), (P, R, R, R)),               # grad_weight linear in input, grad_input unread
    ]


def grouped_mm_backward_compute(call: OpCall) -> OpCompute:
    """Two grouped matmuls of the forward's size: ``4 m k n`` FLOPs."""
    (m, k), n = call.inputs[0].shape, call.inputs[1].shape[-1]
    return OpCompute("matmul", 4.0 * m * k * n, io_bytes(call))


def _offsets(sampler: Sampler, rows: int, groups: int, dtype: torch.dtype) -> torch.Tensor:
    """Sorted group ends, empty groups allowed; the last one is below ``rows``
    now and then, as when the dispatch keeps padding rows (rows past it are zero)."""
    ends = sorted(sampler.randint(0, rows) for _ in range(groups - 1))
    last = sampler.choice((rows, rows, max(ends[-1] if ends else 0, rows - 2)))
    return torch.tensor(ends + [last], dtype=dtype)


def _forward_samples(sampler: Sampler) -> Iterator[SampleInput]:
    for _ in range(3):
        dtype = sampler.float_dtype(_DTYPES)
        m, k, n, g = sampler.size(), sampler.size(), sampler.size(), sampler.choice((2, 3, 4))
        offs = _offsets(sampler, m, g, sampler.choice((torch.int32, torch.int64)))
        yield SampleInput((sampler.randn((m, k), dtype), sampler.randn((g, k, n), dtype), offs), {})


def _backward_samples(sampler: Sampler) -> Iterator[SampleInput]:
    for sample in _forward_samples(sampler):
        x, w, offs = sample.args
        yield SampleInput((x, w, offs, sampler.randn((x.shape[0], w.shape[-1]), x.dtype)), {})


def _new_empty_strided_samples(sampler: Sampler) -> Iterator[SampleInput]:
    for _ in range(2):
        shape = list(sampler.shape(min_ndim=2))
        stride = [1] * len(shape)
        for d in range(len(shape) - 2, -1, -1):
            stride[d] = stride[d + 1] * shape[d + 1]
        yield SampleInput((sampler.randn(sampler.shape(), torch.float32), shape, stride), {})


def _localize_strided(args: tuple, kwargs: dict, local: OpCall) -> tuple[tuple, dict]:
    """``new_empty_strided(x, size, stride)``: the local output's size, laid out contiguously."""
    shape = list(local.outputs[0].shape)
    stride = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        stride[d] = stride[d + 1] * shape[d + 1]
    return (args[0], shape, stride, *args[3:]), kwargs


def _any_values(args: tuple, kwargs: dict, outputs: tuple) -> str | None:
    """Unset values: only the shapes (already compared) count."""
    return None


def register(registry: RuleRegistry) -> None:
    """Add transformers' grouped-matmul rules (by name) and ``aten.new_empty_strided`` to ``registry``."""
    rule = registry.family("hf_ops")
    rule(GROUPED_MM_FALLBACK, compute=grouped_mm_compute, samples=_forward_samples,
         defined_by=TRANSFORMERS_MOE_MODULE)(grouped_mm_rule)
    rule(GROUPED_MM_FALLBACK_BACKWARD, compute=grouped_mm_backward_compute, samples=_backward_samples,
         defined_by=TRANSFORMERS_MOE_MODULE)(grouped_mm_backward_rule)
    if registry.rule_for(aten.new_empty_strided.default) is None:
        rule(aten.new_empty_strided.default, compute=allocation(written=False), samples=_new_empty_strided_samples,
             localize=_localize_strided, contract=_any_values)(sized_rule)
