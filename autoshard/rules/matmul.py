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

``_grouped_mm`` (the expert kernel of Hugging Face MoE models) is an einsum
per layout, with the ragged dim that ``offs`` cuts into groups never split
(:func:`grouped_mm_rule`).

>>> [str(s) for s in einsum_rule("mk,kn->mn")]
['S*(0) <- S*(0), R', 'S*(1) <- R, S*(1)', 'P(sum) <- S*(1), S*(0)', 'P(sum) <- P(sum), R', 'P(sum) <- R, P(sum)']
"""

from __future__ import annotations

import torch

from autoshard.rules.compute import einsum_compute, einsum_letters, io_bytes
from autoshard.rules.error_bounds import einsum_error_bound
from autoshard.rules.core import OpCall, OpCompute, P, R, S, ShardPlaceholder, SingleDimStrategy
from autoshard.rules.registry import RuleRegistry, SampleInput
from autoshard.rules.samples import Sampler

__all__ = [
    "EINSUM_OPS",
    "GROUPED_MM_LAYOUTS",
    "einsum_rule",
    "broadcast_placement",
    "grouped_mm_rule",
    "grouped_mm_reference",
    "register",
]

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
    aten.addr.default: "m,n->mn",
    aten.addbmm.default: "bmk,bkn->mn",
}
"""``beta * bias + alpha * einsum(...)`` with ``bias`` broadcast to the output."""


def einsum_rule(equation: str, *, fixed: str = "") -> list[SingleDimStrategy]:
    """Single-dim strategies of an einsum (module docstring); letters in
    ``fixed`` are never split.

    >>> [str(s) for s in einsum_rule("mk,gkn->mn", fixed="mg")][:2]
    ['S*(1) <- R, S*(2)', 'P(sum) <- S*(1), S*(1)']
    """
    ins, out = einsum_letters(equation)
    letters = sorted(set("".join(ins)) - set(fixed), key=lambda c: (c not in out, "".join(ins + [out]).index(c)))
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
            # sorted: a set of letters iterates in PYTHONHASHSEED's order, which
            # made the sizes (and every later draw) differ between processes
            size = {c: sampler.size() for c in sorted(set("".join(ins)))}
            args = [sampler.randn(tuple(size[c] for c in letters), dtype) for letters in ins]
            if not bias:
                yield SampleInput(tuple(args), {})
                continue
            out_shape = tuple(size[c] for c in out)
            bias_t = sampler.randn(sampler.broadcastable(out_shape), dtype)
            kwargs = sampler.choice([{}, {"beta": 0.5, "alpha": 2.0}])
            yield SampleInput((bias_t, *args), kwargs)

    return samples


# ------------------------------------------------------------------ grouped mm

GROUPED_MM_LAYOUTS: dict[tuple[int, int], tuple[str, str, str]] = {
    (2, 3): ("mk,gkn->mn", "mg", "rows of mat_a cut by offs, one expert mat_b[g] per group (MoE experts)"),
    (3, 3): ("gmk,gkn->gmn", "", "a batched mm: no offs, experts and tokens split like bmm"),
    (3, 2): ("gmk,kn->mn", "gn", "columns of mat_b cut by offs, one mat_a[g] per group"),
    (2, 2): ("mk,kn->gmn", "k", "the contraction dim cut by offs, one output matrix per group"),
}
"""(mat_a dims, mat_b dims) -> (einsum, letters never split, what the layout is).

