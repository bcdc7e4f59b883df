"""Reading a planned range on an executor: a consumer assigned to it, Arrow record batches."""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from collections.abc import Iterator
from itertools import chain

import numpy as np
import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from pyspark.sql.datasource import InputPartition

from sdk.spark._consumers import Reader, discard, give_back, sized, take
from sdk.spark._plan import OffsetRange, OffsetRanges, data_loss
from sdk.spark._settings import LOG, NAME, Settings

log = logging.getLogger("sdk.spark")
STALL_SECONDS = 120.0  # a task whose consumer does not move for this long fails
CHUNK = 10_000  # most records asked of the consumer at once, and per Arrow record batch
_TIMESTAMP = pa.timestamp("us", tz="UTC")
_HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
_ARROW = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", _TIMESTAMP),
        ("timestampType", pa.int32()),
    ]
)
_ARROW_HEADERS = _ARROW.append(pa.field("headers", _HEADERS))


def read_task(settings: Settings, task: InputPartition, headers: bool) -> Iterator[pa.RecordBatch]:
    """The records of one Spark task: a planned range, or several small ones read one after
    the other (see ``sdk.spark._plan.tasks``)."""
    if isinstance(task, OffsetRanges):
        return _read_ranges(settings, task.ranges, headers)
    assert isinstance(task, OffsetRange)
    return read_range(settings, task, headers)


def _read_ranges(
    settings: Settings, ranges: list[OffsetRange], headers: bool
) -> Iterator[pa.RecordBatch]:
    for task in ranges:  # a task stopped midway closes the consumer of the range it was in
        yield from read_range(settings, task, headers)


def read_range(settings: Settings, task: OffsetRange, headers: bool) -> Iterator[pa.RecordBatch]:
    """The records of one planned range, as Arrow record batches (on an executor), read by a
    consumer this worker keeps between tasks (see ``sdk.spark._consumers``)."""
    config = sized(settings.consumer_config(), task.end - task.start)
    reader: Reader | None = None
    try:
        reader = take(config, task.topic, task.partition, task.start, lambda: _open(config))
        readable = _readable(settings, reader.consumer, task)
        # Where the consumer stands once the range is read (-1: not known exactly).
        stands = reader.position
        if readable.start < readable.end:
            # After the check: a consumer fetching from a start Kafka no longer holds would
            # report it (auto.offset.reset is error) even once moved on.
            stands = reader.move_to(task.topic, task.partition, readable.start)
            chunks = _chunks(settings, reader.consumer, readable, stands)
            for messages, stands in chunks:  # noqa: B007
                if messages:
                    yield record_batch(messages, readable, headers)
        done, reader = reader, None
        give_back(done, stands)
    finally:
        if reader is not None:  # failed or stopped in the middle of the range
            discard(reader)


def _open(config: dict[str, str]) -> Consumer:
    return Consumer({**config, "logger": LOG})


def _readable(settings: Settings, consumer: Consumer, task: OffsetRange) -> OffsetRange:
    """The part of ``task`` Kafka still holds (failOnDataLoss=false), or the range."""
    tp = TopicPartition(task.topic, task.partition)
    try:
        low, _ = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError._UNKNOWN_PARTITION:
            raise
        # A kept consumer knows the topic's partitions as they were when it last read it:
        # a partition added since is unknown to it until it lists them again.
        consumer.list_topics(task.topic, timeout=10)
        try:
            low, _ = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
        except KafkaException as again:
            if again.args[0].code() != KafkaError._UNKNOWN_PARTITION:
                raise
            # Deleted after the batch was planned (the driver says the same at its next plan).
            raise RuntimeError(
                f"{NAME}: topic '{task.topic}' does not exist (or no longer does): "
                f"{task.topic}[{task.partition}] is unknown to the broker"
            ) from None
    if task.start >= low:
        return task
    missing = data_loss(task.topic, task.partition, task.start, min(low, task.end))
    if settings.fail_on_data_loss:
        raise RuntimeError(missing)
    log.warning("%s; skipping them (failOnDataLoss is false)", missing)
    return OffsetRange(task.topic, task.partition, min(low, task.end), task.end)


