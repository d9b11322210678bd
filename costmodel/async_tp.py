r"""Async tensor parallelism: a TP collective and the matmul beside it run as one collective matmul.

torch's micro-pipelined async TP (``torch._inductor.fx_passes.micro_pipeline_tp``, on under
torchtitan's ``--parallelism.enable_async_tensor_parallel`` with torch.compile) rewrites
``all_gather -> mm`` into ``fused_all_gather_matmul`` and ``mm -> reduce_scatter`` into
``fused_matmul_reduce_scatter`` (``torch.distributed._symmetric_memory``): the matmul is
decomposed into ``tp`` chunks along the gathered (scattered) rows, and each chunk's
transfer runs on the copy engines while another chunk multiplies.

**All-gather then matmul** (:func:`all_gather_matmul_s`). The rank's own shard needs no
transfer; the other ``tp - 1`` shards arrive one after another, each taking
``a = D / (tp - 1)`` of the all-gather's time ``D``; chunk ``i`` (``b = C / tp`` of the
matmul's time ``C``) starts when chunk ``i - 1`` ended and shard ``i`` arrived:

    e_0 = b,    e_i = max(e_{i-1}, i a) + b   (i = 1 .. tp - 1);    T = e_{tp-1}

**Matmul then reduce-scatter** (:func:`matmul_reduce_scatter_s`). Chunk ``i`` computes the
partial rows another rank owns (``tp - 1`` of them first, the rank's own last); each is
sent as soon as it is made, one send at a time:

    c_i = (i + 1) b,   s_0 = c_0 + a,   s_i = max(c_i, s_{i-1}) + a   (i = 1 .. tp - 2);
    T = max(c_{tp-1}, s_{tp-2})

Either way ``T ~ max(C, D) + one chunk``: what the brief of issue 55 asks, simulated
rather than closed-form so that unequal chunks of compute and transfer are exact.
``b`` may be given priced on its own (``chunk_s``: a chunk is a GEMM of ``1 / tp`` the
FLOPs, at its own efficiency), else ``C / tp``. ``tp = 1``: no collective, ``T = C``.

The fused op occupies the compute stream for ``T`` and the communication stream not at
all (symmetric-memory copies, not NCCL): :func:`fuse` rewrites a step's
``costmodel.overlap`` input so.

>>> round(all_gather_matmul_s(8.0, 6.0, 4), 6)   # b = 2, a = 2: e = 2, 4, 6, 8
8.0
>>> round(all_gather_matmul_s(4.0, 6.0, 4), 6)   # b = 1, a = 2: e = 1, 3, 5, 7 (one chunk past D)
7.0
>>> round(matmul_reduce_scatter_s(4.0, 6.0, 4), 6)   # c = 1, 2, 3, 4; s = 3, 5, 7
7.0
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from costmodel.overlap import Transfer

__all__ = ["CollectiveMatmul", "all_gather_matmul_s", "matmul_reduce_scatter_s", "collective_matmul_s", "fuse",
           "FUSED_KINDS"]

FUSED_KINDS = ("all_gather", "reduce_scatter")
"""The collectives torch's async TP fuses with a matmul (an all-reduce is not: module docstring)."""


def _check(compute_s: float, comm_s: float, tp: int, chunk_s: float | None) -> float:
    if tp < 1:
        raise ValueError(f"tp: must be >= 1, got {tp}")
    if compute_s < 0 or comm_s < 0 or (chunk_s is not None and chunk_s < 0):
        raise ValueError(f"compute_s / comm_s / chunk_s: must be >= 0, got {compute_s}, {comm_s}, {chunk_s}")
    return compute_s / tp if chunk_s is None else chunk_s