A letter that ``offs`` cuts into groups, and the group letter of the operand
indexed by group, stay whole: the kernel starts group 0 at row (column) 0 and
reads ``offs`` as absolute positions, so a rank holding a slice of them would
need offsets relative to its slice, which no split of the global ``offs`` is.
In the 2-D x 3-D (Hugging Face MoE) layout this leaves the hidden dims:
``mat_b`` split on N (column parallel) or both on K (row parallel, ``P(sum)``);
expert parallelism there needs a token all-to-all around the op. The batched
3-D x 3-D layout splits experts (``S(0)`` on both and the output) and tokens."""

_GROUPED_MM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def grouped_mm_rule(call: OpCall) -> list[SingleDimStrategy]:
    """``_grouped_mm(mat_a, mat_b, offs)``: the layout's einsum with its ragged
    letters fixed; ``offs`` (when given) is replicated.

    >>> import torch
    >>> from autoshard.rules.core import TensorMeta
    >>> a, b, offs = TensorMeta((8, 16), torch.bfloat16), TensorMeta((4, 16, 32), torch.bfloat16), TensorMeta((4,), torch.int32)
    >>> call = OpCall(torch.ops.aten._grouped_mm.default, (a, b, offs), {}, (a, b, offs), (TensorMeta((8, 32), torch.bfloat16),))
    >>> [str(s) for s in grouped_mm_rule(call)]
    ['S*(1) <- R, S*(2), R', 'P(sum) <- S*(1), S*(1), R', 'P(sum) <- P(sum), R, R', 'P(sum) <- R, P(sum), R']
    """
    a, b = call.inputs[0], call.inputs[1]
    layout = GROUPED_MM_LAYOUTS.get((a.ndim, b.ndim))
    if layout is None:
        return []
    equation, fixed, _ = layout
    extra = (R,) * (len(call.inputs) - 2)  # offs
    return [SingleDimStrategy(s.outputs, s.inputs + extra) for s in einsum_rule(equation, fixed=fixed)]


def grouped_mm_compute(call: OpCall) -> OpCompute:
    """2 FLOPs per output element per contracted element of its group."""
    a, out = call.inputs[0], call.outputs[0]
    k = a.shape[-1]
    if a.ndim == 2 and call.inputs[1].ndim == 2 and len(call.inputs) > 2:
        k = k / max(call.inputs[2].numel, 1)  # each group contracts its slice of K
    return OpCompute("matmul", 2.0 * out.numel * k, io_bytes(call))


def grouped_mm_reference(
    mat_a: torch.Tensor,
    mat_b: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``aten._grouped_mm`` without the CPU kernel's 16-byte stride alignment,
    which the shards of a validator mesh rarely have; same dtypes accepted,
    rows (columns) past ``offs[-1]`` zero where the kernel leaves them unset.

    >>> a, b = torch.ones(4, 2), torch.ones(2, 2, 3)
    >>> grouped_mm_reference(a, b, torch.tensor([1, 4], dtype=torch.int32)).shape
    torch.Size([4, 3])
    """
    if mat_a.dtype not in _GROUPED_MM_DTYPES or mat_b.dtype != mat_a.dtype:
        raise RuntimeError(f"_grouped_mm: expected float32, bfloat16 or float16 operands of one dtype, got {mat_a.dtype}, {mat_b.dtype}")
    if bias is not None or (out_dtype is not None and out_dtype != mat_a.dtype):
        raise RuntimeError("_grouped_mm: bias and a different out_dtype are not supported on CPU")
    a, b = mat_a.float(), mat_b.float()
    if a.ndim == 3 and b.ndim == 3:
        return torch.bmm(a, b).to(mat_a.dtype)
    if offs is None:
        raise RuntimeError("_grouped_mm: offs is needed when an operand is 2-D")
    ends = [int(e) for e in offs.tolist()]
    starts = [0] + ends[:-1]
    if a.ndim == 2 and b.ndim == 3:
        out = a.new_zeros(a.shape[0], b.shape[-1])
        for g, (lo, hi) in enumerate(zip(starts, ends)):
            out[lo:hi] = a[lo:hi] @ b[g]
    elif a.ndim == 3:
        out = a.new_zeros(a.shape[1], b.shape[-1])
        for g, (lo, hi) in enumerate(zip(starts, ends)):
            out[:, lo:hi] = a[g] @ b[:, lo:hi]
    else:
        out = a.new_zeros(len(ends), a.shape[0], b.shape[-1])
        for g, (lo, hi) in enumerate(zip(starts, ends)):
            out[g] = a[:, lo:hi] @ b[lo:hi]
    return out.to(mat_a.dtype)


def _offsets(sampler: Sampler, total: int, groups: int) -> torch.Tensor:
    """Sorted int32 group ends, the last one ``total``; empty groups allowed."""
    cuts = sorted(sampler.randint(0, total) for _ in range(groups - 1))
    return torch.tensor(cuts + [total], dtype=torch.int32)


def _grouped_mm_samples(sampler: Sampler):
    for a_nd, b_nd in GROUPED_MM_LAYOUTS:
        dtype = sampler.float_dtype(_GROUPED_MM_DTYPES)
        m, k, n, g = sampler.size(), sampler.size(), sampler.size(), sampler.choice((2, 3, 4))
        if (a_nd, b_nd) == (2, 3):
            yield SampleInput((sampler.randn((m, k), dtype), sampler.randn((g, k, n), dtype), _offsets(sampler, m, g)), {})
        elif (a_nd, b_nd) == (3, 3):
            yield SampleInput((sampler.randn((g, m, k), dtype), sampler.randn((g, k, n), dtype)), {})
        elif (a_nd, b_nd) == (3, 2):
            yield SampleInput((sampler.randn((g, m, k), dtype), sampler.randn((k, n), dtype), _offsets(sampler, n, g)), {})
        else:
            yield SampleInput((sampler.randn((m, k), dtype), sampler.randn((k, n), dtype)), {"offs": _offsets(sampler, k, g)})


def register(registry: RuleRegistry) -> None:
    """Add the matmul-like rules to ``registry``."""
    rule = registry.family("matmul")
    for op, equation in EINSUM_OPS.items():
        rule(op, compute=einsum_compute(equation), samples=_einsum_samples(equation, bias=False),
             error_bound=einsum_error_bound(equation))(
            lambda call, eq=equation: einsum_rule(eq)
        )
    for op, equation in BIAS_EINSUM_OPS.items():
        rule(op, compute=einsum_compute(equation, first_input=1), samples=_einsum_samples(equation, bias=True),
             error_bound=einsum_error_bound(equation, bias=True))(
            _bias_rule(equation)
        )
    rule(aten._grouped_mm.default, compute=grouped_mm_compute, samples=_grouped_mm_samples,
         reference=grouped_mm_reference, note="the CPU kernel needs 16-byte aligned strides: validated on a reference")(
        grouped_mm_rule)
