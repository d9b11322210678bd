r"""Sharding rules of a MoE layer's routed experts: ``autoshard::experts`` and its backward.

The ops are the experts stand-in of :mod:`autoshard.trace.experts` (one node per
MoE layer and direction)::

    experts(hidden[T, d], top_k_index[T, k], top_k_weights[T, k],
            gate_up_proj[E, 2h, d], down_proj[E, d, h], activation) -> out[T, d]
    experts_backward(grad_out[T, d], hidden, top_k_index, top_k_weights, gate_up_proj, down_proj,
                     activation) -> (grad_hidden, grad_weights, grad_gate_up, grad_down)

with ``out_t = sum_j w[t, j] down[e] (act(gate[e] x_t) * (up[e] x_t))``,
``e = top_k_index[t, j]`` and ``gate_up[e] = [gate[e]; up[e]]``. Single-dim
strategies (all-replicate implied), each a local op, checked on simulated
shards by :mod:`autoshard.validation`:

* **tokens split**: ``hidden``, ``top_k_index``, ``top_k_weights``, ``out`` on
  T, the experts whole: every token is routed independently. Backward: the
  token-shaped gradients split on T, the experts' gradients ``P(sum)`` (sums
  over tokens).
* **h split inside every expert** (tensor parallel): ``gate_up`` as
  ``_S(1,sf=2)`` (each rank the same slice of ``gate`` and of ``up``: a plain
  ``S(1)`` would hand one rank gates and the other ups, and ``act(gate) * up``
  needs both), ``down`` ``S(2)``; ``act(gate) * up`` is elementwise on h and
  ``down`` contracts h: ``out`` ``P(sum)``. Backward likewise, ``grad_hidden``
  and ``grad_weights`` ``P(sum)``.
* **d split of the output**: ``down`` ``S(1)`` gives ``out`` ``S(1)``.
  Backward: ``grad_out`` and ``down`` ``S(1)`` give ``grad_down`` ``S(1)``, the
  rest ``P(sum)`` (every gradient contracts d through ``down``).
* **linear**: ``out`` is linear in ``top_k_weights`` and in ``down``; every
  gradient is linear in ``grad_out``.

**Expert parallel (not a local op).** Experts split on E with tokens split on
the same mesh dim: each rank's routed copies must reach the rank of their
expert and come back, an all-to-all of run-time split sizes
(:mod:`autoshard.runtime.expert_dispatch`, run by
:mod:`autoshard.runtime.expert_ops`). Run as a local op on shards it would
route to the wrong experts, so it is not among the strategies above: it is
described as data (:func:`expert_parallel_strategies` and its backward's,
marked ``exchange="expert_dispatch"``) and offered by
``autoshard.rules.expand.expand_exchanges`` on every mesh dim that divides E
and T (on the other dims: all-replicate, the token split, or the h split
inside every expert, tensor parallel, whose output is a partial sum), each N-D
strategy tagged ``OpStrategy.exchange = ("expert_dispatch", mesh_dim)``. The
strategy graph prices it with :func:`exchange_strategy_price`
(``costmodel.expert_parallel``: compute at the busiest rank's load, this
direction's token and count exchanges as the runtime issues them, at the
solve option ``expert_imbalance``, default 1.25); the dispatched tokens at
capacity, a temporary of the op, are :func:`exchange_strategy_memory`
(a memory bound over the op's time in ``autoshard.graph.builder``, as context
parallelism's gathered K/V); the plan records the exchange per node
and the runtime's op caller runs it with
``autoshard.runtime.expert_ops.run_expert_op``. Validation skips it (the
runtime's equivalence tests check it).

>>> import torch
>>> from autoshard.rules.core import TensorMeta
>>> f, i = torch.float32, torch.int64
>>> call = OpCall(None, (), {}, (TensorMeta((8, 16), f), TensorMeta((8, 2), i), TensorMeta((8, 2), f),
...                              TensorMeta((4, 12, 16), f), TensorMeta((4, 16, 6), f)), (TensorMeta((8, 16), f),))
>>> [str(s) for s in experts_rule(call)]  # doctest: +NORMALIZE_WHITESPACE
['S*(0) <- S*(0), S*(0), S*(0), R, R', 'P(sum) <- R, R, R, _S(1,sf=2), S(2)', 'S(1) <- R, R, R, R, S(1)',
 'P(sum) <- R, R, P(sum), R, R', 'P(sum) <- R, R, R, R, P(sum)']
>>> [str(s.strategy) for s in expert_parallel_strategies(call, ranks=4)]
['S*(0) <- S*(0), S*(0), S*(0), S*(0), S*(0)']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from costmodel.expert_parallel import DEFAULT_IMBALANCE, ExpertExchangePrice, expert_exchange_price
from costmodel.mesh import MeshSpec
from costmodel.placements import Shard, StridedShard
from hw_profiles import HardwareProfile
from autoshard.rules.compute import io_bytes
from autoshard.rules.core import OpCall, OpCompute, OpStrategy, P, R, S, SingleDimStrategy
from autoshard.rules.expand import local_call, register_exchange, register_exchange_price
from autoshard.rules.registry import RuleRegistry, SampleInput
from autoshard.rules.samples import Sampler

__all__ = ["EXPERTS", "EXPERTS_BACKWARD", "EXPERTS_MODULE", "EXCHANGE", "ExchangeStrategy", "experts_rule",
           "experts_backward_rule", "experts_compute", "experts_backward_compute", "expert_parallel_strategies",
           "expert_parallel_backward_strategies", "expert_parallel_price", "exchange_strategy_price",
           "exchange_strategy_memory", "register"]

EXPERTS = "autoshard.experts.default"
EXPERTS_BACKWARD = "autoshard.experts_backward.default"
EXPERTS_MODULE = "autoshard.trace.experts"
"""Importing it defines both ops (rules are registered by name: loading them imports no trace code)."""
EXCHANGE = "expert_dispatch"
"""The runtime exchange an expert-parallel strategy needs (:mod:`autoshard.runtime.expert_ops`)."""

_GATE_UP = StridedShard(1, 2)  # [gate; up]: the same h slice of both halves on each rank


@dataclass(frozen=True, slots=True)
class ExchangeStrategy:
    """A single-dim strategy that is not a local op: the runtime runs it with ``exchange``."""

    strategy: SingleDimStrategy
    """Placements on the mesh dim (as a local op's would be written)."""
    exchange: str
    """What the runtime runs instead of the local op (:data:`EXCHANGE`)."""


def _shapes(call: OpCall, first: int) -> tuple[int, int, int, int, int]:
    """(T, k, d, h, E) from the call's tensors, ``first`` the position of ``hidden``."""
    (tokens, dim), k = call.inputs[first].shape, call.inputs[first + 1].shape[1]
    experts, two_h, _ = call.inputs[first + 3].shape
    return tokens, k, dim, two_h // 2, experts


def _well_formed(call: OpCall, first: int) -> bool:
    ins = call.inputs
    return (len(ins) == first + 5 and ins[first].ndim == 2 and ins[first + 1].ndim == 2
            and ins[first + 3].ndim == 3 and ins[first + 4].ndim == 3 and ins[first + 3].shape[1] % 2 == 0)


def experts_rule(call: OpCall) -> list[SingleDimStrategy]:
    """The forward's local single-dim strategies (module docstring)."""
    if not _well_formed(call, 0):
        return []
    return [
        SingleDimStrategy(S(0), (S(0), S(0), S(0), R, R)),        # tokens routed independently
        SingleDimStrategy(P, (R, R, R, _GATE_UP, Shard(2))),      # h split: down contracts it
        SingleDimStrategy(Shard(1), (R, R, R, R, Shard(1))),      # rows of down are out's columns
        SingleDimStrategy(P, (R, R, P, R, R)),                    # linear in the routing weights
        SingleDimStrategy(P, (R, R, R, R, P)),                    # linear in down
    ]


def experts_backward_rule(call: OpCall) -> list[SingleDimStrategy]:
    """The backward's local single-dim strategies; outputs
    ``(grad_hidden, grad_weights, grad_gate_up, grad_down)``."""
    if not _well_formed(call, 1):
        return []
    return [
        SingleDimStrategy((S(0), S(0), P, P), (S(0), S(0), S(0), S(0), R, R)),    # expert grads sum over tokens
        SingleDimStrategy((P, P, _GATE_UP, Shard(2)), (R, R, R, R, _GATE_UP, Shard(2))),
        SingleDimStrategy((P, P, P, Shard(1)), (Shard(1), R, R, R, R, Shard(1))),  # d contracted through down
        SingleDimStrategy((P, P, P, P), (P, R, R, R, R, R)),                       # linear in grad_out
    ]


def _expert_flops(tokens: float, k: int, dim: int, h: int) -> float:
    return tokens * k * 3 * 2.0 * dim * h  # gate, up and down matmuls per routed copy


def experts_compute(call: OpCall) -> OpCompute:
    """``T k`` routed copies through a SwiGLU expert: ``6 T k d h`` FLOPs."""
    tokens, k, dim, h, _ = _shapes(call, 0)
    return OpCompute("matmul", _expert_flops(tokens, k, dim, h), io_bytes(call))


def experts_backward_compute(call: OpCall) -> OpCompute:
    """Recomputed forward plus twice the forward for the gradients: ``18 T k d h`` FLOPs."""
    tokens, k, dim, h, _ = _shapes(call, 1)
    return OpCompute("matmul", 3 * _expert_flops(tokens, k, dim, h), io_bytes(call))


def expert_parallel_strategies(call: OpCall, *, ranks: int) -> list[ExchangeStrategy]:
    """The expert-parallel strategy of a forward call on a mesh dim of ``ranks`` ranks: experts
    on E, tokens on T, the same mesh dim; none when ``ranks`` does not divide the experts."""
    if not _well_formed(call, 0) or _shapes(call, 0)[4] % ranks:
        return []
    return [ExchangeStrategy(SingleDimStrategy(S(0), (S(0), S(0), S(0), S(0), S(0))), EXCHANGE)]


def expert_parallel_backward_strategies(call: OpCall, *, ranks: int) -> list[ExchangeStrategy]:
    """The backward's expert-parallel strategy: every input and output on its first dim (the
    token-shaped ones on T, the experts and their gradients on E), the forward's mesh dim."""
    if not _well_formed(call, 1) or _shapes(call, 1)[4] % ranks:
        return []
    return [ExchangeStrategy(SingleDimStrategy((S(0),) * 4, (S(0),) * 6), EXCHANGE)]


def _forward_exchanges(call: OpCall) -> tuple[list[tuple[SingleDimStrategy, str]], list[SingleDimStrategy]]:
    # expand.expand_exchanges checks that the mesh dim divides E and T. On the other mesh dims:
    # the token split (tokens are routed independently) or the h split inside every expert
    # (tensor parallel: each rank of a tp group dispatches the same tokens over its own ep
    # group to the same experts' h slices; the output is a partial sum, as the local rule's)
    ep = [(s.strategy, s.exchange) for s in expert_parallel_strategies(call, ranks=1)]
    return ep, experts_rule(call)[:2]


def _backward_exchanges(call: OpCall) -> tuple[list[tuple[SingleDimStrategy, str]], list[SingleDimStrategy]]:
    ep = [(s.strategy, s.exchange) for s in expert_parallel_backward_strategies(call, ranks=1)]
    return ep, experts_backward_rule(call)[:2]


def expert_parallel_price(call: OpCall, *, mesh_dims: Sequence[int], mesh: MeshSpec, profile: HardwareProfile,
                          imbalance: float = DEFAULT_IMBALANCE) -> tuple[OpCompute, ExpertExchangePrice]:
    """The forward call (global shapes) with its experts on ``mesh_dims``: the busiest rank's expert
    compute and the layer's exchanges over a step (``costmodel.expert_parallel``)."""
    tokens, k, dim, h, experts = _shapes(call, 0)
    ranks = 1
    for d in mesh_dims:
        ranks *= mesh.shape[d]
    local_tokens = tokens // ranks
    price = expert_exchange_price(tokens=local_tokens, top_k=k, dim=dim, itemsize=call.inputs[0].itemsize,
                                  num_experts=experts, mesh_dims=mesh_dims, mesh=mesh, profile=profile,
                                  imbalance=imbalance)
    weights = (call.inputs[3].nbytes + call.inputs[4].nbytes) // ranks
    flops = _expert_flops(imbalance * local_tokens, k, dim, h)
    return OpCompute("matmul", flops, float(weights + price.buffer_bytes)), price


def _exchange_price(call: OpCall, strategy: OpStrategy, mesh: MeshSpec, profile: HardwareProfile,
                    imbalance: float) -> tuple[int, OpCall, ExpertExchangePrice]:
    """(position of ``hidden``, the local call, the layer's exchange price) of an exchange strategy."""
    if strategy.exchange is None:
        raise ValueError(f"{strategy}: not an exchange strategy")
    first = 1 if len(call.inputs) == 6 else 0
    local = local_call(call, strategy, tuple(mesh.shape))
    tokens, k, dim, _, _ = _shapes(local, first)
    experts = _shapes(call, first)[4]
    price = expert_exchange_price(tokens=tokens, top_k=k, dim=dim, itemsize=call.inputs[first].itemsize,
                                  num_experts=experts, mesh_dims=(strategy.exchange[1],), mesh=mesh,
                                  profile=profile, imbalance=imbalance,
                                  weight_itemsize=call.inputs[first + 2].itemsize)
    return first, local, price


def exchange_strategy_price(call: OpCall, strategy: OpStrategy, *, mesh: MeshSpec, profile: HardwareProfile,
                            imbalance: float = DEFAULT_IMBALANCE) -> tuple[OpCompute, float]:
    """An expert-parallel strategy of a forward or backward call (global shapes) priced as it
    runs: the busiest rank's expert compute at ``imbalance`` times its mean load (this rank's
    tokens after every mesh dim's split, the experts of its ep group, their h slice under a
    tensor-parallel companion), the dispatched buffers as bytes accessed, and the seconds of
    this direction's exchanges (``costmodel.expert_parallel``: the forward's dispatch and
    combine, or the backward's token-and-gradient rows, routing weights and the two returns;
    each with its counts exchange).

    >>> # compute, exchange_s = exchange_strategy_price(call, strategy, mesh=mesh, profile=profile)
    """
    first, local, price = _exchange_price(call, strategy, mesh, profile, imbalance)
    tokens, k, dim, h, _ = _shapes(local, first)
    weights = local.inputs[first + 3].nbytes + local.inputs[first + 4].nbytes
    flops = (3 if first else 1) * _expert_flops(imbalance * tokens, k, dim, h)
    held = price.backward_temp_bytes if first else price.forward_temp_bytes
    return OpCompute("matmul", flops, float(weights + held)), price.backward_s if first else price.forward_s


def exchange_strategy_memory(call: OpCall, strategy: OpStrategy, *, mesh: MeshSpec, profile: HardwareProfile,
                             imbalance: float = DEFAULT_IMBALANCE) -> int:
    """Bytes an expert-parallel strategy's exchange holds on the busiest rank while the op runs:
    the dispatched tokens at capacity (``imbalance`` times the mean), the experts' outputs, and
    the copies sent and returned (``ExpertExchangePrice.forward_temp_bytes`` /
    ``backward_temp_bytes``); a temporary of the op, freed when it returns.

    >>> # extra = exchange_strategy_memory(call, strategy, mesh=mesh, profile=profile)
    """
    first, _, price = _exchange_price(call, strategy, mesh, profile, imbalance)
    return price.backward_temp_bytes if first else price.forward_temp_bytes


def _forward_samples(sampler: Sampler) -> Iterator[SampleInput]:
    for _ in range(3):
        dtype = sampler.float_dtype((torch.float32, torch.float64))
        tokens, dim, h = sampler.size(), sampler.size(), sampler.choice((2, 4, 6))
        experts = sampler.choice((2, 3, 4))
        k = sampler.choice((1, 2))
        index = sampler.index((tokens, k), experts)
        yield SampleInput((sampler.randn((tokens, dim), dtype), index, sampler.randn((tokens, k), dtype),
                           sampler.randn((experts, 2 * h, dim), dtype), sampler.randn((experts, dim, h), dtype),
                           "silu"), {})


def _backward_samples(sampler: Sampler) -> Iterator[SampleInput]:
    for sample in _forward_samples(sampler):
        hidden = sample.args[0]
        yield SampleInput((sampler.randn(hidden.shape, hidden.dtype), *sample.args), {})


def register(registry: RuleRegistry) -> None:
    """Add the experts stand-in's rules (by name) to ``registry``."""
    rule = registry.family("experts")
    rule(EXPERTS, compute=experts_compute, samples=_forward_samples, defined_by=EXPERTS_MODULE,
         extremes=False)(experts_rule)
    rule(EXPERTS_BACKWARD, compute=experts_backward_compute, samples=_backward_samples, defined_by=EXPERTS_MODULE,
         extremes=False)(experts_backward_rule)
    register_exchange(experts_rule, _forward_exchanges)
    register_exchange(experts_backward_rule, _backward_exchanges)
    register_exchange_price(EXCHANGE, exchange_strategy_price, memory=exchange_strategy_memory)
