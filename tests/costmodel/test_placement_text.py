"""costmodel.placements: the short text form (docs/design.md, "Notation") parses and prints back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from costmodel.placements import (
    Partial,
    PlacementParseError,
    Replicate,
    Shard,
    StridedShard,
    format_placements,
    parse_placement,
    parse_placements,
)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("S(0)R", (Shard(0), Replicate())),
        ("P(sum)S(1)", (Partial("sum"), Shard(1))),
        ("_S(0,sf=2)", (StridedShard(0, 2),)),
        ("RR", (Replicate(), Replicate())),
        ("P(avg)P(max)P(min)", (Partial("avg"), Partial("max"), Partial("min"))),
    ],
)
def test_design_examples_parse(text, expected):
    assert parse_placements(text) == expected
    assert format_placements(expected) == text


_ONE = st.one_of(
    st.just(Replicate()),
    st.builds(Shard, st.integers(0, 5)),
    st.builds(StridedShard, st.integers(0, 5), st.integers(1, 16)),
    st.builds(Partial, st.sampled_from(["sum", "avg", "max", "min"])),
)


@given(st.lists(_ONE, min_size=1, max_size=4))
def test_format_then_parse_is_identity(placements):
    assert parse_placements(format_placements(placements)) == tuple(placements)


@pytest.mark.parametrize("text,fragment", [("S(0)X", "position 4"), ("P(prod)", "reduce op"), ("", "empty"), ("_S(0,sf=0)", "split factor")])
def test_bad_text_is_rejected_with_a_pointer(text, fragment):
    with pytest.raises(PlacementParseError, match=fragment):
        parse_placements(text)


def test_parse_placement_requires_exactly_one():
    assert parse_placement("S(3)") == Shard(3)
    with pytest.raises(PlacementParseError, match="one placement"):
        parse_placement("RR")
