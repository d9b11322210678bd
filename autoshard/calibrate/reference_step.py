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
call on every rank at once; its ops are also timed alone. The excess per op,
``(step - sum of the ops alone) / ops``, is what :class:`~hw_profiles.correction.ProfileCorrection`
calls ``step_op_s`` and the strategy graph adds to every op of a step
(``autoshard.graph.builder``).

>>> step, parts, ops = reference_step()
>>> ops == sum(count for _, count in parts)
True
"""

from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["reference_step", "LAYERS", "WIDTH", "BATCH"]

aten = torch.ops.aten
LAYERS, WIDTH, BATCH = 8, 256, 64
"""Layers, width and batch of the reference MLP: ops of the sizes of the benchmark models' (0.1-1 ms)."""


def reference_step() -> tuple[Callable[[], Any], list[tuple[Callable[[], Any], int]], int]:
    """(the step as one call, [(one of its ops alone, how many times the step runs it)], ops per step)."""
    weights = [torch.randn(WIDTH, WIDTH) / WIDTH**0.5 for _ in range(LAYERS)]
    x = torch.randn(BATCH, WIDTH)

    def step() -> list[torch.Tensor]:
        acts, outs = [], [x]
        for w in weights:  # forward: keep what the backward reads
            a = aten.mm.default(outs[-1], w)
            acts.append(a)
            outs.append(aten.relu.default(a))
        g = aten.ones_like.default(outs[-1])
        grads = []
        for i in reversed(range(LAYERS)):  # backward
            g = aten.threshold_backward.default(g, acts[i], 0.0)
            grads.append(aten.mm.default(aten.t.default(outs[i]), g))
            g = aten.mm.default(g, aten.t.default(weights[i]))
        return grads  # freed by the caller, as gradients set to None after the update

    a = x @ weights[0]
    parts = [
        (lambda: aten.mm.default(x, weights[0]), LAYERS),                        # forward matmuls
        (lambda: aten.relu.default(a), LAYERS),
        (lambda: aten.ones_like.default(a), 1),
        (lambda: aten.threshold_backward.default(a, a, 0.0), LAYERS),
        (lambda: aten.mm.default(aten.t.default(x), a), LAYERS),                 # weight gradients (t: a view)
        (lambda: aten.mm.default(a, aten.t.default(weights[0])), LAYERS),        # input gradients
    ]
    return step, parts, sum(count for _, count in parts)
