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
data, so each exchange is priced as an all-to-all of

    S = f * T * k * d * itemsize

per rank (the collective model's buffer for all_to_all is what one rank sends,
its own share included: ``costmodel.collectives``), on the ep group's mesh
dims. A step pays four such exchanges (dispatch and combine, forward and
backward), plus one small all-to-all of the per-expert counts before each
dispatch (``E`` int64 per rank: the receivers must know the split sizes).

**Compute.** The experts of the busiest rank process ``f T k`` tokens (the mean
is ``T k``: ``G`` ranks' ``T k`` copies spread over ``G`` ranks); the layer's
expert compute on that rank is ``f T k`` times the per-token expert FLOPs (a
SwiGLU expert of dims ``d -> h -> d``: ``3 * 2 d h`` forward, twice that
backward). The ranks wait for the slowest at the next collective, so the step
pays the busiest rank's compute.

**Memory.** The dispatched buffer and the combined one, each ``f T k d
itemsize`` bytes on the busiest rank, live from the dispatch to the combine
(and are kept for the backward unless recomputed).

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
>>> price.step_s > 4 * price.exchange_s
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from costmodel.collectives import collective_time_s
from costmodel.mesh import MeshSpec
from hw_profiles import HardwareProfile

__all__ = ["DEFAULT_IMBALANCE", "ExpertExchangePrice", "expert_exchange_price", "busiest_rank_tokens",
           "measured_imbalance", "ExpertParallelError"]

DEFAULT_IMBALANCE = 1.25
"""Busiest rank's routed tokens over the mean, when the user gives none (module docstring)."""

_COUNT_ITEMSIZE = 8  # the per-expert counts travel as int64


class ExpertParallelError(ValueError):
    """Expert parallelism that cannot run as asked (names the field and why)."""


@dataclass(frozen=True, slots=True)
class ExpertExchangePrice:
    """One MoE layer's expert-parallel exchanges over one training step, on one ep group."""

    ep_ranks: int
    """Ranks in the ep group (``G``)."""
    bytes_per_exchange: int
    """Per-rank all-to-all buffer of one dispatch or combine, at the busiest rank's load."""
    exchange_s: float
    """One dispatch (or combine): the token all-to-all."""
    counts_s: float
    """The all-to-all of per-expert counts that precedes each dispatch."""
    step_s: float
    """Forward and backward: four token exchanges and two count exchanges."""
    buffer_bytes: int
    """Dispatched plus combined buffers held on the busiest rank."""


def busiest_rank_tokens(tokens: int, top_k: int, imbalance: float) -> float:
    """Routed copies the busiest rank's experts process: ``imbalance * tokens * top_k``."""
    if imbalance < 1.0:
        raise ExpertParallelError(f"imbalance: {imbalance} is below 1 (the busiest rank gets at least the mean)")
    return imbalance * tokens * top_k


def expert_exchange_price(*, tokens: int, top_k: int, dim: int, itemsize: int, num_experts: int,
                          mesh_dims: Sequence[int], mesh: MeshSpec, profile: HardwareProfile,
                          imbalance: float = DEFAULT_IMBALANCE) -> ExpertExchangePrice:
    """The exchanges of one MoE layer whose ``num_experts`` experts are split over ``mesh_dims``.

    ``tokens`` is this rank's token count entering the layer (after any batch or sequence
    split), ``dim`` the hidden size carried per routed copy.
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
    nbytes = int(busiest_rank_tokens(tokens, top_k, imbalance) * dim * itemsize)
    if ranks == 1:
        return ExpertExchangePrice(1, nbytes, 0.0, 0.0, 0.0, 2 * nbytes)
    exchange = collective_time_s("all_to_all", nbytes, tuple(mesh_dims), mesh, profile)
    counts = collective_time_s("all_to_all", num_experts * _COUNT_ITEMSIZE, tuple(mesh_dims), mesh, profile)
    return ExpertExchangePrice(ranks, nbytes, exchange, counts, 4 * exchange + 2 * counts, 2 * nbytes)


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
