"""Reading planned ranges on executors: the tasks of a batch, Arrow batches, cached consumers."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("pyspark")

from sdk.spark._plan import OffsetRange, OffsetRanges, Offsets, ranges, shared, tasks
from sdk.spark._read import read_range, record_batch
from sdk.spark._settings import Settings
from tests.support import KEEP_FOREVER, Kafka, unique, wait_until

partition_ranges = st.dictionaries(
    st.sampled_from(["a", "b"]),
    st.dictionaries(
        st.integers(0, 5).map(str),
        st.tuples(st.integers(0, 1_000), st.integers(0, 400)),
        max_size=4,
    ),
    max_size=2,
)


def offsets(planned: dict[str, dict[str, tuple[int, int]]]) -> tuple[Offsets, Offsets]:
    start = {t: {p: first for p, (first, _) in parts.items()} for t, parts in planned.items()}
    end = {t: {p: first + n for p, (first, n) in parts.items()} for t, parts in planned.items()}
    return start, end


@given(
    partition_ranges,
    st.one_of(st.none(), st.integers(1, 300)),
    st.one_of(st.none(), st.integers(1, 40)),
)
def test_tasks_cover_each_range_exactly_and_respect_the_limits(
    planned: dict[str, dict[str, tuple[int, int]]],
    maximum: int | None,
    minimum: int | None,
) -> None:
    start, end = offsets(planned)
    tasks = ranges(start, end, maximum, minimum)
    for topic, parts in planned.items():
        for partition, (first, count) in parts.items():
            mine = [
                (t.start, t.end) for t in tasks if (t.topic, t.partition) == (topic, int(partition))
            ]
            covered = [o for begin, stop in mine for o in range(begin, stop)]
            assert covered == list(range(first, first + count))
            assert all(begin < stop for begin, stop in mine)
    assert {(t.topic, str(t.partition)) for t in tasks} <= {
        (t, p) for t, parts in planned.items() for p in parts
    }
    if maximum is not None:
        assert all(t.end - t.start <= maximum for t in tasks)
    records = sum(n for parts in planned.values() for _, n in parts.values())
    if minimum is not None:
        assert len(tasks) >= min(minimum, records)
    # Deterministic: a replayed batch plans the identical tasks.
    again = ranges(start, end, maximum, minimum)
    assert [(t.topic, t.partition, t.start, t.end) for t in again] == [
        (t.topic, t.partition, t.start, t.end) for t in tasks
    ]


def test_one_task_per_partition_unless_a_range_is_large() -> None:
    start: Offsets = {"t": {"0": 0, "1": 10, "2": 5}}
    end: Offsets = {"t": {"0": 250_000, "1": 20, "2": 5}}
    assert [(t.partition, t.start, t.end) for t in ranges(start, end, None)] == [
        (0, 0, 250_000),
        (1, 10, 20),
    ]
    # Split evenly: three tasks of 83,334 / 83,333 / 83,333, never one small remainder.
    split = ranges(start, end, 100_000)
    assert [(t.partition, t.start, t.end) for t in split] == [
        (0, 0, 83_334),
        (0, 83_334, 166_667),
        (0, 166_667, 250_000),
        (1, 10, 20),
    ]


def test_min_partitions_splits_the_largest_ranges_first() -> None:
    start: Offsets = {"t": {"0": 0, "1": 0}}
    end: Offsets = {"t": {"0": 300, "1": 100}}
    tasks = ranges(start, end, None, 4)
    assert [(t.partition, t.start, t.end) for t in tasks] == [
        (0, 0, 100),
        (0, 100, 200),
        (0, 200, 300),
        (1, 0, 100),
    ]
    # Never more tasks than records.
    assert len(ranges({"t": {"0": 0}}, {"t": {"0": 3}}, None, 10)) == 3


@given(partition_ranges, st.integers(1, 500))
def test_small_ranges_share_tasks_and_every_range_is_read_once(
    planned: dict[str, dict[str, tuple[int, int]]], fewest: int
) -> None:
    start, end = offsets(planned)
    planned_ranges = ranges(start, end, None)
    found = shared(planned_ranges, fewest)
    groups = [task.ranges for task in found if isinstance(task, OffsetRanges)]
    flat = [
        r for task in found for r in (task.ranges if isinstance(task, OffsetRanges) else [task])
    ]
    assert sorted(r.value for r in flat) == sorted(r.value for r in planned_ranges)  # once each
    for group in groups:
        sizes = [r.end - r.start for r in group]
        # Only small ranges share a task, and a shared task takes none once it holds fewest.
        assert len(group) > 1 and max(sizes) < fewest and sum(sizes[:-1]) < fewest


def test_a_live_batch_is_one_task_and_a_backlog_keeps_a_task_per_partition() -> None:
    """A Spark task costs tens of milliseconds of scheduling, and a batch's tasks beyond the
    cores run in waves: a live query's batch of a few records per partition is one task,
    large ranges keep a task each, and maxRecordsPerPartition and minPartitions still set
    the tasks when given."""
    start: Offsets = {"t": {"0": 100, "1": 200, "2": 300}}
    live: Offsets = {"t": {"0": 117, "1": 215, "2": 320}}
    (task,) = tasks(start, live, None)
    assert isinstance(task, OffsetRanges)
    assert [(r.partition, r.start, r.end) for r in task.ranges] == [
        (0, 100, 117),
        (1, 200, 215),
        (2, 300, 320),
    ]
    backlog: Offsets = {"t": {"0": 60_100, "1": 60_200, "2": 60_300}}
    assert [(t.partition, t.start, t.end) for t in tasks(start, backlog, None)] == [  # type: ignore[attr-defined]
        (0, 100, 60_100),
        (1, 200, 60_200),
        (2, 300, 60_300),
    ]
    # maxOffsetsPerTrigger a quarter of a backlog of 100,000 records in each of 4 partitions:
    # two tasks of two ranges each, one wave on two cores instead of two.
    four: Offsets = {"t": {str(p): 0 for p in range(4)}}
    quarter: Offsets = {"t": {str(p): 25_001 for p in range(4)}}
    assert [[r.partition for r in t.ranges] for t in tasks(four, quarter, None)] == [  # type: ignore[attr-defined]
        [0, 1],
        [2, 3],
    ]
    assert len(tasks(start, live, 100)) == 3
    assert len(tasks(start, live, None, 2)) == 3


# ---- reading ranges with a consumer the worker keeps ------------------------------------


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    """The consumers the reader opens (real ones), with none kept from earlier tests."""
    import sdk.spark._read as read_module
    from sdk.spark import _consumers

    _consumers.close_all()
    consumers: list[object] = []
    real = read_module._open

    def recording(config: dict[str, str]) -> object:
        consumers.append(real(config))
        return consumers[-1]

    monkeypatch.setattr(read_module, "_open", recording)
    yield consumers
    _consumers.close_all()


def settings(kafka: Kafka, topic: str, **options: str) -> Settings:
    return Settings(
        {"kafka.bootstrap.servers": kafka.bootstrap, "subscribe": topic, "gate.enabled": "false"}
        | options
    )


def read(given: Settings, topic: str, partition: int, start: int, end: int) -> list[str]:
    batches = read_range(given, OffsetRange(topic, partition, start, end), headers=False)
    return [
        f"{partition}@{offset}={value.decode()}"
        for batch in batches
        for offset, value in zip(
            batch.column("offset").to_pylist(), batch.column("value").to_pylist(), strict=True
        )
    ]


def expected(partition: int, start: int, end: int) -> list[str]:
    return [f"{partition}@{i}={partition}:{i}" for i in range(start, end)]


def test_one_kept_consumer_reads_adjacent_and_overlapping_ranges_exactly(
    kafka: Kafka, opened: list[object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The consumer kept after a range has fetched past its end: the next range must get
    exactly its own records, whether it starts where the last one ended (read on), before it
    (overlapping: re-assigned, the prefetched records discarded) or on another partition."""
    from sdk.spark import _consumers

    monkeypatch.setattr(_consumers, "KEPT_PER_CONFIGURATION", 1)  # re-assigned, never a new one

    topic = kafka.create_topic(2)
    # Every range leaves more records after it than its consumer queues (1,024): the consumer
    # stays assigned between ranges, its queue full (see the next tests for the log end).
    kafka.produce(topic, {0: 5_000, 1: 2_000})
    given = settings(kafka, topic)
    for partition, start, end in [
        (0, 0, 100),
        (0, 100, 200),  # adjacent
        (0, 50, 150),  # overlapping, before where the consumer stands
        (0, 120, 130),  # inside the last one
        (0, 2_000, 2_010),  # ahead
        (1, 0, 300),  # another partition
        (0, 130, 140),  # back to the first one
        (1, 300, 500),
    ]:
        assert read(given, topic, partition, start, end) == expected(partition, start, end)
        assert _consumers.kept() == 1
    # Ranges of a size class share one consumer (1,024 offsets or fewer).
    assert len(opened) == 1


