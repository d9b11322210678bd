r"""Context-parallel (sequence-split) attention: which chunk pairs each rank computes, and its price.

A sequence of ``L`` tokens is cut into equal chunks and spread over the ``cp``
ranks of one mesh dim (the CP group). Queries stay where they are; keys and
values travel. Two layouts:

* **contiguous**: ``cp`` chunks, rank ``r`` holds chunk ``r``. With a causal
  mask rank ``r`` attends to ``r + 1`` chunks, so the last rank does about
  ``2 cp - 1`` times the work of the first (half the causal triangle each way
  is the whole difference between the two layouts).
* **load-balanced** (Llama 3's CP, torchtitan's ``_RoundRobinLoadBalancer``):
  ``2 cp`` chunks, rank ``r`` holds chunks ``r`` (head) and ``2 cp - 1 - r``
  (tail). Under a causal mask every rank then sees the same number of
  (query, key) pairs: ``r`` whole blocks and a diagonal before its head,
  ``2 cp - 1 - r`` and a diagonal before its tail, ``(2 cp - 1) c^2 + c (c + 1)``
  pairs for chunks of ``c`` tokens, whatever ``r``.

**Pairs of one block.** Query chunk at positions ``[a, a + c)``, key chunk at
``[b, b + c)``, a key ``k`` visible from a query ``p`` iff ``lo <= p - k <= hi``
(causal: ``lo = 0``; a sliding window of ``w`` tokens: ``p - k < w``, and for a
non-causal window also ``k - p < w``; Hugging Face's ``sliding_window`` is the
causal one). With ``u = p - a``, ``v = k - b`` in ``[0, c)`` and
``delta = a - b`` the condition is ``lo - delta <= u - v <= hi - delta``, and
the pairs with ``u - v <= t`` number

    G(t) = 0                          t < -(c - 1)
           (c + t)(c + t + 1) / 2     -(c - 1) <= t < 0
           c^2 - (c - 1 - t)(c - t)/2  0 <= t < c - 1
           c^2                        t >= c - 1

so a block keeps ``G(hi - delta) - G(lo - 1 - delta)`` pairs (:func:`visible_pairs`).

**Parts.** Each local query chunk is computed in *parts*, one attention kernel
call each, merged exactly by their logsumexp (``autoshard.runtime.context_attention``
runs the same list from :func:`attention_parts`): the diagonal block with the
kernel's own causal flag (``is_causal`` aligns the diagonal top-left, right for
a square block on the diagonal); key chunks that are wholly visible in one call
without a mask; partly visible ones in one call with an explicit mask. Chunks
are grouped by *locality* for the all-gather variant (keys this rank holds
first: that compute overlaps the gather) or by *owner* for the ring.

**Price** (:func:`price_context_attention`), per rank, then the slowest rank
(the next collective waits for it):

* all-gather (pass-KV all at once): forward = one ``all_gather`` of this rank's
  K and V (one buffer: ``cp`` times ``2 B H_kv (L/cp) D`` bytes of output) on
  the CP mesh dim, issued before the local parts and waited before the first
  remote part; backward = the parts again (``attention_backward`` kind, 2.5x
  the FLOPs), remote parts first, then the ``reduce_scatter`` of dK/dV (in the
  runtime's fp32 accumulators: twice the bytes of 16-bit K/V) issued and run
  beside the local parts. Without ``keep_gathered`` the
  backward gathers K/V again (beside its local parts) and the reduce-scatter
  runs exposed at the end.
* ring: ``cp`` steps; step ``j`` computes against the keys of rank
  ``r - j (mod cp)`` while the ``permute`` of the K/V block in hand to rank
  ``r + 1`` runs beside it (``cp - 1`` of them). Backward: the K/V block
  travels again and the fp32 dK/dV accumulator follows one step behind (issued
  when its step's compute ends, waited at the end of the next step), then one
  last hop home.

The runtime's memory-bound work is priced beside the kernels as ``elementwise``
ops at its bytes: each part's merge into the fp32 accumulator by logsumexp, the
backward's fp32 dQ/dK/dV accumulation, the conversions back
(:func:`_part_traffic`, :func:`_rank_traffic_s`).

**Whole K/V** (:func:`price_whole_kv_attention`, the plan's ``context_whole_kv`` kinds): K and V
arrive whole on every rank of the CP group (the graph gathers them, before the GQA expansion
where the solver places it) and dK/dV leave as partial sums (the graph reduce-scatters them,
after the expansion's backward sum). The exchange is then compute only: each local query chunk
in at most two kernel calls (:func:`whole_kv_parts`: the causal diagonal block, and every
earlier key chunk in one unmasked call, a contiguous slice of the whole K/V, no copy); the
merge and accumulator traffic as above; no collective (the balanced layout's row moves are the
rule's, ``autoshard.rules.context_parallel``). Memory beside the op: the backward's dK/dV
accumulators of the whole sequence, ``cp`` blocks at the accumulator's itemsize.

Both go through :func:`costmodel.overlap.simulate` with the profile's
contention, so the overlap is the same two-stream model as the rest of the
step. Kernel times are :func:`costmodel.compute.op_time_s` of kind
``attention`` / ``attention_backward`` per part (``4 B H pairs D`` FLOPs, as
``autoshard.rules.compute.attention_compute`` counts them), so the cost of
cutting the work into smaller calls is priced too. Memory per rank: the
gathered K/V (``cp`` blocks; kept to the backward with ``keep_gathered``) and
the fp32 dK/dV buffer the reduce-scatter reads (``cp`` blocks); the ring holds two
K/V blocks (and two fp32 dK/dV blocks in the backward).

>>> from hw_profiles import load
>>> from costmodel.mesh import MeshSpec
>>> shape = AttentionShape(batch=1, heads=32, kv_heads=8, seq_len=131072, head_dim=128)
>>> mesh, h100 = MeshSpec((8, 8), ("dp", "cp")), load("h100-sxm-80gb")
>>> lb = price_context_attention(shape, mesh=mesh, cp_mesh_dim=1, profile=h100)
>>> flat = price_context_attention(shape, mesh=mesh, cp_mesh_dim=1, profile=h100, load_balanced=False)
>>> most = max(flat.forward_pairs_by_rank) / max(lb.forward_pairs_by_rank)  # 2 - 1/cp
>>> len(set(lb.forward_pairs_by_rank)), round(most, 2)
(1, 1.87)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from hw_profiles import HardwareProfile

from costmodel.collectives import collective_time_s
from costmodel.compute import op_time_s
from costmodel.mesh import MeshSpec
from costmodel.overlap import Transfer, simulate

__all__ = [
    "VARIANTS",
    "memory_op_s",
    "ContextParallelError",
    "ChunkLayout",
    "AttentionPart",
    "AttentionShape",
    "ContextAttentionCost",
    "offset_range",
    "visible_pairs",
    "attention_parts",
    "price_context_attention",
    "best_context_attention",
    "whole_kv_parts",
    "price_whole_kv_attention",
]

VARIANTS = ("all_gather", "ring")
BACKWARD_FLOPS_FACTOR = 2.5
"""The backward recomputes ``QK^T`` and does four more products: 2.5x the forward
(the factor ``autoshard.rules.compute.attention_compute`` uses)."""


class ContextParallelError(ValueError):
    """Bad arguments to context-parallel attention (names the argument)."""


@dataclass(frozen=True, slots=True)
class ChunkLayout:
    """Which sequence chunks each rank of a CP group holds (module docstring).

    >>> ChunkLayout(4).chunks_of(1), ChunkLayout(4, load_balanced=False).chunks_of(1)
    ((1, 6), (1,))
    """

    cp: int
    """Ranks in the CP group."""
    load_balanced: bool = True
    """Two chunks per rank, head ``r`` and tail ``2 cp - 1 - r``; else one, chunk ``r``."""

    def __post_init__(self) -> None:
        if not isinstance(self.cp, int) or isinstance(self.cp, bool) or self.cp < 1:
            raise ContextParallelError(f"cp: must be a positive int, got {self.cp!r}")

    @property
    def n_chunks(self) -> int:
        """Chunks the sequence is cut into."""
        return 2 * self.cp if self.load_balanced else self.cp

    @property
    def chunks_per_rank(self) -> int:
        return 2 if self.load_balanced else 1

    def chunks_of(self, rank: int) -> tuple[int, ...]:
        """Global chunk indices rank ``rank`` holds, in the order it stores them."""
        if not 0 <= rank < self.cp:
            raise ContextParallelError(f"rank: {rank} is not in a CP group of {self.cp}")
        return (rank, 2 * self.cp - 1 - rank) if self.load_balanced else (rank,)

    def owner_of(self, chunk: int) -> tuple[int, int]:
        """(rank, slot) that holds global chunk ``chunk``."""
        if not 0 <= chunk < self.n_chunks:
            raise ContextParallelError(f"chunk: {chunk} is not one of {self.n_chunks} chunks")
        if chunk < self.cp:
            return chunk, 0
        return 2 * self.cp - 1 - chunk, 1

    def chunk_order(self) -> tuple[int, ...]:
        """Global chunks in storage order: rank 0's, then rank 1's, ... (an even
        split of a sequence in this order gives every rank its chunks)."""
        return tuple(c for r in range(self.cp) for c in self.chunks_of(r))

    def chunk_len(self, seq_len: int) -> int:
        """Tokens per chunk; ``seq_len`` must split evenly."""
        if seq_len <= 0 or seq_len % self.n_chunks:
            raise ContextParallelError(
                f"seq_len: {seq_len} does not split into {self.n_chunks} equal chunks "
                f"(cp {self.cp}{', load-balanced' if self.load_balanced else ''})")
        return seq_len // self.n_chunks


def offset_range(causal: bool, window: int | None) -> tuple[float, float]:
    """(lo, hi) of ``p - k`` over the visible (query p, key k) pairs (infinite where unbounded).

    >>> offset_range(True, None), offset_range(True, 4), offset_range(False, 4)
    ((0, inf), (0, 3), (-3, 3))
    """
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
        raise ContextParallelError(f"window: must be a positive int or None, got {window!r}")
    hi = math.inf if window is None else window - 1
    lo = 0 if causal else (-math.inf if window is None else -(window - 1))
    return lo, hi


def _pairs_at_most(t: float, c: int) -> int:
    """G(t): pairs (u, v) in [0, c)^2 with u - v <= t (module docstring)."""
    if t >= c - 1:
        return c * c
    if t < -(c - 1):
        return 0
    t = int(math.floor(t))
    if t < 0:
        return (c + t) * (c + t + 1) // 2
    return c * c - (c - 1 - t) * (c - t) // 2


def visible_pairs(query_start: int, key_start: int, length: int, *, causal: bool, window: int | None = None) -> int:
    """(query, key) pairs a mask keeps in the block of two chunks of ``length``
    tokens starting at global positions ``query_start`` and ``key_start``.

    >>> visible_pairs(0, 0, 4, causal=True), visible_pairs(4, 0, 4, causal=True), visible_pairs(0, 4, 4, causal=True)
    (10, 16, 0)
    >>> visible_pairs(4, 0, 4, causal=True, window=3)  # p - k < 3: only (4, 2), (4, 3), (5, 3)
    3
    """
    lo, hi = offset_range(causal, window)
    delta = query_start - key_start
    return _pairs_at_most(hi - delta, length) - _pairs_at_most(lo - 1 - delta, length)


@dataclass(frozen=True, slots=True)
class AttentionPart:
    """One attention kernel call of a rank: one local query chunk against some key chunks."""

    query_chunk: int
    """Global index of the query chunk."""
    key_chunks: tuple[int, ...]
    """Global indices of the key chunks, in the order the call concatenates them."""
    mode: str
    """``causal`` (the diagonal block, the kernel's own causal flag), ``full`` (no
    mask) or ``masked`` (an explicit mask of the visible pairs)."""
    pairs: int
    """Visible (query, key) pairs."""
    local: bool
    """Every key chunk is held by this rank (computable before any exchange)."""
    step: int
    """Grouped by owner: the ring step ``(rank - owner) mod cp`` of its key chunks; by
    locality: 0 for local parts, 1 for remote ones (after the exchange)."""


def attention_parts(layout: ChunkLayout, rank: int, seq_len: int, *, causal: bool, window: int | None = None,
                    group_by: str = "locality") -> tuple[AttentionPart, ...]:
    """The kernel calls of ``rank`` (module docstring), local ones first, then by ring step.
    ``group_by``: ``locality`` (all-gather: remote chunks in one call per query
    chunk and mode) or ``owner`` (ring: one call per owner).

    >>> [(p.query_chunk, p.key_chunks, p.mode) for p in attention_parts(ChunkLayout(2), 0, 8, causal=True)]
    [(0, (0,), 'causal'), (3, (3,), 'causal'), (3, (0,), 'full'), (3, (1, 2), 'full')]
    """
    if group_by not in ("locality", "owner"):
        raise ContextParallelError(f"group_by: {group_by!r} is not 'locality' or 'owner'")
    c = layout.chunk_len(seq_len)
    mine = layout.chunks_of(rank)
    groups: dict[tuple[int, str, int], list[tuple[int, int]]] = {}
    parts: list[AttentionPart] = []
    for q in mine:
        for key in range(layout.n_chunks):
            pairs = visible_pairs(q * c, key * c, c, causal=causal, window=window)
            if pairs == 0:
                continue
            owner = layout.owner_of(key)[0]
            step = (rank - owner) % layout.cp
            if causal and key == q and pairs == c * (c + 1) // 2:
                parts.append(AttentionPart(q, (key,), "causal", pairs, True, 0))
                continue
            mode = "full" if pairs == c * c else "masked"
            where = step if group_by == "owner" else min(step, 1)  # locality: 0 local, 1 remote
            groups.setdefault((q, mode, where), []).append((key, pairs))
    for (q, mode, where), members in groups.items():
        keys = tuple(k for k, _ in members)
        step = (rank - layout.owner_of(keys[0])[0]) % layout.cp
        parts.append(AttentionPart(q, keys, mode, sum(n for _, n in members), where == 0,
                                   where if group_by == "locality" else step))
    # stable: causal diagonals first within the local ones, then by step (ring order)
    return tuple(sorted(parts, key=lambda p: (not p.local, p.step)))


@dataclass(frozen=True, slots=True)
class AttentionShape:
    """Global shape of one attention call: ``q [B, H, L, D]``, ``k, v [B, H_kv, L, D]``."""

    batch: int
    heads: int
    kv_heads: int
    """Key/value heads (GQA: a divisor of ``heads``)."""
    seq_len: int
    head_dim: int
    dtype: str = "bf16"
    itemsize: int = 2
    """Bytes per element."""

    def __post_init__(self) -> None:
        for name in ("batch", "heads", "kv_heads", "seq_len", "head_dim", "itemsize"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ContextParallelError(f"{name}: must be a positive int, got {value!r}")
        if self.heads % self.kv_heads:
            raise ContextParallelError(f"kv_heads: {self.kv_heads} does not divide heads {self.heads}")


@dataclass(frozen=True, slots=True)
class ContextAttentionCost:
    """CP attention of one layer on its CP group (module docstring); seconds are the slowest rank's."""

    variant: str
    load_balanced: bool
    forward_pairs_by_rank: tuple[int, ...]
    """Visible (query, key) pairs each rank computes (FLOPs = 4 B H D pairs)."""
    forward_compute_s: float
    """The slowest rank's forward kernels, end to end without communication."""
    backward_compute_s: float
    forward_comm_s: float
    """The K/V all-gather, or the sum of the ring's steps."""
    backward_comm_s: float
    forward_s: float
    """Simulated forward with its communication beside the compute (slowest rank)."""
    backward_s: float
    kv_buffer_bytes: int
    """Extra memory per rank in the forward: the gathered K/V (all-gather) or the second ring block."""
    held_kv_bytes: int
    """Of those, what stays from the forward to the backward (the gathered K/V with ``keep_gathered``)."""
    backward_buffer_bytes: int
    """Extra memory per rank in the backward: gathered K/V plus the fp32 dK/dV buffer (all-gather), or the
    ring's blocks (the K/V arriving, two fp32 dK/dV accumulators)."""

    @property
    def step_s(self) -> float:
        return self.forward_s + self.backward_s

    @property
    def exposed_comm_s(self) -> float:
        """What communication adds to forward plus backward."""
        return max(0.0, self.step_s - self.forward_compute_s - self.backward_compute_s)


