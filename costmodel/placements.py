"""Placements of one tensor on an N-D device mesh, and their short text form.

A placement says, for ONE mesh dim, how a tensor is laid out across the ranks of
that mesh dim. A tensor on an N-D mesh has one placement per mesh dim, written in
DTensor's short form and concatenated (docs/design.md, "Notation"):

=====================  ==========================================================
text                   meaning on one mesh dim of size m
=====================  ==========================================================
``R``                  every rank holds the whole tensor
``S(d)``               tensor dim d split into m chunks (``torch.chunk`` sizes:
                       ceil(n/m) each, the last ones smaller or empty); rank i
                       holds chunk i
``_S(d,sf=k)``         strided shard: tensor dim d split into m*k chunks; rank i
                       holds chunks i, i+m, ..., i+(k-1)m concatenated (DTensor's
                       ``_StridedShard(d, split_factor=k)``)
``P(sum)``             partial: the tensor is the sum over ranks of their local
                       tensors; also ``P(avg)``, ``P(max)``, ``P(min)``
=====================  ==========================================================

Several mesh dims apply left to right: mesh dim 0 splits the global tensor, mesh
dim 1 splits each rank's piece again, and so on (DTensor's default order).

>>> parse_placements("S(0)P(sum)")
(Shard(dim=0), Partial(reduce_op='sum'))
>>> format_placements((Replicate(), StridedShard(dim=1, split_factor=2)))
'R_S(1,sf=2)'
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union

__all__ = [
    "Replicate",
    "Shard",
    "StridedShard",
    "Partial",
    "Placement",
    "PlacementParseError",
    "REDUCE_OPS",
    "parse_placement",
    "parse_placements",
    "format_placement",
    "format_placements",
    "is_shard",
    "shard_dim",
]

REDUCE_OPS = ("sum", "avg", "max", "min")


@dataclass(frozen=True, slots=True)
class Replicate:
    """Every rank of the mesh dim holds the whole tensor."""

    def __str__(self) -> str:
        return "R"


@dataclass(frozen=True, slots=True)
class Shard:
    """Tensor dim ``dim`` is split into one contiguous chunk per rank."""

    dim: int

    def __str__(self) -> str:
        return f"S({self.dim})"


@dataclass(frozen=True, slots=True)
class StridedShard:
    """Tensor dim ``dim`` split into ``m * split_factor`` chunks, rank i holding
    chunks ``i, i+m, ...``; arises when a view merges a sharded dim into another."""

    dim: int
    split_factor: int

    def __str__(self) -> str:
        return f"_S({self.dim},sf={self.split_factor})"


@dataclass(frozen=True, slots=True)
class Partial:
    """The tensor is the reduction (``reduce_op``) of the ranks' local tensors."""

    reduce_op: str = "sum"

    def __str__(self) -> str:
        return f"P({self.reduce_op})"


Placement = Union[Replicate, Shard, StridedShard, Partial]


class PlacementParseError(ValueError):
    """A placement string that does not follow the short form (docs/design.md, "Notation")."""


_TOKEN = re.compile(
    r"R"
    r"|S\((?P<sdim>-?\d+)\)"
    r"|_S\((?P<ssdim>-?\d+),\s*sf=(?P<sf>\d+)\)"
    r"|P\((?P<op>[a-z]+)\)"
)


def _from_match(match: re.Match[str], text: str) -> Placement:
    if match.group("sdim") is not None:
        return Shard(int(match.group("sdim")))
    if match.group("ssdim") is not None:
        split_factor = int(match.group("sf"))
        if split_factor < 1:
            raise PlacementParseError(f"split factor must be >= 1 in {text!r}")
        return StridedShard(int(match.group("ssdim")), split_factor)
    if match.group("op") is not None:
        op = match.group("op")
        if op not in REDUCE_OPS:
            raise PlacementParseError(
                f"unknown reduce op {op!r} in {text!r} (expected one of {', '.join(REDUCE_OPS)})"
            )
        return Partial(op)
    return Replicate()


def parse_placements(text: str) -> tuple[Placement, ...]:
    """Parse a concatenation of placements, one per mesh dim (``"S(0)R"``).

    >>> parse_placements("_S(0,sf=2)S(1)")
    (StridedShard(dim=0, split_factor=2), Shard(dim=1))
    """
    if not isinstance(text, str):
        raise PlacementParseError(f"placement must be a string, got {type(text).__name__}")
    compact = text.replace(" ", "")
    result: list[Placement] = []
    pos = 0
    while pos < len(compact):
        match = _TOKEN.match(compact, pos)
        if match is None:
            raise PlacementParseError(
                f"cannot parse placement {text!r} at position {pos} "
                "(expected R, S(d), _S(d,sf=k) or P(sum|avg|max|min))"
            )
        result.append(_from_match(match, text))
        pos = match.end()
    if not result:
        raise PlacementParseError("empty placement string")
    return tuple(result)


def parse_placement(text: str) -> Placement:
    """Parse the placement of a single mesh dim (``"S(1)"``)."""
    parsed = parse_placements(text)
    if len(parsed) != 1:
        raise PlacementParseError(f"expected one placement, got {len(parsed)} in {text!r}")
    return parsed[0]


def format_placement(placement: Placement) -> str:
    """Short form of one placement (``Shard(0)`` -> ``"S(0)"``)."""
    return str(placement)


def format_placements(placements: tuple[Placement, ...] | list[Placement]) -> str:
    """Short form of a placement per mesh dim, concatenated (``"S(0)R"``)."""
    return "".join(str(p) for p in placements)


def is_shard(placement: Placement) -> bool:
    """True for ``S(d)`` and ``_S(d,sf=k)``."""
    return isinstance(placement, (Shard, StridedShard))


def shard_dim(placement: Placement) -> int | None:
    """The tensor dim a (strided) shard splits, else None."""
    if isinstance(placement, (Shard, StridedShard)):
        return placement.dim
    return None