def test_a_shared_task_reads_each_of_its_ranges(kafka: Kafka, opened: list[object]) -> None:
    from sdk.spark._read import read_task

    topic = kafka.create_topic(3)
    kafka.produce(topic, {0: 20, 1: 20, 2: 20})
    given = settings(kafka, topic)
    (task,) = tasks({topic: {"0": 3, "1": 0, "2": 10}}, {topic: {"0": 20, "1": 5, "2": 20}}, None)
    assert isinstance(task, OffsetRanges)
    values = [
        f"{p}@{o}={v.decode()}"
        for batch in read_task(given, task, headers=False)
        for p, o, v in zip(
            batch.column("partition").to_pylist(),
            batch.column("offset").to_pylist(),
            batch.column("value").to_pylist(),
            strict=True,
        )
    ]
    assert values == expected(0, 3, 20) + expected(1, 0, 5) + expected(2, 10, 20)


def test_a_range_stopped_or_failed_midway_closes_its_consumer(
    kafka: Kafka, opened: list[object]
) -> None:
    from sdk.spark import _consumers

    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 30_000})
    given = settings(kafka, topic)
    batches = read_range(given, OffsetRange(topic, 0, 0, 30_000), headers=False)
    next(batches)  # the first chunk of records; Spark stops the task there
    batches.close()
    assert _consumers.kept() == 0
    with pytest.raises(RuntimeError, match="closed"):
        opened[-1].assignment()  # type: ignore[attr-defined]
    with pytest.raises(Exception, match=r"(?i)unknown|partition"):
        list(read_range(given, OffsetRange(topic, 7, 0, 10), headers=False))
    assert _consumers.kept() == 0
    with pytest.raises(RuntimeError, match="closed"):
        opened[-1].assignment()  # type: ignore[attr-defined]
    # The next range gets a new consumer and reads exactly.
    assert read(given, topic, 0, 5, 15) == expected(0, 5, 15)
    assert len(opened) == 3


