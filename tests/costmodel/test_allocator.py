"""The caching allocator's replay: each rule on a hand-made sequence, and invariants on random ones."""

from __future__ import annotations

import random

import pytest

from costmodel.allocator import (LARGE_BUFFER, SMALL_BUFFER, CachingAllocator, round_size, segment_size)

MiB = 2**20


def _segments(a: CachingAllocator) -> list[list]:
    """Every segment's blocks in address order (classic segments and expandable pools alike)."""
    heads, seen = [], set()
    blocks = [b for _, _, b in (e for p in a._pools.values() for e in p.free)] + list(a._live.values())
    for b in blocks:
        while b.prev is not None:
            b = b.prev
        if id(b) not in seen:
            seen.add(id(b))
            chain = []
            while b is not None:
                chain.append(b)
                b = b.next
            heads.append(chain)
    return heads


def test_requests_are_rounded_to_512_bytes_and_segments_sized_as_torch_does():
    assert [round_size(s) for s in (1, 512, 513, 4096)] == [512, 512, 1024, 4096]
    assert segment_size(MiB) == SMALL_BUFFER  # the small pool's 2 MiB
    assert segment_size(MiB + 512) == LARGE_BUFFER  # 1-10 MiB share 20 MiB segments
    assert segment_size(10 * MiB) == 10 * MiB
    assert segment_size(10 * MiB + 1) == 12 * MiB  # rounded up to 2 MiB


def test_a_freed_block_is_reused_by_best_fit_not_first_fit():
    a = CachingAllocator()
    big, small = a.malloc(60 * MiB), a.malloc(30 * MiB)
    keep = a.malloc(12 * MiB)
    a.free(big)
    a.free(small)
    a.malloc(25 * MiB)  # fits both; the 30 MiB block is the best fit
    assert a.reserved_bytes == 102 * MiB
    a.malloc(60 * MiB)  # the 60 MiB block is still whole
    assert a.reserved_bytes == 102 * MiB
    assert keep in a._live


def test_a_large_block_is_split_only_when_more_than_1_mib_is_left():
    a = CachingAllocator()
    h = a.malloc(40 * MiB)
    a.free(h)
    a.malloc(int(39.5 * MiB))  # 0.5 MiB would be left: the whole block is handed out
    assert a.allocated_bytes == 40 * MiB
    a2 = CachingAllocator()
    a2.free(a2.malloc(40 * MiB))
    a2.malloc(38 * MiB)  # 2 MiB left: split, the rest stays free in the segment
    assert a2.allocated_bytes == 38 * MiB
    a2.malloc(2 * MiB)
    assert a2.reserved_bytes == 40 * MiB


def test_small_requests_share_2_mib_segments():
    a = CachingAllocator()
    for _ in range(4):
        a.malloc(512 * 1024)
    assert a.reserved_bytes == SMALL_BUFFER
    a.malloc(512 * 1024)
    assert a.reserved_bytes == 2 * SMALL_BUFFER


def test_freed_neighbours_merge_so_a_larger_request_fits_again():
    a = CachingAllocator()
    whole = a.malloc(64 * MiB)
    a.free(whole)
    parts = [a.malloc(16 * MiB) for _ in range(4)]
    for h in parts:
        a.free(h)
    a.malloc(64 * MiB)
    assert a.reserved_bytes == 64 * MiB


def test_blocks_of_one_stream_are_not_reused_by_another():
    a = CachingAllocator()
    a.free(a.malloc(50 * MiB, "compute"))
    a.malloc(50 * MiB, "side")
    assert a.reserved_bytes == 100 * MiB


def test_a_block_stranded_between_live_ones_makes_a_new_segment():
    """The fragmentation the replay exists for: a freed hole too small for the next request."""
    a = CachingAllocator()
    first = a.malloc(100 * MiB)
    a.free(first)
    state = a.malloc(60 * MiB)  # lands in the 100 MiB block, splits it
    assert a.reserved_bytes == 100 * MiB
    a.malloc(100 * MiB)
    assert a.reserved_bytes == 200 * MiB and a.allocated_bytes == 160 * MiB
    assert state in a._live


def test_expandable_segments_grow_in_20_mib_granules_and_reuse_the_free_tail():
    a = CachingAllocator(expandable_segments=True)
    x = a.malloc(30 * MiB)
    assert a.reserved_bytes == 40 * MiB  # two granules; 10 MiB free at the tail
    a.malloc(10 * MiB)
    assert a.reserved_bytes == 40 * MiB
    a.free(x)
    a.malloc(45 * MiB)  # the 30 MiB hole is too small; the tail is taken and the map extended
    assert a.reserved_bytes == 100 * MiB  # 45 MiB: three new granules (the tail block is live)
    b = CachingAllocator(expandable_segments=True)
    y = b.malloc(30 * MiB)
    b.free(y)  # the whole mapped range is free: a 50 MiB request takes it and one more granule
    b.malloc(50 * MiB)
    assert b.reserved_bytes == 60 * MiB


def test_classic_segments_are_released_when_the_capacity_is_reached():
    a = CachingAllocator(capacity_bytes=100 * MiB)
    a.free(a.malloc(60 * MiB))
    a.malloc(70 * MiB)  # 60 + 70 > 100: the cached 60 MiB segment is released first
    p = a.peaks()
    assert p.retries == 1 and not p.over_capacity and a.reserved_bytes == 70 * MiB


@pytest.mark.parametrize("expandable", [False, True])
def test_random_sequences_keep_the_allocators_books_straight(expandable):
    rng = random.Random(7)
    a = CachingAllocator(expandable_segments=expandable)
    live = []
    for _ in range(3000):
        if live and rng.random() < 0.45:
            a.free(live.pop(rng.randrange(len(live))))
        else:
            size = rng.choice([rng.randrange(1, 4096), rng.randrange(MiB // 2, 3 * MiB),
                               rng.randrange(5 * MiB, 90 * MiB)])
            live.append(a.malloc(size, rng.choice(["s0", "s1"])))
        assert a.allocated_bytes <= a.reserved_bytes <= a.peak_reserved_bytes
        if rng.random() < 0.02:  # full check: blocks tile every segment, none overlap
            segments = _segments(a)
            assert sum(b.size for chain in segments for b in chain) == a.reserved_bytes
            assert sum(b.size for chain in segments for b in chain if not b.free) == a.allocated_bytes
            for chain in segments:
                for left, right in zip(chain, chain[1:]):
                    assert left.addr + left.size == right.addr
                    assert not (left.free and right.free)  # free neighbours always merged
    for h in live:
        a.free(h)
    assert a.allocated_bytes == 0


def test_a_recorded_trace_replays_as_the_same_calls_made_directly():
    from costmodel.allocator import replay_trace

    # torch's trace names blocks by address; an address freed is handed out again; segment events skipped
    trace = [("segment_alloc", 100, 64 * MiB, 0), ("alloc", 100, 40 * MiB, 0), ("alloc", 200, 24 * MiB, 0),
             ("free_requested", 100, 40 * MiB, 0), ("free_completed", 100, 40 * MiB, 0),
             ("alloc", 100, 30 * MiB, 0), ("alloc", 300, 50 * MiB, 7), ("free_completed", 200, 24 * MiB, 0)]
    direct = CachingAllocator()
    a = direct.malloc(40 * MiB)
    b = direct.malloc(24 * MiB)
    direct.free(a)
    direct.malloc(30 * MiB)
    direct.malloc(50 * MiB, 7)
    direct.free(b)
    assert replay_trace(trace) == direct.peaks()
    assert replay_trace(trace).reserved_bytes == (40 + 24 + 50) * MiB
