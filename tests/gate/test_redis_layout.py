"""The Redis hash layout round-trips and rejects malformed contents."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gate import Snapshot, SnapshotError, snapshot_from_hash
from gate.publish._redis import snapshot_fields

snapshots = st.builds(
    Snapshot,
    gate=st.from_regex(r"[A-Za-z0-9._-]{1,20}", fullmatch=True),
    version=st.integers(0, 2**53),
    polled_at=st.integers(0, 4_000_000_000_000).map(lambda ms: ms / 1000),
    watermarks=st.dictionaries(
        st.tuples(st.from_regex(r"[A-Za-z0-9._-]{1,12}", fullmatch=True), st.integers(0, 500)),
        st.one_of(st.none(), st.integers(0, 10**15)),
        max_size=30,
    ),
)


@given(snapshots)
def test_hash_round_trips(snapshot: Snapshot) -> None:
    flat = snapshot_fields(snapshot)
    as_redis_returns = {flat[i].encode(): flat[i + 1].encode() for i in range(0, len(flat), 2)}
    assert snapshot_from_hash(as_redis_returns) == snapshot


def test_empty_hash_means_never_published() -> None:
    assert snapshot_from_hash({}) is None


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"version": "1", "polled_at": "2026-01-01T00:00:00Z", "t:0": "1"}, "gate"),
        ({"gate": "g", "version": "x", "polled_at": "2026-01-01T00:00:00Z"}, "version"),
        ({"gate": "g", "version": "1", "polled_at": "nope"}, "polled_at"),
        (
            {"gate": "g", "version": "1", "polled_at": "2026-01-01T00:00:00Z", "t:0": "-3"},
            "watermark",
        ),
        (
            {"gate": "g", "version": "1", "polled_at": "2026-01-01T00:00:00Z", "noseparator": "1"},
            "field",
        ),
        (
            {"gate": "g", "version": "1", "polled_at": "2026-01-01T00:00:00Z", b"t:0": b"\xff"},
            "UTF-8",
        ),
    ],
)
def test_malformed_hashes_raise_snapshot_error(fields, message: str) -> None:
    with pytest.raises(SnapshotError, match=message):
        snapshot_from_hash(fields)