def test_a_range_of_a_topic_deleted_since_its_plan_says_the_topic_does_not_exist(
    kafka: Kafka, opened: list[object]
) -> None:
    """A topic deleted between the driver's plan and the executor's read (a loaded machine
    starts a task seconds after its plan) fails the task with the driver's own words, not
    with librdkafka's "Unknown partition"."""
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 10})
    given = settings(kafka, topic)
    assert read(given, topic, 0, 0, 5) == expected(0, 0, 5)  # a consumer kept, knowing it
    for future in kafka.admin.delete_topics([topic]).values():
        future.result(10)
    wait_until(
        lambda: topic not in kafka.admin.list_topics(timeout=5).topics, what="the topic deleted"
    )
    with pytest.raises(RuntimeError, match=f"topic '{topic}' does not exist"):
        read(given, topic, 0, 5, 10)


def test_a_kept_consumer_reads_a_partition_added_since(kafka: Kafka, opened: list[object]) -> None:
    """A kept consumer knows its topic's partitions as they were when it last read it: a
    partition added since is listed again, not taken for one that does not exist."""
    from confluent_kafka.admin import NewPartitions

    from sdk.spark import _consumers

    if not kafka.broker.adds_partitions:
        pytest.skip(f"{kafka.broker.name} cannot add partitions to a topic")
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 10})
    given = settings(kafka, topic)
    assert read(given, topic, 0, 0, 10) == expected(0, 0, 10)
    for future in kafka.admin.create_partitions([NewPartitions(topic, 2)]).values():
        future.result(10)
    wait_until(
        lambda: len(kafka.admin.list_topics(topic, timeout=5).topics[topic].partitions) == 2,
        what="the partition added",
    )
    kafka.produce(topic, {1: 5})
    kept = [r for readers in _consumers._idle.values() for r in readers]
    wait_until(lambda: all(r.quiet(time.monotonic()) for r in kept), what="the kept one free")
    assert read(given, topic, 1, 0, 5) == expected(1, 0, 5)
    assert len(opened) == 1  # the kept consumer read it


