"""Reading planned ranges on executors: the tasks of a batch, Arrow batches, cached consumers."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("pyspark")

from sdk.spark._plan import OffsetRange, Offsets, ranges
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
    kafka: Kafka, opened: list[object]
) -> None:
    """The consumer kept after a range has fetched past its end: the next range must get
    exactly its own records, whether it starts where the last one ended (read on), before it
    (overlapping: re-assigned, the prefetched records discarded) or on another partition."""
    from sdk.spark import _consumers

    topic = kafka.create_topic(2)
    kafka.produce(topic, {0: 3_000, 1: 500})
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


def test_prefetch_follows_the_range_and_the_users_settings_win() -> None:
    from sdk.spark._consumers import sized

    assert sized({}, 200)["queued.min.messages"] == "1024"
    assert sized({}, 5_000)["queued.min.messages"] == "8192"
    assert sized({}, 10_000_000)["queued.min.messages"] == "131072"
    assert int(sized({}, 200)["queued.max.messages.kbytes"]) < 65_536  # librdkafka's default
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
    assert int(limits["queued.min.messages"]) <= 131_072


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
        "assert 'sdk._engine' not in sys.modules, 'engine imported'\n"
        "assert 'gate._service' not in sys.modules, 'gate service imported'\n"
        "assert 'redis' not in sys.modules, 'redis imported'\n"
        "import sdk, gate\n"
        "for name in sdk.__all__:\n"
        "    exec(f'from sdk import {name}')\n"
        "for name in gate.__all__:\n"
        "    exec(f'from gate import {name}')\n"
        "assert 'sdk._engine' in sys.modules and 'gate._service' in sys.modules\n"
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
