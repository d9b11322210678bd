"""PyTorch's CUDA caching allocator, simulated: what a step's allocations reserve.

``torch.cuda.max_memory_allocated`` counts live blocks; what the device must
hold is ``max_memory_reserved``: the segments the caching allocator took from
the driver, live blocks plus the free ones it keeps for reuse, which a block
too small for the next request strands (fragmentation). This module replays a
sequence of ``malloc(size, stream)`` / ``free`` through the allocator's rules
(``c10/cuda/CUDACachingAllocator.cpp``, read for torch 2.5-2.13; the rules
below did not change in that range) and reports the peaks of both counts.

Rules replayed
--------------
* A request is rounded up to 512 B. Requests of at most 1 MiB come from the
  *small* pool, larger ones from the *large* pool; each stream has its own pair
  of pools, and a block freed on one stream is reused only by that stream.
* Best fit: the free block of the pool with the smallest size ``>= request``
  (lowest address among equal sizes). A larger block is split when the rest is
  ``>= 512 B`` (small pool, or any pool with expandable segments) or
  ``> 1 MiB`` (large pool); otherwise the whole block is handed out.
* No free block fits:
  - classic segments: a new segment of 2 MiB (small), 20 MiB (large requests
    under 10 MiB) or the request rounded up to 2 MiB; when that would pass the
    device's capacity, every free unsplit segment is released first (what
    torch does before its retry) and ``retries`` counts it;
  - expandable segments (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``,
    torchtitan's launcher sets it): one segment per pool whose mapped end grows
    by granules of 2 MiB (small) / 20 MiB (large); the request takes the free
    block at the mapped end, if any, and as many new granules as it lacks.
* A freed block merges with its free neighbours of the same segment.

Not replayed: ``max_split_size_mb``, garbage-collection thresholds, CUDA
graph pools, ``record_stream`` delays (a block is reusable at its free), and,
with expandable segments, unmapping on a capacity miss (the peak is reported
with ``over_capacity`` set instead).

>>> a = CachingAllocator()
>>> x = a.malloc(30 * 2**20); y = a.malloc(30 * 2**20)
>>> a.free(x); z = a.malloc(20 * 2**20)   # best fit into x's block, split
>>> a.peak_reserved_bytes // 2**20, a.peak_allocated_bytes // 2**20
(60, 60)
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterable

__all__ = ["CachingAllocator", "AllocatorPeaks", "replay_trace", "MIN_BLOCK", "SMALL_SIZE", "SMALL_BUFFER", "LARGE_BUFFER",
           "MIN_LARGE_ALLOC", "ROUND_LARGE", "round_size", "segment_size"]

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
LARGE_BUFFER = 20 << 20
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20
_ADDRESS_SPACE = 1 << 52  # one pool's (or one classic segment's) addresses; never reached


def round_size(size: int) -> int:
    """A request as the allocator rounds it (at least 512 B, a multiple of 512).

    >>> round_size(1), round_size(513), round_size(0)
    (512, 1024, 512)
    """
    return MIN_BLOCK if size < MIN_BLOCK else -(-size // MIN_BLOCK) * MIN_BLOCK


def segment_size(size: int) -> int:
    """The classic segment ``cudaMalloc``-ed for a rounded request no free block fits.

    >>> [segment_size(s) // 2**20 for s in (4096, 3 * 2**20, 11 * 2**20 + 1)]
    [2, 20, 12]
    """
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class _Block:
    __slots__ = ("addr", "size", "free", "prev", "next", "pool")

    def __init__(self, addr: int, size: int, pool: "_Pool") -> None:
        self.addr, self.size, self.pool = addr, size, pool
        self.free = True
        self.prev: _Block | None = None
        self.next: _Block | None = None


class _Pool:
    """The free blocks of one (stream, small/large) pool, sorted by (size, address)."""

    __slots__ = ("small", "free", "base", "tail", "mapped")

    def __init__(self, small: bool, base: int) -> None:
        self.small = small
        self.free: list[tuple[int, int, _Block]] = []
        self.base = base
        self.tail: _Block | None = None  # expandable: the block ending at the mapped end
        self.mapped = 0  # expandable: bytes mapped

    def add(self, block: _Block) -> None:
        bisect.insort(self.free, (block.size, block.addr, block), key=lambda e: (e[0], e[1]))

    def remove(self, block: _Block) -> None:
        i = bisect.bisect_left(self.free, (block.size, block.addr), key=lambda e: (e[0], e[1]))
        del self.free[i]

    def best_fit(self, size: int) -> _Block | None:
        i = bisect.bisect_left(self.free, (size, -1), key=lambda e: (e[0], e[1]))
        if i == len(self.free):
            return None
        block = self.free.pop(i)[2]
        return block


def _absorb(pool: _Pool, left: _Block, right: _Block) -> _Block:
    """``right`` merged into its left neighbour ``left`` (both free, one segment): ``left``."""
    left.size += right.size
    left.next = right.next
    if right.next is not None:
        right.next.prev = left
    if pool.tail is right:
        pool.tail = left
    return left


@dataclass(frozen=True, slots=True)
class AllocatorPeaks:
    """What a replay reserved and allocated at most (bytes)."""

    reserved_bytes: int
    allocated_bytes: int
    retries: int = 0
    """Requests that found no room under the capacity and released cached segments first (classic)."""
    over_capacity: bool = False
    """The reservation passed the capacity even after releasing what torch would (torch: out of memory)."""

    @property
    def headroom(self) -> float:
        """Reserved over allocated, minus one (the fraction the allocator keeps beyond the live peak)."""
        return self.reserved_bytes / self.allocated_bytes - 1.0 if self.allocated_bytes else 0.0


class CachingAllocator:
    """One device's caching allocator (module docstring); handles are opaque ints.

    >>> a = CachingAllocator(expandable_segments=True)
    >>> h = a.malloc(30 * 2**20); a.reserved_bytes // 2**20
    40
    """

    def __init__(self, *, expandable_segments: bool = False, capacity_bytes: int | None = None) -> None:
        self.expandable = expandable_segments
        self.capacity = capacity_bytes
        self.reserved_bytes = 0
        self.allocated_bytes = 0
        self.peak_reserved_bytes = 0
        self.peak_allocated_bytes = 0
        self.retries = 0
        self.over_capacity = False
        self._pools: dict[tuple[object, bool], _Pool] = {}
        self._live: dict[int, _Block] = {}
        self._next_handle = 0
        self._next_base = 0

    def peaks(self) -> AllocatorPeaks:
        return AllocatorPeaks(self.peak_reserved_bytes, self.peak_allocated_bytes, self.retries, self.over_capacity)

    def reset_peaks(self) -> None:
        """Peaks from now on, as ``torch.cuda.reset_peak_memory_stats``."""
        self.peak_reserved_bytes, self.peak_allocated_bytes = self.reserved_bytes, self.allocated_bytes

    def _address_range(self) -> int:
        base = self._next_base
        self._next_base += _ADDRESS_SPACE
        return base

    def _pool(self, stream: object, small: bool) -> _Pool:
        pool = self._pools.get((stream, small))
        if pool is None:
            pool = self._pools[(stream, small)] = _Pool(small, self._address_range())
        return pool

    def malloc(self, size: int, stream: object = 0) -> int:
        """Allocate ``size`` bytes on ``stream``; the handle to :meth:`free`."""
        size = round_size(int(size))
        pool = self._pool(stream, size <= SMALL_SIZE)
        block = pool.best_fit(size)
        if block is None:
            block = self._grow_expandable(pool, size) if self.expandable else self._new_segment(pool, size)
        rest = block.size - size
        if rest >= MIN_BLOCK if (pool.small or self.expandable) else rest > SMALL_SIZE:
            remainder = _Block(block.addr + size, rest, pool)
            remainder.prev, remainder.next = block, block.next
            if block.next is not None:
                block.next.prev = remainder
            block.next = remainder
            block.size = size
            if pool.tail is block:
                pool.tail = remainder
            pool.add(remainder)
        block.free = False
        self.allocated_bytes += block.size
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        handle = self._next_handle
        self._next_handle += 1
        self._live[handle] = block
        return handle

    def free(self, handle: int) -> None:
        """Return a block to its pool, merged with its free neighbours."""
        block = self._live.pop(handle)
        pool = block.pool
        self.allocated_bytes -= block.size
        block.free = True
        right = block.next
        if block.prev is not None and block.prev.free:
            pool.remove(block.prev)
            block = _absorb(pool, block.prev, block)
        if right is not None and right.free:
            pool.remove(right)
            block = _absorb(pool, block, right)
        pool.add(block)

    def _reserve(self, nbytes: int) -> None:
        self.reserved_bytes += nbytes
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)
        if self.capacity is not None and self.reserved_bytes > self.capacity:
            self.over_capacity = True

    def _new_segment(self, pool: _Pool, size: int) -> _Block:
        nbytes = segment_size(size)
        if self.capacity is not None and self.reserved_bytes + nbytes > self.capacity:
            self.retries += 1
            self._release_cached()
        block = _Block(self._address_range(), nbytes, pool)
        self._reserve(nbytes)
        return block

    def _release_cached(self) -> None:
        """Free every cached segment no live block splits (torch's retry after a failed cudaMalloc)."""
        for pool in self._pools.values():
            whole = [b for _, _, b in pool.free if b.prev is None and b.next is None]
            for block in whole:
                pool.remove(block)
                self.reserved_bytes -= block.size

    def _grow_expandable(self, pool: _Pool, size: int) -> _Block:
        granule = SMALL_BUFFER if pool.small else LARGE_BUFFER
        tail = pool.tail if pool.tail is not None and pool.tail.free else None
        have = tail.size if tail is not None else 0
        grow = -(-(size - have) // granule) * granule
        self._reserve(grow)
        if tail is not None:
            pool.remove(tail)
            tail.size += grow
            block = tail
        else:
            block = _Block(pool.base + pool.mapped, grow, pool)
            block.prev = pool.tail
            if pool.tail is not None:
                pool.tail.next = block
            pool.tail = block
        pool.mapped += grow
        return block


def replay_trace(events: Iterable[tuple[str, int, int, object]], *, expandable_segments: bool = False
                 ) -> AllocatorPeaks:
    """The peaks of a recorded allocator trace replayed here: ``(action, address, size, stream)``
    as ``torch.cuda.memory._snapshot()["device_traces"]`` lists them; ``alloc`` allocates,
    ``free_completed`` frees the block allocated at that address, every other action (segment
    maps, ``free_requested``, snapshots) is the allocator's own doing and is skipped. A trace
    recorded on a GPU, replayed by these rules, checks the rules: the peaks should be the ones
    torch reported for the same steps (``benchmarks/gpu_check.py`` part m).

    >>> replay_trace([("alloc", 1, 30 * 2**20, 0), ("free_completed", 1, 30 * 2**20, 0),
    ...               ("alloc", 2, 20 * 2**20, 0)]).reserved_bytes // 2**20
    30
    """
    allocator = CachingAllocator(expandable_segments=expandable_segments)
    handles: dict[int, int] = {}
    for action, address, size, stream in events:
        if action == "alloc":
            handles[address] = allocator.malloc(size, stream)
        elif action == "free_completed" and address in handles:
            allocator.free(handles.pop(address))
    return allocator.peaks()