def test_idle_consumers_are_closed(
    kafka: Kafka, opened: list[object], monkeypatch: pytest.MonkeyPatch
) -> None:
    from sdk.spark import _consumers

    monkeypatch.setattr(_consumers, "IDLE_SECONDS", 0.5)
    monkeypatch.setattr(_consumers, "CHECK_SECONDS", 0.1)
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 10})
    assert read(settings(kafka, topic), topic, 0, 0, 10) == expected(0, 0, 10)
    wait_until(lambda: _consumers.kept() == 0, what="the idle consumer closed", timeout=20)
    with pytest.raises(RuntimeError, match="closed"):
        opened[-1].assignment()  # type: ignore[attr-defined]


# ---- a kept consumer between micro-batches: no requests while it waits ------------------


class Requests:
    """The requests a consumer sent, by kind (librdkafka's statistics, summed over brokers),
    as of its latest statistics and at each statistics' time; served by polling the
    consumer."""

    def __init__(self) -> None:
        self.latest: dict[str, int] = {}
        # (when the statistics were taken, on the monotonic clock in seconds; the counts)
        self.history: list[tuple[float, dict[str, int]]] = []

    def record(self, stats: str) -> None:
        import json

        counts: dict[str, int] = {}
        parsed = json.loads(stats)
        for broker in parsed.get("brokers", {}).values():
            for kind, count in broker.get("req", {}).items():
                counts[kind] = counts.get(kind, 0) + count
        self.latest = counts
        # librdkafka's ``ts`` is its monotonic clock in microseconds, Python's on Linux.
        self.history.append((parsed["ts"] / 1e6, counts))

    def sent_within(self, kind: str, begin: float, end: float) -> int:
        """The requests of ``kind`` sent between the first statistics taken at or after
        ``begin`` and the last taken at or before ``end`` (monotonic seconds)."""
        inside = [counts.get(kind, 0) for at, counts in self.history if begin <= at <= end]
        assert len(inside) >= 2, f"statistics within the window: {len(inside)}"
        return inside[-1] - inside[0]

    def sent(self, consumer: object, kind: str, seconds: float) -> int:
        """Polls ``consumer`` (which must have nothing to hand over) for ``seconds``: the
        requests of ``kind`` it sent meanwhile."""
        consumer.poll(0.3)  # type: ignore[attr-defined]
        before = self.latest.get(kind, 0)
        assert self.latest, "no statistics from the consumer"
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            assert consumer.poll(0.1) is None, "the consumer handed over a record"  # type: ignore[attr-defined]
        return self.latest.get(kind, 0) - before


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[list[object], list[Requests]]]:
    """The consumers the reader opens (real ones, none kept from earlier tests), each with
    the requests it sends counted."""
    import sdk.spark._read as read_module
    from sdk.spark import _consumers
    from sdk.spark._settings import LOG

    _consumers.close_all()
    consumers: list[object] = []
    requests: list[Requests] = []

    def counting(config: dict[str, str]) -> object:
        from confluent_kafka import Consumer

        requests.append(Requests())
        stats = {"statistics.interval.ms": 50, "stats_cb": requests[-1].record}
        consumers.append(Consumer({**config, **stats, "logger": LOG}))
        return consumers[-1]

    monkeypatch.setattr(read_module, "_open", counting)
    yield consumers, requests
    _consumers.close_all()


