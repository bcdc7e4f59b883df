"""Reading the timestamps of a few records, for the ages of records older than the gate.

The gate learns when records arrived from its own history of end offsets (``gate.evaluate._lag``);
records appended before it started are known only as "at least this old" until their own
timestamps are read. :class:`RecordReader` reads them with a consumer of its own (assigned
only, never subscribed, committing nothing); :func:`seed_record_times` asks the gates which
records they want (:meth:`~gate.evaluate._status.GateEvaluator.wanted_times`) and gives them what
was read.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, Protocol

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from gate.evaluate._asked import WANTED_AT_MOST
from gate.evaluate._state import RecordAt
from gate.evaluate._watermark import Partition
from gate.poll._kafkalog import KafkaLog, describe_kafka_error

log = logging.getLogger("gate.poller")


class WantsTimes(Protocol):
    """A gate's evaluator, as far as record timestamps go."""

    def wanted_times(self, limit: int) -> list[RecordAt]: ...

    def seed(self, times: Mapping[RecordAt, float | None]) -> int: ...


RECORD_TIMES_GROUP = "kafka-gate-record-times"
"""The group id of the consumer reading record timestamps (librdkafka requires one): it is
assigned partitions, never subscribes, and never commits, so the group never exists."""
RECORD_TIMES_TIMEOUT = 2.0
"""Seconds one read of record timestamps takes at most (what it got by then is kept)."""
READ_AGAIN_AFTER = 60.0
"""Seconds during which no record timestamps are read after a read failed or timed out."""
SEEK_GAP = 64
"""Records between two offsets asked for on a partition beyond which the reader seeks to the
next one instead of reading on."""
_READER_SETTINGS: dict[str, Any] = {
    "group.id": RECORD_TIMES_GROUP,
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": True,
    # An offset below the log's start (deleted by retention): the first record left, whose
    # offset says so.
    "auto.offset.reset": "earliest",
    # Every record at its offset, as the end offsets count them.
    "isolation.level": "read_uncommitted",
    # Little prefetched, and no long wait for more: a read wants a few records, now (some
    # brokers answer nothing when the wait is much shorter than this).
    "fetch.wait.max.ms": 100,
    "fetch.queue.backoff.ms": 10,
    "max.partition.fetch.bytes": 65536,
    "queued.min.messages": 64,
    "queued.max.messages.kbytes": 1024,
}
_NOT_FOR_READING = frozenset(
    {
        # Group membership: the reader joins no group.
        "group.instance.id",
        "group.protocol",
        "group.remote.assignor",
        "partition.assignment.strategy",
        # Producing: the admin client is a producer's handle to librdkafka; a consumer warns.
        "transactional.id",
        "enable.idempotence",
        "acks",
        "request.required.acks",
        "linger.ms",
        "queue.buffering.max.ms",
        "batch.num.messages",
        "batch.size",
        "compression.type",
        "compression.codec",
        "message.timeout.ms",
        "delivery.timeout.ms",
        "partitioner",
    }
)


