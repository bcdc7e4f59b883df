"""Consumers an executor's Python worker keeps between tasks.

Spark reuses a Python worker for the next task and the next micro-batch, so the consumer
that read one range reads the next one: kept per configuration, handed the next range
(reading on without a seek when that range starts exactly where the consumer stands,
re-assigned to it otherwise, which discards what it had fetched), closed after
``IDLE_SECONDS`` unused and at interpreter exit. A consumer whose task failed or stopped
in the middle of a range is closed, never kept.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import Consumer, TopicPartition

IDLE_SECONDS = 30.0  # an unused consumer is closed after this long
CHECK_SECONDS = 1.0  # how often idle consumers are looked for
KEPT_PER_CONFIGURATION = 4  # most idle consumers kept for one configuration
DRAIN_BATCH = 10_000  # events drained at once from a consumer being re-assigned

# Prefetch limits sized to a range, used where the user set none: a consumer fetches about
# what its range holds instead of librdkafka's defaults (100,000 records or 64 MiB queued per
# partition), which read far past the end of a small range.
FEWEST_QUEUED, MOST_QUEUED = 1_024, 131_072
FETCH_BYTES_PER_RECORD = 1_024
# Never above librdkafka's defaults (50 MiB per fetch, 64 MiB queued per partition).
MOST_FETCH_BYTES = 52_428_800
MOST_QUEUED_KBYTES = 65_536
# A response larger than ``receive.message.max.bytes`` (100 MB by default) is refused by the
# client and fetched again forever. Some brokers (noida-db) answer a fetch with everything
# the partition holds from the offset asked, whatever ``fetch.max.bytes`` says: the limit
# is raised to librdkafka's largest so a large range is still read.
MOST_RESPONSE_BYTES = 2_147_483_647


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
    idle_since: float = field(default_factory=time.monotonic)

    def move_to(self, topic: str, partition: int, start: int) -> None:
        """Assigns the consumer to ``start``, unless it stands exactly there already: a new
        assignment discards what the consumer had fetched for its previous one."""
        if (self.topic, self.partition, self.position) == (topic, partition, start):
            return
        self.position = -1  # unknown until the assignment is done
        if self.topic:
            # Drop what was queued for the previous assignment, errors included: an error
            # queued there (its log gone, the topic recreated: "offset out of range") would
            # otherwise be handed over with this range's records, and taken for its own.
            self.consumer.unassign()
            while self.consumer.consume(DRAIN_BATCH, 0):
                pass
        self.consumer.assign([TopicPartition(topic, partition, start)])
        self.topic, self.partition, self.position = topic, partition, start


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
    """A consumer of ``config`` for a range from ``start`` of ``topic[partition]``: a kept one
    (preferably one standing there already), else a new one from ``create``. The caller
    moves it to where it reads (``Reader.move_to``)."""
    key = tuple(sorted((k, str(v)) for k, v in config.items()))
    with _lock:
        kept = _idle.get(key, [])
        chosen = next(
            (r for r in kept if (r.topic, r.partition, r.position) == (topic, partition, start)),
            kept[-1] if kept else None,
        )
        if chosen is not None:
            kept.remove(chosen)
    return chosen or Reader(create(), key)


def give_back(reader: Reader, position: int) -> None:
    """Keeps a consumer that read its range to the end; ``position`` is the next offset it
    hands over (-1 when it read past it: it will be re-assigned)."""
    global _closer
    reader.position = position
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