def test_a_consumer_kept_at_the_log_end_sends_no_fetch_while_it_waits(
    kafka: Kafka, counted: tuple[list[object], list[Requests]]
) -> None:
    """Every range of a live query ends at the log end. A consumer left assigned there asks
    for more records again and again while it waits for its next range: Tansu and Kafka hold
    each fetch for ``fetch.wait.max.ms`` (500 ms by default), and the next range's requests
    on that connection wait behind it; noida-db answers at once, thousands of times a second
    (half a core of the worker and as much of the broker). That was about a second of every
    micro-batch; the consumer now stops fetching once its range is read."""
    from confluent_kafka import TopicPartition

    from sdk.spark import _consumers

    consumers, requests = counted
    topic = kafka.create_topic(2)
    kafka.produce(topic, {0: 60, 1: 40})
    given = settings(kafka, topic)
    for partition, start, end in [(0, 0, 60), (1, 0, 40), (0, 60, 60)]:
        assert read(given, topic, partition, start, end) == expected(partition, start, end)
        assert _consumers.kept() == 1 and len(consumers) == 1
        assert requests[0].sent(consumers[0], "Fetch", 1.0) == 0
        assert consumers[0].assignment() == []  # type: ignore[attr-defined]
    # The next micro-batch's range is read as before, by the same consumer.
    kafka.produce(topic, {0: 5})
    assert read(given, topic, 0, 60, 65) == [f"0@{60 + i}=0:{i}" for i in range(5)]
    assert len(consumers) == 1
    low, high = consumers[0].get_watermark_offsets(  # type: ignore[attr-defined]
        TopicPartition(topic, 0), timeout=10
    )
    assert (low, high) == (0, 65)


def test_a_consumer_sends_no_fetch_while_its_queue_holds_its_read_ahead(
    kafka: Kafka, counted: tuple[list[object], list[Requests]]
) -> None:
    """A large range reads ahead a bounded number of records (``MOST_QUEUED``), and its
    consumer sends no fetch while its queue holds that many. With a read-ahead of about the
    range, a consumer near the log end fetched again and again for the last half of every
    range (noida-db answers an empty fetch at once: thousands a second; Tansu holds one for
    ``fetch.wait.max.ms``): about 1 us of CPU per record in the worker and as much in the
    broker. Counted while the reader is stopped halfway through the range."""
    from sdk.spark._consumers import MOST_QUEUED

    consumers, requests = counted
    topic = kafka.create_topic(1)
    records = 80_000
    assert records // 2 >= 2 * MOST_QUEUED  # what is left when the reader stops
    kafka.produce(topic, {0: records})
    batches = read_range(settings(kafka, topic), OffsetRange(topic, 0, 0, records), False)
    rows = 0
    while rows < records // 2:
        rows += next(batches).num_rows
    stopped = time.monotonic()
    time.sleep(2.5)
    resumed = time.monotonic()
    rows += sum(batch.num_rows for batch in batches)
    assert rows == records and len(consumers) == 1
    # The window opens once the fetches that fill the queue to its limit when the reader
    # stopped have been answered (a few, on a broker that bounds its answers).
    assert requests[0].sent_within("Fetch", stopped + 1.0, resumed) == 0


def test_the_next_range_does_not_wait_behind_a_fetch_held_at_the_log_end(
    kafka: Kafka, counted: tuple[list[object], list[Requests]]
) -> None:
    """Kafka and Tansu hold a fetch at the log end open for ``fetch.wait.max.ms``, and the
    requests after it on that connection wait for it: the consumer that read to the log end
    reads no range during that time (the next range of the batch gets another consumer, a
    new one at first), and is handed ranges again once that fetch has surely ended."""
    from sdk.spark import _consumers

    consumers, _ = counted
    topic = kafka.create_topic(2)
    kafka.produce(topic, {0: 10, 1: 10})
    given = settings(kafka, topic, **{"kafka.fetch.wait.max.ms": "300"})
    assert read(given, topic, 0, 0, 10) == expected(0, 0, 10)
    assert read(given, topic, 1, 0, 10) == expected(1, 0, 10)
    assert len(consumers) == 2
    kept = [r for readers in _consumers._idle.values() for r in readers]
    wait_until(lambda: all(r.quiet(time.monotonic()) for r in kept), what="the held fetches ended")
    kafka.produce(topic, {0: 3, 1: 3})
    assert read(given, topic, 0, 10, 13) == [f"0@{10 + i}=0:{i}" for i in range(3)]
    assert read(given, topic, 1, 10, 13) == [f"1@{10 + i}=1:{i}" for i in range(3)]
    assert len(consumers) == 2 and _consumers.kept() == 2


