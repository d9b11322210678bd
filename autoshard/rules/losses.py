"""Losses: nll_loss (the tail of cross-entropy) and mse_loss, forward and backward.

The reduction decides what a batch split gives:

* ``none``: the per-sample losses split like the batch;
* ``sum``: each rank sums its samples, ``P(sum)``;
* ``mean``: ``mse_loss`` averages equal slices, ``P(avg)`` (even splits only).
  ``nll_loss`` divides by the *total weight* of the non-ignored targets, which
  differs between slices (padding tokens, class weights), so no batch split is
  exact for the forward. Its backward receives the global ``total_weight`` as
  an input, so a batch split is exact there. (A batch-split mean cross-entropy
  is obtained by decomposing nll_loss into sum-reductions before tracing:
  ``autoshard.trace.DEFAULT_DECOMPOSITIONS`` does; it does the same for a mean
  ``mse_loss`` and its backward, whose ``mean`` kernel divides by the count of
  the slice it is given.)

The class dim is never split: the target picks one class per sample, and a
plain local kernel cannot mask classes it does not hold. Every loss is linear
in its log-probabilities (nll) or, for the backward, in ``grad_output``, so
partial inputs stay partial where the other inputs are replicated.

>>> REDUCTIONS
('none', 'mean', 'sum')
"""

from __future__ import annotations

import torch

from autoshard.rules.compute import elementwise, nll_loss_backward_compute, nll_loss_forward_compute
from autoshard.rules.core import P, P_AVG, R, OpCall, S, SingleDimStrategy
from autoshard.rules.registry import RuleRegistry, SampleInput
from autoshard.rules.samples import Sampler

__all__ = ["REDUCTIONS", "register"]

aten = torch.ops.aten
REDUCTIONS = ("none", "mean", "sum")  # aten's reduction codes 0, 1, 2


def _reduction(call: OpCall) -> str:
    return REDUCTIONS[int(call.arg("reduction", 1))]


def nll_forward_rule(call: OpCall) -> list[SingleDimStrategy]:
    """(output, total_weight) of nll_loss_forward(self [N, C] | [C], target, weight?)."""
    red = _reduction(call)
    batched = call.inputs[0].ndim == 2
    strategies = []
    if batched and red == "none":
        strategies.append(SingleDimStrategy((S(0), R), call.place(R, self=S(0), target=S(0))))
    if batched and red == "sum":
        strategies.append(SingleDimStrategy((P, P), call.place(R, self=S(0), target=S(0))))
    # -sum(w[t] * x[t]) (/ total_weight): linear in x; total_weight depends on targets only.
    for k in (P, P_AVG):
        strategies.append(SingleDimStrategy((k, R), call.place(R, self=k)))
    return strategies


def nll_backward_rule(call: OpCall) -> list[SingleDimStrategy]:
    """grad_input of nll_loss_backward(grad_output, self, target, weight?, ..., total_weight)."""
    red = _reduction(call)
    strategies = []
    if call.inputs[1].ndim == 2:
        grad = S(0) if red == "none" else R
        strategies.append(SingleDimStrategy(S(0), call.place(R, grad_output=grad, self=S(0), target=S(0))))
    for k in (P, P_AVG):
        strategies.append(SingleDimStrategy(k, call.place(R, grad_output=k)))
    return strategies


def mse_rule(call: OpCall) -> list[SingleDimStrategy]:
    """mse_loss(x, y, reduction)."""
    red = _reduction(call)
    n = call.inputs[0].ndim
    out = {"none": None, "sum": P, "mean": P_AVG}[red]
    return [SingleDimStrategy(S(d) if out is None else out, (S(d), S(d))) for d in range(n)]


def mse_backward_rule(call: OpCall) -> list[SingleDimStrategy]:
    """mse_loss_backward(grad_output, x, y, reduction): ``mean`` divides by the
    count of the tensor it is given, which on a slice is not the global count:
    no split then. (Traces rewrite ``mean`` as the ``sum`` kernels over the global
    count, ``autoshard.trace.DEFAULT_DECOMPOSITIONS``, which split exactly.)"""
    red = _reduction(call)
    n = call.inputs[1].ndim
    strategies = []
    if red != "mean":
        grad = (lambda d: S(d)) if red == "none" else (lambda d: R)
        strategies = [SingleDimStrategy(S(d), (grad(d), S(d), S(d))) for d in range(n)]
    return strategies + [SingleDimStrategy(k, (k, R, R)) for k in (P, P_AVG)]


# ------------------------------------------------------------------ samples


def _nll_inputs(sampler: Sampler, batched: bool):
    n, c = sampler.size(), sampler.size()
    dtype = sampler.float_dtype((torch.float64, torch.float32))
    x = torch.log_softmax(sampler.randn((n, c) if batched else (c,), dtype), -1)
    t = sampler.index((n,) if batched else (), c)
    if batched:
        t[sampler.bool((n,), 0.25)] = -100  # ignored targets, as padding tokens are
    w = sampler.positive((c,), dtype) if sampler.rng.random() < 0.5 else None
    return x, t, w


def _nll_forward_samples(sampler: Sampler):
    for red in (0, 1, 2):
        x, t, w = _nll_inputs(sampler, batched=red != 1 or sampler.rng.random() < 0.8)
        yield SampleInput((x, t, w, red, -100), {})


def _nll_backward_samples(sampler: Sampler):
    for red in (0, 1, 2):
        x, t, w = _nll_inputs(sampler, batched=True)
        out, total = aten.nll_loss_forward.default(x, t, w, red, -100)
        yield SampleInput((sampler.randn(out.shape, x.dtype), x, t, w, red, -100, total), {})


def _mse_samples(sampler: Sampler):
    for red in (0, 1, 2):
        shape = sampler.shape()
        dtype = sampler.float_dtype()
        yield SampleInput((sampler.randn(shape, dtype), sampler.randn(shape, dtype), red), {})


def _mse_backward_samples(sampler: Sampler):
    for red in (0, 1, 2):
        shape = sampler.shape()
        dtype = sampler.float_dtype((torch.float64, torch.float32))
        g = sampler.randn(shape if red == 0 else (), dtype)
        yield SampleInput((g, sampler.randn(shape, dtype), sampler.randn(shape, dtype), red), {})


def register(registry: RuleRegistry) -> None:
    """Add the loss rules to ``registry``."""
    rule = registry.family("losses")
    rule(aten.nll_loss_forward.default, compute=nll_loss_forward_compute, samples=_nll_forward_samples)(nll_forward_rule)
    rule(aten.nll_loss_backward.default, compute=nll_loss_backward_compute, samples=_nll_backward_samples)(
        nll_backward_rule)
    rule(aten.mse_loss.default, compute=elementwise(3), samples=_mse_samples, uneven=False)(mse_rule)
    rule(aten.mse_loss_backward.default, compute=elementwise(4), samples=_mse_backward_samples)(mse_backward_rule)
