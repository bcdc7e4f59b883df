"""The gated source's options of Spark's JVM Kafka source (subscribePattern, assign, starting
by timestamp) and batch reads (``spark.read.format("gated-kafka")``, endingOffsets)."""

from __future__ import annotations

import json
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

pyspark = pytest.importorskip("pyspark")

from pyspark.sql.streaming.datasource import ReadAllAvailable  # noqa: E402

import sdk.spark._stream as stream_module  # noqa: E402
from sdk.spark import SourceOptionError  # noqa: E402
from sdk.spark._batch import GatedKafkaBatchReader  # noqa: E402
from sdk.spark._bounds import at_times, ending, wanted_times  # noqa: E402
from sdk.spark._settings import Settings  # noqa: E402
from sdk.spark._stream import GatedKafkaStreamReader  # noqa: E402
from tests.sdk.test_spark import LOCAL, spark_session  # noqa: E402
from tests.support import KEEP_FOREVER, Kafka, unique  # noqa: E402

BASE = {"kafka.bootstrap.servers": "127.0.0.1:1", "gate.enabled": "false"}


@pytest.fixture(scope="module")
def spark() -> object:
    return spark_session(LOCAL)


def batch(spark, kafka: Kafka, **options: str):  # type: ignore[no-untyped-def]
    read = spark.read.format("gated-kafka").option("kafka.bootstrap.servers", kafka.bootstrap)
    for key, value in options.items():
        read = read.option(key, value)
    return read.load()


def offsets_read(frame) -> dict[tuple[str, int], list[int]]:  # type: ignore[no-untyped-def]
    found: dict[tuple[str, int], list[int]] = {}
    for row in frame.select("topic", "partition", "offset").collect():
        found.setdefault((row.topic, row.partition), []).append(row.offset)
    return {k: sorted(v) for k, v in sorted(found.items())}


def stream_planner(kafka: Kafka, **options: str) -> GatedKafkaStreamReader:
    return GatedKafkaStreamReader({"kafka.bootstrap.servers": kafka.bootstrap, **options}, False)


def batch_planner(kafka: Kafka, **options: str) -> GatedKafkaBatchReader:
    return GatedKafkaBatchReader({"kafka.bootstrap.servers": kafka.bootstrap, **options}, False)


# ---- parsing (no broker) ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"subscribe": "a", "subscribePattern": "a.*"}, "got subscribe and subscribePattern"),
        ({"subscribe": "a", "assign": '{"a": [0]}'}, "got subscribe and assign"),
        ({"subscribePattern": "a.*", "assign": '{"a": [0]}'}, "got subscribePattern and assign"),
        ({}, "got none"),
    ],
)
def test_exactly_one_of_subscribe_subscribe_pattern_and_assign(
    options: dict, fragment: str
) -> None:
    with pytest.raises(SourceOptionError, match=f"exactly one of the options .*{fragment}"):
        Settings({**BASE, **options})


@pytest.mark.parametrize(
    ("options", "batch", "fragment"),
    [
        ({"subscribePattern": "("}, False, "'subscribePattern' is not a valid regular"),
        ({"assign": "[0, 1]"}, False, r"'assign' must be JSON like"),
        ({"assign": '{"a": [-1]}'}, False, r"'assign' must be JSON like"),
        ({"startingTimestamp": "yesterday"}, False, "'startingTimestamp' must be a timestamp"),
        ({"startingOffsetsByTimestamp": '{"a": {"0": -5}}'}, False, "'startingOffsetsByTime"),
        ({"startingOffsetsByTimestampStrategy": "earliest"}, False, "must be error or latest"),
        ({"endingOffsets": "latest"}, False, "'endingOffsets' is for batch reads only"),
        ({"endingTimestamp": "5"}, True, "'endingTimestamp' is not supported"),
        ({"minOffsetsPerTrigger": "5"}, False, "'minOffsetsPerTrigger' is not supported"),
        ({"startingOffsets": "latest"}, True, "cannot be latest for a batch read"),
        ({"startingOffsets": '{"a": {"0": -1}}'}, True, r"cannot use -1 \(latest\)"),
        ({"endingOffsets": "earliest"}, True, "'endingOffsets' cannot be earliest"),
        ({"endingOffsets": '{"a": {"0": -2}}'}, True, "'endingOffsets' must be JSON like"),
    ],
)
def test_bad_options_are_named(options: dict, batch: bool, fragment: str) -> None:
    subscribe = {} if {"assign", "subscribePattern"} & set(options) else {"subscribe": "a"}
    with pytest.raises(SourceOptionError, match=fragment):
        Settings({**BASE, **subscribe, **options}, batch)


