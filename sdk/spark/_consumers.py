"""Consumers an executor's Python worker keeps between tasks.

Spark reuses a Python worker for the next task and the next micro-batch, so the consumers
that read ranges read the next ones: kept per configuration, each handed a range (reading
on without a seek when the range starts where the consumer stands, or a little after, the
records between skipped; re-assigned to it otherwise, which discards what it had fetched),
closed after ``IDLE_SECONDS`` unused and at interpreter exit. A consumer whose task failed or
stopped in the middle of a range is closed, never kept.

A kept consumer does not fetch while it waits for its next range. One that stands at the
log end (as after every range of a live query) is unassigned once its range is read: an
assigned consumer there asks the broker for more records again and again, and brokers that
answer at once (noida-db) are asked thousands of times a second (half a core of the worker,
as much of the broker). Kafka and Tansu hold such a fetch open for ``fetch.wait.max.ms``
(500 ms by default), and every request on that connection waits behind it: a consumer
unassigned at the log end is not handed a range again until that fetch has surely ended
(another kept consumer is, or a new one). One that holds the records after its range (a
backlog read in several micro-batches) stays assigned: its full queue stops it fetching,
and the next range reads on from it.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaException, TopicPartition

IDLE_SECONDS = 30.0  # an unused consumer is closed after this long
CHECK_SECONDS = 1.0  # how often idle consumers are looked for
KEPT_PER_CONFIGURATION = 4  # most idle consumers kept for one configuration
DRAIN_BATCH = 10_000  # events drained at once from a consumer being re-assigned
QUEUED_DEFAULT = 100_000  # librdkafka's queued.min.messages

# Prefetch limits sized to a range, used where the user set none: a consumer fetches about
# what its range holds instead of librdkafka's defaults (100,000 records or 64 MiB queued per
# partition), which read far past the end of a small range. A large range reads ahead at
# most ``MOST_QUEUED`` records (a few dozen milliseconds of reading): a consumer whose queue
# holds fewer than that fetches again, and at the log end that fetch comes back empty. Brokers
# that answer such a fetch at once (noida-db) are asked thousands of times a second until the
# queue is read: with a read-ahead of 131,072 records that was the last half of every range
# ending at the log end, about 1 us of the worker's CPU per record and as much of the broker.
FEWEST_QUEUED, MOST_QUEUED = 1_024, 16_384
FETCH_BYTES_PER_RECORD = 1_024
# Never above librdkafka's defaults (50 MiB per fetch, 64 MiB queued per partition).
MOST_FETCH_BYTES = 52_428_800
MOST_QUEUED_KBYTES = 65_536
# A response larger than ``receive.message.max.bytes`` (100 MB by default) is refused by the
# client and fetched again forever. Some brokers (noida-db) answer a fetch with everything
# the partition holds from the offset asked, whatever ``fetch.max.bytes`` says: the limit
# is raised to librdkafka's largest so a large range is still read.
MOST_RESPONSE_BYTES = 2_147_483_647
# A queue that was full is filled again within milliseconds of falling below its limit, not
# after librdkafka's 1 s back-off: a range read on from a kept consumer whose queue holds
# only its start would otherwise wait up to a second for the rest.
QUEUE_FULL_BACKOFF_MS = 10
FETCH_WAIT_DEFAULT_MS = 500  # librdkafka's fetch.wait.max.ms


def fetch_limits(records: int) -> dict[str, str]:
    """Prefetch limits for a range of ``records`` offsets: rounded up to a power of two (so
    ranges of similar sizes share a configuration, and a cached consumer) and clamped."""
    queued = min(MOST_QUEUED, max(FEWEST_QUEUED, 1 << max(0, records - 1).bit_length()))
    fetch = min(MOST_FETCH_BYTES, max(1 << 20, queued * FETCH_BYTES_PER_RECORD))
    return {
        "queued.min.messages": str(queued),
        "queued.max.messages.kbytes": str(
            min(MOST_QUEUED_KBYTES, queued * FETCH_BYTES_PER_RECORD // 1024)
        ),
        "fetch.max.bytes": str(fetch),
        "receive.message.max.bytes": str(MOST_RESPONSE_BYTES),
        "fetch.queue.backoff.ms": str(QUEUE_FULL_BACKOFF_MS),
    }


def sized(config: Mapping[str, str], records: int) -> dict[str, str]:
    """``config`` with the prefetch limits for ``records``; the user's own settings win."""
    return {**fetch_limits(records), **config}


