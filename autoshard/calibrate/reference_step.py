"""The reference step of a profile correction (``autoshard.calibrate.first_use``):
what an op costs inside a training step beyond what it costs timed alone.

Why: a profile times every op alone, called again and again in lockstep on all
ranks. A step runs hundreds of different ops one after the other, each on
tensors the previous ops left (cold in cache, another allocator block), with the
runtime's dispatch between them. Measured on a 2-core VM with 4 ranks (load
average ~8, ``benchmarks/results/profile_correction.md``): a forward+backward
of the benchmark MLP and LLaMA took 1.8-2.3x the sum of its own ops timed
alone in lockstep; with glibc told to keep its memory (no page faults) the
MLP's ratio fell from 1.9 to 1.2 (its 4 MiB gradients are faulted in again
every step), the LLaMA's stayed at 1.85 (no faults to remove: ~100 us more per
op). That excess is a cost per op of a step, not of any op alone.

The reference step here is a small MLP's forward and backward written as aten
calls (matmuls, relu, its backward, the weight gradients; the activations kept
for the backward, the gradients freed at the end, as a step does), run as one
call on every rank at once; its ops are also timed alone. It runs in two sizes:
:data:`SMALL` (its whole working set in a core's cache) and :data:`COLD` (16
layers of 512: 16 MiB of weights a rank, each op's operands small enough to stay
in cache when the op is timed alone, the step's far beyond it, as in the plans'
steps). Why two: measured in the plans' steps (``benchmarks/step_parts.py``,
``benchmarks/step_vs_ops.py``, 2026-12-05, 4 ranks on 2 cores) the ops cost
1.8x (LLaMA) and 2.7x (MLP) the CPU they cost alone, about 95 us per MiB they
touch on both models but 39 and 300 us per op: the excess grows with the bytes
(operands cold in a step), which a cache-resident reference step cannot see
(1.28x). The two steps' excesses, ``step - sum of its ops alone``, are split into
a part per op and a part per byte (:class:`~hw_profiles.correction.ProfileCorrection`:
``step_op_s``, ``step_byte_s``), which the strategy graph adds to every op of a
step (``autoshard.graph.build_state``).

>>> step, parts, ops = reference_step()
>>> ops == sum(count for _, count in parts)
True
>>> step_bytes(SMALL) < step_bytes(COLD) / 4
True
"""

from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["reference_step", "step_bytes", "LAYERS", "WIDTH", "BATCH", "SMALL", "COLD"]

aten = torch.ops.aten
LAYERS, WIDTH, BATCH = 8, 256, 64
"""Layers, width and batch of the reference MLP: ops of the sizes of the benchmark models' (0.1-1 ms)."""
SMALL = (LAYERS, WIDTH, BATCH)
"""The cache-resident reference step (2 MiB of weights a rank)."""
COLD = (16, 512, 64)
"""The reference step whose working set leaves the caches between an op and its next call
(16 MiB of weights a rank; each op's operands ~1.3 MiB, within a core's 2 MiB L2 when timed alone)."""


def _bytes_of(ops: list[tuple[Any, tuple, int]]) -> float:
    """The bytes the ops access, as the rules price them (``autoshard.rules``)."""
    from autoshard.rules import load_rules
    from autoshard.rules.core import to_meta

    rules = load_rules()
    return float(sum(count * rules.compute_kind(op, to_meta(args), {}).bytes_accessed for op, args, count in ops))


def _part_calls(layers: int, width: int, batch: int) -> list[tuple[Any, tuple, int]]:
    """(op, arguments, how many times the step runs it) of the reference step's ops alone."""
    x, w = torch.randn(batch, width), torch.randn(width, width) / width**0.5
    a = x @ w
    return [(aten.mm.default, (x, w), layers), (aten.relu.default, (a,), layers), (aten.ones_like.default, (a,), 1),
            (aten.threshold_backward.default, (a, a, 0.0), layers),
            (aten.mm.default, (aten.t.default(x), a), layers),   # weight gradients (t: a view)
            (aten.mm.default, (a, aten.t.default(w)), layers)]   # input gradients


def step_bytes(size: tuple[int, int, int] = SMALL) -> float:
    """Bytes the reference step of ``size`` (layers, width, batch) accesses, as the rules price them."""
    return _bytes_of(_part_calls(*size))


def reference_step(size: tuple[int, int, int] = SMALL
                   ) -> tuple[Callable[[], Any], list[tuple[Callable[[], Any], int]], int]:
    """(the step as one call, [(one of its ops alone, how many times the step runs it)], ops per step)
    of the reference MLP of ``size`` (layers, width, batch)."""
    layers, width, batch = size
    weights = [torch.randn(width, width) / width**0.5 for _ in range(layers)]
    x = torch.randn(batch, width)

    def step() -> list[torch.Tensor]:
        acts, outs = [], [x]
        for w in weights:  # forward: keep what the backward reads
            a = aten.mm.default(outs[-1], w)
            acts.append(a)
            outs.append(aten.relu.default(a))
        g = aten.ones_like.default(outs[-1])
        grads = []
        for i in reversed(range(layers)):  # backward
            g = aten.threshold_backward.default(g, acts[i], 0.0)
            grads.append(aten.mm.default(aten.t.default(outs[i]), g))
            g = aten.mm.default(g, aten.t.default(weights[i]))
        return grads  # freed by the caller, as gradients set to None after the update

    parts = [(lambda op=op, args=args: op(*args), count) for op, args, count in _part_calls(layers, width, batch)]
    return step, parts, sum(count for _, count in parts)
