r"""Which strided shards an op may read natively: the flattened batch x sequence token dim.

A model flattens its tokens before every linear layer and the loss
(``[B, S, D] -> [B*S, D]``, ``logits.flatten(0, 1)``). When a mesh dim of
``n`` ranks splits the sequence and the batch is not split by it (data
parallelism over more ranks than sequences: 4 sequences on an 8-way mesh
dim), the view rule (``autoshard.rules.views``) gives the flattened dim the
strided shard ``_S(0, sf=B)``: rank ``r`` holds the chunk ``r`` of every
sequence, ``B`` chunks of rows instead of one. The ops on those rows
(``mm``, ``log_softmax``, ``nll_loss``, pointwise ops, their backwards) work
row by row or sum over rows, so their rules' shard placeholders ``S*(0)``
hold for a strided row split as for a contiguous one (the rule validator
checks each rule's strided fill on simulated shards: ``MeshCase`` with
``strided_factors``). The registry fills placeholders with the split factors
it is handed (``RuleRegistry.strategies(strided_factors=...)``); without
them every such op reads ``S(0)`` only, and every linear layer's input pays
an all-to-all (or worse) from ``_S(0, sf=B)``, or the mesh dim goes to
weight splits instead. LLaMA-3 8B, 4 x 131,072 tokens on 64 H100s
(``benchmarks/context_parallel.py``): mesh 8 x 8 (dp, cp) priced 10.17 s a
step without, 6.37 s with (4 x 16, whose dp splits the batch whole: 5.6 s).
The price: more strategies on the nodes that read token rows, and a slower
solve (8B, 32 layers, batch 64 x 8,192 on 8 x 8 dp, tp: 1.26M -> 1.88M
strategies, solved optimal in 9.9 s without, a 60 s timeout with, the same
plan). So they are offered only where a data-parallel split cannot take whole
sequences (:func:`token_rows_needed`: a mesh dim that does not divide the
batch); elsewhere a sequence split's flattened rows are redistributed as
before (a plan with context parallelism over a batch that every dim divides
pays that relayout: left).

:func:`token_split_factors` is the set an op node is handed: the split
factors of the strided shards on tensor dim 0 among its producers' output
placements (every strategy of every producer). Only dim 0, the token rows of
a flattened ``[B*S, ...]`` tensor: a strided shard elsewhere (a merge of
heads into the hidden dim, ``_S(2, sf=H)``) would spread its factor to every
op downstream and multiply their strategies for layouts that no plan
wants; those keep being redistributed as before. The set is transitive
through ops that took it (an ``mm`` reading ``_S(0, sf=B)`` makes
``_S(0, sf=B)`` rows) and stops at the view that unflattens the rows again
(``[B*S, D] -> [B, S, D]``: ``S(1)`` from ``_S(0, sf=B)``).

>>> from costmodel.placements import Shard, StridedShard
>>> from autoshard.rules.core import OpStrategy
>>> flat = OpStrategy(((StridedShard(0, 4), Shard(1)),), ((Shard(1), Shard(1)),))
>>> heads = OpStrategy(((StridedShard(2, 32),),), ((Shard(3),),))
>>> token_split_factors([(0, (flat, heads), 0)])
(4,)
"""

from __future__ import annotations

from typing import Sequence

from costmodel.placements import StridedShard

from autoshard.rules.core import OpStrategy

__all__ = ["TOKEN_DIM", "token_split_factors", "factors_signature", "token_rows_needed"]

TOKEN_DIM = 0
"""The tensor dim of the flattened tokens (``[B*S, ...]``) whose strided shards are read natively."""


def _strided_row_factors(placements: Sequence[object] | None) -> set[int]:
    """Split factors of the strided shards on :data:`TOKEN_DIM` in one output's per-mesh-dim placements."""
    if placements is None:
        return set()
    return {p.split_factor for p in placements
            if isinstance(p, StridedShard) and p.dim == TOKEN_DIM and p.split_factor > 1}


def token_split_factors(producers: Sequence[tuple[int, Sequence[OpStrategy], int]],
                        memo: dict[tuple[int, int], set[int]] | None = None) -> tuple[int, ...]:
    """Sorted split factors of the token-row strided shards the producers can hand over.

    ``producers``: per tensor input of the op, ``(producer node, its strategies, the output
    read)`` (module docstring). ``memo``: a dict kept across the nodes of one build, keyed by
    producer node and output, so that a producer read by many ops is scanned once.

    >>> token_split_factors([(0, (), 0)])
    ()
    """
    found: set[int] = set()
    for src, strategies, out in producers:
        key = (src, out)
        got = None if memo is None else memo.get(key)
        if got is None:
            got = set()
            for strategy in strategies:
                outputs = strategy.output_placements
                if out < len(outputs):
                    got |= _strided_row_factors(outputs[out])
            if memo is not None:
                memo[key] = got
        found |= got
    return tuple(sorted(found))


def factors_signature(factors: tuple[int, ...]) -> str:
    """The suffix of a node's strategy-list signature: equal signatures must mean equal lists,
    and the factors change the list (empty when there are none, so other signatures stay).

    >>> factors_signature((4,)), factors_signature(())
    ('|sf=4', '')
    """
    return "|sf=" + ",".join(map(str, factors)) if factors else ""


def token_rows_needed(traced: object, mesh_shape: Sequence[int]) -> bool:
    """Whether some mesh dim of more than one rank does not divide the batch: the leading dim
    of a user input of two or more dims (the tokens), any of them.

    >>> from types import SimpleNamespace as N
    >>> import torch
    >>> tokens = N(meta={"val": torch.empty(4, 16)})
    >>> token_rows_needed(N(inputs={"tokens": tokens}), (8, 8)), token_rows_needed(N(inputs={"tokens": tokens}), (4, 2))
    (True, False)
    """
    batches = set()
    for node in getattr(traced, "inputs", {}).values():
        val = node.meta.get("val") if hasattr(node, "meta") else None
        if val is not None and getattr(val, "dim", lambda: 0)() >= 2:
            batches.add(int(val.shape[0]))
    return any(b % n for b in batches for n in mesh_shape if n > 1)