def _part_times(shape: AttentionShape, parts: Sequence[AttentionPart], c: int, profile: HardwareProfile,
                backward: bool) -> list[float]:
    """Kernel seconds of each part (FLOPs as ``rules.compute.attention_compute`` counts them)."""
    times = []
    for part in parts:
        flops = 4.0 * shape.batch * shape.heads * part.pairs * shape.head_dim
        q_bytes = shape.batch * shape.heads * c * shape.head_dim * shape.itemsize
        kv_bytes = 2 * shape.batch * shape.kv_heads * len(part.key_chunks) * c * shape.head_dim * shape.itemsize
        if backward:  # reads q, out, dout, k, v; writes dq, dk, dv
            flops, nbytes, kind = flops * BACKWARD_FLOPS_FACTOR, 4 * q_bytes + 2 * kv_bytes, "attention_backward"
        else:  # reads q, k, v; writes out
            nbytes, kind = 2 * q_bytes + kv_bytes, "attention"
        times.append(op_time_s(kind, flops=flops, bytes_accessed=nbytes, dtype=shape.dtype, profile=profile))
    return times


def memory_op_s(nbytes: float, profile: HardwareProfile) -> float:
    """Seconds of a memory-bound op (a copy, a conversion, an accumulation) accessing ``nbytes``
    bytes: what the runtime's merges and accumulators around the attention kernels cost.

    >>> from hw_profiles import load
    >>> memory_op_s(2e9, load("h100-sxm-80gb")) > memory_op_s(1e9, load("h100-sxm-80gb"))
    True
    """
    return op_time_s("elementwise", flops=0.0, bytes_accessed=nbytes, dtype="torch.float32", profile=profile)