def test_a_consumer_with_the_next_records_queued_stays_assigned_and_reads_on(
    kafka: Kafka, counted: tuple[list[object], list[Requests]]
) -> None:
    """A range read in several micro-batches (maxOffsetsPerTrigger, a backlog): the consumer
    holds the records after its range; its full queue keeps it from fetching, and the next
    range of the partition reads on from it without a new assignment (which would discard
    the queue and fetch it again)."""
    from confluent_kafka import TopicPartition

    from sdk.spark import _consumers

    consumers, _ = counted
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 6_000})
    given = settings(kafka, topic)
    assert read(given, topic, 0, 0, 1_000) == expected(0, 0, 1_000)
    (reader,) = [r for readers in _consumers._idle.values() for r in readers]
    assert (reader.topic, reader.partition, reader.position) == (topic, 0, 1_000)
    wait_until(
        lambda: (
            consumers[0].get_watermark_offsets(  # type: ignore[attr-defined]
                TopicPartition(topic, 0), cached=True
            )[1]
            == 6_000
        ),
        what="the log end known to the consumer",
    )
    assert consumers[0].assignment() == [TopicPartition(topic, 0)]  # type: ignore[attr-defined]
    assert read(given, topic, 0, 1_000, 2_000) == expected(0, 1_000, 2_000)
    assert reader.assignments == 1 and len(consumers) == 1
    # A range a little further on (its partition's previous range went to another worker):
    # read forward through the queue, the records before it skipped.
    assert read(given, topic, 0, 2_900, 3_000) == expected(0, 2_900, 3_000)
    assert reader.assignments == 1
    # Further than its queue reaches, or behind it: read by other consumers (new ones while
    # fewer than four are kept), and this one keeps its queue for the range after 3,000.
    assert read(given, topic, 0, 4_500, 4_600) == expected(0, 4_500, 4_600)
    assert read(given, topic, 0, 10, 20) == expected(0, 10, 20)
    assert len(consumers) == 3 and (reader.position, reader.assignments) == (3_000, 1)
    assert read(given, topic, 0, 3_000, 3_100) == expected(0, 3_000, 3_100)
    assert len(consumers) == 3 and reader.assignments == 1


def test_prefetch_follows_the_range_and_the_users_settings_win() -> None:
    from sdk.spark._consumers import sized

    assert sized({}, 200)["queued.min.messages"] == "1024"
    assert sized({}, 5_000)["queued.min.messages"] == "8192"
    # A large range reads ahead a bounded part of it (see
    # test_a_consumer_sends_no_fetch_while_its_queue_holds_its_read_ahead).
    assert sized({}, 10_000_000)["queued.min.messages"] == "16384"
    assert int(sized({}, 200)["queued.max.messages.kbytes"]) < 65_536  # librdkafka's default
    # A queue that was full is filled again at once, not after a second.
    assert sized({}, 200)["fetch.queue.backoff.ms"] == "10"
    user = {
        "queued.min.messages": "5",
        "fetch.max.bytes": "1000",
        "queued.max.messages.kbytes": "7",
    }
    assert sized(user, 10_000).items() >= user.items()


@given(st.integers(min_value=0, max_value=10**10))
def test_prefetch_limits_stay_within_what_librdkafka_accepts(records: int) -> None:
    """A response above ``receive.message.max.bytes`` is refused by the client and fetched
    again forever: a task reading a large range would never end."""
    from sdk.spark._consumers import fetch_limits

    limits = fetch_limits(records)
    assert 1 << 20 <= int(limits["fetch.max.bytes"]) <= 52_428_800  # librdkafka's default
    assert int(limits["receive.message.max.bytes"]) == 2_147_483_647  # its largest
    assert int(limits["queued.max.messages.kbytes"]) <= 65_536  # librdkafka's default
    assert int(limits["queued.min.messages"]) <= 16_384