def _chunks(
    settings: Settings, consumer: Consumer, task: OffsetRange, begin: int
) -> Iterator[tuple[list[Message], int]]:
    """The range's records, in the chunks the consumer hands them over from ``begin`` (the
    range's start, or a little before it where a kept consumer stands: the records before
    the start are skipped), each with the next offset the consumer will hand over (-1 once it
    handed over a record beyond the range). Offsets are not contiguous (transaction markers,
    aborted records, compaction): the range is done when the consumer's position reaches its
    end, whatever record it handed last."""
    tp = TopicPartition(task.topic, task.partition)
    position = begin
    moved = time.monotonic()
    while position < task.end:
        # A batch consume waits for as many records as it asks for, or for the timeout:
        # never ask for more than the range's offsets, and do not wait long for a range
        # holding fewer records than offsets.
        messages = consumer.consume(min(CHUNK, task.end - position), 0.1)
        if any(map(Message.error, messages)):  # rare: checked one by one only then
            messages = _records(messages, task, position)
        beyond = bool(messages) and messages[-1].offset() >= task.end
        if beyond:  # never beyond the planned end: the watermark
            offsets = list(map(Message.offset, messages))
            messages = messages[: bisect_left(offsets, task.end)]
        if messages and messages[0].offset() < task.start:  # skipped: before the range
            offsets = list(map(Message.offset, messages))
            messages = messages[bisect_left(offsets, task.start) :]
        # The position passes the records handed over and the markers and aborted records
        # the consumer skipped.
        reached = consumer.position([tp])[0].offset
        if messages:
            reached = max(reached, messages[-1].offset() + 1)
        if beyond:
            reached = task.end
        if reached > position:
            position, moved = reached, time.monotonic()
            yield messages, -1 if beyond else reached
        elif time.monotonic() - moved > STALL_SECONDS:
            raise RuntimeError(
                f"{NAME}: {task.topic}[{task.partition}]: the reader stayed at offset "
                f"{position} for {STALL_SECONDS:.0f}s, below the planned end {task.end}; "
                f"at isolation.level {settings.kafka['isolation.level']} the offsets "
                "from there are not readable (a transaction still open?)"
            )


def _records(messages: list[Message], task: OffsetRange, position: int) -> list[Message]:
    """The records among ``messages``: end-of-partition events dropped, errors raised. An
    error about another partition is dropped too: a kept consumer may still hand over one
    queued for the range it read before (that partition's log gone, its topic recreated)."""
    records = []
    for message in messages:
        error = message.error()
        if error is None:
            records.append(message)
        elif message.topic() is not None and (message.topic(), message.partition()) != (
            task.topic,
            task.partition,
        ):
            continue
        elif error.code() == KafkaError._AUTO_OFFSET_RESET:
            raise RuntimeError(
                data_loss(task.topic, task.partition, position, task.end) + f" ({error.str()})"
            )
        elif error.code() != KafkaError._PARTITION_EOF:
            raise RuntimeError(f"{NAME}: reading {task.topic}[{task.partition}]: {error.str()}")
    return records


def record_batch(messages: list[Message], task: OffsetRange, headers: bool) -> pa.RecordBatch:
    """One Arrow record batch in the source's schema, built column by column: each column is
    one C-level pass over the messages into a list or a NumPy array, handed to Arrow in bulk
    (no Python object kept per record: the timestamp tuples are consumed as they come)."""
    count = len(messages)
    stamps = np.fromiter(
        chain.from_iterable(map(Message.timestamp, messages)), np.int64, count=2 * count
    ).reshape(count, 2)
    kinds = stamps[:, 0].astype(np.int32)
    missing = kinds == 0  # librdkafka's TIMESTAMP_NOT_AVAILABLE: a null timestamp
    columns = [
        pa.array(list(map(Message.key, messages)), pa.binary()),
        pa.array(list(map(Message.value, messages)), pa.binary()),
        pa.repeat(pa.scalar(task.topic, pa.string()), count),
        pa.repeat(pa.scalar(task.partition, pa.int32()), count),
        pa.array(np.fromiter(map(Message.offset, messages), np.int64, count=count)),
        pa.array(stamps[:, 1] * 1000, _TIMESTAMP, mask=missing if missing.any() else None),
        # The JVM source's codes: 0 CreateTime, 1 LogAppendTime, -1 none (librdkafka: 1, 2, 0).
        pa.array(kinds - 1, pa.int32()),
    ]
    if headers:
        columns.append(pa.array([m.headers() or [] for m in messages], _HEADERS))
    return pa.RecordBatch.from_arrays(columns, schema=_ARROW_HEADERS if headers else _ARROW)