def accumulator_itemsize(itemsize: int) -> int:
    """Bytes per element of the runtime's merge and dQ/dK/dV accumulators: fp32 for 16-bit inputs
    (``autoshard.runtime.context_attention``), else the inputs' own.

    >>> accumulator_itemsize(2), accumulator_itemsize(8)
    (4, 8)
    """
    return max(4, itemsize)


def _part_traffic(shape: AttentionShape, parts: Sequence[AttentionPart], c: int, profile: HardwareProfile,
                  backward: bool, concatenated: bool = True) -> list[float]:
    """Seconds of the memory-bound ops the runtime runs beside each part's kernel (elements of one
    query chunk ``X = B H c D``, of one key chunk ``K = B H_kv c D``; ``s`` input bytes, ``a``
    accumulator bytes; a ``.to`` between them reads ``s`` and writes ``a``):

    * forward: the key chunks of a multi-chunk part concatenated (K and V, ``4 n K s``); the merge
      (``_merge``): the part's out converted (``(s + a) X``, none for ``a == s``), then for every
      part after a chunk's first ``acc * w_acc + out * w_new`` (``7 a X``: two products of read 1,
      write 1 and a sum of read 2, write 1; the ``lse`` terms are ``D`` times smaller and left out);
    * backward: ``dout`` and ``out`` rows copied dense (``4 s X``), the key chunks concatenated,
      ``dq += dq_p`` and ``dk, dv += ...`` into the fp32 accumulators (``(2 a + s)`` per element).

    ``concatenated=False``: a part's key chunks are one slice of whole K/V (no concatenation).
    """
    s, a = shape.itemsize, accumulator_itemsize(shape.itemsize)
    x = float(shape.batch * shape.heads * c * shape.head_dim)
    k = float(shape.batch * shape.kv_heads * c * shape.head_dim)
    convert = 0.0 if a == s else (s + a) * x
    times, merged = [], set()
    for part in parts:
        n = len(part.key_chunks)
        cat = 4 * n * k * s if n > 1 and concatenated else 0.0
        if backward:
            times.append(memory_op_s(4 * s * x + cat + (2 * a + s) * (x + 2 * n * k), profile))
            continue
        first = part.query_chunk not in merged
        merged.add(part.query_chunk)
        times.append(memory_op_s(cat + convert + (0.0 if first else 7 * a * x), profile))
    return times


