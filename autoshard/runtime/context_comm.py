"""The collectives of context-parallel attention: one hook, and the load-balanced row exchange.

Every collective the CP attention exchanges issue (``context_attention``'s K/V
all-gather and dK/dV reduce-scatter, the row all-to-alls here) goes through
:func:`issue`, so a test counts them by wrapping one function, as the expert
exchange's tests wrap ``expert_dispatch._all_to_all``.

**Rows between the two layouts.** A plan splits the sequence contiguously
(DTensor ``Shard(2)``: rank ``r`` of ``cp`` holds rows ``[r L/cp, (r+1) L/cp)``);
the causal load-balanced computation wants rank ``r`` to hold chunk ``r`` (head)
and chunk ``2 cp - 1 - r`` (tail) of ``2 cp`` chunks
(``costmodel.context_parallel.ChunkLayout``). :func:`to_balanced` moves the
rows of several tensors (query, and for the backward ``grad_out``, ``out``,
``lse``, a row-split mask) there in one ``all_to_all_single`` (their bytes
side by side, so tensors of different dtypes travel together);
:func:`to_contiguous` moves them back. Contiguous rank ``r`` holds chunks
``2r, 2r + 1``, each going to its balanced owner, so each rank sends two
chunks and receives two.

>>> _order(ChunkLayout(2), rank=0, to_balanced=True)
((0, 1), (0, 3), (0, 1), (0, 3))
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed._functional_collectives  # noqa: F401 - registers the _c10d_functional ops

from costmodel.context_parallel import ChunkLayout

__all__ = ["COLLECTIVES", "issue", "to_balanced", "to_contiguous"]

_OPS = torch.ops._c10d_functional

COLLECTIVES = ("all_gather", "reduce_scatter", "all_to_all")
"""The kinds :func:`issue` takes."""


def issue(kind: str, tensor: torch.Tensor, *args: Any) -> torch.Tensor:
    """Issue one collective of a CP exchange (pending: ``wait_tensor`` it) on the group named last
    in ``args``: ``all_gather`` (``group_size, group_name``), ``reduce_scatter`` (``op, group_size,
    group_name``), ``all_to_all`` (``output_splits, input_splits, group_name``).

    >>> issue("broadcast", torch.zeros(1))
    Traceback (most recent call last):
    ...
    ValueError: issue: collective 'broadcast' is not one of all_gather, reduce_scatter, all_to_all
    """
    if kind == "all_gather":
        return _OPS.all_gather_into_tensor(tensor, *args)
    if kind == "reduce_scatter":
        return _OPS.reduce_scatter_tensor(tensor, *args)
    if kind == "all_to_all":
        return _OPS.all_to_all_single(tensor, *args)
    raise ValueError(f"issue: collective {kind!r} is not one of {', '.join(COLLECTIVES)}")


def _contiguous_owner(chunk: int) -> int:
    """The contiguous rank holding chunk ``chunk`` of ``2 cp`` (two per rank)."""
    return chunk // 2


def _order(layout: ChunkLayout, rank: int, to_balanced: bool
           ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(chunks held, in storage order; chunks wanted, in storage order; the held chunks in send
    order, by destination; the wanted chunks in receive order, by source)."""
    contiguous = (2 * rank, 2 * rank + 1)
    balanced = layout.chunks_of(rank)
    have, want = (contiguous, balanced) if to_balanced else (balanced, contiguous)

    def balanced_owner(g: int) -> int:
        return layout.owner_of(g)[0]

    to, frm = (balanced_owner, _contiguous_owner) if to_balanced else (_contiguous_owner, balanced_owner)
    return have, want, tuple(sorted(have, key=lambda g: (to(g), g))), tuple(sorted(want, key=lambda g: (frm(g), g)))


def _move(tensors: Sequence[torch.Tensor], layout: ChunkLayout, rank: int, group_name: str, to_balanced: bool,
          dim: int = 2) -> list[torch.Tensor]:
    """The rows (tensor dim ``dim``) of ``tensors`` moved between the two layouts (module docstring)."""
    have, want, send, receive = _order(layout, rank, to_balanced)
    c = tensors[0].shape[dim] // 2
    pieces = {g: [t.narrow(dim, slot * c, c) for t in tensors] for slot, g in enumerate(have)}
    shapes = [p.shape for p in pieces[have[0]]]
    dtypes = [t.dtype for t in tensors]
    sizes = [p.numel() * p.element_size() for p in pieces[have[0]]]
    chunk_bytes = sum(sizes)
    flat = torch.cat([p.reshape(-1).view(torch.uint8) for g in send for p in pieces[g]])
    to = (lambda g: layout.owner_of(g)[0]) if to_balanced else _contiguous_owner
    frm = _contiguous_owner if to_balanced else (lambda g: layout.owner_of(g)[0])
    send_splits = [chunk_bytes * sum(1 for g in send if to(g) == d) for d in range(layout.cp)]
    receive_splits = [chunk_bytes * sum(1 for g in receive if frm(g) == s) for s in range(layout.cp)]
    arrived = _OPS.wait_tensor(issue("all_to_all", flat, receive_splits, send_splits, group_name))
    got: dict[int, list[torch.Tensor]] = {}
    for k, g in enumerate(receive):
        start, parts = k * chunk_bytes, []
        for shape, dtype, n in zip(shapes, dtypes, sizes):
            # a copy: a byte offset need not be aligned for a wider dtype's view
            parts.append(arrived.narrow(0, start, n).clone().view(dtype).view(shape))
            start += n
        got[g] = parts
    return [torch.cat([got[g][i] for g in want], dim=dim) for i in range(len(tensors))]


def to_balanced(tensors: Sequence[torch.Tensor], layout: ChunkLayout, rank: int, group_name: str
                ) -> list[torch.Tensor]:
    """This rank's contiguous rows of ``tensors`` (dim 2) exchanged for its head and tail chunks
    (one all-to-all on the CP group; module docstring).

    >>> # q_bal, mask_bal = to_balanced([q, mask], ChunkLayout(cp), rank, group.group_name)
    """
    return _move(tensors, layout, rank, group_name, True)


def to_contiguous(tensors: Sequence[torch.Tensor], layout: ChunkLayout, rank: int, group_name: str
                  ) -> list[torch.Tensor]:
    """Undo :func:`to_balanced`: this rank's head and tail rows exchanged for its contiguous rows.

    >>> # out, lse = to_contiguous([out_bal, lse_bal], ChunkLayout(cp), rank, group.group_name)
    """
    return _move(tensors, layout, rank, group_name, False)