@given(st.dictionaries(st.text(min_size=1), st.lists(st.integers(0, 1000), min_size=1), min_size=1))
def test_assign_keeps_every_given_partition(assigned: dict[str, list[int]]) -> None:
    settings = Settings({**BASE, "assign": json.dumps(assigned)})
    assert settings.assign == {t: sorted(set(p)) for t, p in sorted(assigned.items())}


@given(
    st.text(),
    st.sampled_from(
        [
            "assign",
            "startingOffsets",
            "endingOffsets",
            "startingOffsetsByTimestamp",
            "startingTimestamp",
        ]
    ),
)
def test_any_option_value_parses_or_fails_naming_the_option(value: str, option: str) -> None:
    subscribe = {} if option == "assign" else {"subscribe": "a"}
    try:
        Settings({**BASE, **subscribe, option: value}, batch=True)
    except SourceOptionError as exc:
        assert f"'{option}'" in str(exc)


def test_a_start_by_timestamp_must_name_every_partition_and_latest_takes_the_end() -> None:
    partitions = {"a": [0, 1]}
    with pytest.raises(SourceOptionError, match=r"missing: a\[1\]"):
        wanted_times(partitions, None, {"a": {"0": 10}})
    wanted = wanted_times(partitions, None, {"a": {"0": 10, "1": 20}})
    assert wanted == {("a", 0): 10, ("a", 1): 20}
    assert wanted_times(partitions, 7, {"a": {"0": 10}}) == {("a", 0): 7, ("a", 1): 7}
    high = {"a": {"0": 50, "1": 60}}
    found = {("a", 0): 12, ("a", 1): -1}
    with pytest.raises(RuntimeError, match=r"a\[1\] \(timestamp 20\).*Strategy to latest"):
        at_times(found, wanted, high, "error")
    assert at_times(found, wanted, high, "latest") == {"a": {"0": 12, "1": 60}}


@given(
    st.integers(0, 100),
    st.integers(0, 100),
    st.one_of(st.none(), st.integers(0, 120)),
    st.one_of(st.just(-1), st.integers(0, 120)),
)
def test_a_batch_ends_at_most_at_the_end_the_watermark_and_the_given_end(
    begin: int, top: int, watermark: int | None, given_end: int
) -> None:
    high = {"t": {"0": max(begin, top)}}
    start = {"t": {"0": begin}}
    end = ending({"t": {"0": given_end}}, start, high, lambda t, p: watermark)["t"]["0"]
    assert begin <= end <= high["t"]["0"]
    if given_end >= 0:
        assert end <= max(begin, given_end)
    if watermark is None:
        assert end == begin
    else:
        assert end <= max(begin, watermark)
    ungated = ending("latest", start, high, None)["t"]["0"]
    assert ungated == high["t"]["0"]


# ---- planning against the broker ----------------------------------------------------------


