"""The Redis hash layout round-trips and rejects malformed contents; replicas writing it at
once never move a watermark back."""

from __future__ import annotations

import asyncio

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from gate import GateEvaluator, GateState, PollResult, Snapshot, SnapshotError, snapshot_from_hash
from gate.publish._publish import RedisPublisher
from gate.publish._redis import read_key, snapshot_fields, watermarks_key
from tests.support import unique

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


def replica_state(asked: float, answered: float, watermark: int | None, *, gate: str) -> GateState:
    """The state a replica evaluates from a read of the group's offsets between ``asked``
    and ``answered``."""
    committed = {} if watermark is None else {"g": {("t", 0): watermark}}
    poll = PollResult(
        started_at=asked - 0.05,
        finished_at=answered + 0.01,
        partition_counts={"t": 1},
        end_offsets={("t", 0): 100},
        committed=committed,
        asked_at=asked,
        answered_at=answered,
    )
    return GateEvaluator(gate, ["t"], ["g"]).observe(poll)


def test_replicas_reading_at_once_never_move_a_watermark_back_in_redis(redis_url: str) -> None:
    """Redis refuses a snapshot whose read overlapped the stored one's when it would move a
    watermark back (either read may have seen the newer offsets), and takes one whose read
    began after the stored one's ended (a dependency really rewound); forward it always goes."""
    gate = unique("gate")
    prefix = unique("p")
    key = watermarks_key(prefix, gate)
    client = redis.Redis.from_url(redis_url)

    def stored() -> int | None:
        snapshot = snapshot_from_hash(client.hgetall(key))
        assert snapshot is not None
        return snapshot.watermark("t", 0)

    async def scenario() -> list[bool]:
        publisher = RedisPublisher(redis_url, prefix=prefix)
        try:
            return [
                await publisher.write(replica_state(10.0, 10.2, 37, gate=gate)),
                # Began (10.1) before the stored read ended (10.2): older offsets refused.
                await publisher.write(replica_state(10.1, 10.15, 36, gate=gate)),
                await publisher.write(replica_state(10.12, 10.18, None, gate=gate)),
                # Overlapping but forward: taken.
                await publisher.write(replica_state(10.19, 10.25, 38, gate=gate)),
                # Began after the stored read (10.25) ended: a rewind, taken.
                await publisher.write(replica_state(10.3, 10.31, 20, gate=gate)),
            ]
        finally:
            assert publisher.overlapping_rejections == 2 and publisher.stale_rejections == 0
            await publisher.close()

    written = asyncio.run(scenario())
    assert written == [True, False, False, True, True]
    assert stored() == 20
    assert client.get(read_key(prefix, gate)) == b"10300 10310"
