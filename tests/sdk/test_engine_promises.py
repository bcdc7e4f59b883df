"""Promises of the engine in the paths that are easy to miss, on a real broker: watermarks
that go down, failures that repeat, transactional topics, partitions that come back from
another member, a handler that stops the consumer, and batches that fail for good."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import tracemalloc
from typing import Any

import pytest

from sdk import Gate, Options, Ordering, ParallelConsumer, Record, RetriableError, TerminalError
from tests.sdk.engine_support import CONSUMER, FedSource, Recorder, read_all, start_engine
from tests.support import Kafka, aborted_records_visible, transactions, unique, wait_until

# ---- a watermark that goes down --------------------------------------------------------


def test_a_lowered_watermark_holds_back_records_already_handed_to_a_worker(kafka: Kafka) -> None:
    """One key, so a worker takes a long run of its records at once; the dependency rewinds
    while that run is under way. From the moment the engine applies the lower watermark, no
    record at or beyond it starts: the rest of the run goes back and waits, in order."""
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 120}, key=lambda p, i: b"one")
    source = FedSource()
    gate = Gate("g", source).start()
    source.send(1, {(topic, 0): 100})
    recorder = Recorder(sleep=lambda record: 0.02)
    engine = ParallelConsumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": unique("rewind"), **CONSUMER},
        [topic],
        recorder,
        Options(ordering=Ordering.KEY, max_concurrency=2),
        gate=gate,
        registry=None,
    ).start()
    try:
        wait_until(lambda: len(recorder.done()) >= 10, timeout=30, what="the first records")
        source.send(2, {(topic, 0): 20})
        wait_until(
            lambda: engine.core.partitions[(topic, 0)].limit == 20,
            timeout=10,
            what="the lower watermark applied",
        )
        applied = time.monotonic()
        time.sleep(1.0)
        late = [c.offset for c in recorder.calls if c.start > applied and c.offset >= 20]
        assert not late, f"records {late} started under a watermark of 20"
        source.send(3, {(topic, 0): 120})
        wait_until(lambda: len(recorder.done()) == 120, timeout=60, what="every record")
    finally:
        engine.stop()
        gate.stop()
    assert recorder.offsets(0) == sorted(recorder.offsets(0)), "the run lost its order"
    assert len(recorder.offsets(0)) == 120, "a record ran twice"


# ---- failures keep nothing alive ---------------------------------------------------------

VALUE = 10_000
BUFFER = 100


@pytest.mark.parametrize("handler", ["thread", "coroutine", "batch"])
def test_records_that_failed_and_were_retried_are_not_kept_in_memory(
    kafka: Kafka, handler: str
) -> None:
    """Every record fails once, then succeeds: once all are done, the memory Python holds is
    within the documented bound (the buffer plus one share of records), not the records that
    ever failed (a kept exception's traceback holds the worker's frames, and their locals
    hold whole items)."""
    count = 1500
    topic = kafka.create_topic(1)
    producer = kafka.producer(**{"batch.num.messages": 100, "linger.ms": 5})
    for i in range(count):
        producer.produce(topic, value=bytes([i % 256]) * VALUE, key=b"k%d" % (i % 7), partition=0)
    producer.flush(30)
    seen: set[int] = set()
    lock = threading.Lock()

    def first_attempt_fails(record: Record) -> None:
        with lock:
            if record.offset not in seen:
                seen.add(record.offset)
                payload = record.value  # a local of the frame the traceback keeps
                raise RetriableError(f"once ({len(payload)} bytes)")

    handlers: dict[str, Any] = {
        "thread": first_attempt_fails,
        "coroutine": _coroutine(first_attempt_fails),
        "batch": lambda records: [first_attempt_fails(r) for r in records],
    }
    options = Options(
        ordering=Ordering.KEY,
        max_buffered=BUFFER,
        retry_delay=lambda attempt, error: 0.0,
        batch_size=10 if handler == "batch" else None,
    )
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        engine = start_engine(kafka.bootstrap, topic, handlers[handler], options)
        try:
            wait_until(
                lambda: kafka.committed(engine.group, topic, 1) == {0: count},
                timeout=120,
                what="every record processed and committed",
            )
            gc.collect()
            kept = tracemalloc.get_traced_memory()[0] - before
        finally:
            engine.stop()
    finally:
        tracemalloc.stop()
    bound = 2 * BUFFER * VALUE  # the buffer plus one share (one partition: its share)
    assert kept <= bound, f"{kept / 1e6:.1f} MB kept after {count} records, bound {bound / 1e6} MB"


def _coroutine(handler: Any) -> Any:
    async def handle(record: Record) -> None:
        await asyncio.sleep(0)
        handler(record)

    return handle


# ---- a failing record holds back its own key only -------------------------------------------


@pytest.mark.parametrize("ordering", [Ordering.KEY, Ordering.UNORDERED])
@pytest.mark.parametrize("error", [RetriableError("again"), TerminalError("never")])
def test_a_record_that_keeps_failing_holds_back_only_its_own_key(
    kafka: Kafka, ordering: Ordering, error: Exception
) -> None:
    """3,000 records over 50 keys, a buffer of 500; offset 10 fails on every attempt (or for
    good, with no dead-letter topic: held). Every other key's records are processed (in
    UNORDERED, every other record), far beyond the buffer; the commit stays at 10."""
    topic = kafka.create_topic(1)
    producer = kafka.producer(**{"batch.num.messages": 500, "linger.ms": 5})
    for i in range(3000):
        producer.produce(topic, value=b"v", key=b"k%d" % (i % 50), partition=0)
    producer.flush(30)
    recorder = Recorder(fail=lambda record: error if record.offset == 10 else None)
    options = Options(
        ordering=ordering, max_buffered=500, retry_delay=lambda attempt, e: 0.05, max_concurrency=8
    )
    engine = start_engine(kafka.bootstrap, topic, recorder, options)
    held_back = {i for i in range(10, 3000) if i % 50 == 10} if ordering is Ordering.KEY else {10}
    try:
        wait_until(
            lambda: len(recorder.done()) == 3000 - len(held_back),
            timeout=120,
            what="every record but those held behind offset 10",
        )
        wait_until(
            lambda: (
                engine.stats().get("partitions", {}).get((topic, 0), {}).get("committable") == 10
            ),
            timeout=10,
            what="the commit waiting at offset 10",
        )
    finally:
        engine.stop(drain=False)
    done = {offset for _, offset in recorder.done()}
    assert not done & held_back
    assert kafka.committed(engine.group, topic, 1) in ({}, {0: 10})


# ---- transactional topics ------------------------------------------------------------------


@pytest.mark.parametrize("aborted", [False, True], ids=["committed", "with-aborted"])
def test_the_commit_passes_transaction_markers_and_aborted_records(
    kafka: Kafka, aborted: bool
) -> None:
    """Committed transactions of 20 and 10 records (with an aborted one of 5 between them):
    the engine (read_committed, librdkafka's default) processes the 30 committed records and
    commits the end of the partition, past the markers, as a plain consumer would (lag 0)."""
    topic = kafka.create_topic(1)
    middle = [("abort", 5)] if aborted else []
    transactions(kafka, topic, ("commit", 20), *middle, ("commit", 10))
    if aborted and aborted_records_visible(kafka, topic):
        pytest.skip(f"{kafka.broker.name} hands aborted records to read_committed consumers")
    end = _end_offset(kafka, topic)
    assert end == (38 if aborted else 32), f"the log should end after its markers, at {end}"
    recorder = Recorder()
    engine = start_engine(kafka.bootstrap, topic, recorder, Options())
    try:
        wait_until(lambda: len(recorder.done()) == 30, timeout=60, what="the committed records")
        wait_until(
            lambda: kafka.committed(engine.group, topic, 1) == {0: end},
            timeout=20,
            what=f"the commit at the end of the partition ({end})",
        )
    finally:
        engine.stop()
    assert len(recorder.calls) == 30, "an aborted record was processed"


def test_whether_the_broker_hides_aborted_records_from_read_committed_consumers(
    kafka: Kafka,
) -> None:
    """Tansu 0.6 hands aborted records to read_committed consumers (the test above skips
    there): this fails once a Tansu that hides them is in use, so its skip can go."""
    topic = kafka.create_topic(1)
    transactions(kafka, topic, ("commit", 2), ("abort", 2), ("commit", 1))
    assert aborted_records_visible(kafka, topic) == (kafka.broker.name == "tansu")


def _end_offset(kafka: Kafka, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    reader = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": unique("end")})
    try:
        return int(reader.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
    finally:
        reader.close()


# ---- committed offsets are the group's ------------------------------------------------------


def test_stats_show_the_groups_committed_offset_after_another_member_moved_it(
    kafka: Kafka,
) -> None:
    """The group's offset moved while this member was away (another member processed 50
    more records): the partition comes back idle, and stats and the committed-offset metric
    show the broker's offset, not this member's last commit."""
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 50})
    group = unique("moved")
    recorder = Recorder()
    engine = start_engine(kafka.bootstrap, topic, recorder, Options(), group=group)
    try:
        wait_until(lambda: kafka.committed(group, topic, 1) == {0: 50}, timeout=30, what="50")
    finally:
        engine.stop()
    kafka.produce(topic, {0: 50})
    kafka.commit(group, topic, {0: 100})  # another member's progress
    engine = start_engine(kafka.bootstrap, topic, recorder, Options(), group=group)
    try:
        wait_until(
            lambda: (
                engine.stats().get("partitions", {}).get((topic, 0), {}).get("committed") == 100
            ),
            timeout=30,
            what="stats showing the group's offset (100)",
        )
    finally:
        engine.stop()
    assert len(recorder.calls) == 50


# ---- stop() from a handler ------------------------------------------------------------------


def test_stop_called_from_a_handler_returns_at_once_and_its_record_is_committed(
    kafka: Kafka,
) -> None:
    """ "Stop after this record": the handler of offset 5 calls ``stop()``. The call returns
    at once (it cannot wait for the record that calls it), the record completes normally,
    and the commit includes it."""
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 20})
    returned = threading.Event()
    engine: ParallelConsumer | None = None

    def handler(record: Record) -> None:
        if record.offset == 5:
            assert engine is not None
            engine.stop()
            returned.set()

    engine = start_engine(
        kafka.bootstrap, topic, handler, Options(ordering=Ordering.PARTITION, max_concurrency=1)
    )
    try:
        wait_until(returned.is_set, timeout=10, what="stop() returning inside the handler")
        wait_until(lambda: not engine.running, timeout=30, what="the consumer stopped")
    finally:
        engine.stop()
    committed = kafka.committed(engine.group, topic, 1)
    assert committed.get(0, 0) >= 6, (
        f"the record that stopped the consumer was not committed: {committed}"
    )


# ---- batches that fail for good -------------------------------------------------------------


def test_a_batch_failing_for_good_dead_letters_only_the_records_that_fail_alone(
    kafka: Kafka,
) -> None:
    """A batch handler raises ``TerminalError`` whenever its batch holds offset 7: the batch's
    records are tried again one at a time, and only offset 7 reaches the dead-letter topic;
    its healthy siblings are processed."""
    topic, dlt = kafka.create_topic(1), kafka.create_topic(1)
    kafka.produce(topic, {0: 40}, key=lambda p, i: b"k%d" % i)
    processed: list[int] = []
    lock = threading.Lock()

    def handle(records: list[Record]) -> None:
        if any(r.offset == 7 for r in records):
            raise TerminalError("offset 7 cannot be processed")
        with lock:
            processed.extend(r.offset for r in records)

    options = Options(ordering=Ordering.KEY, batch_size=10, dead_letter_topic=dlt)
    engine = start_engine(kafka.bootstrap, topic, handle, options)
    try:
        wait_until(
            lambda: kafka.committed(engine.group, topic, 1) == {0: 40},
            timeout=60,
            what="every record done",
        )
    finally:
        engine.stop()
    letters = read_all(kafka.bootstrap, dlt, 1, 1, timeout=5)
    assert [dict(m.headers())["dlt.original.offset"] for m in letters] == [b"7"]
    assert sorted(processed) == [i for i in range(40) if i != 7]
