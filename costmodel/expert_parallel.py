r"""The price of expert parallelism: tokens to their experts' ranks and back (torch-free).

A mixture-of-experts layer routes each of a rank's ``T`` tokens to ``k`` of ``E``
experts. With the experts split over an expert-parallel (ep) group of ``G``
ranks (rank ``r`` holds experts ``[r E/G, (r+1) E/G)``), every routed copy of a
token travels to the rank of its expert (the *dispatch*, one all-to-all with
split sizes known only at run time), is computed there, and travels back (the
*combine*, the reverse all-to-all). The backward runs the same two exchanges
on the gradients, in reverse.

**Bytes.** A rank sends ``T k`` routed copies of ``d`` elements (``itemsize``
bytes each); under uniform routing a fraction ``(G-1)/G`` leaves the rank.
Routing is not uniform: the rank whose experts are the most popular receives
``f`` times the mean (``f``, the *imbalance factor*, >= 1: ``max over ranks of
tokens received / mean``). An all-to-all ends when its largest receiver has its
data, so each exchange is priced as an all-to-all of ``f`` times the mean
per-rank buffer (the collective model's buffer for all_to_all is what one rank
sends, its own share included: ``costmodel.collectives``), on the ep group's
mesh dims. The exchanges are those ``autoshard.runtime.expert_ops`` issues
(:func:`exchange_bytes`, one entry per all-to-all; a test counts the runtime's
bytes against it), with ``R = f T k``:

    forward:  counts E x 8 | dispatch R d s | combine R d s
    backward: counts E x 8 | token and its output gradient as one row R 2d s
              | routing weights R w | input gradients R d s | weights' gradients R w

(``s`` the hidden states' itemsize, ``w`` the routing weights'). The backward
moves ``3 d + 2 w / s`` columns per copy to the forward's ``2 d``: the graph's
backward node gets the forward's inputs, not its dispatched rows, so it
dispatches again with the gradient beside the token.

**Compute.** The experts of the busiest rank process ``f T k`` tokens (the mean
is ``T k``: ``G`` ranks' ``T k`` copies spread over ``G`` ranks); the layer's
expert compute on that rank is ``f T k`` times the per-token expert FLOPs (a
SwiGLU expert of dims ``d -> h -> d``: ``3 * 2 d h`` forward, twice that
backward). The ranks wait for the slowest at the next collective, so the step
pays the busiest rank's compute.

**Memory.** While the exchange runs the busiest rank holds what it receives
and what its experts return, at capacity, and the copies it sends and gets
back: forward ``(2 R + 2 T k) d s`` (received rows, expert outputs; sent
copies, returned ones), backward ``R (2d + d + d) s + T k (2d + d) s``
(received token-and-gradient rows, input gradients, recomputed outputs;
the sent pairs and returned gradients): :attr:`ExpertExchangePrice.forward_temp_bytes`
and :attr:`ExpertExchangePrice.backward_temp_bytes`, temporaries of the op
(freed when it returns: the forward keeps no dispatched row for the
backward, which dispatches again).

**Default imbalance.** ``DEFAULT_IMBALANCE = 1.25``: a load-balanced router
(auxiliary loss or bias-based balancing, as DeepSeek-V3 and Qwen3-MoE train)
keeps the busiest of a few dozen expert groups within ~1.1-1.4x of the mean
over a step; the runtime reports the measured factor
(``autoshard.runtime.expert_dispatch.DispatchLayout.received_rows``, gathered over the group), so a plan can
be priced again with what a run saw.

>>> from hw_profiles import load
>>> from costmodel.mesh import MeshSpec
>>> price = expert_exchange_price(tokens=4096, top_k=8, dim=7168, itemsize=2, num_experts=256,
...                               mesh_dims=(1,), mesh=MeshSpec((32, 64)), profile=load("h100-sxm-80gb"))
>>> price.bytes_per_exchange == int(1.25 * 4096 * 8 * 7168 * 2)
True
>>> price.backward_s > price.forward_s > 2 * price.exchange_s  # the backward's rows are wider
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from costmodel.collectives import collective_time_s
from costmodel.mesh import MeshSpec
from hw_profiles import HardwareProfile

__all__ = ["DEFAULT_IMBALANCE", "ExchangeBytes", "ExpertExchangePrice", "exchange_bytes", "expert_exchange_price",
           "busiest_rank_tokens", "measured_imbalance", "ExpertParallelError"]

DEFAULT_IMBALANCE = 1.25
"""Busiest rank's routed tokens over the mean, when the user gives none (module docstring)."""

_COUNT_ITEMSIZE = 8  # the per-expert counts travel as int64


class ExpertParallelError(ValueError):
    """Expert parallelism that cannot run as asked (names the field and why)."""


@dataclass(frozen=True, slots=True)
class ExchangeBytes:
    """Per-rank buffers of one MoE layer's all-to-alls, in the order the runtime issues them."""

    forward: tuple[int, ...]
    """Counts, dispatch, combine."""
    backward: tuple[int, ...]
    """Counts, token-and-gradient rows, routing weights, input gradients, weights' gradients."""