def all_gather_matmul_s(compute_s: float, comm_s: float, tp: int, *, chunk_s: float | None = None) -> float:
    """Seconds of ``fused_all_gather_matmul``: an all-gather of ``comm_s`` over ``tp`` ranks
    feeding a matmul of ``compute_s`` (module docstring)."""
    b = _check(compute_s, comm_s, tp, chunk_s)
    if tp == 1:
        return compute_s
    a = comm_s / (tp - 1)
    end = b
    for i in range(1, tp):
        end = max(end, i * a) + b
    return end


def matmul_reduce_scatter_s(compute_s: float, comm_s: float, tp: int, *, chunk_s: float | None = None) -> float:
    """Seconds of ``fused_matmul_reduce_scatter``: a matmul of ``compute_s`` whose output a
    reduce-scatter of ``comm_s`` over ``tp`` ranks splits (module docstring)."""
    b = _check(compute_s, comm_s, tp, chunk_s)
    if tp == 1:
        return compute_s
    a = comm_s / (tp - 1)
    sent = 0.0
    for i in range(tp - 1):
        sent = max((i + 1) * b, sent) + a
    return max(tp * b, sent)


def collective_matmul_s(kind: str, compute_s: float, comm_s: float, tp: int, *,
                        chunk_s: float | None = None) -> float:
    """:func:`all_gather_matmul_s` or :func:`matmul_reduce_scatter_s` by ``kind``.

    >>> collective_matmul_s("all_reduce", 1.0, 1.0, 2)
    Traceback (most recent call last):
    ...
    ValueError: kind: async TP fuses all_gather or reduce_scatter with a matmul, not 'all_reduce'
    """
    if kind == "all_gather":
        return all_gather_matmul_s(compute_s, comm_s, tp, chunk_s=chunk_s)
    if kind == "reduce_scatter":
        return matmul_reduce_scatter_s(compute_s, comm_s, tp, chunk_s=chunk_s)
    raise ValueError(f"kind: async TP fuses {' or '.join(FUSED_KINDS)} with a matmul, not {kind!r}")


@dataclass(frozen=True, slots=True)
class CollectiveMatmul:
    """One transfer of a step fused with the matmul at ``position`` (:func:`fuse`)."""

    transfer: int
    """Index of the transfer in the step's list: a single collective of ``kind``."""
    position: int
    """The matmul's position (op index) in the step."""
    kind: str
    tp: int
    chunk_s: float | None = None
    """One chunk's matmul time priced on its own (None: the matmul's time over ``tp``)."""


def fuse(compute_s: Sequence[float], transfers: Sequence[Transfer],
         fusions: Sequence[CollectiveMatmul]) -> tuple[list[float], list[Transfer]]:
    """The ``costmodel.overlap.simulate`` input of a step with ``fusions`` applied: each fused
    transfer leaves the communication stream and its matmul's time becomes the collective
    matmul's (module docstring). Several transfers fused with one matmul fuse in turn
    (the matmul's time so far is the compute each overlaps).

    >>> c, t = fuse([1.0, 4.0], [Transfer(1, 1, (6.0,))], [CollectiveMatmul(0, 1, "all_gather", 4)])
    >>> c, t
    ([1.0, 7.0], [])
    """
    compute = [float(c) for c in compute_s]
    dropped = set()
    for f in fusions:
        if f.transfer in dropped:
            raise ValueError(f"fusions: transfer {f.transfer} fused twice")
        if not 0 <= f.transfer < len(transfers) or not 0 <= f.position < len(compute):
            raise ValueError(f"fusions: transfer {f.transfer} / position {f.position} out of range")
        durations = transfers[f.transfer].durations_s
        if len(durations) != 1:
            raise ValueError(f"fusions: transfer {f.transfer} has {len(durations)} collectives; only a single "
                             "all-gather or reduce-scatter fuses with a matmul")
        compute[f.position] = collective_matmul_s(f.kind, compute[f.position], durations[0], f.tp,
                                                  chunk_s=f.chunk_s)
        dropped.add(f.transfer)
    return compute, [t for k, t in enumerate(transfers) if k not in dropped]