def test_record_batches_match_the_records_row_by_row(kafka: Kafka) -> None:
    from confluent_kafka import Consumer, TopicPartition

    topic = kafka.create_topic(1, config=KEEP_FOREVER)
    producer = kafka.producer()
    for i in range(40):
        producer.produce(
            topic,
            key=None if i % 3 else b"k%d" % i,
            value=None if i % 5 == 0 else b"v%d" % i,
            partition=0,
            timestamp=1_700_000_000_000 + i if i % 2 else 0,
            headers=[("h", b"%d" % i)] if i % 4 else None,
        )
    producer.flush(30)
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": unique("rows")})
    consumer.assign([TopicPartition(topic, 0, 0)])
    messages: list = []
    wait_until(lambda: messages.extend(consumer.consume(40, 0.5)) or len(messages) >= 40)
    consumer.close()
    task = OffsetRange(topic, 0, 0, 40)
    columns = record_batch(messages, task, headers=True).to_pydict()
    assert columns["key"] == [m.key() for m in messages]
    assert columns["value"] == [m.value() for m in messages]
    assert columns["topic"] == [topic] * 40
    assert columns["partition"] == [0] * 40
    assert columns["offset"] == list(range(40))
    assert [t.timestamp() * 1000 for t in columns["timestamp"]] == [
        m.timestamp()[1] for m in messages
    ]
    assert columns["timestampType"] == [m.timestamp()[0] - 1 for m in messages]
    assert columns["headers"] == [
        [{"key": k, "value": v} for k, v in m.headers() or []] for m in messages
    ]


def test_the_executor_side_does_not_import_the_engine() -> None:
    """What an executor unpickles to read (the stream reader's module) leaves the parallel
    consumer engine and the gate's HTTP service unloaded, and every public name of ``sdk``
    and ``gate`` is still importable."""
    import subprocess
    import sys

    code = (
        "import sys, sdk.spark._stream\n"
        "assert 'sdk.consumer._parallel' not in sys.modules, 'engine imported'\n"
        "assert 'gate.service._service' not in sys.modules, 'gate service imported'\n"
        "assert 'redis' not in sys.modules, 'redis imported'\n"
        "import sdk, gate\n"
        "for name in sdk.__all__:\n"
        "    exec(f'from sdk import {name}')\n"
        "for name in gate.__all__:\n"
        "    exec(f'from gate import {name}')\n"
        "assert 'sdk.consumer._parallel' in sys.modules and 'gate.service._service' in sys.modules\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr


def test_the_broker_still_answers_a_fetch_with_more_than_fetch_max_bytes(kafka: Kafka) -> None:
    """Why the reader raises ``receive.message.max.bytes`` to its largest: Tansu and noida-db
    answer a fetch with more than ``fetch.max.bytes`` (noida-db: everything from the offset
    asked), which librdkafka refuses above ``receive.message.max.bytes`` and fetches again
    forever. When this fails, the broker keeps to the limit as Kafka does."""
    from confluent_kafka import Consumer, TopicPartition

    topic = kafka.create_topic(1)
    producer = kafka.producer(**{"linger.ms": 50, "batch.num.messages": 10_000})
    for i in range(30_000):
        producer.produce(topic, b"x" * 100, partition=0)
        if i % 5_000 == 0:
            producer.poll(0)
    producer.flush(60)
    refused: list[str] = []

    class Log:
        def log(self, level: int, fmt: str, *args: object) -> None:
            refused.extend(str(a) for a in args if "Invalid response size" in str(a))

    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": unique("quirk"),
            "fetch.max.bytes": 1 << 20,
            "max.partition.fetch.bytes": 1 << 20,
            "receive.message.max.bytes": (1 << 20) + 512,
            "logger": Log(),
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 10
        while not refused and time.monotonic() < deadline:
            consumer.consume(1_000, 0.5)
    finally:
        consumer.close()
    assert refused, f"{kafka.broker.name} kept each answer within fetch.max.bytes"


def test_the_end_of_a_partition_written_in_batches(kafka: Kafka) -> None:
    """Where a batch read ends (``Trigger.AvailableNow``, a gate's end offsets): Tansu reports
    a partition's end as the base offset of its last batch, short of its last records (which
    it serves all the same), so the tests write one record per batch (``tests.support``).
    When this fails on Tansu, it reports the end as Kafka does."""
    from confluent_kafka import Consumer, TopicPartition

    topic = kafka.create_topic(1)
    producer = kafka.producer(**{"linger.ms": 50, "batch.num.messages": 1_000})
    for _ in range(5_000):
        producer.produce(topic, b"x" * 100, partition=0)
    producer.flush(60)
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": unique("quirk")})
    try:
        _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        consumer.close()
    if kafka.broker.name == "tansu":
        assert end < 5_000, "Tansu now reports the end of a partition after its last batch"
    else:
        assert end == 5_000