def _rank_traffic_s(shape: AttentionShape, layout: ChunkLayout, profile: HardwareProfile, variant: str
                    ) -> tuple[float, float]:
    """(forward, backward) seconds of one rank's memory-bound ops outside the parts: the forward's
    ``torch.cat`` of the merged chunks and its conversion back; the backward's fp32 zeros (dQ, the
    local dK/dV, the ``[cp, ...]`` dK/dV buffer or the ring's per-step one), the arrived dK/dV
    added (all-gather) or the ring's arriving accumulators added, and the conversions back (the
    ``torch.cat`` of this rank's K and V before a gather or pass, ``2 s`` per element, left out)."""
    s, a = shape.itemsize, accumulator_itemsize(shape.itemsize)
    rows = shape.seq_len // layout.cp
    x = float(shape.batch * shape.heads * rows * shape.head_dim)
    kv = 2.0 * shape.batch * shape.kv_heads * rows * shape.head_dim
    convert = 0.0 if a == s else (s + a)
    forward = memory_op_s(2 * a * x + convert * x, profile)
    if variant == "ring":  # zeros of dq and of a dK/dV block a step; each arriving accumulator added
        backward = memory_op_s(a * (x + layout.cp * kv) + 3 * a * kv * (layout.cp - 1) + convert * (x + kv),
                               profile)
    else:  # zeros of dq, local dK/dV and the buffer; the reduce-scatter's dK/dV added
        backward = memory_op_s(a * (x + kv + layout.cp * kv) + 3 * a * kv + convert * (x + kv), profile)
    return forward, backward