class RecordReader:
    """Reads the timestamps of given records with a consumer of its own, created at the first
    read from the admin client's properties (less those of group membership and producing):
    assigned the records' partitions, never subscribed, committing nothing. Errors are
    logged (once while they stay the same), never raised; after a failed or timed-out read,
    nothing is read for ``READ_AGAIN_AFTER`` seconds. One read at a time; :meth:`close` may
    come from another thread during a read (which then closes the consumer as it ends)."""

    def __init__(
        self,
        properties: Mapping[str, Any],
        *,
        timeout: float = RECORD_TIMES_TIMEOUT,
        consumer: Consumer | None = None,
    ) -> None:
        self._properties = reader_properties(properties)
        self._timeout = timeout
        self._consumer = consumer
        self._paused_until = float("-inf")
        self._logged: str | None = None
        self._reading = threading.Lock()
        self._closed = False
        self._errors = ClientErrors(properties.get("error_cb"))
        self._properties["error_cb"] = self._errors

    def read(self, records: Collection[RecordAt]) -> dict[RecordAt, float | None]:
        """Per record read, its timestamp in seconds since the epoch (as the broker gives it:
        the producer's CreateTime or the broker's LogAppendTime), or None when the record is
        gone (deleted by retention or compaction, or a transaction marker) or has no
        timestamp. Records not read (an error, or time ran out) are absent."""
        if not records or self._closed or time.monotonic() < self._paused_until:
            return {}
        with self._reading:
            times, error = self._read(records)
        if self._closed:  # closed during the read
            self.close()
        if error is None:
            self._logged = None
            return times
        self._paused_until = time.monotonic() + READ_AGAIN_AFTER
        if error != self._logged:
            log.warning(
                "cannot read record timestamps (%s): the ages of records older than the gate "
                "stay lower bounds; trying again in %.0f s",
                error,
                READ_AGAIN_AFTER,
            )
            self._logged = error
        return times

    def _read(
        self, records: Collection[RecordAt]
    ) -> tuple[dict[RecordAt, float | None], str | None]:
        try:
            consumer = self._consumer
            if consumer is None:
                consumer = self._consumer = Consumer(
                    self._properties, logger=KafkaLog("gate.kafka")
                )
            return read_times(consumer, records, self._timeout, self._errors)
        except Exception as exc:  # the consumer cannot be created, or a call failed
            return {}, describe_kafka_error(exc)

    def close(self) -> None:
        """Close the consumer now, or as the read in progress ends; read nothing after."""
        self._closed = True
        if self._reading.acquire(blocking=False):
            try:
                self._close_consumer()
            finally:
                self._reading.release()

    def _close_consumer(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            with contextlib.suppress(Exception):
                consumer.close()


class ClientErrors:
    """The consumer's ``error_cb``: notes when no broker can be reached (librdkafka says so
    once, as the last one goes), and passes every error on to ``then`` (one configured)."""

    def __init__(self, then: Any = None) -> None:
        self.then = then if callable(then) else None
        self.unreachable = False

    def __call__(self, error: KafkaError) -> None:
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            self.unreachable = True
        if self.then is not None:
            self.then(error)


def reader_properties(properties: Mapping[str, Any]) -> dict[str, Any]:
    """The record reader's consumer properties, from the admin client's."""
    config = {key: value for key, value in properties.items() if key not in _NOT_FOR_READING}
    config.update(_READER_SETTINGS)
    return config


def offsets_by_partition(records: Collection[RecordAt]) -> dict[Partition, list[int]]:
    """The offsets of ``records`` per partition, each once, in order."""
    found: dict[Partition, set[int]] = {}
    for topic, partition, offset in records:
        if offset >= 0:
            found.setdefault((topic, partition), set()).add(offset)
    return {tp: sorted(offsets) for tp, offsets in found.items()}


def answer(
    tp: Partition,
    offsets: list[int],
    at: int,
    timestamp: float | None,
    found: dict[RecordAt, float | None],
) -> bool:
    """The record at offset ``at`` of ``tp`` (read in order from the first offset asked, or
    from the one sought) answers the offsets asked up to it, removed from ``offsets``: those
    below it are gone (None), ``at`` itself gets ``timestamp``. Returns whether it answered
    any."""
    answered = False
    while offsets and offsets[0] <= at:
        offset = offsets.pop(0)
        found[(tp[0], tp[1], offset)] = timestamp if offset == at else None
        answered = True
    return answered


def timestamp_of(message: Message) -> float | None:
    """A record's timestamp in seconds since the epoch (None: it has none)."""
    kind, milliseconds = message.timestamp()
    if kind == TIMESTAMP_NOT_AVAILABLE or milliseconds < 0:
        return None
    return milliseconds / 1000


def read_times(
    consumer: Consumer,
    records: Collection[RecordAt],
    timeout: float,
    errors: ClientErrors | None = None,
) -> tuple[dict[RecordAt, float | None], str | None]:
    """Read one record per offset asked (see :meth:`RecordReader.read`) within ``timeout``
    seconds (ending at once when ``errors``, the consumer's, says no broker can be reached):
    the timestamps read, and what went wrong (None: nothing)."""
    pending = offsets_by_partition(records)
    found: dict[RecordAt, float | None] = {}
    error: str | None = None
    if errors is not None:
        errors.unreachable = False
    consumer.assign([TopicPartition(t, p, offsets[0]) for (t, p), offsets in pending.items()])
    deadline = time.perf_counter() + timeout  # the read's own stopwatch
    try:
        while pending:
            left = deadline - time.perf_counter()
            if errors is not None and errors.unreachable:
                return found, error or "no broker can be reached"
            if left <= 0:
                return found, error or f"no answer within {timeout:g} s"
            first = consumer.poll(min(left, 0.1))  # as soon as one comes
            if first is None:
                continue
            for message in [first, *consumer.consume(500, 0)]:  # with those already here
                problem = _take(consumer, message, pending, found)
                error = error or problem
    finally:
        consumer.unassign()
    return found, error


def _take(
    consumer: Consumer,
    message: Message,
    pending: dict[Partition, list[int]],
    found: dict[RecordAt, float | None],
) -> str | None:
    """Take one message (or event) of the read: answer the offsets it answers, and seek to
    the next offset asked on its partition when it is far ahead. Returns an error it
    carries."""
    topic, partition = message.topic(), message.partition()
    error = message.error()
    if topic is None or partition is None:
        # The client's own: librdkafka retries what it can (a dropped connection), and the
        # timeout catches what it cannot.
        return error.str() if error is not None and error.fatal() else None
    tp = (topic, partition)
    offsets = pending.get(tp)
    if offsets is None:
        return None
    at = message.offset()
    if at is None:
        return None
    if error is None:
        if not answer(tp, offsets, at, timestamp_of(message), found):
            return None  # a record before the next one asked
    elif error.code() == KafkaError._PARTITION_EOF:
        for offset in [o for o in offsets if o >= at]:  # no record at or past the end
            found[(topic, partition, offset)] = None
            offsets.remove(offset)
    else:
        del pending[tp]
        return f"{topic}[{partition}]: {error.str()}"
    if not offsets:
        del pending[tp]  # (a pause here would outlive the assignment in the client)
    elif error is None and offsets[0] - at > SEEK_GAP:
        with contextlib.suppress(KafkaException):  # then it reads on to it
            consumer.seek(TopicPartition(topic, partition, offsets[0]))
    return None


def seed_record_times(
    evaluators: Iterable[WantsTimes],
    read: Callable[[list[RecordAt]], Mapping[RecordAt, float | None]],
    limit: int = WANTED_AT_MOST,
) -> int:
    """Read, with ``read``, the timestamps of the records the gates want (at most ``limit``,
    each once; see :meth:`gate.evaluate._status.GateEvaluator.wanted_times`) and give them to every
    gate. Nothing is read when no gate wants any: the usual case once the records older than
    the gate are processed. Returns how many records were asked for."""
    gates = list(evaluators)
    wanted: dict[RecordAt, None] = {}
    for evaluator in gates:
        wanted.update(dict.fromkeys(evaluator.wanted_times(limit - len(wanted))))
    if not wanted:
        return 0
    times = read(list(wanted))
    if times:
        for evaluator in gates:
            evaluator.seed(times)
    return len(wanted)
