"""The price of one redistribution step from the bytes it moves: the formula both the
planner's search graph (``costmodel.redistribute_search``) and the shape classes'
tables (``costmodel.redistribute_classes``) evaluate, so both give the same floats.

A step's price depends on its tensor's shape through three numbers only: ``b_in`` /
``b_out``, the largest local shard before / after it, and whether it re-lays the data
out before (``relayout_in``) or after (``relayout_out``) its collective (module
docstring of ``costmodel.redistribute_search``, "Prices")::

    all_gather      coll(|G| b_in)            [+ copy(|G| b_in)   relayout_in]
    all_reduce      coll(b_in)
    reduce_scatter  coll(b_in)                [+ copy(b_in)       relayout_in]
    all_to_all      coll(max(b_in, b_out))    [+ copy(b_in)       relayout_in] [+ copy(b_out) relayout_out]
    permute         coll(b_in)
    local_slice     copy(b_out);  local_zero_fill fill(b_in);  local_copy copy(b_in);
    local_zero_pad  fill(b_out + b_in)

>>> from hw_profiles import load
>>> from costmodel.mesh import MeshSpec
>>> prices = step_prices(MeshSpec((2, 2)), load("h100-sxm-80gb"))
>>> cost, nbytes, relayout = price_step(prices, "all_gather", (0,), 2, 1024, 2048, True, False)
>>> nbytes, relayout == prices.copy(2048), cost == prices.collective("all_gather", 2048, (0,)) + relayout
(2048, True, True)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from costmodel.collectives import collective_time_s
from costmodel.compute import local_copy_time_s, local_fill_time_s
from costmodel.mesh import MeshSpec
from hw_profiles import HardwareProfile

__all__ = ["StepPrices", "price_step", "step_prices"]


@dataclass(slots=True)
class StepPrices:
    """Collective, copy and fill times on one mesh and profile, memoised: pricing asks
    the same few questions of ~10^5 edges per model."""

    mesh: MeshSpec
    profile: HardwareProfile
    _collective: dict = field(default_factory=dict)
    _copy: dict = field(default_factory=dict)
    _fill: dict = field(default_factory=dict)

    def collective(self, kind: str, nbytes: int, group: tuple[int, ...]) -> float:
        key = (kind, nbytes, group)
        seconds = self._collective.get(key)
        if seconds is None:
            seconds = self._collective[key] = collective_time_s(kind, nbytes, group, self.mesh, self.profile)
        return seconds

    def copy(self, nbytes: int) -> float:
        seconds = self._copy.get(nbytes)
        if seconds is None:
            seconds = self._copy[nbytes] = local_copy_time_s(nbytes, self.profile)
        return seconds

    def fill(self, nbytes: int) -> float:
        seconds = self._fill.get(nbytes)
        if seconds is None:
            seconds = self._fill[nbytes] = local_fill_time_s(nbytes, self.profile)
        return seconds


@lru_cache(maxsize=64)
def step_prices(mesh: MeshSpec, profile: HardwareProfile) -> StepPrices:
    """The memoised prices of one (mesh, profile), shared by every tensor priced on them."""
    return StepPrices(mesh, profile)


def price_step(
    prices: StepPrices,
    kind: str,
    group: tuple[int, ...],
    size: int,
    b_in: int,
    b_out: int,
    relayout_in: bool,
    relayout_out: bool,
) -> tuple[float, int, float]:
    """``(cost_s, bytes, relayout_s)`` of one step of ``kind`` on ``group`` (``size`` ranks)
    between shards of ``b_in`` and ``b_out`` bytes (table in the module docstring)."""
    if kind == "all_gather":
        nbytes = b_in * size
        relayout = prices.copy(nbytes) if relayout_in else 0.0  # gathered on dim 0, then moved / unpadded / reordered
        return prices.collective(kind, nbytes, group) + relayout, nbytes, relayout
    if kind == "all_reduce" or kind == "permute":
        return prices.collective(kind, b_in, group), b_in, 0.0
    if kind == "reduce_scatter":
        relayout = prices.copy(b_in) if relayout_in else 0.0  # input packed with dim d first / padded
        return prices.collective(kind, b_in, group) + relayout, b_in, relayout
    if kind == "all_to_all":
        relayout = 0.0
        if relayout_in:
            relayout += prices.copy(b_in)  # pack the chunks to send
        if relayout_out:
            relayout += prices.copy(b_out)  # received chunks concatenated along d
        nbytes = max(b_in, b_out)
        return prices.collective(kind, nbytes, group) + relayout, nbytes, relayout
    if kind == "local_slice":
        return prices.copy(b_out), b_out, 0.0
    if kind == "local_zero_fill":
        return prices.fill(b_in), b_in, 0.0
    if kind == "local_copy":
        return prices.copy(b_in), b_in, 0.0
    if kind == "local_zero_pad":
        return prices.fill(b_out + b_in), b_out, 0.0
    raise ValueError(f"internal: unknown step kind {kind!r}")