@dataclass(frozen=True, slots=True)
class ExpertExchangePrice:
    """One MoE layer's expert-parallel exchanges over one training step, on one ep group."""

    ep_ranks: int
    """Ranks in the ep group (``G``)."""
    bytes_per_exchange: int
    """Per-rank all-to-all buffer of one forward dispatch or combine, at the busiest rank's load."""
    exchange_s: float
    """One forward dispatch (or combine): the token all-to-all."""
    counts_s: float
    """The all-to-all of per-expert counts that precedes each dispatch."""
    step_s: float
    """Forward and backward: ``forward_s + backward_s``."""
    buffer_bytes: int
    """Forward dispatched plus combined buffers held on the busiest rank."""
    forward_s: float = 0.0
    """The forward's three all-to-alls (:attr:`ExchangeBytes.forward`)."""
    backward_s: float = 0.0
    """The backward's five all-to-alls (:attr:`ExchangeBytes.backward`)."""
    forward_temp_bytes: int = 0
    """Exchange buffers the forward holds while it runs (module docstring, **Memory**)."""
    backward_temp_bytes: int = 0
    """Exchange buffers the backward holds while it runs."""


def busiest_rank_tokens(tokens: int, top_k: int, imbalance: float) -> float:
    """Routed copies the busiest rank's experts process: ``imbalance * tokens * top_k``."""
    if imbalance < 1.0:
        raise ExpertParallelError(f"imbalance: {imbalance} is below 1 (the busiest rank gets at least the mean)")
    return imbalance * tokens * top_k


def exchange_bytes(*, tokens: int, top_k: int, dim: int, itemsize: int, num_experts: int,
                   weight_itemsize: int | None = None, imbalance: float = 1.0) -> ExchangeBytes:
    """The per-rank buffer of each all-to-all ``autoshard.runtime.expert_ops`` issues for one layer
    (module docstring, **Bytes**): at ``imbalance`` 1 what every rank sends, at the measured
    imbalance what the busiest rank receives.

    >>> exchange_bytes(tokens=4, top_k=2, dim=8, itemsize=4, num_experts=4)
    ExchangeBytes(forward=(32, 256, 256), backward=(32, 512, 32, 256, 32))
    """
    rows = busiest_rank_tokens(tokens, top_k, imbalance)
    weight = itemsize if weight_itemsize is None else weight_itemsize
    counts = num_experts * _COUNT_ITEMSIZE
    wide = int(rows * dim * itemsize)
    return ExchangeBytes(forward=(counts, wide, wide),
                         backward=(counts, int(rows * 2 * dim * itemsize), int(rows * weight), wide,
                                   int(rows * weight)))


def expert_exchange_price(*, tokens: int, top_k: int, dim: int, itemsize: int, num_experts: int,
                          mesh_dims: Sequence[int], mesh: MeshSpec, profile: HardwareProfile,
                          imbalance: float = DEFAULT_IMBALANCE,
                          weight_itemsize: int | None = None) -> ExpertExchangePrice:
    """The exchanges of one MoE layer whose ``num_experts`` experts are split over ``mesh_dims``.

    ``tokens`` is this rank's token count entering the layer (after any batch or sequence
    split), ``dim`` the hidden size carried per routed copy, ``weight_itemsize`` the routing
    weights' (default ``itemsize``).
    """
    ranks = 1
    for d in mesh_dims:
        if not 0 <= d < len(mesh.shape):
            raise ExpertParallelError(f"mesh dim {d}: the mesh has {len(mesh.shape)} dims")
        ranks *= mesh.shape[d]
    if num_experts % ranks:
        raise ExpertParallelError(f"experts: {num_experts} experts do not divide over {ranks} expert-parallel ranks")
    if min(tokens, top_k, dim, itemsize) < 1:
        raise ExpertParallelError("tokens, top_k, dim and itemsize must be positive")
    sizes = exchange_bytes(tokens=tokens, top_k=top_k, dim=dim, itemsize=itemsize, num_experts=num_experts,
                           weight_itemsize=weight_itemsize, imbalance=imbalance)
    nbytes = sizes.forward[1]
    sent = tokens * top_k * dim * itemsize  # the source side: copies sent and returned, not imbalanced
    forward_temp, backward_temp = 2 * nbytes + 2 * sent, 4 * nbytes + 3 * sent
    if ranks == 1:
        return ExpertExchangePrice(1, nbytes, 0.0, 0.0, 0.0, 2 * nbytes, 0.0, 0.0, forward_temp, backward_temp)

    def seconds(buffers: tuple[int, ...]) -> float:
        return sum(collective_time_s("all_to_all", b, tuple(mesh_dims), mesh, profile) for b in buffers)

    exchange = seconds(sizes.forward[1:2])
    counts = seconds(sizes.forward[:1])
    forward_s, backward_s = seconds(sizes.forward), seconds(sizes.backward)
    return ExpertExchangePrice(ranks, nbytes, exchange, counts, forward_s + backward_s, 2 * nbytes, forward_s,
                               backward_s, forward_temp, backward_temp)


def measured_imbalance(tokens_per_rank: Sequence[int]) -> float:
    """``max / mean`` of the routed copies each ep rank received (1.0 when none were routed).

    >>> measured_imbalance([10, 30, 20, 20])
    1.5
    """
    if not tokens_per_rank:
        raise ExpertParallelError("tokens_per_rank: empty")
    total = sum(tokens_per_rank)
    if total == 0:
        return 1.0
    return max(tokens_per_rank) * len(tokens_per_rank) / total