def _step_bounds(parts: Sequence[AttentionPart], cp: int) -> list[int]:
    """Position of the first part of each ring step ``0 .. cp`` (``parts`` are in step order)."""
    return [sum(1 for p in parts if p.step < j) for j in range(cp + 1)]


def _all_gather_rank(parts: Sequence[AttentionPart], fwd: list[float], bwd: list[float], gather_s: float,
                     scatter_s: float, contention: float, keep_gathered: bool) -> tuple[float, float]:
    """(forward, backward) seconds of one rank: gather beside the local parts; reduce-scatter beside them too."""
    n_local = sum(1 for p in parts if p.local)
    forward = simulate(fwd, [Transfer(0, n_local, (gather_s,))], contention=contention).step_s
    if keep_gathered:  # remote parts first, then the reduce-scatter runs beside the local ones
        order = bwd[n_local:] + bwd[:n_local]
        transfers = [Transfer(len(bwd) - n_local, len(bwd), (scatter_s,))]
    else:  # gather again beside the local parts; the reduce-scatter is needed at once
        order = bwd
        transfers = [Transfer(0, n_local, (gather_s,)), Transfer(len(bwd), len(bwd), (scatter_s,))]
    backward = simulate(order, transfers, contention=contention).step_s
    return forward, backward


def _ring_rank(parts: Sequence[AttentionPart], fwd: list[float], bwd: list[float], cp: int, pass_s: float,
               grad_pass_s: float, contention: float) -> tuple[float, float]:
    """(forward, backward) seconds of one rank on the ring (module docstring); ``grad_pass_s``:
    one hop of the fp32 dK/dV accumulator."""
    bounds = _step_bounds(parts, cp)
    n = len(parts)
    forward = simulate(fwd, [Transfer(bounds[j], bounds[j + 1], (pass_s,)) for j in range(cp - 1)],
                       contention=contention).step_s
    # K/V (with dK/dV's accumulator one step behind) travel during step j; the last accumulator goes home at the end
    transfers = [Transfer(bounds[j], bounds[j + 1], (pass_s,)) for j in range(cp - 1)]
    transfers += [Transfer(bounds[j + 1], bounds[min(j + 2, cp)], (grad_pass_s,)) for j in range(cp - 1)]
    transfers.append(Transfer(n, n, (grad_pass_s,)))
    backward = simulate(bwd, sorted(transfers, key=lambda t: (t.issue, t.wait)), contention=contention).step_s
    return forward, backward


