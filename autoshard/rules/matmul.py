"""Matmul-like ops, described as einsum equations.

From an equation the single-dim strategies follow mechanically, per letter:

* a letter in the output: shard it in the output and in every input that has
  it (inputs without it are broadcast, so replicated);
* a letter summed away (in inputs, not in the output): shard it in every input
  that has it; each rank sums its slice, so the output is ``P(sum)``;
* the op is linear in each input: one input ``P(sum)``, the others ``R``,
  gives ``P(sum)``.

``addmm``/``baddbmm`` add a broadcast bias: it follows the output's shard
(replicated where broadcast), and must itself be ``P(sum)`` when the output is
partial, because every rank adds its piece once.

>>> [str(s) for s in einsum_rule("mk,kn->mn")]
['S*(0) <- S*(0), R', 'S*(1) <- R, S*(1)', 'P(sum) <- S*(1), S*(0)', 'P(sum) <- P(sum), R', 'P(sum) <- R, P(sum)']
"""

from __future__ import annotations

import torch

from autoshard.rules.compute import einsum_compute, einsum_letters
from autoshard.rules.core import OpCall, P, R, S, ShardPlaceholder, SingleDimStrategy
from autoshard.rules.registry import RuleRegistry, SampleInput
from autoshard.rules.samples import Sampler

__all__ = ["EINSUM_OPS", "einsum_rule", "broadcast_placement", "register"]

aten = torch.ops.aten

EINSUM_OPS: dict[torch._ops.OpOverload, str] = {
    aten.mm.default: "mk,kn->mn",
    aten.bmm.default: "bmk,bkn->bmn",
    aten.mv.default: "mk,k->m",
    aten.dot.default: "k,k->",
    aten.vdot.default: "k,k->",
}
"""Ops that are exactly one einsum of their tensor inputs."""

BIAS_EINSUM_OPS: dict[torch._ops.OpOverload, str] = {
    aten.addmm.default: "mk,kn->mn",
    aten.baddbmm.default: "bmk,bkn->bmn",
    aten.addmv.default: "mk,k->m",
}
"""``beta * bias + alpha * einsum(...)`` with ``bias`` broadcast to the output."""


def einsum_rule(equation: str) -> list[SingleDimStrategy]:
    """Single-dim strategies of an einsum (module docstring)."""
    ins, out = einsum_letters(equation)
    letters = sorted(set("".join(ins)), key=lambda c: (c not in out, "".join(ins + [out]).index(c)))
    strategies = []
    for letter in letters:
        placed_ins = tuple(S(i.index(letter)) if letter in i else R for i in ins)
        placed_out = S(out.index(letter)) if letter in out else P
        strategies.append(SingleDimStrategy(placed_out, placed_ins))
    for k in range(len(ins)):
        strategies.append(SingleDimStrategy(P, tuple(P if j == k else R for j in range(len(ins)))))
    return strategies


def broadcast_placement(out_placement: object, out_shape: tuple[int, ...], arg_shape: tuple[int, ...]) -> object:
    """Placement of an input broadcast to ``out_shape`` when the output has
    ``out_placement``: the matching shard, ``R`` where the input is broadcast,
    the same partial when the output is partial."""
    if not isinstance(out_placement, ShardPlaceholder):
        return out_placement
    d = out_placement.dim
    ad = d - (len(out_shape) - len(arg_shape))
    if ad < 0 or (arg_shape[ad] == 1 and out_shape[d] != 1):
        return R
    return S(ad)


def _bias_rule(equation: str):
    def rule(call: OpCall) -> list[SingleDimStrategy]:
        out_shape = call.outputs[0].shape
        bias_shape = call.inputs[0].shape
        strategies = []
        for s in einsum_rule(equation):
            bias = broadcast_placement(s.outputs[0], out_shape, bias_shape)
            strategies.append(SingleDimStrategy(s.outputs, (bias,) + s.inputs))
        return strategies

    return rule


def _einsum_samples(equation: str, *, bias: bool):
    ins, out = einsum_letters(equation)

    def samples(sampler: Sampler):
        for _ in range(2):
            dtype = sampler.float_dtype()
            size = {c: sampler.size() for c in set("".join(ins))}
            args = [sampler.randn(tuple(size[c] for c in letters), dtype) for letters in ins]
            if not bias:
                yield SampleInput(tuple(args), {})
                continue
            out_shape = tuple(size[c] for c in out)
            bias_t = sampler.randn(sampler.broadcastable(out_shape), dtype)
            kwargs = sampler.choice([{}, {"beta": 0.5, "alpha": 2.0}])
            yield SampleInput((bias_t, *args), kwargs)

    return samples


def register(registry: RuleRegistry) -> None:
    """Add the matmul-like rules to ``registry``."""
    rule = registry.family("matmul")
    for op, equation in EINSUM_OPS.items():
        rule(op, compute=einsum_compute(equation), samples=_einsum_samples(equation, bias=False))(
            lambda call, eq=equation: einsum_rule(eq)
        )
    for op, equation in BIAS_EINSUM_OPS.items():
        rule(op, compute=einsum_compute(equation, first_input=1), samples=_einsum_samples(equation, bias=True))(
            _bias_rule(equation)
        )
