"""Offset-map encoding: round trips, smallest codec, the size limit, and bad input."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdk.engine._offsets import (
    MAX_METADATA_BYTES,
    OffsetMapError,
    decode_offset_map,
    encode_offset_map,
)

bases = st.integers(0, 2**62)


@st.composite
def maps(draw: st.DrawFn) -> tuple[int, set[int]]:
    base = draw(bases)
    kind = draw(st.sampled_from(["sparse", "dense", "runs"]))
    if kind == "sparse":
        completed = draw(st.sets(st.integers(1, 100_000), max_size=200))
    elif kind == "dense":
        span = draw(st.integers(1, 5000))
        completed = (
            {i for i in range(1, span) if draw(st.booleans())}
            if span < 300
            else set(draw(st.lists(st.integers(1, span), max_size=3000)))
        )
    else:
        completed = set()
        at = 1
        for _ in range(draw(st.integers(0, 30))):
            at += draw(st.integers(0, 500))
            length = draw(st.integers(1, 5000))
            completed.update(range(at, at + length))
            at += length
    return base, {base + c for c in completed}


@settings(max_examples=300)
@given(maps())
def test_round_trip_or_too_big(case: tuple[int, set[int]]) -> None:
    base, completed = case
    text = encode_offset_map(base, completed)
    if not completed:
        assert text == ""
        return
    if text is None:  # only when no encoding fits the limit
        return
    assert len(text.encode()) <= MAX_METADATA_BYTES
    assert decode_offset_map(text) == (base, frozenset(completed))


def test_a_single_stuck_record_with_long_runs_behind_it_is_tiny() -> None:
    text = encode_offset_map(5, range(6, 50_006))
    assert text is not None and len(text) < 40
    assert decode_offset_map(text)[1] == frozenset(range(6, 50_006))


def test_random_maps_that_cannot_fit_are_refused() -> None:
    import random

    rng = random.Random(7)
    completed = {o for o in range(1, 200_000) if rng.random() < 0.5}
    assert encode_offset_map(0, completed) is None
    assert encode_offset_map(0, completed, limit=10**9) is not None


def test_offsets_at_or_below_the_base_are_ignored() -> None:
    assert decode_offset_map(encode_offset_map(10, [3, 10, 11, 13]))[1] == frozenset({11, 13})


@given(st.text(max_size=60))
def test_garbage_is_rejected_cleanly(text: str) -> None:
    with contextlib.suppress(OffsetMapError):
        decode_offset_map(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "hello",
        "om1:x:r:AA",
        "om1:1:z:AA",
        "om1:1:r:!!!",
        "om1:1:R:AAAA",
        "om1:1:r:gA",
        "om2:1:r:AA",
    ],
)
def test_known_bad_maps(text: str) -> None:
    with pytest.raises(OffsetMapError):
        decode_offset_map(text)