def price_context_attention(shape: AttentionShape, *, mesh: MeshSpec, cp_mesh_dim: int, profile: HardwareProfile,
                            causal: bool = True, window: int | None = None, load_balanced: bool = True,
                            variant: str = "all_gather", keep_gathered: bool = True) -> ContextAttentionCost:
    """Price one CP attention (forward and backward) on mesh dim ``cp_mesh_dim``
    (module docstring). ``shape`` is the global (unsplit) attention.

    >>> from hw_profiles import load
    >>> shape = AttentionShape(batch=1, heads=8, kv_heads=2, seq_len=8192, head_dim=128)
    >>> cost = price_context_attention(shape, mesh=MeshSpec((4,)), cp_mesh_dim=0, profile=load("h100-sxm-80gb"))
    >>> cost.kv_buffer_bytes  # 4 ranks' K and V: 2 x 2 heads x 8192 tokens x 128 x 2 bytes
    8388608
    """
    if variant not in VARIANTS:
        raise ContextParallelError(f"variant: {variant!r} is not one of {', '.join(VARIANTS)}")
    if not 0 <= cp_mesh_dim < len(mesh.shape):
        raise ContextParallelError(f"cp_mesh_dim: {cp_mesh_dim} is not a mesh dim of a {len(mesh.shape)}-D mesh")
    cp = mesh.shape[cp_mesh_dim]
    layout = ChunkLayout(cp, load_balanced)
    c = layout.chunk_len(shape.seq_len)
    local_kv = 2 * shape.batch * shape.kv_heads * (shape.seq_len // cp) * shape.head_dim * shape.itemsize
    dims = (cp_mesh_dim,)
    group_by = "owner" if variant == "ring" else "locality"
    # dK/dV travel as the runtime accumulates them: fp32 for 16-bit inputs
    grad_kv = local_kv * accumulator_itemsize(shape.itemsize) // shape.itemsize
    gather_s = collective_time_s("all_gather", cp * local_kv, dims, mesh, profile)
    scatter_s = collective_time_s("reduce_scatter", cp * grad_kv, dims, mesh, profile)
    pass_s = collective_time_s("permute", local_kv, dims, mesh, profile)
    grad_pass_s = collective_time_s("permute", grad_kv, dims, mesh, profile)
    contention = profile.contention
    pairs, fwd_c, bwd_c, fwd_s, bwd_s = [], [], [], [], []
    for rank in range(cp):
        parts = attention_parts(layout, rank, shape.seq_len, causal=causal, window=window, group_by=group_by)
        fwd = [k + m for k, m in zip(_part_times(shape, parts, c, profile, False),
                                     _part_traffic(shape, parts, c, profile, False))]
        bwd = [k + m for k, m in zip(_part_times(shape, parts, c, profile, True),
                                     _part_traffic(shape, parts, c, profile, True))]
        if variant == "ring":
            f, b = _ring_rank(parts, fwd, bwd, cp, pass_s, grad_pass_s, contention)
        else:
            f, b = _all_gather_rank(parts, fwd, bwd, gather_s, scatter_s, contention, keep_gathered)
        # before the first part and after the last: compute-stream time outside the overlap
        f_rest, b_rest = _rank_traffic_s(shape, layout, profile, variant)
        f, b = f + f_rest, b + b_rest
        pairs.append(sum(p.pairs for p in parts))
        fwd_c.append(sum(fwd) + f_rest)
        bwd_c.append(sum(bwd) + b_rest)
        fwd_s.append(f)
        bwd_s.append(b)
    if variant == "ring":  # K/V in hand and arriving; in the backward also two dK/dV accumulators
        forward_comm, backward_comm = (cp - 1) * pass_s, (cp - 1) * pass_s + cp * grad_pass_s
        kv_bytes, held, backward_bytes = local_kv, 0, local_kv + 2 * grad_kv
    else:  # the gathered K/V, and in the backward the [cp, ...] dK/dV buffer beside it
        forward_comm = gather_s
        backward_comm = scatter_s + (0.0 if keep_gathered else gather_s)
        kv_bytes, backward_bytes = cp * local_kv, cp * (local_kv + grad_kv)
        held = cp * local_kv if keep_gathered and cp > 1 else 0
    return ContextAttentionCost(variant, load_balanced, tuple(pairs), max(fwd_c), max(bwd_c), forward_comm,
                                backward_comm, max(fwd_s), max(bwd_s), kv_bytes, held, backward_bytes)


def best_context_attention(shape: AttentionShape, *, mesh: MeshSpec, cp_mesh_dim: int, profile: HardwareProfile,
                           causal: bool = True, window: int | None = None,
                           load_balanced: bool = True) -> ContextAttentionCost:
    """The cheaper of the all-gather and the ring (ties: the all-gather, which needs
    one collective instead of ``cp - 1``); the ring where its overlap pays.

    >>> from hw_profiles import load
    >>> shape = AttentionShape(batch=1, heads=8, kv_heads=8, seq_len=4096, head_dim=128)
    >>> best = best_context_attention(shape, mesh=MeshSpec((2,)), cp_mesh_dim=0, profile=load("h100-sxm-80gb"))
    >>> best.variant in VARIANTS
    True
    """
    costs = [price_context_attention(shape, mesh=mesh, cp_mesh_dim=cp_mesh_dim, profile=profile, causal=causal,
                                     window=window, load_balanced=load_balanced, variant=v) for v in VARIANTS]
    return min(costs, key=lambda cost: cost.step_s)


def whole_kv_parts(layout: ChunkLayout, rank: int, seq_len: int, *, causal: bool) -> tuple[AttentionPart, ...]:
    """The kernel calls of ``rank`` with the whole K/V in hand (module docstring, Whole K/V): per
    local query chunk ``q``, causal: the diagonal block with the kernel's causal flag and, for
    ``q > 0``, key chunks ``0 .. q - 1`` in one unmasked call; not causal: every key chunk in one
    call. Key chunks of a part are consecutive, so each part reads one slice of K/V.

    >>> [(p.query_chunk, p.key_chunks, p.mode) for p in whole_kv_parts(ChunkLayout(2), 0, 8, causal=True)]
    [(0, (0,), 'causal'), (3, (3,), 'causal'), (3, (0, 1, 2), 'full')]
    """
    c = layout.chunk_len(seq_len)
    parts = []
    for q in layout.chunks_of(rank):
        if not causal:
            parts.append(AttentionPart(q, tuple(range(layout.n_chunks)), "full", layout.n_chunks * c * c, True, 0))
            continue
        parts.append(AttentionPart(q, (q,), "causal", c * (c + 1) // 2, True, 0))
        if q > 0:
            parts.append(AttentionPart(q, tuple(range(q)), "full", q * c * c, True, 0))
    return tuple(parts)


def price_whole_kv_attention(shape: AttentionShape, *, mesh: MeshSpec, cp_mesh_dim: int, profile: HardwareProfile,
                             causal: bool = True, load_balanced: bool = True) -> ContextAttentionCost:
    """Price one CP attention with whole K/V in and partial dK/dV out (module docstring, Whole
    K/V): the slowest rank's kernels and memory-bound work, no communication. ``shape`` is the
    global attention; ``kv_heads`` the heads of the K/V the op takes (after any expansion).

    >>> from hw_profiles import load
    >>> shape = AttentionShape(batch=1, heads=8, kv_heads=8, seq_len=8192, head_dim=128)
    >>> cost = price_whole_kv_attention(shape, mesh=MeshSpec((4,)), cp_mesh_dim=0, profile=load("h100-sxm-80gb"))
    >>> cost.forward_comm_s, cost.kv_buffer_bytes, cost.backward_buffer_bytes  # fp32 dK, dV of 8192 tokens
    (0.0, 0, 67108864)
    """
    if not 0 <= cp_mesh_dim < len(mesh.shape):
        raise ContextParallelError(f"cp_mesh_dim: {cp_mesh_dim} is not a mesh dim of a {len(mesh.shape)}-D mesh")
    cp = mesh.shape[cp_mesh_dim]
    layout = ChunkLayout(cp, load_balanced)
    c = layout.chunk_len(shape.seq_len)
    s, a = shape.itemsize, accumulator_itemsize(shape.itemsize)
    x = float(shape.batch * shape.heads * (shape.seq_len // cp) * shape.head_dim)
    whole_kv = 2.0 * shape.batch * shape.kv_heads * shape.seq_len * shape.head_dim
    convert = 0.0 if a == s else (s + a)
    # outside the parts: the forward's cat of the merged chunks and its conversion back; the
    # backward's zeros of dQ and of the whole dK/dV, and their conversions to the graph's dtype
    f_rest = memory_op_s(2 * a * x + convert * x, profile)
    b_rest = memory_op_s(a * (x + whole_kv) + convert * (x + whole_kv), profile)
    pairs, fwd_c, bwd_c = [], [], []
    for rank in range(cp):
        parts = whole_kv_parts(layout, rank, shape.seq_len, causal=causal)
        fwd = [k + m for k, m in zip(_part_times(shape, parts, c, profile, False),
                                     _part_traffic(shape, parts, c, profile, False, concatenated=False))]
        bwd = [k + m for k, m in zip(_part_times(shape, parts, c, profile, True),
                                     _part_traffic(shape, parts, c, profile, True, concatenated=False))]
        pairs.append(sum(p.pairs for p in parts))
        fwd_c.append(sum(fwd) + f_rest)
        bwd_c.append(sum(bwd) + b_rest)
    grad_bytes = int(whole_kv) * a
    return ContextAttentionCost("whole_kv", load_balanced, tuple(pairs), max(fwd_c), max(bwd_c), 0.0, 0.0,
                                max(fwd_c), max(bwd_c), 0, 0, grad_bytes)