@dataclass
class Reader:
    """A consumer assigned to at most one partition, and where it stands there."""

    consumer: Consumer
    key: tuple[tuple[str, str], ...]
    topic: str = ""
    partition: int = -1
    position: int = -1  # the next offset it hands over; -1 when not known exactly
    # Stays assigned between ranges only with at least this many offsets of the log ahead
    # of its position: its queue's limit (queued.min.messages), which a full queue keeps it
    # from fetching past.
    ahead: int = QUEUED_DEFAULT
    # How long a fetch it sent may be held open by the broker (fetch.wait.max.ms).
    fetch_wait: float = FETCH_WAIT_DEFAULT_MS / 1000
    idle_since: float = field(default_factory=time.monotonic)
    # When no fetch of its last assignment can still hold up its connection.
    quiet_at: float = 0.0
    assignments: int = 0  # how often it was assigned a partition

    def quiet(self, now: float) -> bool:
        return now >= self.quiet_at

    def reads_on_to(self, topic: str, partition: int, start: int) -> bool:
        """Whether the consumer stands at ``start`` of ``topic[partition]`` or a little
        before it, with the records between in its queue (or being fetched into it): fewer
        than its queue holds."""
        return (self.topic, self.partition) == (topic, partition) and (
            0 <= self.position <= start < self.position + self.ahead
        )

    def move_to(self, topic: str, partition: int, start: int) -> int:
        """Readies the consumer to hand over the records of ``topic[partition]`` from
        ``start``; returns the offset it hands over next. That is where it stands when it
        reads on to ``start`` (the records before ``start`` are the reader's to skip, which
        costs less than a new assignment: that discards what the consumer had fetched for its
        previous one, and fetches again), else ``start``, where it is assigned."""
        if self.reads_on_to(topic, partition, start):
            return self.position
        self.unassign()
        self.consumer.assign([TopicPartition(topic, partition, start)])
        self.topic, self.partition, self.position = topic, partition, start
        self.assignments += 1
        return start

    def unassign(self) -> None:
        """Stops the consumer fetching and drops what was queued for its assignment, errors
        included: an error queued there (its log gone, the topic recreated: "offset out of
        range") would otherwise be handed over with the next range's records, and taken for
        its own."""
        if not self.topic:
            return
        self.topic, self.partition, self.position = "", -1, -1
        self.consumer.unassign()
        while self.consumer.consume(DRAIN_BATCH, 0):
            pass

    def rest(self) -> None:
        """Between ranges: stays assigned only while a full queue of the records ahead keeps
        the consumer from fetching (and the next range may read on from it); unassigned
        otherwise, as at the log end, where an assigned consumer fetches without end."""
        if not self.topic:
            return
        end = -1
        if self.position >= 0:
            with contextlib.suppress(KafkaException):
                # The log end of the consumer's last fetch: no request to the broker.
                _, end = self.consumer.get_watermark_offsets(
                    TopicPartition(self.topic, self.partition), cached=True
                )
        if self.position < 0 or end - self.position < self.ahead:
            self.unassign()
            # It may have sent a fetch at the log end just before, which the broker holds.
            self.quiet_at = time.monotonic() + self.fetch_wait


_idle: dict[tuple[tuple[str, str], ...], list[Reader]] = {}
_lock = threading.Lock()
_closer: threading.Thread | None = None


def take(
    config: Mapping[str, str],
    topic: str,
    partition: int,
    start: int,
    create: Callable[[], Consumer],
) -> Reader:
    """A consumer of ``config`` for a range from ``start`` of ``topic[partition]``, the first
    of: a kept one that reads on to ``start`` (``Reader.reads_on_to``; the nearest); a kept
    one without an assignment whose last fetch has surely ended (its queue holds nothing to
    lose, its connection waits for nothing); a new one from ``create`` while fewer than
    ``KEPT_PER_CONFIGURATION`` are kept (the others hold the records after their ranges,
    which the next ranges of their partitions read on from, or a fetch the broker holds
    open); a kept one whose fetch has ended; the one whose fetch ends first. The caller moves
    it to where it reads (``Reader.move_to``)."""
    key = tuple(sorted((k, str(v)) for k, v in config.items()))
    now = time.monotonic()
    with _lock:
        kept = _idle.get(key, [])
        quiet = [r for r in kept if r.quiet(now)]
        chosen = min(
            (r for r in kept if r.reads_on_to(topic, partition, start)),
            key=lambda r: start - r.position,
            default=None,
        ) or next((r for r in reversed(quiet) if not r.topic), None)
        if chosen is None and len(kept) >= KEPT_PER_CONFIGURATION:
            chosen = quiet[0] if quiet else min(kept, key=lambda r: r.quiet_at)
        if chosen is not None:
            kept.remove(chosen)
    if chosen is not None:
        return chosen
    return Reader(
        create(),
        key,
        ahead=int(config.get("queued.min.messages", QUEUED_DEFAULT)),
        fetch_wait=int(config.get("fetch.wait.max.ms", FETCH_WAIT_DEFAULT_MS)) / 1000,
    )


def give_back(reader: Reader, position: int) -> None:
    """Keeps a consumer that read its range to the end; ``position`` is the next offset it
    hands over (-1 when it read past it: it will be re-assigned). It stops fetching unless a
    full queue of the records ahead stops it (``Reader.rest``)."""
    global _closer
    reader.position = position
    reader.rest()
    reader.idle_since = time.monotonic()
    surplus: list[Reader] = []
    with _lock:
        kept = _idle.setdefault(reader.key, [])
        kept.append(reader)
        while len(kept) > KEPT_PER_CONFIGURATION:
            surplus.append(kept.pop(0))
        if _closer is None:
            _closer = threading.Thread(target=_close_idle, name="gated-kafka-idle", daemon=True)
            _closer.start()
    for old in surplus:
        discard(old)


def discard(reader: Reader) -> None:
    """Closes a consumer that is not kept (failed, stopped mid-range, or surplus)."""
    with contextlib.suppress(Exception):  # a broken consumer must not hide the task's error
        reader.consumer.close()


def close_all() -> None:
    """Closes every kept consumer (at interpreter exit)."""
    with _lock:
        readers = [r for kept in _idle.values() for r in kept]
        _idle.clear()
    for reader in readers:
        discard(reader)


def kept() -> int:
    """How many idle consumers are kept."""
    with _lock:
        return sum(len(readers) for readers in _idle.values())


def _close_idle() -> None:
    while True:
        time.sleep(CHECK_SECONDS)
        now = time.monotonic()
        expired: list[Reader] = []
        with _lock:
            for key, readers in list(_idle.items()):
                expired += [r for r in readers if now - r.idle_since >= IDLE_SECONDS]
                readers[:] = [r for r in readers if now - r.idle_since < IDLE_SECONDS]
                if not readers:
                    del _idle[key]
        for reader in expired:
            discard(reader)


atexit.register(close_all)
