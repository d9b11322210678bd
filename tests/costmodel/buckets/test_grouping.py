"""costmodel.buckets.grouping: the window of a gradient's bucket (``bucket_window``) contains
every bucket ``group_buckets`` forms, and is the widest run within the cap on each side."""

from __future__ import annotations

import doctest
import random

from costmodel.buckets import grouping
from costmodel.buckets.grouping import bucket_window, group_buckets
from costmodel.mesh import MeshSpec
from costmodel.placements import parse_placements as pp
from costmodel.redistribute_steps import RedistributeStep
from hw_profiles import load

GLOO = load("cpu-gloo")
MESH = MeshSpec((2,))


def test_the_module_examples_run_as_written():
    result = doctest.testmod(grouping)
    assert result.attempted > 0 and result.failed == 0


def _all_reduce(nbytes: int) -> RedistributeStep:
    return RedistributeStep("all_reduce", (0,), nbytes, 1e-3, pp("P(sum)"), pp("R"), reduce_op="sum")


def _random_sequence(rng: random.Random) -> tuple[list[int], list[int], int]:
    """Gradient bytes (some zero, some past the cap), their times (not sorted: a
    gradient's producer need not run in bucket order) and a cap."""
    n = rng.randint(1, 30)
    cap = rng.choice([0, 1, rng.randint(2, 200), rng.randint(200, 5000)])
    sizes = [rng.choice([0, rng.randint(1, 100), rng.randint(1, 2000)]) for _ in range(n)]
    times = [rng.randint(0, 3 * n) for _ in range(n)]
    return sizes, times, cap


def test_every_bucket_lies_inside_each_members_window_on_random_sequences():
    rng = random.Random(53)
    formed = 0
    for _ in range(400):
        sizes, times, cap = _random_sequence(rng)
        names = [f"grad:g{i}" for i in range(len(sizes))]
        items = [(name, "float32", [_all_reduce(b)]) for name, b in zip(names, sizes)]
        position = {name: i for i, name in enumerate(names)}
        for bucket in group_buckets(items, MESH, GLOO, cap):
            formed += 1
            members = [position[m] for m in bucket.members]
            for j in members:
                first, last = bucket_window(sizes, j, cap)
                assert first <= min(members) and max(members) <= last, (sizes, cap, bucket.members, j)
                # what the memory model reads: the latest time a bucket-mate is made
                assert max(times[first:last + 1]) >= max(times[m] for m in members)
    assert formed > 100  # the random cases do form buckets


def test_the_window_is_the_widest_run_within_the_cap_on_each_side():
    rng = random.Random(5353)
    for _ in range(400):
        sizes, _, cap = _random_sequence(rng)
        for j in range(len(sizes)):
            first, last = bucket_window(sizes, j, cap)
            if cap <= 0 or sizes[j] > cap:
                assert (first, last) == (j, j)
                continue
            assert first == min(a for a in range(j + 1) if sum(sizes[a:j + 1]) <= cap)
            assert last == max(b for b in range(j, len(sizes)) if sum(sizes[j:b + 1]) <= cap)


def test_a_bucket_of_one_kind_can_skip_another_kind_past_the_window():
    """The limit the module docstring names: the window is over one kind's sequence."""
    reduce_scatter = RedistributeStep("reduce_scatter", (0,), 100, 1e-3, pp("P(sum)"), pp("S(0)"),
                                      tensor_dim=0, reduce_op="sum")
    items = [("grad:a", "float32", [_all_reduce(10)]), ("grad:b", "float32", [reduce_scatter]),
             ("grad:c", "float32", [_all_reduce(10)])]
    (bucket,) = group_buckets(items, MESH, GLOO, cap=40)
    assert bucket.members == ("grad:a", "grad:c")
    assert bucket_window([10, 100, 10], 0, cap=40) == (0, 0)  # over all gradients: a alone
    assert bucket_window([10, 10], 0, cap=40) == (0, 1)  # over the all_reduce gradients: a and c


def test_every_bucket_lies_inside_each_members_window_with_a_first_cap():
    rng = random.Random(54)
    formed = 0
    for _ in range(400):
        sizes, times, cap = _random_sequence(rng)
        first_cap = rng.choice([0, 1, rng.randint(2, 200), rng.randint(200, 5000)])
        names = [f"grad:g{i}" for i in range(len(sizes))]
        items = [(name, "float32", [_all_reduce(b)]) for name, b in zip(names, sizes)]
        position = {name: i for i, name in enumerate(names)}
        for bucket in group_buckets(items, MESH, GLOO, cap, first_cap=first_cap):
            formed += 1
            members = [position[m] for m in bucket.members]
            for j in members:
                first, last = bucket_window(sizes, j, cap, first_cap=first_cap)
                assert first <= min(members) and max(members) <= last, (sizes, cap, first_cap, bucket.members, j)
                assert max(times[first:last + 1]) >= max(times[m] for m in members)
    assert formed > 100


def test_the_first_cap_closes_only_the_first_bucket_of_each_kind():
    reduce_scatter = RedistributeStep("reduce_scatter", (0,), 10, 1e-3, pp("P(sum)"), pp("S(0)"),
                                      tensor_dim=0, reduce_op="sum")
    items = [(f"grad:a{i}", "float32", [_all_reduce(10)]) for i in range(6)]
    items += [(f"grad:r{i}", "float32", [reduce_scatter]) for i in range(3)]
    buckets = group_buckets(items, MESH, GLOO, cap=30, first_cap=20)
    # a5 and r2 are left alone (a bucket of one is no bucket); each kind starts with a 20-byte bucket
    assert [b.members for b in buckets] == [("grad:a0", "grad:a1"), ("grad:a2", "grad:a3", "grad:a4"),
                                            ("grad:r0", "grad:r1")]
    assert [b.members for b in group_buckets(items, MESH, GLOO, cap=30)][0] == ("grad:a0", "grad:a1", "grad:a2")


def test_a_first_gradient_past_the_first_cap_goes_alone():
    items = [("grad:head", "float32", [_all_reduce(200)])]
    items += [(f"grad:g{i}", "float32", [_all_reduce(10)]) for i in range(3)]
    (bucket,) = group_buckets(items, MESH, GLOO, cap=1000, first_cap=100)
    assert bucket.members == ("grad:g0", "grad:g1", "grad:g2")