def test_subscribe_pattern_reads_matching_topics_and_one_created_later_joins(
    kafka: Kafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stream reader lists the topics at most every few seconds: here at every batch.
    monkeypatch.setattr(stream_module, "METADATA_REFRESH_SECONDS", 0.0)
    prefix = unique("pat").replace("-", "_")
    first, second = kafka.create_topic(2, f"{prefix}_a"), kafka.create_topic(1, f"{prefix}_b")
    other = kafka.create_topic(1, f"x{prefix}_c")  # contains the prefix: a full match only
    kafka.produce(first, {0: 3, 1: 4})
    kafka.produce(second, {0: 5})
    kafka.produce(other, {0: 6})
    source = stream_planner(kafka, subscribePattern=f"{prefix}_.*", **{"gate.enabled": "false"})
    try:
        start = source.initialOffset()
        assert start == {first: {"0": 0, "1": 0}, second: {"0": 0}}
        end = source.latestOffset(start, ReadAllAvailable())
        assert end == {first: {"0": 3, "1": 4}, second: {"0": 5}}
        later = kafka.create_topic(1, f"{prefix}_d")
        kafka.produce(later, {0: 7})
        # A topic created since joins at its earliest offset, as an empty range first ...
        joined = source.latestOffset(end, ReadAllAvailable())
        assert joined == {**end, later: {"0": 0}}
        assert [(r.topic, r.start, r.end) for r in source.partitions(end, joined)] == []
        # ... and is read from the next batch on.
        assert source.latestOffset(joined, ReadAllAvailable())[later] == {"0": 7}
    finally:
        source.stop()


def test_subscribe_pattern_with_polled_dependencies_gates_a_topic_created_later(
    kafka: Kafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stream reader lists the topics at most every few seconds: here at every batch.
    monkeypatch.setattr(stream_module, "METADATA_REFRESH_SECONDS", 0.0)
    prefix = unique("gpat").replace("-", "_")
    first = kafka.create_topic(1, f"{prefix}_a")
    kafka.produce(first, {0: 10})
    dependency = unique("dep")
    kafka.commit(dependency, first, {0: 4})
    options = {"gate.name": "job", "gate.dependsOn": dependency, "gate.pollIntervalMs": "50"}
    source = stream_planner(kafka, subscribePattern=f"{prefix}_.*", **options)
    try:
        start = source.initialOffset()
        end = source.latestOffset(start, ReadAllAvailable())
        assert end == {first: {"0": 4}}
        later = kafka.create_topic(1, f"{prefix}_b")
        kafka.produce(later, {0: 8})
        kafka.commit(dependency, later, {0: 6})
        joined = source.latestOffset(end, ReadAllAvailable())
        assert joined == {first: {"0": 4}, later: {"0": 0}}
        assert source.latestOffset(joined, ReadAllAvailable()) == {first: {"0": 4}, later: {"0": 6}}
    finally:
        source.stop()


def test_assign_plans_only_its_partitions_and_names_a_missing_one(kafka: Kafka) -> None:
    topic = kafka.create_topic(3)
    kafka.produce(topic, {0: 2, 1: 3, 2: 4})
    source = stream_planner(kafka, assign=json.dumps({topic: [2, 0]}), **{"gate.enabled": "false"})
    start = source.initialOffset()
    assert start == {topic: {"0": 0, "2": 0}}
    assert source.latestOffset(start, ReadAllAvailable()) == {topic: {"0": 2, "2": 4}}
    missing = stream_planner(kafka, assign=json.dumps({topic: [1, 5]}), **{"gate.enabled": "false"})
    with pytest.raises(RuntimeError, match=f"option 'assign': topic '{topic}' has no partition 5"):
        missing.initialOffset()


def produce_at(kafka: Kafka, topic: str, stamps: dict[int, list[int]]) -> None:
    producer = kafka.producer()
    for partition, times in stamps.items():
        for i, ms in enumerate(times):
            producer.produce(
                topic, value=f"{partition}:{i}".encode(), partition=partition, timestamp=ms
            )
    producer.flush(30)


T0 = 1_700_000_000_000


def require_offsets_by_timestamp(kafka: Kafka, topic: str) -> None:
    """Skip on a broker whose ListOffsets ignores the timestamp (Tansu 0.6 answers 0)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    spec = {TopicPartition(topic, 0): OffsetSpec.for_timestamp(T0 + 15)}
    answer = next(iter(kafka.admin.list_offsets(spec, request_timeout=10).values())).result(10)
    if answer.offset != 2:
        pytest.skip(
            f"{kafka.broker.name} answers ListOffsets by timestamp with offset {answer.offset} "
            "where Kafka answers 2 (the first record at or after the timestamp)"
        )


def test_tansu_still_ignores_the_timestamp_of_a_list_offsets_request(kafka: Kafka) -> None:
    """The quirk the by-timestamp test skips on: when this fails, Tansu answers as Kafka does
    and the skip in ``require_offsets_by_timestamp`` can go."""
    if kafka.broker.name != "tansu":
        pytest.skip("shows a quirk of Tansu's")
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    topic = kafka.create_topic(1, config=KEEP_FOREVER)
    produce_at(kafka, topic, {0: [T0, T0 + 10, T0 + 20, T0 + 30]})
    spec = {TopicPartition(topic, 0): OffsetSpec.for_timestamp(T0 + 15)}
    answer = next(iter(kafka.admin.list_offsets(spec, request_timeout=10).values())).result(10)
    assert answer.offset == 0  # Kafka: 2, the first record at or after the timestamp


def test_a_read_starts_at_the_first_record_at_or_after_a_timestamp(kafka: Kafka) -> None:
    topic = kafka.create_topic(2, config=KEEP_FOREVER)
    produce_at(kafka, topic, {0: [T0, T0 + 10, T0 + 20, T0 + 30], 1: [T0 + 5, T0 + 15]})
    require_offsets_by_timestamp(kafka, topic)
    off = {"gate.enabled": "false", "subscribe": topic}
    by_partition = json.dumps({topic: {"0": T0 + 15, "1": T0}})
    source = stream_planner(kafka, startingOffsetsByTimestamp=by_partition, **off)
    assert source.initialOffset() == {topic: {"0": 2, "1": 0}}
    # startingTimestamp comes first, then startingOffsetsByTimestamp, then startingOffsets.
    source = stream_planner(
        kafka,
        startingTimestamp=str(T0 + 10),
        startingOffsetsByTimestamp=by_partition,
        startingOffsets="latest",
        **off,
    )
    assert source.initialOffset() == {topic: {"0": 1, "1": 1}}
    source = stream_planner(kafka, startingTimestamp=str(T0 + 25), **off)
    with pytest.raises(RuntimeError, match=rf"{topic}\[1\] \(timestamp {T0 + 25}\)"):
        source.initialOffset()
    source = stream_planner(
        kafka,
        startingTimestamp=str(T0 + 25),
        startingOffsetsByTimestampStrategy="latest",
        **off,
    )
    assert source.initialOffset() == {topic: {"0": 3, "1": 2}}


def test_a_batch_read_stops_the_gate_when_planning_ends(kafka: Kafka) -> None:
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 5})
    dependency = unique("dep")
    kafka.commit(dependency, topic, {0: 3})
    before = set(threading.enumerate())
    source = batch_planner(
        kafka, subscribe=topic, **{"gate.name": "job", "gate.dependsOn": dependency}
    )
    assert source.plan() == ({topic: {"0": 0}}, {topic: {"0": 3}})
    assert source._gate is None and source._admin is None
    left = [t for t in set(threading.enumerate()) - before if t.is_alive()]
    for thread in left:
        thread.join(5)
    assert [t.name for t in left if t.is_alive()] == []


# ---- batch reads through Spark ---------------------------------------------------------------


def test_a_gated_batch_read_reads_from_the_start_to_the_watermark(spark, kafka: Kafka) -> None:
    topic = kafka.create_topic(3)
    kafka.produce(topic, {0: 30, 1: 20, 2: 10})
    dependency = unique("dep")
    kafka.commit(dependency, topic, {0: 12, 1: 20})  # nothing released in partition 2
    frame = batch(
        spark,
        kafka,
        subscribe=topic,
        startingOffsets=json.dumps({topic: {"0": 5}}),
        **{"gate.name": "job", "gate.dependsOn": dependency},
    )
    assert offsets_read(frame) == {(topic, 0): list(range(5, 12)), (topic, 1): list(range(20))}


def test_a_batch_read_ends_at_the_ending_offsets(spark, kafka: Kafka) -> None:
    topic = kafka.create_topic(2)
    kafka.produce(topic, {0: 30, 1: 20})
    dependency = unique("dep")
    kafka.commit(dependency, topic, {0: 25, 1: 15})
    ends = json.dumps({topic: {"0": 8, "1": -1}})
    gated = {"gate.name": "job", "gate.dependsOn": dependency}
    frame = batch(spark, kafka, subscribe=topic, endingOffsets=ends, **gated)
    assert offsets_read(frame) == {(topic, 0): list(range(8)), (topic, 1): list(range(15))}
    frame = batch(spark, kafka, subscribe=topic, endingOffsets=ends, **{"gate.enabled": "false"})
    assert offsets_read(frame) == {(topic, 0): list(range(8)), (topic, 1): list(range(20))}


def test_an_ungated_batch_read_reads_to_the_end(spark, kafka: Kafka) -> None:
    prefix = unique("bpat").replace("-", "_")
    first, second = kafka.create_topic(2, f"{prefix}_a"), kafka.create_topic(1, f"{prefix}_b")
    kafka.produce(first, {0: 4, 1: 6})
    kafka.produce(second, {0: 3})
    frame = batch(spark, kafka, subscribePattern=f"{prefix}_.*", **{"gate.enabled": "false"})
    assert offsets_read(frame) == {
        (first, 0): list(range(4)),
        (first, 1): list(range(6)),
        (second, 0): list(range(3)),
    }
    frame = batch(spark, kafka, assign=json.dumps({first: [1]}), **{"gate.enabled": "false"})
    assert offsets_read(frame) == {(first, 1): list(range(6))}


def test_a_batch_read_with_two_subscriptions_fails_naming_them(spark, kafka: Kafka) -> None:
    topic = kafka.create_topic(1)
    frame = batch(spark, kafka, subscribe=topic, assign=json.dumps({topic: [0]}))
    with pytest.raises(Exception, match=r"exactly one of the options .*got subscribe and assign"):
        frame.collect()
